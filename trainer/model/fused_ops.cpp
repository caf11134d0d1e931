#include "trainer/model/fused_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/formats/safetensors.h"
#include "trainer/runtime/parallel.h"

namespace sftctl::trainer::fused {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Conversions the compiler can vectorize: common/formats/safetensors.h's, the project's one bf16 rounding
// (nearest even; a NaN stays a quiet NaN of its sign).
inline float F(float v) { return v; }
inline float F(c10::BFloat16 v) { return safetensors::BF16ToFloat(v.x); }
template <typename T>
inline T To(float v);
template <>
inline float To<float>(float v) {
  return v;
}
template <>
inline c10::BFloat16 To<c10::BFloat16>(float v) {
  return c10::BFloat16(safetensors::FloatToBF16(v), c10::BFloat16::from_bits());
}

// exp(x) to about 2 ulp (Cephes expf's polynomial), without branches or libm, so loops
// using it vectorize and give the same bits on every machine.
inline float FastExp(float x) {
  x = std::min(88.3762626647949f, std::max(-88.3762626647949f, x));
  const float fx = x * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(fx);
  n -= (static_cast<float>(n) > fx) ? 1 : 0;  // floor
  const float nf = static_cast<float>(n);
  x = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  const float z = x * x;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  const int32_t e = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return y * scale;
}

// Calls f(T{}) with T the C++ type of `t` (float or c10::BFloat16).
template <typename Fn>
void Dispatch(torch::ScalarType t, Fn&& f) {
  if (t == torch::kFloat32) {
    f(float{});
  } else if (t == torch::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    TORCH_CHECK(false, "fused kernels take float or bfloat16, got ", t);
  }
}

// Hot loops get an AVX2 clone chosen at load time (GCC function multiversioning), so they
// vectorize 8-wide where the CPU allows and still run on any x86-64. Other targets: plain.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SFT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SFT_CLONES
#endif

template <typename X>
SFT_CLONES void SwiGluForwardRows(const X* src, X* dst, int64_t r0, int64_t r1, int64_t I) {
  for (int64_t r = r0; r < r1; ++r) {
    const X* g = src + r * 2 * I;
    const X* u = g + I;
    X* o = dst + r * I;
    for (int64_t j = 0; j < I; ++j) {
      const float gv = F(g[j]);
      o[j] = To<X>(gv / (1.0f + FastExp(-gv)) * F(u[j]));
    }
  }
}

// Each row is staged through float scratch (`tmp`, 5*I floats): separate simple loops for the
// bf16 loads, the math and the bf16 stores vectorize far better than one loop doing all three.
template <typename X>
SFT_CLONES void SwiGluBackwardRows(const X* src, const X* gy, X* out, int64_t r0, int64_t r1, int64_t I,
                                   float* tmp) {
  float *g = tmp, *u = tmp + I, *d = tmp + 2 * I, *og = tmp + 3 * I, *ou = tmp + 4 * I;
  for (int64_t r = r0; r < r1; ++r) {
    const X* row = src + r * 2 * I;
    const X* dy = gy + r * I;
    for (int64_t j = 0; j < I; ++j) g[j] = F(row[j]);
    for (int64_t j = 0; j < I; ++j) u[j] = F(row[I + j]);
    for (int64_t j = 0; j < I; ++j) d[j] = F(dy[j]);
    for (int64_t j = 0; j < I; ++j) {
      const float gv = g[j], sg = 1.0f / (1.0f + FastExp(-gv));
      og[j] = d[j] * u[j] * sg * (1.0f + gv * (1.0f - sg));
      ou[j] = d[j] * gv * sg;
    }
    X* o = out + r * 2 * I;
    for (int64_t j = 0; j < I; ++j) o[j] = To<X>(og[j]);
    for (int64_t j = 0; j < I; ++j) o[I + j] = To<X>(ou[j]);
  }
}

template <typename X, typename Y>
SFT_CLONES void RmsNormForwardRows(const X* xp, const float* wp, Y* yp, float* ip, int64_t r0, int64_t r1,
                                   int64_t C, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const X* xr = xp + r * C;
    float ss = 0;
    for (int64_t j = 0; j < C; ++j) ss += F(xr[j]) * F(xr[j]);
    const float ir = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    ip[r] = ir;
    Y* yr = yp + r * C;
    for (int64_t j = 0; j < C; ++j) yr[j] = To<Y>(wp[j] * F(To<X>(F(xr[j]) * ir)));
  }
}

