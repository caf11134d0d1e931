// GgufWriter: writes a GGUF file (version 3), the single-file model format of llama.cpp and
// ollama, written from the GGUF specification:
//
//   header        "GGUF", uint32 version 3, uint64 tensor count, uint64 metadata count
//   metadata      per entry: key (string), uint32 value type, value; arrays are uint32 element
//                 type, uint64 count, elements; strings are uint64 length + bytes (no NUL)
//   tensor infos  per tensor: name (string), uint32 n_dims, uint64 dims innermost first (the row
//                 length first, the reverse of PyTorch's order), uint32 ggml type, uint64 offset
//                 into the data section (a multiple of the alignment)
//   padding       zeros up to a multiple of general.alignment (32, always written as metadata)
//   data          each tensor's bytes (common/formats/ggml_types.h), each padded to the alignment
//
// Everything is little-endian whatever the host. Metadata keys keep the order they were set in.
// Tensor bytes are produced one tensor at a time while the file is written, so at most one
// tensor's encoding is held in memory.
//
// Write() writes "<path>.tmp-gguf", fsyncs it and renames it to `path`; on any error the
// temporary file is removed and `path` is left as it was.
//
// Thread safety: a writer is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/formats/ggml_types.h"
#include "common/os/file_system.h"
#include "common/status.h"

namespace sftctl::gguf {

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kAlignment = 32;
// ggml's GGML_MAX_NAME: tensor names must be shorter.
inline constexpr size_t kMaxTensorName = 64;

// GGUF metadata value types.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

class GgufWriter {
 public:
  // Produces the tensor's bytes (exactly TensorBytes(type, shape) of them) into `out` (empty on
  // entry). Called once, during Write().
  using Producer = std::function<Status(std::string* out)>;

  GgufWriter();  // sets general.alignment

  // Metadata. A key set twice keeps its first position and takes the new value.
  void SetUint32(const std::string& key, uint32_t v);
  void SetFloat32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, const std::string& v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetInt32Array(const std::string& key, const std::vector<int32_t>& v);
  void SetFloat32Array(const std::string& key, const std::vector<float>& v);

  // Adds a tensor. `shape` is outermost first (PyTorch's order). INVALID_ARGUMENT naming the
  // tensor for a duplicate or too long name, an empty or non-positive shape, or a Q8_0 tensor
  // whose rows are not a multiple of 32 values.
  Status AddTensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type,
                   Producer produce);

  // Writes the file (see the header comment). Producer errors are returned as they are; a
  // producer that returns the wrong number of bytes is INTERNAL naming the tensor.
  Status Write(FileSystem* fs, const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    std::string encoded;  // value type + value, little-endian
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    TensorType type;
    Producer produce;
  };
  void Set(const std::string& key, std::string encoded);
  std::string Head() const;  // header, metadata, tensor infos and the padding after them
  Status WriteTo(WritableFile* file) const;

  std::vector<Entry> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace sftctl::gguf
