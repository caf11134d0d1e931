// The fused CUDA kernels on a GPU (built where the trainer's are: SFTCTL_CUDA_KERNELS): each
// launcher against the composite formulation computed on the CPU, on fresh random inputs (bf16 and
// fp32, odd row lengths, T not a multiple of any block, head_dim 64 and 128, Qwen's 151,936
// vocabulary), outputs poisoned beforehand so an element no thread writes fails; then the model's
// loss and gradients with the kernels against the composite path on the same GPU, for every model
// family. Skipped without a GPU. bench/gpu/run.sh runs it, under compute-sanitizer when the machine
// has it.
#include "trainer/model/kernels/cuda_kernels.h"

#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "trainer/model/cuda_ops.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/kernels/cublas_gemm.h"
#include "trainer/model/model.h"
#include "trainer/model/model_config.h"

namespace sftctl::trainer {
namespace {

using torch::Tensor;
namespace k = kernels;

#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

const torch::Device kGpu(torch::kCUDA, 0);

k::DType Dt(torch::ScalarType t) { return t == torch::kBFloat16 ? k::DType::kBFloat16 : k::DType::kFloat32; }
void* Stream() { return c10::cuda::getCurrentCUDAStream(0).stream(); }

Tensor Poisoned(at::IntArrayRef sizes, torch::ScalarType type) {
  return torch::full(sizes, std::numeric_limits<float>::quiet_NaN(),
                     torch::TensorOptions().dtype(type).device(kGpu));
}

// max |a - b| / max(1, max |b|) on the CPU in fp32; any NaN gives +inf.
double Diff(const Tensor& a, const Tensor& b) {
  const Tensor af = a.to(torch::kCPU, torch::kFloat32), bf = b.to(torch::kCPU, torch::kFloat32);
  if (af.isnan().any().item<bool>() || bf.isnan().any().item<bool>()) return INFINITY;
  return (af - bf).abs().max().item<double>() / std::max(1.0, bf.abs().max().item<double>());
}

double Tol(torch::ScalarType t) { return t == torch::kBFloat16 ? 1.6e-2 : 5e-5; }

TEST(CudaKernels, AddRmsNormForwardAndBackward) {
  REQUIRE_GPU();
  for (const auto out : {torch::kFloat32, torch::kBFloat16}) {
    for (const bool add : {false, true}) {
      for (const int64_t C : {7, 896, 4097}) {
        SCOPED_TRACE(testing::Message() << "out " << out << " add " << add << " C " << C);
        const int64_t N = 37;
        torch::manual_seed(C);
        const Tensor x = torch::randn({N, C}), d = torch::randn({N, C}).to(torch::kBFloat16);
        const Tensor w = torch::rand({C}) + 0.5, dy = torch::randn({N, C}).to(out),
                     dh_in = torch::randn({N, C});
        // Reference (CPU, autograd through the composite formulation).
        Tensor xr = x.clone().requires_grad_(true), dr = d.clone().requires_grad_(true),
               wr = w.clone().requires_grad_(true);
        const Tensor hr = add ? xr + dr.to(torch::kFloat32) : xr;
        const Tensor yr = (wr * (hr * torch::rsqrt(hr.pow(2).mean(-1, true) + 1e-6))).to(out);
        Tensor loss = (yr.to(torch::kFloat32) * dy.to(torch::kFloat32)).sum();
        if (add) loss = loss + (hr * dh_in).sum();
        loss.backward();
        // Kernels.
        const Tensor xg = x.to(kGpu), dg = d.to(kGpu), wg = w.to(kGpu), dyg = dy.to(kGpu),
                     dhg = dh_in.to(kGpu);
        Tensor h = add ? Poisoned({N, C}, torch::kFloat32) : xg, y = Poisoned({N, C}, out);
        Tensor rstd = Poisoned({N}, torch::kFloat32);
        ASSERT_EQ(k::LaunchAddRmsNormForward(xg.data_ptr(), k::DType::kFloat32, add ? dg.data_ptr() : nullptr,
                                             k::DType::kBFloat16, wg.data_ptr<float>(),
                                             add ? h.data_ptr<float>() : nullptr, y.data_ptr(), Dt(out),
                                             rstd.data_ptr<float>(), N, C, 1e-6f, Stream()),
                  0);
        EXPECT_LE(Diff(y, yr), Tol(out));
        if (add) {
          EXPECT_EQ(Diff(h, hr), 0.0);
        }
        Tensor dx = Poisoned({N, C}, torch::kFloat32), dd = Poisoned({N, C}, torch::kBFloat16);
        Tensor dw = Poisoned({C}, torch::kFloat32);
        Tensor scratch = Poisoned({k::WeightGradScratchFloats(N, C)}, torch::kFloat32);
        ASSERT_EQ(k::LaunchAddRmsNormBackward(
                      h.data_ptr(), k::DType::kFloat32, wg.data_ptr<float>(), dyg.data_ptr(), Dt(out),
                      add ? dhg.data_ptr<float>() : nullptr, rstd.data_ptr<float>(), dx.data_ptr(),
                      add ? dd.data_ptr() : nullptr, k::DType::kBFloat16, dw.data_ptr<float>(),
                      scratch.data_ptr<float>(), N, C, Stream()),
                  0);
        EXPECT_LE(Diff(dx, xr.grad()), 1e-4);
        if (add) {
          EXPECT_LE(Diff(dd, dr.grad()), Tol(torch::kBFloat16));
        }
        EXPECT_LE(Diff(dw, wr.grad()), 1e-4);
      }
    }
  }
}

Tensor RotateHalf(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

TEST(CudaKernels, QkvRopeForwardAndBackward) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t D : {64, 128}) {
      SCOPED_TRACE(testing::Message() << dtype << " D " << D);
      const int64_t B = 2, T = 37, H = 14, Hk = 2, P = 64, W = (H + 2 * Hk) * D;
      torch::manual_seed(D);
      const Tensor inv = 1.0 / torch::pow(1e6, torch::arange(0, D, 2, torch::kFloat32) / D);
      const Tensor f = torch::outer(torch::arange(P, torch::kFloat32), inv);
      const Tensor cos = torch::cat({f, f}, -1).cos(), sin = torch::cat({f, f}, -1).sin();
      const Tensor pos = torch::randint(0, P, {B, T}, torch::kInt64);
      const Tensor qkv = torch::randn({B, T, W}).to(dtype);
      Tensor src = qkv.to(torch::kFloat32).requires_grad_(true);
      const auto sp = src.split({H * D, Hk * D, Hk * D}, -1);
      auto rope = [&](const Tensor& x, int64_t heads) {
        const Tensor h = x.view({B, T, heads, D}).transpose(1, 2);
        return h * cos.index({pos}).unsqueeze(1) + RotateHalf(h) * sin.index({pos}).unsqueeze(1);
      };
      const Tensor qr = rope(sp[0], H), kr = rope(sp[1], Hk), vr = sp[2].view({B, T, Hk, D}).transpose(1, 2);
      const Tensor gq = torch::randn({B, H, T, D}).to(dtype), gk = torch::randn({B, Hk, T, D}).to(dtype);
      const Tensor gv = torch::randn({B, Hk, T, D}).to(dtype);
      ((qr * gq.to(torch::kFloat32)).sum() + (kr * gk.to(torch::kFloat32)).sum() +
       (vr * gv.to(torch::kFloat32)).sum())
          .backward();

      const Tensor g = qkv.to(kGpu), cg = cos.to(kGpu), sg = sin.to(kGpu), pg = pos.to(kGpu);
      Tensor q = Poisoned({B, H, T, D}, dtype), kk = Poisoned({B, Hk, T, D}, dtype),
             v = Poisoned({B, Hk, T, D}, dtype);
      const char* base = static_cast<const char*>(g.data_ptr());
      const int64_t es = g.element_size();
      ASSERT_EQ(k::LaunchQkvRopeForward(base, W, base + H * D * es, W, base + (H + Hk) * D * es, W,
                                        cg.data_ptr<float>(), sg.data_ptr<float>(), pg.data_ptr<int64_t>(),
                                        q.data_ptr(), kk.data_ptr(), v.data_ptr(), Dt(dtype), B, T, H, Hk, D,
                                        Stream()),
                0);
      EXPECT_LE(Diff(q, qr), Tol(dtype));
      EXPECT_LE(Diff(kk, kr), Tol(dtype));
      EXPECT_EQ(Diff(v, vr), 0.0);
      const Tensor gqg = gq.to(kGpu), gkg = gk.to(kGpu), gvg = gv.to(kGpu);
      Tensor dsrc = Poisoned({B, T, W}, dtype);
      char* dbase = static_cast<char*>(dsrc.data_ptr());
      ASSERT_EQ(
          k::LaunchQkvRopeBackward(gqg.data_ptr(), gkg.data_ptr(), gvg.data_ptr(), cg.data_ptr<float>(),
                                   sg.data_ptr<float>(), pg.data_ptr<int64_t>(), dbase, W, dbase + H * D * es,
                                   W, dbase + (H + Hk) * D * es, W, Dt(dtype), B, T, H, Hk, D, Stream()),
          0);
      EXPECT_LE(Diff(dsrc, src.grad()), Tol(dtype));
    }
  }
}

