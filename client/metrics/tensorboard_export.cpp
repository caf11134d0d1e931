#include "client/metrics/tensorboard_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <iostream>

#include "common/event_line.h"
#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status WriteLine(std::string_view line, tensorboard::EventFileWriter* writer) {
  StatusOr<EventLine> ev = ParseEventLine(line, "metric record");
  if (!ev.ok()) return OkStatus();  // not a trainer record: skipped
  return writer->WriteMetrics(*ev);
}

}  // namespace

Status ExportNewMetricLines(const std::string& jsonl, uint64_t* offset,
                            tensorboard::EventFileWriter* writer) {
  const int fd = ::open(jsonl.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? OkStatus() : ErrnoError("cannot open", jsonl, errno);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), static_cast<off_t>(*offset + text.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot read", jsonl, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    SFT_RETURN_IF_ERROR(WriteLine(std::string_view(text).substr(start, nl - start), writer));
  }
  *offset += start;
  return OkStatus();
}

StatusOr<std::unique_ptr<MetricsFileExport>> MetricsFileExport::Start(const std::string& jsonl,
                                                                      const std::string& dir,
                                                                      const std::string& spec_text) {
  std::unique_ptr<MetricsFileExport> e(new MetricsFileExport());
  e->jsonl_ = jsonl;
  SFT_ASSIGN_OR_RETURN(e->writer_, tensorboard::EventFileWriter::Open(dir));
  SFT_RETURN_IF_ERROR(e->writer_->WriteTextOnce(tensorboard::kSpecTag, spec_text, NowSeconds()));
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

void MetricsFileExport::Loop() {
  while (!stop_.load()) {
    Status s = ExportNewMetricLines(jsonl_, &offset_, writer_.get());
    if (!s.ok()) {
      error_ = s;
      return;
    }
    for (int i = 0; i < 5 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status MetricsFileExport::Stop() {
  if (!thread_.joinable()) return error_;
  stop_ = true;
  thread_.join();
  if (!error_.ok()) return error_;
  return ExportNewMetricLines(jsonl_, &offset_, writer_.get());
}

MetricsFileExport::~MetricsFileExport() {
  if (thread_.joinable()) {
    stop_ = true;
    thread_.join();
  }
}

StatusOr<FollowResult> FollowToTensorBoard(Reconnector* rc, const std::string& job_id,
                                           uint64_t print_after_seq, bool follow, bool json,
                                           const std::string& dir) {
  v1::Job job;
  SFT_RETURN_IF_ERROR(GetJob(rc, job_id, &job));
  SFT_ASSIGN_OR_RETURN(auto writer, tensorboard::EventFileWriter::Open(dir));
  if (auto spec = ParseJson(job.spec_json(), "the job's spec"); spec.ok()) {
    SFT_RETURN_IF_ERROR(writer->WriteTextOnce(tensorboard::kSpecTag, tensorboard::SpecText(*spec),
                                              job.created_unix_ms() / 1000.0));
  }
  EventPrinter printer;
  Status write_error;
  auto on_event = [&](const v1::Event& e) {
    if (e.kind() == v1::Event::METRIC && e.rank() == 0 && write_error.ok()) {
      write_error = WriteLine(e.text(), writer.get());
      if (!write_error.ok())
        std::cerr << "sftctl: TensorBoard export stopped: " << write_error.message() << "\n";
    }
    if (e.seq() <= print_after_seq) return;
    if (json) {
      std::cout << EventToJson(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (const std::string line = printer.Format(e); !line.empty()) {
      std::cout << EscapeForTerminal(line) << "\n";  // agent text: escaped before printing
    }
  };
  auto result = FollowEvents(rc, job_id, 0, follow, on_event, [] { std::cout.flush(); });
  if (!write_error.ok()) return write_error;
  return result;
}

}  // namespace sftctl::client
