#include "trainer/model/cuda_ops.h"

#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "trainer/model/fused_ops.h"
#include "trainer/model/kernels/host_kernels.h"
#include "trainer/runtime/device.h"

#if defined(SFTCTL_CUDA_KERNELS)
#include <c10/cuda/CUDAStream.h>

#include "trainer/model/kernels/cublas_gemm.h"
#include "trainer/model/kernels/cuda_kernels.h"
#endif

namespace sftctl::trainer::cuda_ops {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace k = sftctl::trainer::kernels;

k::DType Dt(torch::ScalarType t) {
  TORCH_CHECK(t == torch::kFloat32 || t == torch::kBFloat16, "the CUDA kernels take float or bfloat16, got ",
              t);
  return t == torch::kBFloat16 ? k::DType::kBFloat16 : k::DType::kFloat32;
}
k::DType Dt(const Tensor& t) { return Dt(t.scalar_type()); }

// The kernels for a tensor's device: the CUDA launchers, or on the CPU their host reference
// (kernels/host_kernels.h, same signatures).
struct Launchers {
  decltype(&k::host::LaunchAddRmsNormForward) add_rms_norm_forward;
  decltype(&k::host::LaunchAddRmsNormBackward) add_rms_norm_backward;
  decltype(&k::host::LaunchQkvRopeForward) qkv_rope_forward;
  decltype(&k::host::LaunchQkvRopeBackward) qkv_rope_backward;
  decltype(&k::host::LaunchSwiGluForward) swiglu_forward;
  decltype(&k::host::LaunchSwiGluBackward) swiglu_backward;
  decltype(&k::host::LaunchCrossEntropyForward) cross_entropy_forward;
  decltype(&k::host::LaunchCrossEntropyGradInPlace) cross_entropy_grad;
  decltype(&k::host::GemmTransposedAccumulateF32) gemm_accumulate;
};

constexpr Launchers kHost{k::host::LaunchAddRmsNormForward,    k::host::LaunchAddRmsNormBackward,
                          k::host::LaunchQkvRopeForward,       k::host::LaunchQkvRopeBackward,
                          k::host::LaunchSwiGluForward,        k::host::LaunchSwiGluBackward,
                          k::host::LaunchCrossEntropyForward,  k::host::LaunchCrossEntropyGradInPlace,
                          k::host::GemmTransposedAccumulateF32};
#if defined(SFTCTL_CUDA_KERNELS)
constexpr Launchers kCuda{
    k::LaunchAddRmsNormForward,   k::LaunchAddRmsNormBackward,      k::LaunchQkvRopeForward,
    k::LaunchQkvRopeBackward,     k::LaunchSwiGluForward,           k::LaunchSwiGluBackward,
    k::LaunchCrossEntropyForward, k::LaunchCrossEntropyGradInPlace, k::GemmTransposedAccumulateF32};
#endif

const Launchers& For(const Tensor& t) {
#if defined(SFTCTL_CUDA_KERNELS)
  if (t.is_cuda()) return kCuda;
#endif
  TORCH_CHECK(t.is_cpu(), "the fused kernels have no launcher for ", t.device());
  return kHost;
}

// The current stream of the tensor's CUDA device; null on the CPU.
void* Stream(const Tensor& t) {
#if defined(SFTCTL_CUDA_KERNELS)
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif
  return nullptr;
}

void Check(int err, const char* kernel) {
#if defined(SFTCTL_CUDA_KERNELS)
  TORCH_CHECK(err == 0, kernel, ": ", cudaGetErrorString(static_cast<cudaError_t>(err)));
#else
  TORCH_CHECK(err == 0, kernel, " failed with ", err);
#endif
}

// A profiler/RecordFunction scope named after the kernel, so traces (sftctl run --profile) and
// the kernel count (tests/trainer/kernel_math_test.cpp) see each launch as one op.
#define SFT_KERNEL_SCOPE(name) RECORD_FUNCTION("sftctl::" name, std::vector<c10::IValue>())

std::atomic<bool>& HostReference() {
  static std::atomic<bool> on{false};
  return on;
}

// Rows of a [..., n] tensor whose last dimension is contiguous and whose rows lie at one stride
// (a contiguous tensor, or a column slice of one): that stride, else -1.
int64_t RowStride(const Tensor& t) {
  if (t.dim() == 0 || t.stride(-1) != 1) return -1;
  const int64_t row = t.dim() >= 2 ? t.stride(-2) : t.size(-1);
  for (int64_t d = t.dim() - 2; d > 0; --d)
    if (t.size(d) > 1 && t.stride(d - 1) != t.stride(d) * t.size(d)) return -1;
  return row;
}

// `t` as rows at one stride: itself when it already is, else a contiguous copy.
Tensor Rows(const Tensor& t, int64_t* stride) {
  *stride = RowStride(t);
  if (*stride >= 0) return t;
  Tensor c = t.contiguous();
  *stride = c.size(-1);
  return c;
}

// ---- RMSNorm, with or without the residual add ----------------------------------------------

struct AddRmsNormFn : public torch::autograd::Function<AddRmsNormFn> {
  // d empty: plain RMSNorm of x (the first output is then empty and unused).
  static variable_list forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& d_in,
                               const Tensor& weight, double eps, int64_t out_dtype) {
    const c10::DeviceGuard guard(x_in.device());
    const Tensor x = x_in.contiguous();
    const Tensor w = weight.to(torch::kFloat32).contiguous();
    const bool add = d_in.numel() > 0;
    const Tensor d = add ? d_in.contiguous() : Tensor();
    const int64_t C = x.size(-1), N = x.numel() / C;
    TORCH_CHECK(!add || x.scalar_type() == torch::kFloat32, "AddRmsNorm: the residual stream must be fp32");
    Tensor h = add ? torch::empty(x.sizes(), x.options()) : x;
    Tensor y = torch::empty(x.sizes(), x.options().dtype(static_cast<torch::ScalarType>(out_dtype)));
    Tensor rstd = torch::empty({N}, x.options().dtype(torch::kFloat32));
    {
      SFT_KERNEL_SCOPE("add_rms_norm_forward");
      Check(For(x).add_rms_norm_forward(x.data_ptr(), Dt(x), add ? d.data_ptr() : nullptr,
                                        add ? Dt(d) : Dt(x), w.data_ptr<float>(),
                                        add ? h.data_ptr<float>() : nullptr, y.data_ptr(), Dt(y),
                                        rstd.data_ptr<float>(), N, C, static_cast<float>(eps), Stream(x)),
            "AddRmsNormForward");
    }
    ctx->save_for_backward({h, w, rstd});
    // An output nobody used (the plain norm's empty first one) gets no zero-filled gradient.
    ctx->set_materialize_grads(false);
    ctx->saved_data["add"] = add;
    ctx->saved_data["d_dtype"] = static_cast<int64_t>(add ? d.scalar_type() : x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return {add ? h : torch::empty({0}, x.options()), y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &h = saved[0], &w = saved[1], &rstd = saved[2];
    const c10::DeviceGuard guard(h.device());
    const bool add = ctx->saved_data["add"].toBool();
    const int64_t C = h.size(-1), N = h.numel() / C;
    Tensor dy = grads[1].defined() ? grads[1].contiguous() : torch::zeros(h.sizes(), h.options());
    if (dy.scalar_type() != torch::kFloat32 && dy.scalar_type() != torch::kBFloat16)
      dy = dy.to(torch::kFloat32);
    const Tensor dh_in = add && grads[0].defined() ? grads[0].to(torch::kFloat32).contiguous() : Tensor();
    const auto d_dtype = static_cast<torch::ScalarType>(ctx->saved_data["d_dtype"].toInt());
    Tensor dx = torch::empty_like(h);
    Tensor dd =
        add && ctx->needs_input_grad(1) ? torch::empty(h.sizes(), h.options().dtype(d_dtype)) : Tensor();
    const bool want_w = ctx->needs_input_grad(2);
    Tensor dw = want_w ? torch::empty({C}, h.options().dtype(torch::kFloat32)) : Tensor();
    Tensor scratch = want_w ? torch::empty({k::WeightGradScratchFloats(N, C)}, dw.options()) : Tensor();
    {
      SFT_KERNEL_SCOPE("add_rms_norm_backward");
      Check(For(h).add_rms_norm_backward(
                h.data_ptr(), Dt(h), w.data_ptr<float>(), dy.data_ptr(), Dt(dy),
                dh_in.defined() ? dh_in.data_ptr<float>() : nullptr, rstd.data_ptr<float>(), dx.data_ptr(),
                dd.defined() ? dd.data_ptr() : nullptr, Dt(d_dtype), want_w ? dw.data_ptr<float>() : nullptr,
                want_w ? scratch.data_ptr<float>() : nullptr, N, C, Stream(h)),
            "AddRmsNormBackward");
    }
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    if (want_w && w_dtype != torch::kFloat32) dw = dw.to(w_dtype);
    return {dx, dd, dw, Tensor(), Tensor()};
  }
};

// ---- RoPE -----------------------------------------------------------------------------------

// stacked: q_in is q, k and v stacked ([B, T, (H + 2 Hk) D]; k_in and v_in are unused), and
// backward returns one gradient for it.
struct QkvRopeFn : public torch::autograd::Function<QkvRopeFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q_in, const Tensor& k_in,
                               const Tensor& v_in, const Tensor& cos, const Tensor& sin,
                               const Tensor& positions, int64_t H, int64_t Hk, int64_t D, bool stacked) {
    const c10::DeviceGuard guard(q_in.device());
    TORCH_CHECK(D % 2 == 0, "QkvRope: head_dim ", D, " is odd");
    const int64_t B = q_in.size(0), T = q_in.size(1);
    int64_t qs = 0, ks = 0, vs = 0;
    Tensor q_src, k_src, v_src;
    if (stacked) {
      TORCH_CHECK(q_in.size(2) == (H + 2 * Hk) * D, "QkvRope: the stacked width does not match the heads");
      q_src = Rows(q_in, &qs);
      k_src = q_src.narrow(-1, H * D, Hk * D);
      v_src = q_src.narrow(-1, (H + Hk) * D, Hk * D);
      ks = vs = qs;
    } else {
      TORCH_CHECK(q_in.scalar_type() == k_in.scalar_type() && q_in.scalar_type() == v_in.scalar_type(),
                  "QkvRope: q, k and v differ in dtype");
      TORCH_CHECK(q_in.size(2) == H * D && k_in.size(2) == Hk * D && v_in.size(2) == Hk * D,
                  "QkvRope: projection widths do not match the heads");
      q_src = Rows(q_in, &qs);
      k_src = Rows(k_in, &ks);
      v_src = Rows(v_in, &vs);
    }
    const auto opts = q_in.options();
    Tensor q = torch::empty({B, H, T, D}, opts), k = torch::empty({B, Hk, T, D}, opts);
    Tensor v = torch::empty({B, Hk, T, D}, opts);
    const Tensor pos = positions.numel() > 0 ? positions.to(torch::kInt64).contiguous() : Tensor();
    const Tensor c = cos.contiguous(), s = sin.contiguous();
    {
      SFT_KERNEL_SCOPE("qkv_rope_forward");
      Check(For(q).qkv_rope_forward(q_src.data_ptr(), qs, k_src.data_ptr(), ks, v_src.data_ptr(), vs,
                                    c.data_ptr<float>(), s.data_ptr<float>(),
                                    pos.defined() ? pos.data_ptr<int64_t>() : nullptr, q.data_ptr(),
                                    k.data_ptr(), v.data_ptr(), Dt(q), B, T, H, Hk, D, Stream(q)),
            "QkvRopeForward");
    }
    ctx->save_for_backward({c, s, pos.defined() ? pos : torch::empty({0}, opts.dtype(torch::kInt64))});
    ctx->saved_data["dims"] = std::vector<int64_t>{B, T, H, Hk, D};
    ctx->saved_data["stacked"] = stacked;
    ctx->set_materialize_grads(false);
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &c = saved[0], &s = saved[1], &pos = saved[2];
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const int64_t B = dims[0], T = dims[1], H = dims[2], Hk = dims[3], D = dims[4];
    const c10::DeviceGuard guard(c.device());
    // (An unused output has no gradient: zeros in the dtype of one that has.)
    const torch::ScalarType dtype = grads[0].defined()   ? grads[0].scalar_type()
                                    : grads[1].defined() ? grads[1].scalar_type()
                                                         : grads[2].scalar_type();
    auto grad = [&](int i, int64_t heads) {
      return grads[i].defined() ? grads[i].contiguous()
                                : torch::zeros({B, heads, T, D}, c.options().dtype(dtype));
    };
    const Tensor gq = grad(0, H), gk = grad(1, Hk), gv = grad(2, Hk);
    TORCH_CHECK(gk.scalar_type() == gq.scalar_type() && gv.scalar_type() == gq.scalar_type(),
                "QkvRope: gradients differ in dtype");
    // Stacked: the three gradients are column slices of one (row stride (H + 2 Hk) D).
    const bool stacked = ctx->saved_data["stacked"].toBool();
    Tensor dq, dk, dv, dqkv;
    int64_t qs = H * D, ks = Hk * D;
    if (stacked) {
      dqkv = torch::empty({B, T, (H + 2 * Hk) * D}, gq.options());
      dq = dqkv.narrow(-1, 0, H * D);
      dk = dqkv.narrow(-1, H * D, Hk * D);
      dv = dqkv.narrow(-1, (H + Hk) * D, Hk * D);
      qs = ks = (H + 2 * Hk) * D;
    } else {
      dq = torch::empty({B, T, H * D}, gq.options());
      dk = torch::empty({B, T, Hk * D}, gq.options());
      dv = torch::empty({B, T, Hk * D}, gq.options());
    }
    {
      SFT_KERNEL_SCOPE("qkv_rope_backward");
      Check(For(gq).qkv_rope_backward(
                gq.data_ptr(), gk.data_ptr(), gv.data_ptr(), c.data_ptr<float>(), s.data_ptr<float>(),
                pos.numel() > 0 ? pos.data_ptr<int64_t>() : nullptr, dq.data_ptr(), qs, dk.data_ptr(), ks,
                dv.data_ptr(), ks, Dt(gq), B, T, H, Hk, D, Stream(gq)),
            "QkvRopeBackward");
    }
    variable_list out(10);  // one per forward argument
    if (stacked) {
      out[0] = dqkv;
    } else {
      out[0] = dq;
      out[1] = dk;
      out[2] = dv;
    }
    return out;
  }
};

