#include "common/formats/gguf_writer.h"

#include <cstring>
#include <utility>

namespace sftctl::gguf {
namespace {

void PutU32(uint32_t v, std::string* out) {
  for (int b = 0; b < 4; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}

void PutU64(uint64_t v, std::string* out) {
  for (int b = 0; b < 8; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}

void PutString(const std::string& s, std::string* out) {
  PutU64(s.size(), out);
  out->append(s);
}

void PutType(ValueType t, std::string* out) { PutU32(static_cast<uint32_t>(t), out); }

uint64_t PaddedTo(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

std::string TempPath(const std::string& path) { return path + ".tmp-gguf"; }

std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

GgufWriter::GgufWriter() { SetUint32("general.alignment", kAlignment); }

void GgufWriter::Set(const std::string& key, std::string encoded) {
  for (Entry& e : metadata_) {
    if (e.key == key) {
      e.encoded = std::move(encoded);
      return;
    }
  }
  metadata_.push_back(Entry{key, std::move(encoded)});
}

void GgufWriter::SetUint32(const std::string& key, uint32_t v) {
  std::string e;
  PutType(ValueType::kUint32, &e);
  PutU32(v, &e);
  Set(key, std::move(e));
}

void GgufWriter::SetFloat32(const std::string& key, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  std::string e;
  PutType(ValueType::kFloat32, &e);
  PutU32(bits, &e);
  Set(key, std::move(e));
}

void GgufWriter::SetBool(const std::string& key, bool v) {
  std::string e;
  PutType(ValueType::kBool, &e);
  e.push_back(v ? 1 : 0);
  Set(key, std::move(e));
}

void GgufWriter::SetString(const std::string& key, const std::string& v) {
  std::string e;
  PutType(ValueType::kString, &e);
  PutString(v, &e);
  Set(key, std::move(e));
}

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& v) {
  std::string e;
  PutType(ValueType::kArray, &e);
  PutType(ValueType::kString, &e);
  PutU64(v.size(), &e);
  for (const std::string& s : v) PutString(s, &e);
  Set(key, std::move(e));
}

void GgufWriter::SetInt32Array(const std::string& key, const std::vector<int32_t>& v) {
  std::string e;
  PutType(ValueType::kArray, &e);
  PutType(ValueType::kInt32, &e);
  PutU64(v.size(), &e);
  for (int32_t x : v) PutU32(static_cast<uint32_t>(x), &e);
  Set(key, std::move(e));
}

void GgufWriter::SetFloat32Array(const std::string& key, const std::vector<float>& v) {
  std::string e;
  PutType(ValueType::kArray, &e);
  PutType(ValueType::kFloat32, &e);
  PutU64(v.size(), &e);
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    PutU32(bits, &e);
  }
  Set(key, std::move(e));
}

Status GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type,
                             Producer produce) {
  if (name.empty() || name.size() >= kMaxTensorName) {
    return InvalidArgumentError("GGUF tensor name '" + name + "' must have 1 to " +
                                std::to_string(kMaxTensorName - 1) + " characters");
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgumentError("GGUF tensor '" + name + "' is added twice");
  }
  if (shape.empty() || shape.size() > 4) {
    return InvalidArgumentError("GGUF tensor '" + name + "' must have 1 to 4 dimensions");
  }
  for (int64_t d : shape) {
    if (d <= 0) return InvalidArgumentError("GGUF tensor '" + name + "' has a dimension of size <= 0");
  }
  if (type == TensorType::kQ8_0 && shape.back() % kQ8_0BlockValues != 0) {
    return InvalidArgumentError("GGUF tensor '" + name +
                                "': Q8_0 needs rows of a multiple of 32 values, not " +
                                std::to_string(shape.back()));
  }
  tensors_.push_back(Tensor{name, shape, type, std::move(produce)});
  return OkStatus();
}

std::string GgufWriter::Head() const {
  std::string out = "GGUF";
  PutU32(kVersion, &out);
  PutU64(tensors_.size(), &out);
  PutU64(metadata_.size(), &out);
  for (const Entry& e : metadata_) {
    PutString(e.key, &out);
    out.append(e.encoded);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(t.name, &out);
    PutU32(static_cast<uint32_t>(t.shape.size()), &out);
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) PutU64(static_cast<uint64_t>(*d), &out);
    PutU32(static_cast<uint32_t>(t.type), &out);
    PutU64(offset, &out);
    offset = PaddedTo(offset + TensorBytes(t.type, t.shape), kAlignment);
  }
  out.resize(PaddedTo(out.size(), kAlignment), '\0');
  return out;
}

Status GgufWriter::WriteTo(WritableFile* file) const {
  SFT_RETURN_IF_ERROR(file->Append(Head()));
  std::string bytes;
  for (const Tensor& t : tensors_) {
    bytes.clear();
    SFT_RETURN_IF_ERROR(t.produce(&bytes));
    const uint64_t want = TensorBytes(t.type, t.shape);
    if (bytes.size() != want) {
      return InternalError("GGUF tensor '" + t.name + "': produced " + std::to_string(bytes.size()) +
                           " bytes, expected " + std::to_string(want));
    }
    bytes.resize(PaddedTo(bytes.size(), kAlignment), '\0');
    SFT_RETURN_IF_ERROR(file->Append(bytes));
  }
  SFT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Status GgufWriter::Write(FileSystem* fs, const std::string& path) const {
  const std::string tmp = TempPath(path);
  Status s = [&]() -> Status {
    SFT_ASSIGN_OR_RETURN(auto file, fs->NewWritableFile(tmp));
    SFT_RETURN_IF_ERROR(WriteTo(file.get()));
    SFT_RETURN_IF_ERROR(fs->Rename(tmp, path));
    return fs->SyncDir(ParentDir(path));
  }();
  if (!s.ok()) (void)fs->RemoveAll(tmp);
  return s;
}

}  // namespace sftctl::gguf
