#include "agent/state/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/os/fd_util.h"

namespace sftctl::agent {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string EncodeJournalLine(const JournalEvent& ev) {
  nlohmann::json j = {
      {"seq", ev.seq}, {"t", ev.time_ms}, {"k", static_cast<int>(ev.kind)}, {"r", ev.rank}, {"x", ev.text}};
  if (ev.state != ::sftctl::v1::JOB_STATE_UNSPECIFIED) j["s"] = static_cast<int>(ev.state);
  if (ev.src >= 0) {
    j["src"] = ev.src;
    j["off"] = ev.src_end;
  }
  // Trainer output may not be valid UTF-8: replace bad bytes instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

bool DecodeJournalLine(const std::string& line, JournalEvent* ev) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned()) return false;
  try {
    ev->seq = j["seq"].get<uint64_t>();
    ev->time_ms = j.value("t", int64_t{0});
    ev->kind = static_cast<::sftctl::v1::Event::Kind>(j.value("k", 0));
    ev->rank = j.value("r", -1);
    ev->text = j.value("x", std::string());
    ev->state = static_cast<::sftctl::v1::JobState>(j.value("s", 0));
    ev->src = j.value("src", -1);
    ev->src_end = j.value("off", uint64_t{0});
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

std::string ReadRankOutput(const std::string& path, uint64_t off, bool* at_eof, bool* more) {
  *at_eof = true;
  if (more != nullptr) *more = false;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) <= off) return "";
  const uint64_t avail = static_cast<uint64_t>(st.st_size) - off;
  std::string buf(static_cast<size_t>(std::min<uint64_t>(avail, kMaxRankReadPerPass)), '\0');
  const ssize_t n = ::pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(off));
  buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  if (buf.empty()) return "";
  *at_eof = off + buf.size() == static_cast<uint64_t>(st.st_size);
  if (more != nullptr) *more = avail > kMaxRankReadPerPass;
  return buf;
}

StatusOr<EventLine> ParseTrainerEvent(std::string_view line, int rank) {
  return ParseEventLine(line, "rank " + std::to_string(rank) + " event");
}

size_t SplitRankOutput(int rank, int src, uint64_t off, const std::string& buf, bool last_piece,
                       std::vector<JournalEvent>* events) {
  size_t start = 0;
  for (;;) {
    const size_t nl = buf.find('\n', start);
    size_t end, next;
    if (nl != std::string::npos && nl - start <= kMaxRankLine) {
      end = nl;
      next = nl + 1;
    } else if (buf.size() - start >= kMaxRankLine) {
      end = next = start + kMaxRankLine;  // an over-long line: emit in pieces
    } else if (last_piece && start < buf.size()) {
      end = next = buf.size();  // the unterminated last line of a dead rank
    } else {
      return start;
    }
    JournalEvent ev;
    ev.rank = rank;
    ev.text = buf.substr(start, end - start);
    if (!ev.text.empty() && ev.text.back() == '\r') ev.text.pop_back();
    ev.src = src;
    ev.src_end = off + next;
    ev.kind = src == 0   ? ::sftctl::v1::Event::STDOUT
              : src == 1 ? ::sftctl::v1::Event::STDERR
                         : ::sftctl::v1::Event::METRIC;
    events->push_back(std::move(ev));
    start = next;
  }
}

StatusOr<std::shared_ptr<Journal>> Journal::Open(const std::string& path, FileSystem* fs) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<AppendableFile> file, fs->NewAppendableFile(path));
  std::shared_ptr<Journal> j(new Journal(path, std::move(file)));
  {
    MutexLock lock(&j->mu_);  // not shared yet: nobody else can hold it
    SFT_RETURN_IF_ERROR(j->Scan());
  }
  return j;
}

// Called by Open before the journal is shared.
Status Journal::Scan() {
  // Rebuild seq, index, ring and source offsets; find the end of the last good line.
  std::string buf;
  std::vector<char> chunk(1 << 16);
  uint64_t pos = 0;   // file offset of buf[0]
  uint64_t good = 0;  // end of the last valid line
  for (;;) {
    SFT_ASSIGN_OR_RETURN(size_t n, file_->ReadAt(pos + buf.size(), chunk.size(), chunk.data()));
    if (n == 0) break;
    buf.append(chunk.data(), n);
    size_t start = 0;
    bool bad = false;
    for (;;) {
      size_t nl = buf.find('\n', start);
      if (nl == std::string::npos) break;
      JournalEvent ev;
      if (!DecodeJournalLine(buf.substr(start, nl - start), &ev) || ev.seq != last_seq_ + 1) {
        bad = true;
        break;
      }
      if ((ev.seq - 1) % kIndexEvery == 0) index_.push_back(pos + start);
      last_seq_ = ev.seq;
      if (ev.src >= 0) source_offsets_[{ev.rank, ev.src}] = ev.src_end;
      PushRingLocked(std::move(ev));
      start = nl + 1;
      good = pos + start;
    }
    if (bad) break;
    pos += start;
    buf.erase(0, start);
  }
  SFT_ASSIGN_OR_RETURN(uint64_t size, file_->Size());
  if (size != good) SFT_RETURN_IF_ERROR(file_->Truncate(good));
  file_size_ = good;
  return OkStatus();
}

Journal::~Journal() { (void)file_->Close(); }

