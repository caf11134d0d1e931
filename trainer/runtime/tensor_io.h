// Bridges between torch::Tensor and the safetensors format (common/formats/safetensors.h).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/safetensors.h"
#include "common/os/file_system.h"

namespace sftctl::trainer {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes tensors (any device; F32/BF16/F16/I64/U8...) to a safetensors file with
// {"format": "pt"} metadata, as transformers' save_pretrained does.
Status SaveTensors(FileSystem* fs, const std::string& path, const NamedTensors& tensors);

// Copies one tensor out of an open file into a new CPU tensor of its stored dtype.
StatusOr<torch::Tensor> ReadTensor(const safetensors::Reader& reader, const safetensors::TensorInfo& info);

// Reads every tensor of a file into CPU tensors, keyed by name.
StatusOr<std::map<std::string, torch::Tensor>> LoadTensors(const std::string& path);

// The torch dtype of a safetensors dtype, and back (INVALID_ARGUMENT for types safetensors
// cannot hold).
torch::ScalarType ScalarTypeOf(safetensors::DType d);
StatusOr<safetensors::DType> DTypeOf(torch::ScalarType t);

// Copies one tensor of an open file into `dst` (any device and floating dtype), converting
// on copy without materialising a converted copy of the whole file. Only F32/BF16/F16/F64
// sources are accepted. Errors (DATA_LOSS / INVALID_ARGUMENT) name the file and the tensor:
// shape mismatch, unsupported dtype.
Status CopyTensorInto(const safetensors::Reader& reader, const safetensors::TensorInfo& info,
                      const torch::Tensor& dst);

// Drops the pages behind `info`'s bytes from this process's resident set: they stay in the page
// cache, and a later read maps them again (the mapping is read-only, so nothing is lost). A loop
// that copies each tensor once calls it after each copy, so the file's mapping never holds more
// than about one tensor resident. Pages shared with a neighbouring tensor are dropped too (they
// are read back on demand). A no-op where the system has no madvise(MADV_DONTNEED).
// REQUIRES: `info` is one of `reader`'s tensors, and no copy from it is still in flight.
void ReleaseTensorPages(const safetensors::Reader& reader, const safetensors::TensorInfo& info);

// Copies `src` tensors into `dst` parameters by name, converting dtype. Every destination
// must be present in `src` with the same shape. Errors name `source_name` and the tensor.
Status CopyIntoParameters(const std::map<std::string, torch::Tensor>& src, const NamedTensors& dst,
                          const std::string& source_name);

}  // namespace sftctl::trainer