// ---- SwiGLU ---------------------------------------------------------------------------------

// stacked: g_in is gate and up stacked ([..., 2 I]; u_in is unused), and backward returns one
// gradient for it.
struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& g_in, const Tensor& u_in, bool stacked) {
    const c10::DeviceGuard guard(g_in.device());
    int64_t gs = 0, us = 0;
    Tensor g, u;
    if (stacked) {
      TORCH_CHECK(g_in.size(-1) % 2 == 0, "SwiGlu: the stacked gate/up width ", g_in.size(-1), " is odd");
      const Tensor gu = Rows(g_in, &gs);
      g = gu.narrow(-1, 0, gu.size(-1) / 2);
      u = gu.narrow(-1, gu.size(-1) / 2, gu.size(-1) / 2);
      us = gs;
    } else {
      TORCH_CHECK(g_in.scalar_type() == u_in.scalar_type() && g_in.sizes() == u_in.sizes(),
                  "SwiGlu: gate and up differ in dtype or shape");
      g = Rows(g_in, &gs);
      u = Rows(u_in, &us);
    }
    const int64_t I = g.size(-1), N = g.numel() / std::max<int64_t>(I, 1);
    Tensor y = torch::empty(g.sizes(), g.options());
    {
      SFT_KERNEL_SCOPE("swiglu_forward");
      Check(For(g).swiglu_forward(g.data_ptr(), gs, u.data_ptr(), us, y.data_ptr(), Dt(g), N, I, Stream(g)),
            "SwiGluForward");
    }
    ctx->save_for_backward({g, u});
    ctx->saved_data["strides"] = std::vector<int64_t>{gs, us};
    ctx->saved_data["stacked"] = stacked;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &u = saved[1];
    const auto strides = ctx->saved_data["strides"].toIntVector();
    const c10::DeviceGuard guard(g.device());
    const Tensor dy = grads[0].to(g.scalar_type()).contiguous();
    const int64_t I = g.size(-1), N = g.numel() / std::max<int64_t>(I, 1);
    // Stacked: dgate and dup are the two halves of one gradient's rows.
    const bool stacked = ctx->saved_data["stacked"].toBool();
    Tensor dg, du, dgu;
    if (stacked) {
      std::vector<int64_t> sizes = g.sizes().vec();
      sizes.back() = 2 * I;
      dgu = torch::empty(sizes, g.options());
      dg = dgu.narrow(-1, 0, I);
      du = dgu.narrow(-1, I, I);
    } else {
      dg = torch::empty(g.sizes(), g.options());
      du = torch::empty(g.sizes(), g.options());
    }
    const int64_t ds = stacked ? 2 * I : I;
    {
      SFT_KERNEL_SCOPE("swiglu_backward");
      Check(For(g).swiglu_backward(g.data_ptr(), strides[0], u.data_ptr(), strides[1], dy.data_ptr(),
                                   dg.data_ptr(), ds, du.data_ptr(), ds, Dt(g), N, I, Stream(g)),
            "SwiGluBackward");
    }
    if (stacked) return {dgu, Tensor(), Tensor()};
    return {dg, du, Tensor()};
  }
};

