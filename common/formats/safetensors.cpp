#include "common/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace sftctl {
namespace safetensors {
namespace {

using json = nlohmann::json;

constexpr DType kAllDTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                                DType::kI32, DType::kI16, DType::kI8,  DType::kU8,   DType::kBool};

// A valid header nests at most 3 deep (object > tensor object > shape array); anything
// much deeper is garbage and is rejected before it costs memory.
constexpr int kMaxJsonDepth = 16;

struct JsonTooDeep {};

Status Corrupt(const std::string& path, const std::string& msg) {
  return DataLossError("safetensors file '" + path + "': " + msg);
}

Status CorruptTensor(const std::string& path, const std::string& tensor, const std::string& msg) {
  return Corrupt(path, "tensor '" + tensor + "': " + msg);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Product of `shape` into *numel; false on overflow or a negative dimension.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *numel = n;
  return true;
}

// numel * DTypeSize(dtype) into *nbytes; false on overflow.
bool CheckedNbytes(int64_t numel, DType dtype, uint64_t* nbytes) {
  return !__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(DTypeSize(dtype)),
                                 nbytes);
}

// Parses JSON, reporting the first duplicated key (nlohmann::json silently keeps the last
// one) through *duplicate as "<key>" plus the top-level key it was found under.
struct DuplicateKey {
  std::string key;
  std::string parent;  // top-level key containing it; empty when `key` is top-level
};

StatusOr<json> ParseJsonRejectingDuplicates(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> open_objects;
  std::string current_top_key;
  std::optional<DuplicateKey> duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) throw JsonTooDeep{};
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (depth == 1) current_top_key = key;
        if (!open_objects.empty() && !open_objects.back().insert(key).second && !duplicate) {
          duplicate = DuplicateKey{key, depth == 1 ? std::string() : current_top_key};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input, so "{}\0garbage" would parse.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return Corrupt(path, "header is not valid JSON: NUL byte at offset " + std::to_string(nul));
  }
  json root;
  try {
    root = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return Corrupt(path, std::string("header is not valid JSON: ") + e.what());
  } catch (const JsonTooDeep&) {
    return Corrupt(path, "header is not valid JSON: nested deeper than " + std::to_string(kMaxJsonDepth));
  }
  if (duplicate) {
    if (duplicate->parent.empty()) return Corrupt(path, "duplicate key '" + duplicate->key + "' in header");
    if (duplicate->parent == "__metadata__") {
      return Corrupt(path, "duplicate key '" + duplicate->key + "' in __metadata__");
    }
    return CorruptTensor(path, duplicate->parent, "duplicate key '" + duplicate->key + "'");
  }
  return root;
}

StatusOr<TensorInfo> ParseTensorEntry(const std::string& name, const json& entry, uint64_t data_size,
                                      const std::string& path) {
  if (!entry.is_object()) return CorruptTensor(path, name, "entry is not a JSON object");
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return CorruptTensor(path, name, "missing \"dtype\"");
  if (!dtype_it->is_string()) return CorruptTensor(path, name, "\"dtype\" is not a string");
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  StatusOr<DType> dtype = ParseDType(dtype_name);
  if (!dtype.ok()) return CorruptTensor(path, name, "unknown dtype '" + dtype_name + "'");
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return CorruptTensor(path, name, "missing \"shape\"");
  if (!shape_it->is_array()) return CorruptTensor(path, name, "\"shape\" is not an array");
  for (const json& dim : *shape_it) {
    if (dim.is_number_unsigned()) {
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return CorruptTensor(path, name, "dimension " + std::to_string(d) + " is too large");
      }
      info.shape.push_back(static_cast<int64_t>(d));
    } else if (dim.is_number_integer()) {
      return CorruptTensor(path, name,
                           "negative dimension " + std::to_string(dim.get<int64_t>()) + " in shape");
    } else {
      return CorruptTensor(path, name,
                           "\"shape\" must be an array of non-negative integers, got " + dim.dump());
    }
  }
  int64_t numel = 0;
  if (!CheckedNumel(info.shape, &numel)) {
    return CorruptTensor(path, name, "shape " + ShapeString(info.shape) + " overflows int64");
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return CorruptTensor(path, name, "missing \"data_offsets\"");
  const json& offsets = *offsets_it;
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return CorruptTensor(
        path, name, "\"data_offsets\" must be [begin, end] of non-negative integers, got " + offsets.dump());
  }
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  const std::string range = "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
  if (info.begin > info.end) return CorruptTensor(path, name, "data_offsets " + range + " has begin > end");
  if (info.end > data_size) {
    return CorruptTensor(path, name,
                         "data_offsets " + range + " out of range: the data section has " +
                             std::to_string(data_size) + " bytes");
  }
  uint64_t expected = 0;
  if (!CheckedNbytes(numel, info.dtype, &expected) || info.nbytes() != expected) {
    return CorruptTensor(path, name,
                         "byte length " + std::to_string(info.nbytes()) + " of data_offsets " + range +
                             " does not match shape " + ShapeString(info.shape) + " and dtype " +
                             DTypeName(info.dtype) + " (" + std::to_string(numel) + " elements)");
  }
  return info;
}