TEST(CudaKernels, SwiGluForwardAndBackward) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t N = 37, I = 4865;
    torch::manual_seed(I);
    const Tensor g = (torch::randn({N, I}) * 3).to(dtype), u = torch::randn({N, I}).to(dtype);
    const Tensor dy = torch::randn({N, I}).to(dtype);
    Tensor gr = g.to(torch::kFloat32).requires_grad_(true), ur = u.to(torch::kFloat32).requires_grad_(true);
    const Tensor yr = torch::silu(gr) * ur;
    (yr * dy.to(torch::kFloat32)).sum().backward();
    const Tensor gg = g.to(kGpu), ug = u.to(kGpu), dyg = dy.to(kGpu);
    Tensor y = Poisoned({N, I}, dtype), dg = Poisoned({N, I}, dtype), du = Poisoned({N, I}, dtype);
    ASSERT_EQ(
        k::LaunchSwiGluForward(gg.data_ptr(), I, ug.data_ptr(), I, y.data_ptr(), Dt(dtype), N, I, Stream()),
        0);
    ASSERT_EQ(k::LaunchSwiGluBackward(gg.data_ptr(), I, ug.data_ptr(), I, dyg.data_ptr(), dg.data_ptr(), I,
                                      du.data_ptr(), I, Dt(dtype), N, I, Stream()),
              0);
    EXPECT_LE(Diff(y, yr), Tol(dtype));
    EXPECT_LE(Diff(dg, gr.grad()), 2 * Tol(dtype));
    EXPECT_LE(Diff(du, ur.grad()), 2 * Tol(dtype));
    // Stacked (one gate/up projection's output [N, 2I], and its gradient in one [N, 2I]): rows at
    // stride 2I, each half written whole.
    const Tensor gug = torch::cat({g, u}, -1).to(kGpu);
    const char* gu_base = static_cast<const char*>(gug.data_ptr());
    Tensor y2 = Poisoned({N, I}, dtype), dgu = Poisoned({N, 2 * I}, dtype);
    char* dgu_base = static_cast<char*>(dgu.data_ptr());
    const int64_t half = I * gug.element_size();
    ASSERT_EQ(k::LaunchSwiGluForward(gu_base, 2 * I, gu_base + half, 2 * I, y2.data_ptr(), Dt(dtype), N, I,
                                     Stream()),
              0);
    ASSERT_EQ(k::LaunchSwiGluBackward(gu_base, 2 * I, gu_base + half, 2 * I, dyg.data_ptr(), dgu_base, 2 * I,
                                      dgu_base + half, 2 * I, Dt(dtype), N, I, Stream()),
              0);
    EXPECT_LE(Diff(y2, yr), Tol(dtype));
    EXPECT_LE(Diff(dgu, torch::cat({gr.grad(), ur.grad()}, -1)), 2 * Tol(dtype));
  }
}

