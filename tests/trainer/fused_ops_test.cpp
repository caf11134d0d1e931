// The fused CPU kernels against the model's composite ATen formulation, forward and backward.
#include "trainer/model/fused_ops.h"

#include <gtest/gtest.h>

#include "trainer/model/model.h"
#include "trainer/runtime/parallel.h"

namespace sftctl::trainer {
namespace {

double MaxAbs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Runs `f` on fresh leaf copies of `inputs`, backpropagates `upstream` through its output(s),
// and returns outputs followed by input gradients.
std::vector<torch::Tensor> Differentiate(
    const std::function<std::vector<torch::Tensor>(std::vector<torch::Tensor>&)>& f,
    const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(t.is_floating_point()));
  auto outs = f(leaves);
  torch::autograd::backward(outs, upstream);
  std::vector<torch::Tensor> result;
  for (auto& o : outs) result.push_back(o.detach());
  for (auto& l : leaves) {
    if (l.is_floating_point()) result.push_back(l.grad());
  }
  return result;
}

void ExpectClose(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "tensor " << i;
    const double scale = std::max(1.0, b[i].abs().max().item<double>());
    EXPECT_LE(MaxAbs(a[i], b[i]), tol * scale) << "tensor " << i;
  }
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, h), x.slice(-1, 0, h)}, -1);
}

class FusedOps : public ::testing::TestWithParam<torch::ScalarType> {
 protected:
  void SetUp() override { torch::manual_seed(3); }
  torch::ScalarType dtype() const { return GetParam(); }
  // fp32 kernels agree with ATen to rounding; bf16 ones round once where ATen rounds per op.
  double tol() const { return dtype() == torch::kFloat32 ? 2e-5 : 3e-2; }
};

TEST_P(FusedOps, RmsNormMatchesComposite) {
  const auto x = torch::randn({3, 5, 48}).to(dtype());
  const auto w = torch::rand({48}) + 0.5;
  const auto up = torch::randn({3, 5, 48}).to(dtype());
  auto fused = Differentiate(
      [&](auto& in) { return std::vector{fused::RmsNorm(in[0], in[1], 1e-5, dtype())}; }, {x, w}, {up});
  auto ref = Differentiate(
      [&](auto& in) {
        auto xf = in[0].to(torch::kFloat32);
        auto y = in[1] * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + 1e-5)).to(in[0].scalar_type());
        return std::vector{y.to(dtype())};
      },
      {x, w}, {up});
  ExpectClose(fused, ref, tol());
}

TEST_P(FusedOps, QkvRopeMatchesComposite) {
  const int64_t B = 2, T = 7, H = 4, Hk = 2, D = 8;
  const auto qkv = torch::randn({B, T, (H + 2 * Hk) * D}).to(dtype());
  ModelConfig c;
  c.head_dim = D;
  c.rope_theta = 10000;
  RotaryTables rope(c, 16, torch::kCPU);
  const auto positions = torch::randint(0, 16, {B, T}, torch::kInt64);
  for (bool with_positions : {false, true}) {
    const torch::Tensor pos = with_positions ? positions : torch::Tensor();
    std::vector<torch::Tensor> up = {torch::randn({B, H, T, D}).to(dtype()),
                                     torch::randn({B, Hk, T, D}).to(dtype()),
                                     torch::randn({B, Hk, T, D}).to(dtype())};
    auto fused = Differentiate(
        [&](auto& in) {
          auto [q, k, v] = fused::QkvRope(in[0], rope.cos_table(), rope.sin_table(), pos, H, Hk, D);
          return std::vector{q, k, v};
        },
        {qkv}, up);
    auto ref = Differentiate(
        [&](auto& in) {
          auto parts = in[0].split_with_sizes({H * D, Hk * D, Hk * D}, -1);
          auto q = parts[0].view({B, T, H, D}).transpose(1, 2);
          auto k = parts[1].view({B, T, Hk, D}).transpose(1, 2);
          auto v = parts[2].view({B, T, Hk, D}).transpose(1, 2);
          auto [cos, sin] = rope.Get(T, pos);
          return std::vector{q * cos + RotateHalf(q) * sin, k * cos + RotateHalf(k) * sin, v};
        },
        {qkv}, up);
    ExpectClose(fused, ref, tol());
  }
}