// Unmaps on destruction unless released.
class Mapping {
 public:
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~Mapping() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* get() const { return addr_; }
  void* release() { return std::exchange(addr_, nullptr); }

 private:
  void* addr_;
  size_t size_;
};

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "UNKNOWN";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (name == DTypeName(d)) return d;
  }
  return InvalidArgumentError("unknown safetensors dtype '" + std::string(name) + "'");
}

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}

// ---- Reader -------------------------------------------------------------------------------

StatusOr<Header> Reader::ParseHeader(std::string_view header_json, uint64_t data_size,
                                     const std::string& path_for_errors) {
  const std::string& path = path_for_errors;
  SFT_ASSIGN_OR_RETURN(json root, ParseJsonRejectingDuplicates(header_json, path));
  if (!root.is_object()) return Corrupt(path, "header is not a JSON object");

  Header header;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) return Corrupt(path, "__metadata__ is not a JSON object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Corrupt(path, "__metadata__ value for key '" + mkey + "' is not a string: " + mvalue.dump());
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    SFT_ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(key, value, data_size, path));
    header.tensors.push_back(std::move(info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });

  // The tensors must tile the data section exactly: no overlap, no gap, nothing left over.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(header.tensors.size());
  for (const TensorInfo& t : header.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < cursor) {
      return CorruptTensor(path, t->name,
                           "data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                               "] overlap tensor '" + previous->name + "' (which ends at " +
                               std::to_string(cursor) + ")");
    }
    if (t->begin > cursor) {
      return CorruptTensor(path, t->name,
                           "gap in the data section: bytes [" + std::to_string(cursor) + ", " +
                               std::to_string(t->begin) + ") before this tensor belong to no tensor");
    }
    cursor = t->end;
    previous = t;
  }
  if (cursor != data_size) {
    return Corrupt(path, "data section not fully covered: bytes [" + std::to_string(cursor) + ", " +
                             std::to_string(data_size) + ") belong to no tensor");
  }
  return header;
}

StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError("safetensors file '" + path + "' is not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return Corrupt(path, "truncated: " + std::to_string(file_size) +
                             " bytes, fewer than the 8-byte header length prefix");
  }
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (addr == MAP_FAILED) return ErrnoError("cannot mmap", path, mmap_err);
  Mapping mapping(addr, file_size);

  const auto* bytes = static_cast<const uint8_t*>(addr);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderSize) {
    return Corrupt(path, "header too large: " + std::to_string(header_size) + " bytes (limit " +
                             std::to_string(kMaxHeaderSize) + ")");
  }
  if (header_size > file_size - 8) {
    return Corrupt(path, "truncated: header length " + std::to_string(header_size) + " exceeds the " +
                             std::to_string(file_size - 8) + " bytes after the length prefix");
  }
  const std::string_view header_json(reinterpret_cast<const char*>(bytes + 8), header_size);
  const uint64_t data_size = file_size - 8 - header_size;
  SFT_ASSIGN_OR_RETURN(Header header, ParseHeader(header_json, data_size, path));
  const uint8_t* data = bytes + 8 + header_size;
  return std::unique_ptr<Reader>(new Reader(path, mapping.release(), file_size, data, std::move(header)));
}

Reader::Reader(std::string path, void* map, size_t map_size, const uint8_t* data, Header header)
    : path_(std::move(path)), map_(map), map_size_(map_size), data_(data), header_(std::move(header)) {}

Reader::~Reader() { ::munmap(map_, map_size_); }

