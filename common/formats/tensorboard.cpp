#include "common/formats/tensorboard.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/event_line.h"
#include "common/os/file_system.h"

namespace sftctl::tensorboard {
namespace {

// --- protobuf wire format, the few pieces the messages need ---

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutKey(std::string* out, int field, int wire_type) {
  PutVarint(out, (uint64_t(field) << 3) | wire_type);
}

void PutBytes(std::string* out, int field, std::string_view bytes) {
  PutKey(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

void PutDouble(std::string* out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, 1);
  PutLittleEndian(out, bits, 8);
}

void PutFloat(std::string* out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, 5);
  PutLittleEndian(out, bits, 4);
}

// Event{wall_time = 1, step = 2, summary = 5 {value = 1 {...}}}.
std::string EventWithValue(double wall_time, int64_t step, const std::string& value) {
  std::string summary, event;
  PutBytes(&summary, 1, value);
  PutDouble(&event, 1, wall_time);
  PutKey(&event, 2, 0);
  PutVarint(&event, static_cast<uint64_t>(step));
  PutBytes(&event, 5, summary);
  return event;
}

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && pos_ < b_.size(); shift += 7) {
      const uint8_t c = static_cast<uint8_t>(b_[pos_++]);
      *v |= uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  }
  bool Fixed(int bytes, uint64_t* v) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    *v = 0;
    for (int i = 0; i < bytes; ++i) *v |= uint64_t(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += bytes;
    return true;
  }
  bool Bytes(std::string_view* s) {
    uint64_t n;
    if (!Varint(&n) || n > b_.size() - pos_) return false;
    *s = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // Reads one field: its number, wire type, and (for wire type 2) its bytes, else its value.
  bool Field(int* field, int* wire, uint64_t* value, std::string_view* bytes) {
    uint64_t key;
    if (!Varint(&key)) return false;
    *field = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    switch (*wire) {
      case 0:
        return Varint(value);
      case 1:
        return Fixed(8, value);
      case 2:
        return Bytes(bytes);
      case 5:
        return Fixed(4, value);
      default:
        return false;
    }
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// The tag of every Summary.Value in `summary`.
bool ParseSummaryTags(std::string_view summary, std::vector<std::string>* tags) {
  Reader r(summary);
  while (!r.done()) {
    int field, wire;
    uint64_t v;
    std::string_view bytes;
    if (!r.Field(&field, &wire, &v, &bytes)) return false;
    if (field != 1 || wire != 2) continue;
    Reader value(bytes);
    while (!value.done()) {
      int f, w;
      std::string_view tag;
      if (!value.Field(&f, &w, &v, &tag)) return false;
      if (f == 1 && w == 2) tags->emplace_back(tag);
    }
  }
  return true;
}

bool ParseEvent(std::string_view data, ParsedEvent* e) {
  Reader r(data);
  while (!r.done()) {
    int field, wire;
    uint64_t v = 0;
    std::string_view bytes;
    if (!r.Field(&field, &wire, &v, &bytes)) return false;
    if (field == 1 && wire == 1) {
      std::memcpy(&e->wall_time, &v, sizeof(v));
    } else if (field == 2 && wire == 0) {
      e->step = static_cast<int64_t>(v);
    } else if (field == 3 && wire == 2) {
      e->file_version = std::string(bytes);
    } else if (field == 5 && wire == 2) {
      if (!ParseSummaryTags(bytes, &e->tags)) return false;
    }
  }
  return true;
}

uint64_t LoadLittleEndian(std::string_view b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Holds an flock for its lifetime.
class FlockGuard {
 public:
  explicit FlockGuard(int fd) : fd_(fd) {
    while ((rc_ = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
  }
  ~FlockGuard() {
    if (rc_ == 0) ::flock(fd_, LOCK_UN);
  }
  bool ok() const { return rc_ == 0; }

 private:
  int fd_;
  int rc_ = -1;
};

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (char ch : data) crc = table[(crc ^ static_cast<uint8_t>(ch)) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(std::string_view data) {
  std::string length;
  PutLittleEndian(&length, data.size(), 8);
  std::string out = length;
  PutLittleEndian(&out, MaskedCrc32c(length), 4);
  out.append(data);
  PutLittleEndian(&out, MaskedCrc32c(data), 4);
  return out;
}

std::string FileVersionEvent(double wall_time) {
  std::string event;
  PutDouble(&event, 1, wall_time);
  PutBytes(&event, 3, "brain.Event:2");
  return event;
}

std::string ScalarEvent(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  PutBytes(&v, 1, tag);
  PutFloat(&v, 2, value);
  return EventWithValue(wall_time, step, v);
}

std::string TextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text) {
  // SummaryMetadata{plugin_data = 1 {plugin_name = 1 "text"}, data_class = 4 DATA_CLASS_TENSOR (2)}.
  std::string plugin, metadata, shape, tensor, v;
  PutBytes(&plugin, 1, "text");
  PutBytes(&metadata, 1, plugin);
  PutKey(&metadata, 4, 0);
  PutVarint(&metadata, 2);
  // TensorProto{dtype = 1 DT_STRING (7), tensor_shape = 2 {} (a scalar), string_val = 8}.
  PutKey(&tensor, 1, 0);
  PutVarint(&tensor, 7);
  PutBytes(&tensor, 2, shape);
  PutBytes(&tensor, 8, text);
  PutBytes(&v, 1, tag);
  PutBytes(&v, 9, metadata);
  PutBytes(&v, 8, tensor);
  return EventWithValue(wall_time, step, v);
}

namespace {

// The scalars of a record read by ReadEventLine (see ScalarsOf).
std::vector<std::pair<std::string, double>> ScalarsOfLine(const EventLine& ev) {
  std::vector<std::pair<std::string, double>> out;
  if (ev.type != EventKind::kStep && ev.type != EventKind::kEval) return out;
  const bool eval = ev.type == EventKind::kEval;
  for (const auto& [key, value] : ev.json.items()) {
    if (key == "step" || key == "time" || !value.is_number()) continue;
    const double d = value.get<double>();
    if (!std::isfinite(d)) continue;
    std::string name = key;
    if (eval && name.rfind("eval_", 0) == 0) name = name.substr(5);
    out.emplace_back((eval ? "eval/" : "train/") + name, d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::pair<std::string, double>> ScalarsOf(const nlohmann::json& record) {
  StatusOr<EventLine> ev = ReadEventLine(record, "metric record");
  if (!ev.ok()) return {};  // not an event line, or a field of the wrong type ({"event":7})
  return ScalarsOfLine(*ev);
}

std::string SpecText(const nlohmann::json& spec) {
  const std::string dump = spec.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out = "    ";
  for (char c : dump) {
    out.push_back(c);
    if (c == '\n') out += "    ";
  }
  return out;
}

StatusOr<std::vector<ParsedEvent>> ParseRecords(std::string_view bytes, size_t offset, size_t* end,
                                                const std::string& name) {
  std::vector<ParsedEvent> events;
  size_t pos = offset;
  while (bytes.size() - pos >= 12) {
    const std::string_view length = bytes.substr(pos, 8);
    if (LoadLittleEndian(bytes, pos + 8, 4) != MaskedCrc32c(length))
      return DataLossError(name + ": byte " + std::to_string(pos) + ": record length CRC mismatch");
    const uint64_t n = LoadLittleEndian(bytes, pos, 8);
    if (n > bytes.size() - pos - 12 || bytes.size() - pos - 12 - n < 4) break;  // incomplete
    const std::string_view data = bytes.substr(pos + 12, n);
    if (LoadLittleEndian(bytes, pos + 12 + n, 4) != MaskedCrc32c(data))
      return DataLossError(name + ": byte " + std::to_string(pos) + ": record data CRC mismatch");
    ParsedEvent e;
    if (!ParseEvent(data, &e))
      return DataLossError(name + ": byte " + std::to_string(pos) + ": not a tensorboard.Event");
    events.push_back(std::move(e));
    pos += 12 + n + 4;
  }
  *end = pos;
  return events;
}

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoError("cannot create the TensorBoard folder", dir, ec.value());
  std::unique_ptr<EventFileWriter> w(new EventFileWriter());
  w->path_ = JoinPath(dir, kEventFileName);
  w->fd_ = ::open(w->path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoError("cannot open", w->path_, errno);
  FlockGuard lock(w->fd_);
  if (!lock.ok()) return ErrnoError("cannot lock", w->path_, errno);
  SFT_RETURN_IF_ERROR(w->CatchUp());
  return w;
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status EventFileWriter::CatchUp() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError("cannot stat", path_, errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == offset_) return OkStatus();
  if (size < offset_) return DataLossError(path_ + ": the file shrank while being written");
  std::string bytes(size - offset_, '\0');
  SFT_RETURN_IF_ERROR(PreadFully(fd_, bytes.data(), bytes.size(), offset_, path_));
  size_t end = 0;
  SFT_ASSIGN_OR_RETURN(auto events, ParseRecords(bytes, 0, &end, path_));
  for (const ParsedEvent& e : events) {
    for (const std::string& tag : e.tags) {
      auto [it, inserted] = last_.emplace(tag, e.step);
      if (!inserted && e.step > it->second) it->second = e.step;
    }
  }
  offset_ += end;
  // Under the lock every writer has finished its records: a partial one is a crashed write.
  if (offset_ < size && ::ftruncate(fd_, static_cast<off_t>(offset_)) != 0)
    return ErrnoError("cannot cut the torn last record of", path_, errno);
  return OkStatus();
}

Status EventFileWriter::Append(const std::vector<Pending>& events) {
  FlockGuard lock(fd_);
  if (!lock.ok()) return ErrnoError("cannot lock", path_, errno);
  SFT_RETURN_IF_ERROR(CatchUp());
  std::string bytes;
  if (offset_ == 0) bytes = FrameRecord(FileVersionEvent(Now()));
  std::map<std::string, int64_t> last = last_;
  for (const Pending& p : events) {
    auto it = last.find(p.tag);
    if (it != last.end() && p.step <= it->second) continue;
    last[p.tag] = p.step;
    bytes += FrameRecord(p.event);
  }
  if (bytes.empty()) return OkStatus();
  SFT_RETURN_IF_ERROR(WriteFully(fd_, bytes, path_));
  offset_ += bytes.size();
  last_ = std::move(last);
  return OkStatus();
}

Status EventFileWriter::WriteMetrics(const nlohmann::json& record) {
  StatusOr<EventLine> ev = ReadEventLine(record, "metric record");
  return ev.ok() ? WriteMetrics(*ev) : OkStatus();
}

Status EventFileWriter::WriteMetrics(const EventLine& ev) {
  if (!ev.step) return OkStatus();
  const int64_t step = *ev.step;
  const double wall = ev.time.value_or(Now());
  std::vector<Pending> events;
  for (const auto& [tag, value] : ScalarsOfLine(ev))
    events.push_back({tag, step, ScalarEvent(wall, step, tag, static_cast<float>(value))});
  if (events.empty()) return OkStatus();
  return Append(events);
}

Status EventFileWriter::WriteTextOnce(std::string_view tag, std::string_view text, double wall_time) {
  return Append({{std::string(tag), 0, TextEvent(wall_time, 0, tag, text)}});
}

}  // namespace sftctl::tensorboard