TEST_P(FusedOps, CausalSoftmaxMatchesComposite) {
  const int64_t Z = 3, rep = 2, T = 9;
  const auto scores = torch::randn({Z, rep * T, T}).to(dtype()) * 4;
  const auto up = torch::randn({Z, rep * T, T}).to(dtype());
  auto fused = Differentiate([&](auto& in) { return std::vector{fused::CausalSoftmax(in[0], 0.3, dtype())}; },
                             {scores}, {up});
  auto ref = Differentiate(
      [&](auto& in) {
        auto rows = torch::arange(rep * T).remainder(T).unsqueeze(1);
        auto masked = torch::arange(T).unsqueeze(0).gt(rows);
        auto s =
            (in[0].to(torch::kFloat32) * 0.3).masked_fill(masked, -std::numeric_limits<float>::infinity());
        return std::vector{torch::softmax(s, -1).to(dtype())};
      },
      {scores}, {up});
  ExpectClose(fused, ref, tol());
  // Masked entries are exactly zero.
  auto p = fused::CausalSoftmax(scores, 0.3, dtype());
  EXPECT_EQ(p[0][0].slice(0, 1).abs().sum().item<double>(), 0.0);
}

TEST_P(FusedOps, SlidingWindowSoftmaxMatchesComposite) {
  const int64_t Z = 2, rep = 3, T = 11, window = 4;
  const auto scores = torch::randn({Z, rep * T, T}).to(dtype()) * 4;
  const auto up = torch::randn({Z, rep * T, T}).to(dtype());
  auto fused =
      Differentiate([&](auto& in) { return std::vector{fused::CausalSoftmax(in[0], 0.3, dtype(), window)}; },
                    {scores}, {up});
  auto ref = Differentiate(
      [&](auto& in) {
        auto rows = torch::arange(rep * T).remainder(T).unsqueeze(1);
        auto back = rows - torch::arange(T).unsqueeze(0);  // t - j
        auto masked = back.lt(0).logical_or(back.ge(window));
        auto s =
            (in[0].to(torch::kFloat32) * 0.3).masked_fill(masked, -std::numeric_limits<float>::infinity());
        return std::vector{torch::softmax(s, -1).to(dtype())};
      },
      {scores}, {up});
  ExpectClose(fused, ref, tol());
  // Query 9 sees keys 6..9 only: the others are exactly zero, the four sum to one.
  auto p = fused::CausalSoftmax(scores, 0.3, dtype(), window).to(torch::kFloat32);
  EXPECT_EQ(p[1][9].slice(0, 0, 6).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(p[1][9].slice(0, 10).abs().sum().item<double>(), 0.0);
  EXPECT_GT(p[1][9][6].item<double>(), 0.0);
  EXPECT_NEAR(p[1][9].sum().item<double>(), 1.0, 1e-2);
  // A window as long as the sequence is plain causal attention.
  EXPECT_TRUE(torch::equal(fused::CausalSoftmax(scores, 0.3, dtype(), T),
                           fused::CausalSoftmax(scores, 0.3, dtype())));
}

TEST_P(FusedOps, SwiGluMatchesComposite) {
  const auto gu = torch::randn({4, 3, 2 * 40}).to(dtype()) * 3;
  const auto up = torch::randn({4, 3, 40}).to(dtype());
  auto fused = Differentiate([&](auto& in) { return std::vector{fused::SwiGlu(in[0])}; }, {gu}, {up});
  auto ref = Differentiate(
      [&](auto& in) {
        auto parts = in[0].chunk(2, -1);
        return std::vector{torch::silu(parts[0].to(torch::kFloat32)) * parts[1].to(torch::kFloat32)};
      },
      {gu}, {up.to(torch::kFloat32)});
  ExpectClose(fused, ref, tol());
}

// Every fused kernel, forward and backward, on inputs large enough to split into many parallel
// subranges; outputs and gradients in one list.
std::vector<torch::Tensor> RunEveryKernel(torch::ScalarType dtype) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> all;
  auto keep = [&](const std::vector<torch::Tensor>& ts) { all.insert(all.end(), ts.begin(), ts.end()); };
  const auto x = torch::randn({1000, 64}).to(dtype), w = torch::rand({64}) + 0.5;
  keep(Differentiate([&](auto& in) { return std::vector{fused::RmsNorm(in[0], in[1], 1e-5, dtype)}; }, {x, w},
                     {torch::randn({1000, 64}).to(dtype)}));
  const int64_t B = 2, T = 400, H = 4, Hk = 2, D = 8;
  ModelConfig c;
  c.head_dim = D;
  c.rope_theta = 10000;
  RotaryTables rope(c, T, torch::kCPU);
  const auto positions = torch::randint(0, T, {B, T}, torch::kInt64);
  keep(Differentiate(
      [&](auto& in) {
        auto [q, k, v] = fused::QkvRope(in[0], rope.cos_table(), rope.sin_table(), positions, H, Hk, D);
        return std::vector{q, k, v};
      },
      {torch::randn({B, T, (H + 2 * Hk) * D}).to(dtype)},
      {torch::randn({B, H, T, D}).to(dtype), torch::randn({B, Hk, T, D}).to(dtype),
       torch::randn({B, Hk, T, D}).to(dtype)}));
  keep(Differentiate([&](auto& in) { return std::vector{fused::CausalSoftmax(in[0], 0.3, dtype)}; },
                     {torch::randn({8, 2 * 64, 64}).to(dtype) * 4},
                     {torch::randn({8, 2 * 64, 64}).to(dtype)}));
  keep(Differentiate([&](auto& in) { return std::vector{fused::SwiGlu(in[0])}; },
                     {torch::randn({1000, 2 * 40}).to(dtype) * 3}, {torch::randn({1000, 40}).to(dtype)}));
  auto p = torch::randn({200003}), g = torch::randn({200003}), m = torch::randn({200003}) * 0.1,
       v = torch::rand({200003});
  fused::AdamWStep(p, g, m, v, 1e-2, 0.1, 0.9, 0.95, 1e-8, 0.271, 0.142625);
  keep({p, m, v, torch::tensor(fused::SumOfSquares(g), torch::kFloat64)});
  return all;
}