TEST(CudaKernels, CrossEntropyAndItsGradientOverQwensVocabulary) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t N = 5, V = 151936;
    torch::manual_seed(7);
    const Tensor logits = (torch::randn({N, V}) * 8).to(dtype), t = torch::randint(0, V, {N}, torch::kInt64);
    const Tensor lf = logits.to(torch::kFloat32);
    const Tensor lg = logits.to(kGpu), tg = t.to(kGpu);
    Tensor lse = Poisoned({N}, torch::kFloat32), picked = Poisoned({N}, torch::kFloat32);
    ASSERT_EQ(k::LaunchCrossEntropyForward(lg.data_ptr(), Dt(dtype), tg.data_ptr<int64_t>(),
                                           lse.data_ptr<float>(), picked.data_ptr<float>(), N, V, Stream()),
              0);
    EXPECT_LE(Diff(lse, lf.logsumexp(1)), 1e-5);
    EXPECT_EQ(Diff(picked, lf.gather(1, t.unsqueeze(1)).squeeze(1)), 0.0);
    const Tensor scale = torch::full({1}, 0.5f, torch::TensorOptions().device(kGpu));
    ASSERT_EQ(
        k::LaunchCrossEntropyGradInPlace(lg.data_ptr(), Dt(dtype), tg.data_ptr<int64_t>(),
                                         lse.data_ptr<float>(), scale.data_ptr<float>(), N, V, Stream()),
        0);
    const Tensor ref = (torch::softmax(lf, 1) - torch::one_hot(t, V).to(torch::kFloat32)) * 0.5;
    EXPECT_LE(Diff(lg, ref), dtype == torch::kBFloat16 ? 2e-3 : 1e-6);
  }
}