// Rows per parallel task for a row length of `cols` (about 16k elements per task).
int64_t Grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// ---------------------------------------------------------------------------------------------
// RMSNorm

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& weight, double eps,
                        int64_t out_dtype) {
    const Tensor x = x_in.contiguous();
    const Tensor w = weight.contiguous();
    const int64_t C = x.size(-1), N = x.numel() / C;
    Tensor y = torch::empty(x.sizes(), x.options().dtype(static_cast<torch::ScalarType>(out_dtype)));
    Tensor inv = torch::empty({N}, x.options().dtype(torch::kFloat32));
    const float* wp = w.data_ptr<float>();
    float* ip = inv.data_ptr<float>();
    Dispatch(x.scalar_type(), [&](auto xt) {
      using X = decltype(xt);
      Dispatch(y.scalar_type(), [&](auto yt) {
        using Y = decltype(yt);
        const X* xp = x.data_ptr<X>();
        Y* yp = y.data_ptr<Y>();
        parallel::For(0, N, Grain(C), [&](int64_t b, int64_t e) {
          RmsNormForwardRows<X, Y>(xp, wp, yp, ip, b, e, C, static_cast<float>(eps));
        });
      });
    });
    ctx->save_for_backward({x, w, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &inv = saved[2];
    const int64_t C = x.size(-1), N = x.numel() / C;
    Tensor g = grads[0].contiguous();
    if (g.scalar_type() != torch::kFloat32 && g.scalar_type() != torch::kBFloat16) g = g.to(torch::kFloat32);
    Tensor gx = torch::empty_like(x);
    // Weight gradient: fixed chunks of rows, summed in order (deterministic for any thread count).
    const int64_t K = std::min<int64_t>(N, 32), rows_per = (N + K - 1) / K;
    std::vector<float> partial(static_cast<size_t>(K * C), 0.0f);
    const float* wp = w.data_ptr<float>();
    const float* ip = inv.data_ptr<float>();
    Dispatch(x.scalar_type(), [&](auto xt) {
      using X = decltype(xt);
      Dispatch(g.scalar_type(), [&](auto gt) {
        using G = decltype(gt);
        const X* xp = x.data_ptr<X>();
        const G* gp = g.data_ptr<G>();
        X* gxp = gx.data_ptr<X>();
        parallel::For(0, K, 1, [&](int64_t kb, int64_t ke) {
          for (int64_t k = kb; k < ke; ++k) {
            float* pw = partial.data() + k * C;
            for (int64_t r = k * rows_per; r < std::min(N, (k + 1) * rows_per); ++r) {
              const X* xr = xp + r * C;
              const G* gr = gp + r * C;
              const float ir = ip[r];
              float dot = 0;
              for (int64_t j = 0; j < C; ++j) {
                const float xn = F(xr[j]) * ir;
                dot += F(gr[j]) * wp[j] * xn;
                pw[j] += F(gr[j]) * F(To<X>(xn));
              }
              const float mean = dot / static_cast<float>(C);
              X* gxr = gxp + r * C;
              for (int64_t j = 0; j < C; ++j) gxr[j] = To<X>(ir * (F(gr[j]) * wp[j] - F(xr[j]) * ir * mean));
            }
          }
        });
      });
    });
    Tensor gw = torch::zeros({C}, w.options());
    float* gwp = gw.data_ptr<float>();
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < C; ++j) gwp[j] += partial[k * C + j];
    }
    return {gx, gw, Tensor(), Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// QKV split + rotate-half RoPE

struct QkvRopeFn : public torch::autograd::Function<QkvRopeFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& qkv_in, const Tensor& cos,
                               const Tensor& sin, const Tensor& positions, int64_t H, int64_t Hk, int64_t D) {
    const Tensor qkv = qkv_in.contiguous();
    const int64_t B = qkv.size(0), T = qkv.size(1), W = (H + 2 * Hk) * D, half = D / 2;
    TORCH_CHECK(qkv.size(2) == W, "QkvRope: last dim ", qkv.size(2), " != (H + 2*Hkv) * D = ", W);
    Tensor q = torch::empty({B, H, T, D}, qkv.options());
    Tensor k = torch::empty({B, Hk, T, D}, qkv.options());
    Tensor v = torch::empty({B, Hk, T, D}, qkv.options());
    // An empty `positions` means 0..T-1 (autograd functions cannot take undefined inputs).
    const Tensor pos = positions.numel() > 0 ? positions.contiguous() : Tensor();
    const int64_t* pp = pos.defined() ? pos.data_ptr<int64_t>() : nullptr;
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    Dispatch(qkv.scalar_type(), [&](auto xt) {
      using X = decltype(xt);
      const X* src = qkv.data_ptr<X>();
      X *qp = q.data_ptr<X>(), *kp = k.data_ptr<X>(), *vp = v.data_ptr<X>();
      parallel::For(0, B * T, Grain(W), [&](int64_t b0, int64_t e0) {
        for (int64_t bt = b0; bt < e0; ++bt) {
          const int64_t b = bt / T, t = bt % T;
          const int64_t p = pp ? pp[bt] : t;
          const float* c = cp + p * D;
          const float* s = sp + p * D;
          const X* row = src + bt * W;
          auto rope = [&](const X* in, X* out) {
            for (int64_t i = 0; i < half; ++i) {
              const float x1 = F(in[i]), x2 = F(in[i + half]);
              out[i] = To<X>(x1 * c[i] - x2 * s[i]);
              out[i + half] = To<X>(x2 * c[i + half] + x1 * s[i + half]);
            }
          };
          for (int64_t h = 0; h < H; ++h) rope(row + h * D, qp + ((b * H + h) * T + t) * D);
          for (int64_t h = 0; h < Hk; ++h) {
            rope(row + (H + h) * D, kp + ((b * Hk + h) * T + t) * D);
            std::copy(row + (H + Hk + h) * D, row + (H + Hk + h + 1) * D, vp + ((b * Hk + h) * T + t) * D);
          }
        }
      });
    });
    ctx->save_for_backward({cos, sin, pos.defined() ? pos : torch::empty({0}, torch::kInt64)});
    ctx->saved_data["dims"] = std::vector<int64_t>{B, T, H, Hk, D, pos.defined() ? 1 : 0};
    ctx->saved_data["dtype"] = static_cast<int64_t>(qkv.scalar_type());
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const int64_t B = dims[0], T = dims[1], H = dims[2], Hk = dims[3], D = dims[4], half = D / 2;
    const bool has_pos = dims[5] != 0;
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t W = (H + 2 * Hk) * D;
    auto grad_or_zero = [&](const Tensor& g, int64_t heads) {
      return g.defined() ? g.to(dtype).contiguous()
                         : torch::zeros({B, heads, T, D}, saved[0].options().dtype(dtype));
    };
    const Tensor gq = grad_or_zero(grads[0], H), gk = grad_or_zero(grads[1], Hk),
                 gv = grad_or_zero(grads[2], Hk);
    Tensor gqkv = torch::empty({B, T, W}, gq.options());
    const int64_t* pp = has_pos ? saved[2].data_ptr<int64_t>() : nullptr;
    const float* cp = saved[0].data_ptr<float>();
    const float* sp = saved[1].data_ptr<float>();
    Dispatch(dtype, [&](auto xt) {
      using X = decltype(xt);
      const X *gqp = gq.data_ptr<X>(), *gkp = gk.data_ptr<X>(), *gvp = gv.data_ptr<X>();
      X* dst = gqkv.data_ptr<X>();
      parallel::For(0, B * T, Grain(W), [&](int64_t b0, int64_t e0) {
        for (int64_t bt = b0; bt < e0; ++bt) {
          const int64_t b = bt / T, t = bt % T;
          const int64_t p = pp ? pp[bt] : t;
          const float* c = cp + p * D;
          const float* s = sp + p * D;
          X* row = dst + bt * W;
          auto unrope = [&](const X* g, X* out) {
            for (int64_t i = 0; i < half; ++i) {
              const float g1 = F(g[i]), g2 = F(g[i + half]);
              out[i] = To<X>(g1 * c[i] + g2 * s[i + half]);
              out[i + half] = To<X>(g2 * c[i + half] - g1 * s[i]);
            }
          };
          for (int64_t h = 0; h < H; ++h) unrope(gqp + ((b * H + h) * T + t) * D, row + h * D);
          for (int64_t h = 0; h < Hk; ++h) {
            unrope(gkp + ((b * Hk + h) * T + t) * D, row + (H + h) * D);
            const X* g = gvp + ((b * Hk + h) * T + t) * D;
            std::copy(g, g + D, row + (H + Hk + h) * D);
          }
        }
      });
    });
    return {gqkv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// Causal softmax

// The first key query row t sees: 0, or t - window + 1 under a sliding window (window > 0).
inline int64_t WindowStart(int64_t t, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
}

struct CausalSoftmaxFn : public torch::autograd::Function<CausalSoftmaxFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& scores_in, double scale, int64_t out_dtype,
                        int64_t window) {
    const Tensor scores = scores_in.contiguous();
    const int64_t Z = scores.size(0), R = scores.size(1), T = scores.size(2);
    Tensor probs =
        torch::empty(scores.sizes(), scores.options().dtype(static_cast<torch::ScalarType>(out_dtype)));
    const float sc = static_cast<float>(scale);
    Dispatch(scores.scalar_type(), [&](auto st) {
      using S = decltype(st);
      Dispatch(probs.scalar_type(), [&](auto pt) {
        using P = decltype(pt);
        const S* sp = scores.data_ptr<S>();
        P* pp = probs.data_ptr<P>();
        parallel::For(0, Z * R, Grain(T), [&](int64_t b, int64_t e) {
          std::vector<float> buf(static_cast<size_t>(T));
          for (int64_t zr = b; zr < e; ++zr) {
            const int64_t t = (zr % R) % T, lo = WindowStart(t, window);
            const S* in = sp + zr * T;
            P* out = pp + zr * T;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < lo; ++j) out[j] = To<P>(0.0f);
            for (int64_t j = lo; j <= t; ++j) {
              buf[j] = F(in[j]) * sc;
              mx = std::max(mx, buf[j]);
            }
            float sum = 0;
            for (int64_t j = lo; j <= t; ++j) {
              buf[j] = FastExp(buf[j] - mx);
              sum += buf[j];
            }
            const float inv = 1.0f / sum;
            for (int64_t j = lo; j <= t; ++j) out[j] = To<P>(buf[j] * inv);
            for (int64_t j = t + 1; j < T; ++j) out[j] = To<P>(0.0f);
          }
        });
      });
    });
    ctx->save_for_backward({probs});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dtype"] = static_cast<int64_t>(scores.scalar_type());
    ctx->saved_data["window"] = window;
    return probs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor probs = ctx->get_saved_variables()[0];
    const float sc = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t window = ctx->saved_data["window"].toInt();
    const Tensor g = grads[0].to(probs.scalar_type()).contiguous();
    const int64_t Z = probs.size(0), R = probs.size(1), T = probs.size(2);
    Tensor gs = torch::empty(probs.sizes(), probs.options().dtype(dtype));
    Dispatch(probs.scalar_type(), [&](auto pt) {
      using P = decltype(pt);
      Dispatch(dtype, [&](auto st) {
        using S = decltype(st);
        const P* pp = probs.data_ptr<P>();
        const P* gp = g.data_ptr<P>();
        S* out = gs.data_ptr<S>();
        parallel::For(0, Z * R, Grain(T), [&](int64_t b, int64_t e) {
          for (int64_t zr = b; zr < e; ++zr) {
            const int64_t t = (zr % R) % T, lo = WindowStart(t, window);
            const P* p = pp + zr * T;
            const P* gr = gp + zr * T;
            S* o = out + zr * T;
            float dot = 0;
            for (int64_t j = lo; j <= t; ++j) dot += F(gr[j]) * F(p[j]);
            for (int64_t j = 0; j < lo; ++j) o[j] = To<S>(0.0f);
            for (int64_t j = lo; j <= t; ++j) o[j] = To<S>(sc * F(p[j]) * (F(gr[j]) - dot));
            for (int64_t j = t + 1; j < T; ++j) o[j] = To<S>(0.0f);
          }
        });
      });
    });
    return {gs, Tensor(), Tensor(), Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// SwiGLU

struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gu_in) {
    const Tensor gu = gu_in.contiguous();
    const int64_t I2 = gu.size(-1), I = I2 / 2, N = gu.numel() / I2;
    std::vector<int64_t> shape = gu.sizes().vec();
    shape.back() = I;
    Tensor y = torch::empty(shape, gu.options());
    Dispatch(gu.scalar_type(), [&](auto xt) {
      using X = decltype(xt);
      const X* src = gu.data_ptr<X>();
      X* yp = y.data_ptr<X>();
      parallel::For(0, N, Grain(I2), [&](int64_t b, int64_t e) { SwiGluForwardRows<X>(src, yp, b, e, I); });
    });
    ctx->save_for_backward({gu});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor gu = ctx->get_saved_variables()[0];
    const int64_t I2 = gu.size(-1), I = I2 / 2, N = gu.numel() / I2;
    const Tensor gy = grads[0].to(gu.scalar_type()).contiguous();
    Tensor ggu = torch::empty_like(gu);
    Dispatch(gu.scalar_type(), [&](auto xt) {
      using X = decltype(xt);
      const X* src = gu.data_ptr<X>();
      const X* gyp = gy.data_ptr<X>();
      X* out = ggu.data_ptr<X>();
      parallel::For(0, N, Grain(I2), [&](int64_t b, int64_t e) {
        std::vector<float> tmp(static_cast<size_t>(5 * I));
        SwiGluBackwardRows<X>(src, gyp, out, b, e, I, tmp.data());
      });
    });
    return {ggu};
  }
};

}  // namespace

