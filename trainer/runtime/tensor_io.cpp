#include "trainer/runtime/tensor_io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace sftctl::trainer {

StatusOr<safetensors::DType> DTypeOf(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat64:
      return safetensors::DType::kF64;
    case torch::kFloat32:
      return safetensors::DType::kF32;
    case torch::kFloat16:
      return safetensors::DType::kF16;
    case torch::kBFloat16:
      return safetensors::DType::kBF16;
    case torch::kInt64:
      return safetensors::DType::kI64;
    case torch::kInt32:
      return safetensors::DType::kI32;
    case torch::kInt16:
      return safetensors::DType::kI16;
    case torch::kInt8:
      return safetensors::DType::kI8;
    case torch::kUInt8:
      return safetensors::DType::kU8;
    case torch::kBool:
      return safetensors::DType::kBool;
    default:
      return InvalidArgumentError(std::string("cannot store dtype ") + c10::toString(t));
  }
}

torch::ScalarType ScalarTypeOf(safetensors::DType d) {
  switch (d) {
    case safetensors::DType::kF64:
      return torch::kFloat64;
    case safetensors::DType::kF32:
      return torch::kFloat32;
    case safetensors::DType::kF16:
      return torch::kFloat16;
    case safetensors::DType::kBF16:
      return torch::kBFloat16;
    case safetensors::DType::kI64:
      return torch::kInt64;
    case safetensors::DType::kI32:
      return torch::kInt32;
    case safetensors::DType::kI16:
      return torch::kInt16;
    case safetensors::DType::kI8:
      return torch::kInt8;
    case safetensors::DType::kU8:
      return torch::kUInt8;
    case safetensors::DType::kBool:
      return torch::kBool;
  }
  return torch::kFloat32;
}

Status SaveTensors(FileSystem* fs, const std::string& path, const NamedTensors& tensors) {
  std::vector<torch::Tensor> keep;  // contiguous CPU copies that must outlive the write
  std::vector<safetensors::TensorRef> refs;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    SFT_ASSIGN_OR_RETURN(safetensors::DType dtype, DTypeOf(t.scalar_type()));
    keep.push_back(t.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& c = keep.back();
    refs.push_back({name, dtype, c.sizes().vec(), c.data_ptr(), static_cast<size_t>(c.nbytes())});
  }
  return safetensors::Write(fs, path, refs, {{"format", "pt"}});
}

StatusOr<torch::Tensor> ReadTensor(const safetensors::Reader& reader, const safetensors::TensorInfo& info) {
  torch::Tensor t = torch::empty(info.shape, torch::TensorOptions().dtype(ScalarTypeOf(info.dtype)));
  const size_t nbytes = static_cast<size_t>(info.end - info.begin);
  if (nbytes != static_cast<size_t>(t.nbytes())) {
    return DataLossError(reader.path() + ": tensor '" + info.name + "' size does not match its shape");
  }
  if (nbytes > 0) std::memcpy(t.data_ptr(), reader.data(info), nbytes);
  return t;
}

StatusOr<std::map<std::string, torch::Tensor>> LoadTensors(const std::string& path) {
  SFT_ASSIGN_OR_RETURN(auto reader, safetensors::Reader::Open(path));
  std::map<std::string, torch::Tensor> out;
  for (const auto& info : reader->tensors()) {
    SFT_ASSIGN_OR_RETURN(torch::Tensor t, ReadTensor(*reader, info));
    out.emplace(info.name, std::move(t));
  }
  return out;
}

Status CopyTensorInto(const safetensors::Reader& reader, const safetensors::TensorInfo& info,
                      const torch::Tensor& dst) {
  using safetensors::DType;
  if (info.dtype != DType::kF32 && info.dtype != DType::kBF16 && info.dtype != DType::kF16 &&
      info.dtype != DType::kF64) {
    return InvalidArgumentError(reader.path() + ": tensor '" + info.name + "' has dtype " +
                                safetensors::DTypeName(info.dtype) +
                                ", which is not supported for weights (F32, BF16, F16)");
  }
  if (c10::IntArrayRef(info.shape) != dst.sizes()) {
    return DataLossError(reader.path() + ": tensor '" + info.name + "' has shape " +
                         c10::str(c10::IntArrayRef(info.shape)) + ", the model expects " +
                         c10::str(dst.sizes()));
  }
  const torch::ScalarType st = ScalarTypeOf(info.dtype);
  const size_t elem = safetensors::DTypeSize(info.dtype);
  if (info.nbytes() == 0) return OkStatus();
  torch::NoGradGuard no_grad;
  const uint8_t* p = reader.data(info);
  torch::Tensor src;
  if (reinterpret_cast<uintptr_t>(p) % elem == 0) {
    // A view of the mapping: the kernel pages the bytes in as copy_ converts them.
    src = torch::from_blob(const_cast<uint8_t*>(p), info.shape, torch::TensorOptions().dtype(st));
  } else {
    src = torch::empty(info.shape, torch::TensorOptions().dtype(st));
    std::memcpy(src.data_ptr(), p, info.nbytes());
  }
  dst.copy_(src);
  return OkStatus();
}

void ReleaseTensorPages(const safetensors::Reader& reader, const safetensors::TensorInfo& info) {
#if defined(MADV_DONTNEED)
  if (info.nbytes() == 0) return;
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (page_size <= 0) return;
  const uintptr_t page = static_cast<uintptr_t>(page_size);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(reader.data(info)) / page * page;
  // The mapping covers whole pages, so rounding the end up stays inside it.
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(reader.data(info)) + info.nbytes() + page - 1) / page * page;
  // Advice only: a failure leaves the pages resident, which is what happens without it.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
#else
  (void)reader;
  (void)info;
#endif
}

Status CopyIntoParameters(const std::map<std::string, torch::Tensor>& src, const NamedTensors& dst,
                          const std::string& source_name) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : dst) {
    auto it = src.find(name);
    if (it == src.end()) return DataLossError(source_name + ": missing tensor '" + name + "'");
    if (it->second.sizes() != p.sizes()) {
      return DataLossError(source_name + ": tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                           ", the model expects " + c10::str(p.sizes()));
    }
    p.copy_(it->second);
  }
  return OkStatus();
}

}  // namespace sftctl::trainer
