#include "client/transfer/progress.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <ostream>

#include "common/mutex.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

// `text` for the one line the bar redraws: EscapeForTerminal, and newline, tab and carriage
// return escaped too (each would break the line apart).
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : EscapeForTerminal(text)) {
    if (c == '\n') {
      out += "\\x0a";
    } else if (c == '\t') {
      out += "\\x09";
    } else if (c == '\r') {
      out += "\\x0d";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The stream of the uploader's lines: one whole line at a time.
struct UploadLines {
  Mutex mu;
  std::ostream* const out PT_GUARDED_BY(mu) = &std::cerr;
};

}  // namespace

void PrintUploadLine(const std::string& line) {
  static UploadLines* const lines = new UploadLines;  // never destroyed: uploader threads may outlive exit
  MutexLock l(&lines->mu);
  *lines->out << "sftctl: upload: " << line << std::endl;
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes < 1000) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < 1000 * 1000) {
    std::snprintf(buf, sizeof(buf), "%.1f KB", b / 1e3);
  } else if (bytes < 1000ull * 1000 * 1000) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  }
  return buf;
}

Progress::Progress(bool enabled, uint64_t total)
    : enabled_(enabled), total_(total), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { Finish(); }

void Progress::SetLabel(const std::string& label) {
  label_ = OneLine(label);
  Draw(true);
}

void Progress::Add(uint64_t n) {
  done_ += n;
  Draw(false);
}

double Progress::Seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::Rate() const {
  const double s = Seconds();
  return s > 0 ? static_cast<double>(done_) / s : 0.0;
}

void Progress::Draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  std::string line = label_;
  const double rate = Rate();
  char buf[128];
  if (total_ > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const int width = 24, fill = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(fill), '=');
    if (fill < width) bar += '>';
    bar.resize(width, ' ');
    std::snprintf(buf, sizeof(buf), " [%s] %3d%% %.1f/%.1f MB %.1f MB/s", bar.c_str(),
                  static_cast<int>(frac * 100), static_cast<double>(done_) / 1e6,
                  static_cast<double>(total_) / 1e6, rate / 1e6);
    line += buf;
    if (rate > 0 && done_ < total_) {
      const long eta = static_cast<long>(static_cast<double>(total_ - done_) / rate);
      std::snprintf(buf, sizeof(buf), " ETA %ld:%02ld", eta / 60, eta % 60);
      line += buf;
    }
  } else {
    std::snprintf(buf, sizeof(buf), " %.1f MB %.1f MB/s", static_cast<double>(done_) / 1e6, rate / 1e6);
    line += buf;
  }
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace sftctl::client