namespace {
std::atomic<bool>& Enabled() {
  static std::atomic<bool> enabled{[] {
    const char* v = std::getenv("SFTCTL_NO_FUSED");
    return v == nullptr || std::string(v) != "1";
  }()};
  return enabled;
}
}  // namespace

void SetEnabled(bool enabled) { Enabled() = enabled; }

bool IsEnabled() { return Enabled(); }

bool Supported(const torch::Tensor& t) {
  return Enabled() && t.device().is_cpu() &&
         (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      torch::ScalarType out_dtype) {
  return RmsNormFn::apply(x, weight, eps, static_cast<int64_t>(out_dtype));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(const torch::Tensor& qkv,
                                                                const torch::Tensor& cos,
                                                                const torch::Tensor& sin,
                                                                const torch::Tensor& positions, int64_t heads,
                                                                int64_t kv_heads, int64_t head_dim) {
  const torch::Tensor pos = positions.defined() ? positions : torch::empty({0}, torch::kInt64);
  auto out = QkvRopeFn::apply(qkv, cos, sin, pos, heads, kv_heads, head_dim);
  return {out[0], out[1], out[2]};
}

torch::Tensor CausalSoftmax(const torch::Tensor& scores, double scale, torch::ScalarType out_dtype,
                            int64_t window) {
  TORCH_CHECK(window >= 0, "CausalSoftmax: window must be >= 0, got ", window);
  return CausalSoftmaxFn::apply(scores, scale, static_cast<int64_t>(out_dtype), window);
}

torch::Tensor SwiGlu(const torch::Tensor& gate_up) { return SwiGluFn::apply(gate_up); }

namespace {
SFT_CLONES void AdamWRange(float* pp, const float* gp, float* mp, float* vp, int64_t b, int64_t end,
                           float keep, float b1, float b2, float one_b1, float one_b2, float step,
                           float sqrt_bc2, float e) {
  for (int64_t i = b; i < end; ++i) {
    const float gi = gp[i];
    const float mi = mp[i] * b1 + gi * one_b1;
    const float vi = vp[i] * b2 + gi * gi * one_b2;
    mp[i] = mi;
    vp[i] = vi;
    pp[i] = pp[i] * keep - step * (mi / (std::sqrt(vi) / sqrt_bc2 + e));
  }
}
}  // namespace

void AdamWStep(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, double lr,
               double wd, double beta1, double beta2, double eps, double bc1, double bc2) {
  float* pp = p.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  const float decay = static_cast<float>(1.0 - lr * wd), b1 = static_cast<float>(beta1),
              b2 = static_cast<float>(beta2), one_b1 = static_cast<float>(1.0 - beta1),
              one_b2 = static_cast<float>(1.0 - beta2), step = static_cast<float>(lr / bc1),
              sqrt_bc2 = static_cast<float>(std::sqrt(bc2)), e = static_cast<float>(eps);
  const float keep = wd > 0 ? decay : 1.0f;
  parallel::For(0, p.numel(), 1 << 15, [&](int64_t b, int64_t end) {
    AdamWRange(pp, gp, mp, vp, b, end, keep, b1, b2, one_b1, one_b2, step, sqrt_bc2, e);
  });
}

double SumOfSquares(const torch::Tensor& flat) {
  const float* x = flat.data_ptr<float>();
  const int64_t n = flat.numel();
  constexpr int64_t kChunks = 64;
  const int64_t per = (n + kChunks - 1) / kChunks;
  std::vector<double> partial(kChunks, 0.0);
  parallel::For(0, kChunks, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      double s = 0;
      for (int64_t i = k * per; i < std::min(n, (k + 1) * per); ++i) s += static_cast<double>(x[i]) * x[i];
      partial[k] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace sftctl::trainer::fused
