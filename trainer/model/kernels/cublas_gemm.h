// One GEMM the ATen API of every supported LibTorch lacks: bf16 (or fp32) inputs accumulated into
// an fp32 output in place (C += A^T B), which the fused cross-entropy needs for the lm_head's
// weight gradient (one fp32 buffer, no per-chunk add kernel). cuBLAS is reached through the
// library LibTorch's CUDA build has already loaded (dlsym in the process's global scope), so the
// trainer links nothing beyond LibTorch and needs no cuBLAS headers (a pip toolkit has none).
//
// Thread safety: safe from any thread (one cuBLAS handle per thread and device).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/model/kernels/cuda_kernels.h"

namespace sftctl::trainer::kernels {

// out[M, N] (row-major fp32, row stride N) += a[K, M]^T b[K, N] (row-major, `dtype`, row strides M
// and N), on `stream` of CUDA device `device`. Returns "" on success, else what failed (no
// cuBLAS in the process, a cuBLAS status).
std::string GemmTransposedAccumulateF32(const void* a, const void* b, float* out, DType dtype, int64_t M,
                                        int64_t N, int64_t K, int device, void* stream);

}  // namespace sftctl::trainer::kernels
