#include "common/formats/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/formats/safetensors.h"

namespace sftctl::gguf {
namespace {

void AppendU16(uint16_t v, std::string* out) {
  out->push_back(static_cast<char>(v & 0xFF));
  out->push_back(static_cast<char>(v >> 8));
}

void AppendF32(const float* x, int64_t n, std::string* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    for (int b = 0; b < 4; ++b) out->push_back(static_cast<char>((bits >> (8 * b)) & 0xFF));
  }
}

void AppendQ8_0(const float* x, int64_t n, std::string* out) {
  for (int64_t start = 0; start < n; start += kQ8_0BlockValues) {
    const float* block = x + start;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8_0BlockValues; ++i) amax = std::max(amax, std::fabs(block[i]));
    const uint16_t d16 = safetensors::FloatToHalf(amax / 127.0f);
    const float d = safetensors::HalfToFloat(d16);
    AppendU16(d16, out);
    for (int64_t i = 0; i < kQ8_0BlockValues; ++i) {
      float q = d > 0.0f ? std::round(block[i] / d) : 0.0f;
      q = std::clamp(q, -127.0f, 127.0f);
      out->push_back(static_cast<char>(static_cast<int8_t>(q)));
    }
  }
}

}  // namespace

const char* TensorTypeName(TensorType t) {
  switch (t) {
    case TensorType::kF32:
      return "F32";
    case TensorType::kF16:
      return "F16";
    case TensorType::kQ8_0:
      return "Q8_0";
  }
  return "?";
}

uint64_t TensorBytes(TensorType type, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  switch (type) {
    case TensorType::kF32:
      return n * 4;
    case TensorType::kF16:
      return n * 2;
    case TensorType::kQ8_0:
      return n / kQ8_0BlockValues * kQ8_0BlockBytes;
  }
  return 0;
}

void AppendEncoded(TensorType type, const float* values, int64_t n, std::string* out) {
  switch (type) {
    case TensorType::kF32:
      out->reserve(out->size() + static_cast<size_t>(n) * 4);
      AppendF32(values, n, out);
      return;
    case TensorType::kF16:
      out->reserve(out->size() + static_cast<size_t>(n) * 2);
      for (int64_t i = 0; i < n; ++i) AppendU16(safetensors::FloatToHalf(values[i]), out);
      return;
    case TensorType::kQ8_0:
      out->reserve(out->size() + static_cast<size_t>(n / kQ8_0BlockValues * kQ8_0BlockBytes));
      AppendQ8_0(values, n, out);
      return;
  }
}

}  // namespace sftctl::gguf