// Appends `data` at file_size_, or nothing: a failed or short write (ENOSPC, EFBIG) is cut off again,
// so the file and memory never disagree and the next Append reuses the seqs.
Status Journal::WriteLocked(const std::string& data) {
  if (torn_) {
    if (Status t = file_->Truncate(file_size_); !t.ok()) {
      return Status(t.code(), "journal still holds the rest of a failed write: " + t.message());
    }
    torn_ = false;
  }
  Status w = file_->Append(data);
  if (w.ok()) return w;
  if (Status t = file_->Truncate(file_size_); !t.ok()) {
    torn_ = true;
    return Status(w.code(), "cannot undo a failed journal write (" + w.message() + "): " + t.message());
  }
  return w;
}

StatusOr<uint64_t> Journal::Append(std::vector<JournalEvent> events) {
  std::vector<std::function<void()>> fire;
  uint64_t last;
  {
    MutexLock lock(&mu_);
    // All or nothing: the lines are numbered and written first; memory (seq, index, ring, source
    // offsets) changes only once they are all on file.
    std::string data;
    std::vector<size_t> line_sizes;
    const int64_t now = NowMs();
    uint64_t seq = last_seq_;
    for (JournalEvent& ev : events) {
      ev.seq = ++seq;
      if (ev.time_ms == 0) ev.time_ms = now;
      const std::string line = EncodeJournalLine(ev);
      line_sizes.push_back(line.size());
      data += line;
    }
    SFT_RETURN_IF_ERROR(WriteLocked(data));
    uint64_t off = file_size_;
    for (size_t i = 0; i < events.size(); ++i) {
      JournalEvent& ev = events[i];
      if ((ev.seq - 1) % kIndexEvery == 0) index_.push_back(off);
      off += line_sizes[i];
      if (ev.src >= 0) source_offsets_[{ev.rank, ev.src}] = ev.src_end;
      PushRingLocked(std::move(ev));
    }
    file_size_ += data.size();
    last_seq_ = seq;
    last = last_seq_;
    FireWaitersLocked(&fire);
  }
  for (auto& fn : fire) fn();
  return last;
}

Status Journal::Flush() { return file_->Sync(); }

StatusOr<std::vector<JournalEvent>> Journal::Read(uint64_t after_seq, size_t max_events) {
  std::vector<JournalEvent> out;
  uint64_t start_off;
  uint64_t end_off;
  uint64_t skip;  // lines between the indexed one and after_seq: counted, not decoded
  {
    MutexLock lock(&mu_);
    if (after_seq >= last_seq_ || max_events == 0) return out;
    if (!ring_.empty() && after_seq + 1 >= ring_.front().seq) {
      size_t i = static_cast<size_t>(after_seq + 1 - ring_.front().seq);
      for (; i < ring_.size() && out.size() < max_events; ++i) out.push_back(ring_[i]);
      return out;
    }
    size_t idx = static_cast<size_t>(after_seq / kIndexEvery);
    start_off = index_[idx];
    end_off = file_size_;
    skip = after_seq - idx * kIndexEvery;
  }
  // Older than the ring: read the file from the nearest indexed line (outside the lock).
  std::string buf;
  std::vector<char> chunk(1 << 16);
  uint64_t pos = start_off;
  while (out.size() < max_events && pos < end_off) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), end_off - pos));
    SFT_ASSIGN_OR_RETURN(size_t n, file_->ReadAt(pos, want, chunk.data()));
    if (n == 0) break;
    pos += n;
    buf.append(chunk.data(), n);
    size_t start = 0;
    for (;;) {
      size_t nl = buf.find('\n', start);
      if (nl == std::string::npos) break;
      if (skip > 0) {
        --skip;
        start = nl + 1;
        continue;
      }
      JournalEvent ev;
      if (!DecodeJournalLine(buf.substr(start, nl - start), &ev)) {
        return DataLossError("journal '" + path_ + "': corrupt line near offset " + std::to_string(pos));
      }
      start = nl + 1;
      if (ev.seq <= after_seq) continue;
      out.push_back(std::move(ev));
      if (out.size() >= max_events) break;
    }
    buf.erase(0, start);
  }
  return out;
}

uint64_t Journal::last_seq() const {
  MutexLock lock(&mu_);
  return last_seq_;
}

void Journal::SetFinished(bool finished) {
  std::vector<std::function<void()>> fire;
  {
    MutexLock lock(&mu_);
    finished_ = finished;
    FireWaitersLocked(&fire);
  }
  for (auto& fn : fire) fn();
}

bool Journal::finished() const {
  MutexLock lock(&mu_);
  return finished_;
}

void Journal::NotifyWhenAfter(uint64_t after_seq, std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (last_seq_ <= after_seq && !finished_) {
      waiters_.emplace_back(after_seq, std::move(fn));
      return;
    }
  }
  fn();
}

size_t Journal::ring_bytes() const {
  MutexLock lock(&mu_);
  return ring_bytes_;
}

void Journal::PushRingLocked(JournalEvent ev) {
  ring_bytes_ += ev.text.size();
  ring_.push_back(std::move(ev));
  while (ring_.size() > 1 &&
         (ring_.size() > kRingSize || ring_bytes_ - ring_.back().text.size() > kRingBytes)) {
    ring_bytes_ -= ring_.front().text.size();
    ring_.pop_front();
  }
}

void Journal::FireWaitersLocked(std::vector<std::function<void()>>* out) {
  for (size_t i = 0; i < waiters_.size();) {
    if (last_seq_ > waiters_[i].first || finished_) {
      out->push_back(std::move(waiters_[i].second));
      waiters_[i] = std::move(waiters_.back());
      waiters_.pop_back();
    } else {
      ++i;
    }
  }
}

std::map<std::pair<int, int>, uint64_t> Journal::source_offsets() const {
  MutexLock lock(&mu_);
  return source_offsets_;
}

}  // namespace sftctl::agent