// ---- Linear cross-entropy -------------------------------------------------------------------

// The master weight, passed so that autograd does not take it for an input (no edge to its
// AccumulateGrad: its gradient is written by the GEMM, not returned).
struct MasterWeight {
  Tensor tensor;
};

// The fp32 gradient a working weight's GEMM adds into: master.grad(), checked.
Tensor MasterGrad(const Tensor& master, at::IntArrayRef sizes, const char* what) {
  const Tensor g = master.grad();
  TORCH_CHECK(g.defined() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() && g.sizes() == sizes,
              what, ": the master weight's gradient must be the optimizer's fp32 view of its flat buffer");
  return g;
}

// Logits of rows [b, e) of h (already in `dt`) against w (in `dt`): [e - b, V] in `dt`.
Tensor ChunkLogits(const Tensor& h, const Tensor& w, int64_t b, int64_t e) {
  return at::mm(h.slice(0, b, e), w.t());
}

struct LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
  // master defined: `weight` is its working copy in `dtype` and the weight's gradient goes into
  // master.grad() (none is returned).
  static Tensor forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                        const Tensor& targets, int64_t chunk, int64_t dtype, const MasterWeight& master) {
    const c10::DeviceGuard guard(hidden.device());
    const auto dt = static_cast<torch::ScalarType>(dtype);
    const Tensor h = hidden.to(dt).contiguous(), w = weight.to(dt).contiguous();
    const Tensor t = targets.to(torch::kInt64).contiguous();
    const int64_t N = h.size(0), V = w.size(0);
    Tensor lse = torch::empty({N}, h.options().dtype(torch::kFloat32));
    Tensor picked = torch::empty({N}, lse.options());
    for (int64_t b = 0; b < N; b += chunk) {
      const int64_t e = std::min(N, b + chunk);
      const Tensor logits = ChunkLogits(h, w, b, e);
      {
        SFT_KERNEL_SCOPE("cross_entropy_forward");
        Check(For(h).cross_entropy_forward(logits.data_ptr(), Dt(dt), t.data_ptr<int64_t>() + b,
                                           lse.data_ptr<float>() + b, picked.data_ptr<float>() + b, e - b, V,
                                           Stream(h)),
              "CrossEntropyForward");
      }
    }
    ctx->save_for_backward({hidden, weight, t, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["dtype"] = dtype;
    ctx->saved_data["master"] = master.tensor;
    return (lse - picked).sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &hidden = saved[0], &weight = saved[1], &t = saved[2], &lse = saved[3];
    const c10::DeviceGuard guard(hidden.device());
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto dt = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const Tensor master = ctx->saved_data["master"].toTensor();
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1) || master.defined();
    const Tensor scale = grads[0].to(torch::kFloat32).reshape({1}).contiguous();  // stays on the device
    const Tensor h = hidden.to(dt).contiguous(), w = weight.to(dt).contiguous();
    const int64_t N = h.size(0), V = w.size(0), C = h.size(1);
    Tensor dh = want_h ? torch::empty({N, C}, h.options()) : Tensor();
    Tensor dw;  // fp32: master's gradient itself, or a buffer returned as the weight's
    if (master.defined()) {
      dw = MasterGrad(master, weight.sizes(), "the lm_head's weight gradient");
    } else if (want_w) {
      dw = torch::zeros({V, C}, h.options().dtype(torch::kFloat32));
    }
    for (int64_t b = 0; b < N; b += chunk) {
      const int64_t e = std::min(N, b + chunk);
      Tensor logits = ChunkLogits(h, w, b, e);
      {
        SFT_KERNEL_SCOPE("cross_entropy_grad");
        Check(For(h).cross_entropy_grad(logits.data_ptr(), Dt(dt), t.data_ptr<int64_t>() + b,
                                        lse.data_ptr<float>() + b, scale.data_ptr<float>(), e - b, V,
                                        Stream(h)),
              "CrossEntropyGradInPlace");
      }
      if (want_h) {
        Tensor out = dh.slice(0, b, e);
        at::mm_out(out, logits, w);
      }
      if (want_w) {
        SFT_KERNEL_SCOPE("gemm_accumulate");
        const std::string err =
            For(h).gemm_accumulate(logits.data_ptr(), h.slice(0, b, e).data_ptr(), dw.data_ptr<float>(),
                                   Dt(dt), V, C, e - b, h.device().index(), Stream(h));
        TORCH_CHECK(err.empty(), "the lm_head's weight gradient: ", err);
      }
    }
    if (want_h && dh.scalar_type() != hidden.scalar_type()) dh = dh.to(hidden.scalar_type());
    if (master.defined()) return {dh, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    if (want_w && weight.scalar_type() != torch::kFloat32) dw = dw.to(weight.scalar_type());
    return {dh, dw, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// ---- A linear layer on the working weights ---------------------------------------------------

struct WorkingLinearFn : public torch::autograd::Function<WorkingLinearFn> {
  // bias empty: none (autograd functions take no undefined tensors).
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                        const MasterWeight& master) {
    const c10::DeviceGuard guard(x.device());
    const torch::ScalarType dt = w.scalar_type();
    const Tensor xc = x.scalar_type() == dt ? x : x.to(dt);
    const bool has_bias = bias.numel() > 0;
    Tensor y = at::linear(xc, w, has_bias ? bias.to(dt) : Tensor());
    ctx->save_for_backward({xc, w});
    ctx->saved_data["master"] = master.tensor;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias"] = has_bias;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1];
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    const c10::DeviceGuard guard(w.device());
    const Tensor dy = grads[0].to(w.scalar_type());
    const int64_t out = w.size(0), in = w.size(1);
    const Tensor dy2 = dy.reshape({-1, out}).contiguous();
    Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = at::matmul(dy, w).to(static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    const Tensor g = MasterGrad(ctx->saved_data["master"].toTensor(), w.sizes(), "WorkingLinear");
    {
      SFT_KERNEL_SCOPE("gemm_accumulate");
      const Tensor x2 = x.reshape({-1, in}).contiguous();
      const std::string err =
          For(dy2).gemm_accumulate(dy2.data_ptr(), x2.data_ptr(), g.data_ptr<float>(), Dt(w), out, in,
                                   dy2.size(0), w.device().index(), Stream(dy2));
      TORCH_CHECK(err.empty(), "a weight gradient: ", err);
    }
    Tensor db;
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2))
      db = at::sum(dy2, {0}, false, torch::kFloat32);
    return {dx, Tensor(), db, Tensor()};
  }
};

}  // namespace

bool Compiled() {
#if defined(SFTCTL_CUDA_KERNELS)
  return true;
#else
  return false;
#endif
}

void SetHostReference(bool on) { HostReference() = on; }

bool Supported(const torch::Tensor& t) {
  if (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kBFloat16) return false;
  if (t.is_cpu()) return HostReference();
  // (fp16 autocast would hand the kernels fp16 activations: the composite path takes those.)
  const bool fp16_autocast = AutocastEnabled(at::kCUDA) && AutocastDtype(at::kCUDA) == torch::kHalf;
  return Compiled() && fused::IsEnabled() && t.is_cuda() && !fp16_autocast;
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      torch::ScalarType out_dtype) {
  // Autograd functions take no undefined tensors: an empty d means no residual add.
  return AddRmsNormFn::apply(x, torch::empty({0}, x.options()), weight, eps,
                             static_cast<int64_t>(out_dtype))[1];
}

std::pair<torch::Tensor, torch::Tensor> AddRmsNorm(const torch::Tensor& x, const torch::Tensor& d,
                                                   const torch::Tensor& weight, double eps,
                                                   torch::ScalarType out_dtype) {
  auto out = AddRmsNormFn::apply(x, d, weight, eps, static_cast<int64_t>(out_dtype));
  return {out[0], out[1]};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& cos,
    const torch::Tensor& sin, const torch::Tensor& positions, int64_t heads, int64_t kv_heads,
    int64_t head_dim) {
  // Autograd functions take no undefined tensors: an empty one means 0..T-1.
  const torch::Tensor pos =
      positions.defined() ? positions : torch::empty({0}, q.options().dtype(torch::kInt64));
  auto out = QkvRopeFn::apply(q, k, v, cos, sin, pos, heads, kv_heads, head_dim, false);
  return {out[0], out[1], out[2]};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(const torch::Tensor& qkv,
                                                                const torch::Tensor& cos,
                                                                const torch::Tensor& sin,
                                                                const torch::Tensor& positions, int64_t heads,
                                                                int64_t kv_heads, int64_t head_dim) {
  const torch::Tensor none = torch::empty({0}, qkv.options());
  const torch::Tensor pos =
      positions.defined() ? positions : torch::empty({0}, qkv.options().dtype(torch::kInt64));
  auto out = QkvRopeFn::apply(qkv, none, none, cos, sin, pos, heads, kv_heads, head_dim, true);
  return {out[0], out[1], out[2]};
}

torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  return SwiGluFn::apply(gate, up, false);
}

torch::Tensor SwiGlu(const torch::Tensor& gate_up) {
  return SwiGluFn::apply(gate_up, torch::empty({0}, gate_up.options()), true);
}

torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk_tokens,
                                    torch::ScalarType dtype, const torch::Tensor& master) {
  TORCH_CHECK(chunk_tokens > 0, "LinearCrossEntropySum: chunk_tokens must be positive");
  TORCH_CHECK(
      !master.defined() || (weight.scalar_type() == dtype && master.sizes() == weight.sizes()),
      "LinearCrossEntropySum: a working weight must be in the matmul dtype and of its master's shape");
  return LinearCrossEntropyFn::apply(hidden, weight, targets, chunk_tokens, static_cast<int64_t>(dtype),
                                     MasterWeight{master});
}

torch::Tensor WorkingLinear(const torch::Tensor& x, const torch::Tensor& w_work, const torch::Tensor& bias,
                            const torch::Tensor& master) {
  TORCH_CHECK(w_work.dim() == 2 && master.sizes() == w_work.sizes(), "WorkingLinear: W ", w_work.sizes(),
              " and its master ", master.sizes(), " differ");
  return WorkingLinearFn::apply(x, w_work, bias.defined() ? bias : torch::empty({0}, x.options()),
                                MasterWeight{master});
}

}  // namespace sftctl::trainer::cuda_ops