// The same bits for any thread count and either parallel backend (exact resume relies on it).
TEST_P(FusedOps, EveryKernelIsBitIdenticalAcrossBackendsAndThreadCounts) {
  const int saved_threads = torch::get_num_threads();
  const parallel::Backend saved_backend = parallel::CurrentBackend();
  std::vector<parallel::Backend> backends = {parallel::Backend::kPool};
  if (parallel::AtenAvailable()) backends.insert(backends.begin(), parallel::Backend::kAten);
  std::vector<torch::Tensor> first;
  for (parallel::Backend backend : backends) {
    ASSERT_TRUE(parallel::SetBackend(backend).ok());
    for (int threads : {1, 2, 3}) {
      torch::set_num_threads(threads);
      const auto got = RunEveryKernel(dtype());
      if (first.empty()) {
        first = got;
        continue;
      }
      ASSERT_EQ(got.size(), first.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::equal(got[i], first[i]))
            << "tensor " << i << " differs with " << parallel::BackendName(backend) << ", " << threads
            << " threads (max diff " << MaxAbs(got[i], first[i]) << ")";
      }
    }
  }
  torch::set_num_threads(saved_threads);
  ASSERT_TRUE(parallel::SetBackend(saved_backend).ok());
  EXPECT_EQ(first.size(), 3u + 4u + 2u + 2u + 4u);  // every kernel contributed
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedOps, ::testing::Values(torch::kFloat32, torch::kBFloat16),
                         [](const auto& info) { return info.param == torch::kFloat32 ? "fp32" : "bf16"; });

