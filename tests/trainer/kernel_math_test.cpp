// The fused CUDA kernels' bodies (trainer/model/kernels/kernel_math.h) driven on the CPU: every
// element index a grid would visit, and for the row kernels every thread of a block (thread tid of
// nt, the partials combined in thread order where the GPU's BlockReduce combines them), checked
// against the composite ATen formulation. Outputs are poisoned (NaN) beforehand, so an element no
// index writes fails. tests/trainer/cuda_kernels_test.cpp checks the kernels themselves on a GPU.
#include "trainer/model/kernels/kernel_math.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "trainer/model/kernels/cuda_kernels.h"

namespace sftctl::trainer::kernels {
namespace {

using torch::Tensor;

template <typename T>
constexpr torch::ScalarType kType = std::is_same_v<T, Bf16> ? torch::kBFloat16 : torch::kFloat32;

template <typename T>
T* Ptr(const Tensor& t) {
  if constexpr (std::is_same_v<T, Bf16>) {
    static_assert(sizeof(Bf16) == sizeof(c10::BFloat16));
    return reinterpret_cast<Bf16*>(t.data_ptr<c10::BFloat16>());
  } else {
    return t.data_ptr<float>();
  }
}

Tensor Poisoned(at::IntArrayRef sizes, torch::ScalarType type) {
  return torch::full(sizes, std::numeric_limits<float>::quiet_NaN(), torch::TensorOptions().dtype(type));
}

// Largest |a - b| relative to max(1, |b|), as float; NaN anywhere gives +inf.
double MaxRelDiff(const Tensor& a, const Tensor& b) {
  const Tensor af = a.to(torch::kFloat32), bf = b.to(torch::kFloat32);
  if (af.isnan().any().item<bool>() || bf.isnan().any().item<bool>()) return INFINITY;
  return ((af - bf).abs() / bf.abs().clamp_min(1.0)).max().item<double>();
}

// Tolerance of one value rounded to T (plus fp32 reordering slack).
template <typename T>
double Tol() {
  return std::is_same_v<T, Bf16> ? 1.6e-2 : 2e-5;
}

TEST(KernelMath, Bf16StoreRoundsToNearestEvenAsLibTorch) {
  torch::manual_seed(1);
  Tensor x = torch::cat({torch::randn({4096}) * 1000, torch::tensor({0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f,
                                                                     3.0e38f, 1.00390625f, 1.01171875f})});
  const Tensor ref = x.to(torch::kBFloat16);
  const float* xp = x.data_ptr<float>();
  const c10::BFloat16* rp = ref.data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(Store<Bf16>(xp[i]).bits, rp[i].x) << "at " << xp[i];
  EXPECT_TRUE(std::isnan(Load(Store<Bf16>(std::nanf("")))));
}

// ---- RMSNorm --------------------------------------------------------------------------------

// The composite formulation: h = x (+ d), y = w * (h * rsqrt(mean(h^2) + eps)).to(h.dtype).
std::tuple<Tensor, Tensor> ReferenceNorm(const Tensor& x, const Tensor& d, const Tensor& w, double eps,
                                         torch::ScalarType out) {
  const Tensor h = d.defined() ? x + d.to(torch::kFloat32) : x;
  const Tensor hf = h.to(torch::kFloat32);
  const Tensor n = hf * torch::rsqrt(hf.pow(2).mean(-1, true) + eps);
  return {h, (w * n.to(h.scalar_type())).to(out)};
}

template <typename H, typename D, typename Out>
void CheckNorm(int64_t N, int64_t C, bool add, int nt) {
  SCOPED_TRACE(testing::Message() << "N " << N << " C " << C << " add " << add << " nt " << nt << " H "
                                  << kType<H> << " D " << kType<D> << " Out " << kType<Out>);
  torch::manual_seed(N * 131 + C);
  const Tensor x = torch::randn({N, C}).to(kType<H>), w = torch::rand({C}) + 0.5;
  const Tensor d = add ? torch::randn({N, C}).to(kType<D>) : Tensor();
  Tensor h_out = add ? Poisoned({N, C}, torch::kFloat32) : Tensor(), y = Poisoned({N, C}, kType<Out>);
  Tensor rstd = Poisoned({N}, torch::kFloat32);
  const AddRmsNormArgs<H, D, Out> a{Ptr<H>(x),
                                    add ? Ptr<D>(d) : nullptr,
                                    w.data_ptr<float>(),
                                    add ? h_out.data_ptr<float>() : nullptr,
                                    Ptr<Out>(y),
                                    rstd.data_ptr<float>(),
                                    C,
                                    1e-6f};
  for (int64_t r = 0; r < N; ++r) {
    float ss = 0.0f;
    for (int t = 0; t < nt; ++t) ss += AddRmsNormForwardPhase1(a, r, t, nt);
    for (int t = 0; t < nt; ++t) AddRmsNormForwardPhase2(a, r, ss, t, nt);
  }
  auto [h_ref, y_ref] = ReferenceNorm(x, d, w, 1e-6, kType<Out>);
  if (add) {
    EXPECT_EQ(MaxRelDiff(h_out, h_ref), 0.0);
  }
  EXPECT_LE(MaxRelDiff(y, y_ref), Tol<Out>() + Tol<H>());

  // Backward against autograd through the composite formulation.
  const Tensor dy = torch::randn({N, C}).to(kType<Out>), dh_in = add ? torch::randn({N, C}) : Tensor();
  Tensor xg = x.detach().clone().requires_grad_(true), wg = w.detach().clone().requires_grad_(true);
  Tensor dg = add ? d.detach().clone().requires_grad_(true) : Tensor();
  auto [hr, yr] = ReferenceNorm(xg, dg, wg, 1e-6, kType<Out>);
  Tensor loss = (yr.to(torch::kFloat32) * dy.to(torch::kFloat32)).sum();
  if (add) loss = loss + (hr * dh_in).sum();
  loss.backward();
  const Tensor h = add ? h_out : x;
  Tensor dx = Poisoned({N, C}, kType<H>), dd = add ? Poisoned({N, C}, kType<D>) : Tensor();
  const RmsNormBackwardArgs<H, Out, D> b{Ptr<H>(h),
                                         w.data_ptr<float>(),
                                         Ptr<Out>(dy),
                                         add ? dh_in.data_ptr<float>() : nullptr,
                                         rstd.data_ptr<float>(),
                                         Ptr<H>(dx),
                                         add ? Ptr<D>(dd) : nullptr,
                                         C};
  for (int64_t r = 0; r < N; ++r) {
    float dot = 0.0f;
    for (int t = 0; t < nt; ++t) dot += RmsNormBackwardPhase1(b, r, t, nt);
    for (int t = 0; t < nt; ++t) RmsNormBackwardPhase2(b, r, dot, t, nt);
  }
  EXPECT_LE(MaxRelDiff(dx, xg.grad()), 4 * Tol<H>() + 1e-4);
  if (add) {
    EXPECT_LE(MaxRelDiff(dd, dg.grad()), 4 * Tol<D>() + 1e-4);
  }
  // The weight's gradient through the groups, as the two kernels run it.
  const int64_t groups = std::min<int64_t>(N, kWeightGradGroups), per = (N + groups - 1) / groups;
  Tensor partial = Poisoned({groups * C}, torch::kFloat32), dw = Poisoned({C}, torch::kFloat32);
  for (int64_t i = 0; i < groups * C; ++i)
    WeightGradPartialElement(Ptr<H>(h), Ptr<Out>(dy), rstd.data_ptr<float>(), partial.data_ptr<float>(), N, C,
                             per, i);
  for (int64_t c = 0; c < C; ++c)
    WeightGradSumElement(partial.data_ptr<float>(), dw.data_ptr<float>(), groups, C, c);
  EXPECT_LE(MaxRelDiff(dw, wg.grad()), 1e-3);
}

// The flat-index split of the per-element kernels: 32-bit arithmetic below 2^32, 64-bit above, the
// same quotient and remainder as int64_t division either way (the 2^32 edge, Qwen's vocabulary as
// the divisor with row counts on both sides of the edge, a divisor above 2^32).
TEST(KernelMath, DivModIsInt64DivisionOnBothSidesOf32Bits) {
  const int64_t edge = int64_t{1} << 32;
  const std::vector<int64_t> ns = {0,
                                   1,
                                   7,
                                   151935,
                                   151936,
                                   edge - 1,
                                   edge,
                                   edge + 1,
                                   edge + 5,
                                   28245 * int64_t{151936} + 17,
                                   32768 * int64_t{151936} - 1,
                                   (int64_t{1} << 62) + 12345};
  const std::vector<int64_t> ds = {1, 2, 3, 64, 4864, 151936, edge - 1, edge, edge + 3};
  for (int64_t n : ns) {
    for (int64_t d : ds) {
      const QuotRem qr = DivMod(n, d);
      EXPECT_EQ(qr.q, n / d) << n << " / " << d;
      EXPECT_EQ(qr.r, n % d) << n << " % " << d;
    }
  }
}

TEST(KernelMath, RmsNormMatchesTheCompositeFormulation) {
  for (int nt : {1, 32, 256}) {
    for (int64_t C : {1, 7, 333, 896}) {
      CheckNorm<float, float, float>(5, C, false, nt);
      CheckNorm<float, float, Bf16>(5, C, false, nt);
      CheckNorm<Bf16, Bf16, Bf16>(5, C, false, nt);  // Qwen3's q/k norm on bf16 heads
    }
  }
}

TEST(KernelMath, AddRmsNormMatchesTheCompositeFormulation) {
  for (int nt : {1, 256}) {
    for (int64_t C : {7, 333, 896}) {
      CheckNorm<float, Bf16, Bf16>(5, C, true, nt);
      CheckNorm<float, float, float>(5, C, true, nt);
    }
  }
  CheckNorm<float, Bf16, Bf16>(kWeightGradGroups * 2 + 3, 64, true, 32);  // rows in more groups than one
}

// ---- RoPE -----------------------------------------------------------------------------------

Tensor RotateHalf(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// q [B, T, H*D] -> [B, H, T, D] with RoPE at `pos` ([B, T]) in fp32.
Tensor ReferenceRope(const Tensor& q, const Tensor& cos, const Tensor& sin, const Tensor& pos, int64_t H,
                     int64_t D) {
  const int64_t B = q.size(0), T = q.size(1);
  const Tensor x = q.to(torch::kFloat32).view({B, T, H, D}).transpose(1, 2);
  const Tensor c = cos.index({pos}).unsqueeze(1), s = sin.index({pos}).unsqueeze(1);
  return x * c + RotateHalf(x) * s;
}

template <typename T>
void CheckRope(int64_t D, bool with_positions) {
  SCOPED_TRACE(testing::Message() << "D " << D << " positions " << with_positions << " " << kType<T>);
  const int64_t B = 2, Tn = 7, H = 4, Hk = 2, P = 32;
  torch::manual_seed(D);
  const Tensor inv = 1.0 / torch::pow(10000.0, torch::arange(0, D, 2, torch::kFloat32) / D);
  const Tensor freqs = torch::outer(torch::arange(P, torch::kFloat32), inv);
  const Tensor cos = torch::cat({freqs, freqs}, -1).cos(), sin = torch::cat({freqs, freqs}, -1).sin();
  const Tensor pos = with_positions ? torch::randint(0, P, {B, Tn}, torch::kInt64)
                                    : torch::arange(Tn, torch::kInt64).expand({B, Tn}).contiguous();
  // One fused projection, so q, k and v are column slices at one row stride.
  const Tensor qkv = torch::randn({B, Tn, (H + 2 * Hk) * D}).to(kType<T>);
  const int64_t W = (H + 2 * Hk) * D;
  Tensor q = Poisoned({B, H, Tn, D}, kType<T>), k = Poisoned({B, Hk, Tn, D}, kType<T>);
  Tensor v = Poisoned({B, Hk, Tn, D}, kType<T>);
  T* base = Ptr<T>(qkv);
  const QkvRopeArgs<T> a{base,
                         base + H * D,
                         base + (H + Hk) * D,
                         W,
                         W,
                         W,
                         cos.data_ptr<float>(),
                         sin.data_ptr<float>(),
                         with_positions ? pos.data_ptr<int64_t>() : nullptr,
                         Ptr<T>(q),
                         Ptr<T>(k),
                         Ptr<T>(v),
                         Tn,
                         H,
                         Hk,
                         D};
  const int64_t total = QkvRopeElements(a, B);
  for (int64_t i = 0; i < total; ++i) QkvRopeElement(a, /*backward=*/false, i);
  const auto parts = qkv.split({H * D, Hk * D, Hk * D}, -1);
  EXPECT_LE(MaxRelDiff(q, ReferenceRope(parts[0], cos, sin, pos, H, D)), Tol<T>());
  EXPECT_LE(MaxRelDiff(k, ReferenceRope(parts[1], cos, sin, pos, Hk, D)), Tol<T>());
  EXPECT_EQ(MaxRelDiff(v, parts[2].view({B, Tn, Hk, D}).transpose(1, 2)), 0.0);

  // Backward: the transpose, against autograd through the reference.
  Tensor src = qkv.to(torch::kFloat32).detach().requires_grad_(true);
  const auto sp = src.split({H * D, Hk * D, Hk * D}, -1);
  const Tensor gq = torch::randn({B, H, Tn, D}).to(kType<T>), gk = torch::randn({B, Hk, Tn, D}).to(kType<T>);
  const Tensor gv = torch::randn({B, Hk, Tn, D}).to(kType<T>);
  ((ReferenceRope(sp[0], cos, sin, pos, H, D) * gq.to(torch::kFloat32)).sum() +
   (ReferenceRope(sp[1], cos, sin, pos, Hk, D) * gk.to(torch::kFloat32)).sum() +
   (sp[2].view({B, Tn, Hk, D}).transpose(1, 2) * gv.to(torch::kFloat32)).sum())
      .backward();
  Tensor dsrc = Poisoned({B, Tn, W}, kType<T>);
  T* dbase = Ptr<T>(dsrc);
  const QkvRopeArgs<T> b{dbase,
                         dbase + H * D,
                         dbase + (H + Hk) * D,
                         W,
                         W,
                         W,
                         cos.data_ptr<float>(),
                         sin.data_ptr<float>(),
                         with_positions ? pos.data_ptr<int64_t>() : nullptr,
                         Ptr<T>(gq),
                         Ptr<T>(gk),
                         Ptr<T>(gv),
                         Tn,
                         H,
                         Hk,
                         D};
  for (int64_t i = 0; i < total; ++i) QkvRopeElement(b, /*backward=*/true, i);
  EXPECT_LE(MaxRelDiff(dsrc, src.grad()), Tol<T>());
}

TEST(KernelMath, QkvRopeMatchesTheCompositeFormulation) {
  for (int64_t D : {64, 128}) {
    for (bool positions : {false, true}) {
      CheckRope<float>(D, positions);
      CheckRope<Bf16>(D, positions);
    }
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

template <typename T>
void CheckSwiGlu(int64_t N, int64_t I) {
  SCOPED_TRACE(testing::Message() << "N " << N << " I " << I << " " << kType<T>);
  torch::manual_seed(I);
  const Tensor gu = (torch::randn({N, 2 * I}) * 3).to(kType<T>);  // fused gate/up: strides 2I
  const Tensor dy = torch::randn({N, I}).to(kType<T>);
  Tensor y = Poisoned({N, I}, kType<T>), dgu = Poisoned({N, 2 * I}, kType<T>);
  T* base = Ptr<T>(gu);
  T* dbase = Ptr<T>(dgu);
  const SwiGluArgs<T> a{base,  2 * I, base + I,  2 * I, Ptr<T>(dy), Ptr<T>(y),
                        dbase, 2 * I, dbase + I, 2 * I, I};
  for (int64_t i = 0; i < N * I; ++i) SwiGluForwardElement(a, i);
  for (int64_t i = 0; i < N * I; ++i) SwiGluBackwardElement(a, i);
  Tensor ref_in = gu.to(torch::kFloat32).detach().requires_grad_(true);
  const Tensor ref = torch::silu(ref_in.slice(1, 0, I)) * ref_in.slice(1, I);
  (ref * dy.to(torch::kFloat32)).sum().backward();
  EXPECT_LE(MaxRelDiff(y, ref), Tol<T>());
  EXPECT_LE(MaxRelDiff(dgu, ref_in.grad()), 2 * Tol<T>());
}

TEST(KernelMath, SwiGluMatchesTheCompositeFormulation) {
  for (int64_t I : {1, 13, 4864}) {
    CheckSwiGlu<float>(3, I);
    CheckSwiGlu<Bf16>(3, I);
  }
}

// ---- Cross-entropy --------------------------------------------------------------------------

template <typename T>
void CheckCrossEntropy(int64_t N, int64_t V, int nt) {
  SCOPED_TRACE(testing::Message() << "N " << N << " V " << V << " nt " << nt << " " << kType<T>);
  torch::manual_seed(V);
  Tensor logits = (torch::randn({N, V}) * 8).to(kType<T>);
  const Tensor targets = torch::randint(0, V, {N}, torch::kInt64);
  Tensor lse = Poisoned({N}, torch::kFloat32), picked = Poisoned({N}, torch::kFloat32);
  for (int64_t r = 0; r < N; ++r) {
    MaxSum total{kNegInf, 0.0f};
    for (int t = 0; t < nt; ++t)
      total = MaxSumCombine(total, CrossEntropyPartial(Ptr<T>(logits) + r * V, V, t, nt));
    CrossEntropyRowFinish(Ptr<T>(logits), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                          picked.data_ptr<float>(), V, r, total);
  }
  const Tensor lf = logits.to(torch::kFloat32);
  EXPECT_LE(MaxRelDiff(lse, lf.logsumexp(1)), 1e-5);
  EXPECT_EQ(MaxRelDiff(picked, lf.gather(1, targets.unsqueeze(1)).squeeze(1)), 0.0);
  const Tensor scale = torch::tensor({0.25f});
  const Tensor ref = (torch::softmax(lf, 1) - torch::one_hot(targets, V).to(torch::kFloat32)) * 0.25;
  for (int64_t i = 0; i < N * V; ++i)
    CrossEntropyGradElement(Ptr<T>(logits), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                            scale.data_ptr<float>(), V, i);
  const double tol = std::is_same_v<T, Bf16> ? 2e-3 : 1e-6;
  EXPECT_LE((logits.to(torch::kFloat32) - ref).abs().max().item<double>(), tol);
}

TEST(KernelMath, CrossEntropyMatchesLogSumExpAndSoftmax) {
  CheckCrossEntropy<float>(3, 1000, 256);
  CheckCrossEntropy<Bf16>(3, 1000, 1);
  CheckCrossEntropy<Bf16>(2, 151936, 256);  // Qwen's vocabulary
  CheckCrossEntropy<float>(1, 151936, 32);
}

TEST(KernelMath, CrossEntropyTargetOutsideTheRowIsNaNNotARead) {
  Tensor logits = torch::randn({1, 10});
  const Tensor targets = torch::tensor({int64_t{10}});
  Tensor lse = torch::zeros({1}), picked = torch::zeros({1});
  const MaxSum total = CrossEntropyPartial(logits.data_ptr<float>(), 10, 0, 1);
  CrossEntropyRowFinish(logits.data_ptr<float>(), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                        picked.data_ptr<float>(), 10, 0, total);
  EXPECT_TRUE(std::isnan(picked.item<float>()));
  EXPECT_FLOAT_EQ(lse.item<float>(), logits.logsumexp(1).item<float>());
}

}  // namespace
}  // namespace sftctl::trainer::kernels
