#include "trainer/model/kernels/cublas_gemm.h"

#include <dlfcn.h>

#include <limits>
#include <map>

namespace sftctl::trainer::kernels {
namespace {

// cuBLAS's C API as the header declares it (cublas_api.h, library_types.h: values stable since
// CUDA 11), with the handle and stream as opaque pointers.
using Handle = void*;
using CreateFn = int (*)(Handle*);
using SetStreamFn = int (*)(Handle, void*);
using GemmExFn = int (*)(Handle, int, int, int, int, int, const void*, const void*, int, int, const void*,
                         int, int, const void*, void*, int, int, int, int);
constexpr int kOpN = 0, kOpT = 1;
constexpr int kR32F = 0, kR16BF = 14;
constexpr int kCompute32F = 68;
constexpr int kGemmDefault = -1;

struct Api {
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;
};

const Api& Cublas() {
  static const Api api = [] {
    Api a;
    a.create = reinterpret_cast<CreateFn>(dlsym(RTLD_DEFAULT, "cublasCreate_v2"));
    a.set_stream = reinterpret_cast<SetStreamFn>(dlsym(RTLD_DEFAULT, "cublasSetStream_v2"));
    a.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(RTLD_DEFAULT, "cublasGemmEx"));
    return a;
  }();
  return api;
}

// This thread's handle for `device` (created on first use, while that device is current).
Handle ThreadHandle(const Api& api, int device, int* status) {
  thread_local std::map<int, Handle> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  Handle h = nullptr;
  *status = api.create(&h);
  if (*status != 0) return nullptr;
  handles.emplace(device, h);
  return h;
}

}  // namespace

std::string GemmTransposedAccumulateF32(const void* a, const void* b, float* out, DType dtype, int64_t M,
                                        int64_t N, int64_t K, int device, void* stream) {
  const Api& api = Cublas();
  if (!api.create || !api.set_stream || !api.gemm_ex)
    return "cuBLAS is not loaded in this process (LibTorch's CUDA library should have loaded it)";
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (M > kMax || N > kMax || K > kMax) return "GEMM dimensions exceed cuBLAS's int range";
  int status = 0;
  Handle h = ThreadHandle(api, device, &status);
  if (!h) return "cublasCreate failed with status " + std::to_string(status);
  if ((status = api.set_stream(h, stream)) != 0)
    return "cublasSetStream failed with status " + std::to_string(status);
  // Column-major view: out^T [N, M] (ld N) = b^T [N, K] (b, ld N) x a [K, M] (a^T, ld M), so
  // out^T += op_N(b) op_T(a) with m = N, n = M, k = K.
  const float one = 1.0f;
  const int type = dtype == DType::kBFloat16 ? kR16BF : kR32F;
  status = api.gemm_ex(h, kOpN, kOpT, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one, b,
                       type, static_cast<int>(N), a, type, static_cast<int>(M), &one, out, kR32F,
                       static_cast<int>(N), kCompute32F, kGemmDefault);
  if (status != 0) return "cublasGemmEx failed with status " + std::to_string(status);
  return "";
}

}  // namespace sftctl::trainer::kernels