const TensorInfo* Reader::Find(std::string_view name) const {
  auto it = std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == header_.tensors.end() || it->name != name) return nullptr;
  return &*it;
}

// ---- Write --------------------------------------------------------------------------------

Status Write(FileSystem* fs, const std::string& path, const std::vector<TensorRef>& tensors,
             const std::map<std::string, std::string>& metadata) {
  const std::string where = "safetensors::Write '" + path + "': ";
  std::set<std::string_view> names;
  for (const TensorRef& t : tensors) {
    if (t.name.empty()) return InvalidArgumentError(where + "tensor name is empty");
    const std::string tensor = "tensor '" + t.name + "': ";
    if (t.name == "__metadata__") return InvalidArgumentError(where + tensor + "the name is reserved");
    if (!names.insert(t.name).second) return InvalidArgumentError(where + tensor + "duplicate tensor name");
    for (int64_t d : t.shape) {
      if (d < 0) {
        return InvalidArgumentError(where + tensor + "negative dimension in shape " + ShapeString(t.shape));
      }
    }
    int64_t numel = 0;
    uint64_t expected = 0;
    if (!CheckedNumel(t.shape, &numel) || !CheckedNbytes(numel, t.dtype, &expected)) {
      return InvalidArgumentError(where + tensor + "shape " + ShapeString(t.shape) + " overflows");
    }
    if (t.nbytes != expected) {
      return InvalidArgumentError(where + tensor + "nbytes " + std::to_string(t.nbytes) +
                                  " != " + std::to_string(expected) + " for shape " + ShapeString(t.shape) +
                                  " and dtype " + DTypeName(t.dtype));
    }
    if (t.data == nullptr && t.nbytes > 0) return InvalidArgumentError(where + tensor + "data is null");
  }

  // Data order: largest element size first, then name (keeps every tensor naturally aligned).
  std::vector<size_t> data_order(tensors.size());
  std::iota(data_order.begin(), data_order.end(), size_t{0});
  std::sort(data_order.begin(), data_order.end(), [&](size_t a, size_t b) {
    const size_t sa = DTypeSize(tensors[a].dtype), sb = DTypeSize(tensors[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });
  std::vector<uint64_t> begin(tensors.size());
  uint64_t offset = 0;
  for (size_t i : data_order) {
    begin[i] = offset;
    offset += tensors[i].nbytes;
  }

  // Header order: "__metadata__", then tensors by name.
  std::vector<size_t> name_order(tensors.size());
  std::iota(name_order.begin(), name_order.end(), size_t{0});
  std::sort(name_order.begin(), name_order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  for (size_t i : name_order) {
    const TensorRef& t = tensors[i];
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = DTypeName(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = nlohmann::ordered_json::array({begin[i], begin[i] + t.nbytes});
    header[t.name] = std::move(entry);
  }
  std::string header_json;
  try {
    header_json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(where + "a tensor name or metadata string is not valid UTF-8: " + e.what());
  }
  header_json.append((8 - header_json.size() % 8) % 8, ' ');

  std::string prefix(8, '\0');
  const uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  prefix += header_json;

  SFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  SFT_RETURN_IF_ERROR(file->Append(prefix));
  for (size_t i : data_order) {
    const TensorRef& t = tensors[i];
    if (t.nbytes == 0) continue;
    SFT_RETURN_IF_ERROR(file->Append(std::string_view(static_cast<const char*>(t.data), t.nbytes)));
  }
  SFT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// ---- 16-bit floats ------------------------------------------------------------------------

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;  // signed zero
    } else {        // subnormal: normalise
      int32_t e = -14;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --e;
      }
      mantissa &= 0x3FFu;
      bits = sign | (static_cast<uint32_t>(e + 127) << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf or NaN (payload kept)
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // quiet NaN
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal or zero
    if (abs <= 0x33000000u) return sign;          // <= 2^-25 rounds (ties to even) to zero
    const uint32_t exponent = abs >> 23;          // 102..112
    const uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24; result unit is 2^-24
    uint32_t r = significand >> shift;
    const uint32_t rem = significand & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);  // r == 0x400 is the smallest normal, correctly
  }
  const uint32_t rebiased = abs - 0x38000000u;  // exponent bias 127 -> 15
  uint32_t r = rebiased >> 13;
  const uint32_t rem = rebiased & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent
  return static_cast<uint16_t>(sign | r);
}

}  // namespace safetensors
}  // namespace sftctl
