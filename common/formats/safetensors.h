// safetensors: reading and writing the Hugging Face tensor file format.
//
// Layout of a file (all integers little-endian):
//
//   [8 bytes]  N, a u64: the length of the header in bytes
//   [N bytes]  a UTF-8 JSON object, possibly padded with trailing spaces:
//                {"__metadata__": {"format": "pt"},              (optional, string -> string)
//                 "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   [rest]     the data section; tensor bytes are row-major, little-endian, and
//              data_offsets are relative to the start of the data section.
//
// Reader maps a file read-only and validates it the way the reference implementation
// (the Rust `safetensors` crate) does, including a few checks it leaves to serde: a
// header is rejected if it is over 100 MB, not JSON, not an object, has duplicate keys,
// an unknown dtype, a negative dimension, a tensor whose byte length differs from
// numel * DTypeSize, offsets out of range, or offsets that overlap or leave a gap (the
// data section must be covered exactly). Errors in a file's content are DATA_LOSS and
// name the file and the tensor; I/O errors keep their errno-derived code.
//
// Write produces files the reference library (and transformers/vLLM) reads.
//
// Example:
//   SFT_ASSIGN_OR_RETURN(auto reader, safetensors::Reader::Open(path));
//   const safetensors::TensorInfo* w = reader->Find("lm_head.weight");
//   if (w == nullptr || w->dtype != safetensors::DType::kBF16) return ...;
//   const uint8_t* bytes = reader->data(*w);  // w->nbytes() bytes, maybe unaligned
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/os/file_system.h"
#include "common/status.h"

namespace sftctl {
namespace safetensors {

static_assert(std::numeric_limits<float>::is_iec559, "IEEE 754 float required");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this implementation assumes a little-endian host"
#endif

// Header lengths above this are rejected (same limit as the reference library).
inline constexpr uint64_t kMaxHeaderSize = 100'000'000;

// The element types sftctl supports. Other safetensors dtypes (F8_*, U16, U32, U64, ...)
// are rejected by ParseDType and therefore by Reader.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// The name used in safetensors headers: "F64", "F32", "F16", "BF16", "I64", "I32", "I16",
// "I8", "U8", "BOOL". Never null; the pointer is to a static string.
const char* DTypeName(DType dtype);
// Size of one element in bytes (kBool is one byte).
size_t DTypeSize(DType dtype);
// Inverse of DTypeName (case-sensitive). INVALID_ARGUMENT naming `name` if unknown.
StatusOr<DType> ParseDType(std::string_view name);

// Where a tensor lives in a file, as described by the header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a 0-dim scalar
  uint64_t begin = 0;          // byte offsets relative to the data section, [begin, end)
  uint64_t end = 0;

  // Product of the dimensions: 1 for a scalar, 0 if any dimension is 0.
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// The validated content of a header.
struct Header {
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// A read-only view of one safetensors file, backed by mmap(PROT_READ, MAP_PRIVATE).
// No tensor data is copied; pages are read lazily by the kernel on first access.
//
// Thread safety: immutable after Open; any number of threads may call the const methods
// concurrently.
//
// Caveat: the mapping reflects the file as it is on disk. If another process truncates
// the file while it is mapped, touching the lost pages raises SIGBUS. sftctl never
// rewrites a safetensors file in place (writers use temp folders + rename), which keeps
// this safe.
class Reader {
 public:
  // Opens, maps and validates `path`. Errors: NOT_FOUND / PERMISSION_DENIED / ... from
  // open(2); INVALID_ARGUMENT if `path` is not a regular file; DATA_LOSS if the content is
  // not a valid safetensors file (message names the path and, when there is one, the
  // tensor).
  static StatusOr<std::unique_ptr<Reader>> Open(const std::string& path);

  // Validates a header (the N bytes after the length prefix) against a data section of
  // `data_size` bytes. `path_for_errors` is only used in error messages. Used by Open;
  // exposed for tests and for tools that read headers without mapping a file.
  static StatusOr<Header> ParseHeader(std::string_view header_json, uint64_t data_size,
                                      const std::string& path_for_errors);

  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  // The tensor called `name`, or nullptr. The pointer is valid while this Reader lives.
  const TensorInfo* Find(std::string_view name) const;
  // The first byte of `info`'s data: info.nbytes() readable bytes that stay valid while
  // this Reader lives. Do not write through it.
  // REQUIRES: `info` is one of this Reader's tensors().
  // The pointer is NOT guaranteed to be aligned to DTypeSize(info.dtype): the format only
  // puts the data section at an 8-byte file offset, and writers other than ours may lay
  // tensors out at any offset. Copy with memcpy (or check alignment) before reading
  // elements as float/int64_t/... When info.nbytes() == 0 the pointer must not be
  // dereferenced.
  const uint8_t* data(const TensorInfo& info) const { return data_ + info.begin; }
  // The "__metadata__" map; empty if the file has none.
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // The path given to Open.
  const std::string& path() const { return path_; }

 private:
  Reader(std::string path, void* map, size_t map_size, const uint8_t* data, Header header);

  std::string path_;
  void* map_;  // owned; munmap'ed by the destructor
  size_t map_size_;
  const uint8_t* data_;  // start of the data section inside map_
  Header header_;
};

// One tensor to write. Does not own `data`, which must stay valid during Write.
struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // may be null only when nbytes == 0
  size_t nbytes = 0;           // must equal numel(shape) * DTypeSize(dtype)
};

// Writes `tensors` and `metadata` to `path` through `fs`, creating or truncating it.
//
// The header lists "__metadata__" first (omitted when `metadata` is empty) and then the
// tensors sorted by name; it is padded with spaces to a multiple of 8 bytes, so the data
// section starts at an 8-aligned file offset. In the data section, tensors are ordered by
// element size (largest first) and then by name, like the reference writer does; hence
// every tensor in a file written here starts at a file offset that is a multiple of its
// element size. Tensor bytes are streamed with one WritableFile::Append per tensor (no
// copy of the data), then the file is synced and closed.
//
// Errors: INVALID_ARGUMENT naming the tensor if a name is empty, duplicated or
// "__metadata__", a dimension is negative, nbytes != numel * DTypeSize, data is null with
// nbytes > 0, or a name/metadata string is not valid UTF-8; these are checked before the
// file is created. I/O errors from `fs` are returned as is.
// Not atomic: on error a partial file may be left at `path` (callers write into a temp
// folder and rename it into place).
// REQUIRES: fs != nullptr.
Status Write(FileSystem* fs, const std::string& path, const std::vector<TensorRef>& tensors,
             const std::map<std::string, std::string>& metadata);

// ---- Scalar conversions between float and the 16-bit float formats ----------------------
// All are pure functions, safe from any thread, and independent of the FP rounding mode.

// float -> bfloat16, rounding to nearest, ties to even. Overflow becomes +-inf. A NaN
// stays a NaN (quiet, same sign); it is never rounded into an infinity. Branch-free (a select),
// so the loops of trainer/model/fused_ops.cpp that store through it vectorize: the one bf16 rounding.
inline uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// bfloat16 -> float. Exact.
inline float BF16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE binary16 -> float. Exact, including subnormals, infinities and NaNs.
float HalfToFloat(uint16_t h);

// float -> IEEE binary16, rounding to nearest, ties to even. Values whose magnitude
// rounds above 65504 become +-inf; tiny values become subnormals or a signed zero. A NaN
// stays a NaN (quiet, same sign).
uint16_t FloatToHalf(float f);

}  // namespace safetensors
}  // namespace sftctl
