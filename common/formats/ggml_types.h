// ggml tensor types as GGUF files store them: the type ids, the byte size of a tensor of each
// type, and the encoders that turn fp32 values into each type's bytes (little-endian).
//
//   F32   4 bytes per value.
//   F16   IEEE binary16, rounded to nearest, ties to even (safetensors::FloatToHalf).
//   Q8_0  blocks of 32 values along the row: an F16 scale d, then 32 int8 q, 34 bytes a block;
//         a value reads back as q * d. d = max|x| / 127 rounded to F16, and q = round(x / d)
//         (half away from zero) computed against that stored d, so every value reads back
//         within d / 2 of the original. (ggml's own quantizer divides by the unrounded d; the
//         two differ by at most one step in rare elements and read back the same way.) An
//         all-zero block has d = 0 and q = 0.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sftctl::gguf {

// ggml's type ids (the values GGUF tensor infos store).
enum class TensorType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8 };

inline constexpr int64_t kQ8_0BlockValues = 32;
inline constexpr int64_t kQ8_0BlockBytes = 2 + kQ8_0BlockValues;

// "F32", "F16", "Q8_0".
const char* TensorTypeName(TensorType t);

// Bytes of a tensor of `type` with `shape` (outermost first, as PyTorch writes it; the last
// entry is the row length). REQUIRES: for kQ8_0 the row length is a multiple of 32.
uint64_t TensorBytes(TensorType type, const std::vector<int64_t>& shape);

// Appends the encoding of `n` values to `out`. REQUIRES: for kQ8_0, n is a multiple of 32 (the
// values are whole rows, so blocks never straddle rows).
void AppendEncoded(TensorType type, const float* values, int64_t n, std::string* out);

}  // namespace sftctl::gguf