TEST(FusedOptimizer, AdamWStepMatchesTheAtenFormula) {
  torch::manual_seed(5);
  auto p = torch::randn({1000}), g = torch::randn({1000}), m = torch::randn({1000}) * 0.1,
       v = torch::rand({1000});
  auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8, bc1 = 1 - std::pow(b1, 3),
               bc2 = 1 - std::pow(b2, 3);
  fused::AdamWStep(p, g, m, v, lr, wd, b1, b2, eps, bc1, bc2);
  p2.mul_(1 - lr * wd);
  m2.mul_(b1).add_(g, 1 - b1);
  v2.mul_(b2).addcmul_(g, g, 1 - b2);
  p2.addcdiv_(m2, (v2.sqrt() / std::sqrt(bc2)).add_(eps), -lr / bc1);
  EXPECT_LE(MaxAbs(m, m2), 1e-6);
  EXPECT_LE(MaxAbs(v, v2), 1e-6);
  EXPECT_LE(MaxAbs(p, p2), 1e-6);
  EXPECT_GT(MaxAbs(p, torch::zeros_like(p)), 0.1);  // it did update
}

TEST(FusedOptimizer, SumOfSquaresIsExactAndThreadIndependent) {
  auto x = torch::randn({100003});
  const double want = x.to(torch::kFloat64).pow(2).sum().item<double>();
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const double one = fused::SumOfSquares(x);
  torch::set_num_threads(2);
  const double two = fused::SumOfSquares(x);
  torch::set_num_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, want, 1e-9 * want);
}

TEST(FusedModel, LossAndGradientsMatchTheCompositePath) {
  for (const std::string type : {"llama", "qwen2", "qwen3", "mistral"}) {
    ModelConfig c;
    c.model_type = type;
    c.attention_bias = type == "qwen2";
    c.qk_norm = type == "qwen3";                   // q_norm / k_norm before RoPE
    c.sliding_window = type == "mistral" ? 5 : 0;  // shorter than the 12 positions
    c.vocab_size = 50;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 32;
    c.rms_norm_eps = 1e-6;
    torch::manual_seed(11);
    CausalLM model(c);
    const auto ids = torch::randint(0, 50, {3, 12}, torch::kInt64);
    auto labels = ids.clone();
    labels.slice(1, 0, 4).fill_(-100);
    auto run = [&](bool fused_on) {
      fused::SetEnabled(fused_on);
      model->zero_grad();
      auto loss = model->LossSum(ids, labels);
      loss.backward();
      std::vector<torch::Tensor> out = {loss.detach()};
      for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
      fused::SetEnabled(true);
      return out;
    };
    SCOPED_TRACE(type);
    ExpectClose(run(true), run(false), 2e-5);
    int64_t qk_norms = 0;
    for (const auto& p : model->named_parameters())
      qk_norms += p.key().find("_norm.weight") != std::string::npos;
    EXPECT_EQ(qk_norms, type == "qwen3" ? 4 : 0);
  }
}

TEST(FusedRmsNorm, WeightGradientDoesNotDependOnThreads) {
  torch::manual_seed(2);
  const auto x = torch::randn({257, 64});
  const auto w = torch::rand({64});
  const auto up = torch::randn({257, 64});
  auto grad_w = [&](int threads) {
    torch::set_num_threads(threads);
    auto wl = w.clone().requires_grad_();
    fused::RmsNorm(x, wl, 1e-6, torch::kFloat32).backward(up);
    return wl.grad();
  };
  const int saved = torch::get_num_threads();
  auto a = grad_w(1), b = grad_w(2);
  torch::set_num_threads(saved);
  EXPECT_TRUE(torch::equal(a, b));
}

}  // namespace
}  // namespace sftctl::trainer