TEST(CudaKernels, GemmAccumulatesIntoFp32InPlace) {
  REQUIRE_GPU();
  const int64_t K = 33, M = 1001, N = 96;
  torch::manual_seed(3);
  const Tensor a = torch::randn({K, M}).to(torch::kBFloat16), b = torch::randn({K, N}).to(torch::kBFloat16);
  const Tensor start = torch::randn({M, N});
  Tensor out = start.to(kGpu);
  const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
  const std::string err = k::GemmTransposedAccumulateF32(ag.data_ptr(), bg.data_ptr(), out.data_ptr<float>(),
                                                         k::DType::kBFloat16, M, N, K, 0, Stream());
  ASSERT_EQ(err, "");
  const Tensor ref = start + torch::matmul(a.to(torch::kFloat32).t(), b.to(torch::kFloat32));
  EXPECT_LE(Diff(out, ref), 1e-4);
}

// One small config.json per family the model knows, each with what sets its path apart: Qwen2's
// q/k/v biases, q/k-norm, a sliding window shorter than the batch's 29 positions, Gemma 2's soft-caps
// (the explicit attention: SDPA cannot soft-cap) and (1 + w) norms, Gemma 3's local RoPE base,
// Phi-3's fused projections with longrope past original_max_position_embeddings, and partial rotary
// (the composite RoPE with the other kernels).
std::vector<std::pair<std::string, nlohmann::json>> FamilyConfigs() {
  const nlohmann::json base = {{"vocab_size", 300},        {"hidden_size", 128},
                               {"intermediate_size", 200}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                               {"head_dim", 32},           {"max_position_embeddings", 64},
                               {"rms_norm_eps", 1e-6}};
  auto with = [&](nlohmann::json extra) {
    nlohmann::json j = base;
    j.update(extra);
    return j;
  };
  auto longrope = [](size_t pairs) {  // pairs: rotary_dim / 2
    return nlohmann::json{{"type", "longrope"},
                          {"short_factor", std::vector<double>(pairs, 1.5)},
                          {"long_factor", std::vector<double>(pairs, 4.0)}};
  };
  return {
      {"llama", with({{"model_type", "llama"}})},
      {"qwen2", with({{"model_type", "qwen2"}})},
      {"qwen3", with({{"model_type", "qwen3"}})},
      {"mistral", with({{"model_type", "mistral"}, {"sliding_window", 5}})},
      {"gemma2", with({{"model_type", "gemma2"},
                       {"sliding_window", 6},
                       {"query_pre_attn_scalar", 24},
                       {"attn_logit_softcapping", 0.8},  // small enough to cap these small logits
                       {"final_logit_softcapping", 0.8}})},
      {"gemma3_text", with({{"model_type", "gemma3_text"},
                            {"num_hidden_layers", 3},
                            {"sliding_window", 6},
                            {"sliding_window_pattern", 2},
                            {"query_pre_attn_scalar", 24}})},
      {"phi3", with({{"model_type", "phi3"},
                     {"original_max_position_embeddings", 16},
                     {"rope_scaling", longrope(16)},
                     {"sliding_window", 20}})},
      {"phi3 partial rotary", with({{"model_type", "phi3"},
                                    {"partial_rotary_factor", 0.75},
                                    {"original_max_position_embeddings", 16},
                                    {"rope_scaling", longrope(12)}})},
  };
}

// The model on the GPU with the kernels against the composite path, every family.
TEST(CudaKernels, ModelLossAndGradientsMatchTheCompositePath) {
  REQUIRE_GPU();
  for (const auto& [name, json] : FamilyConfigs()) {
    SCOPED_TRACE(name);
    auto parsed = ParseModelConfig(json, name + "/config.json");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    const ModelConfig& c = *parsed;
    torch::manual_seed(11);
    CausalLM model(c);
    model->ToDevice(kGpu);
    model->SetLossChunkTokens(17);  // several chunks, the last one short
    const Tensor ids = torch::randint(0, c.vocab_size, {3, 29}, torch::kInt64).to(kGpu);
    Tensor labels = ids.clone();
    labels.slice(1, 0, 4).fill_(-100);
    auto run = [&](bool fused_on) {
      fused::SetEnabled(fused_on);
      EXPECT_EQ(cuda_ops::Supported(ids.to(torch::kFloat32)), fused_on);
      model->zero_grad();
      Tensor loss = model->LossSum(ids, labels);
      loss.backward();
      std::vector<Tensor> out = {loss.detach().cpu()};
      for (const auto& p : model->parameters()) out.push_back(p.grad().cpu());
      fused::SetEnabled(true);
      return out;
    };
    const auto fused = run(true), ref = run(false);
    ASSERT_EQ(fused.size(), ref.size());
    EXPECT_GT(ref[0].item<double>(), 0);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_LE(Diff(fused[i], ref[i]), 1e-4) << "tensor " << i;
  }
}

}  // namespace
}  // namespace sftctl::trainer
