#include "trainer/training/metrics.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>

#include "common/os/file_system.h"

namespace sftctl::trainer {
namespace {

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%02ld:%02ld", t / 60, t % 60);
  }
  return buf;
}

// " mem 1.2G mfu 41%" from a step record's resource fields (GPU memory where there is one, else RSS).
std::string ResourceText(const nlohmann::json& r) {
  auto num = [&](const char* k) { return r.contains(k) && r[k].is_number() ? r[k].get<double>() : -1.0; };
  std::string s;
  char buf[64];
  const double gpu = num("gpu_mem_allocated_mb"), rss = num("rss_mb"), mfu = num("mfu");
  if (gpu >= 0 || rss >= 0) {
    std::snprintf(buf, sizeof(buf), " %s %.2fG", gpu >= 0 ? "gpu mem" : "rss", (gpu >= 0 ? gpu : rss) / 1024);
    s += buf;
  }
  if (mfu >= 0) {
    std::snprintf(buf, sizeof(buf), " mfu %.0f%%", mfu * 100);
    s += buf;
  }
  return s;
}

}  // namespace

bool StderrIsTty() { return ::isatty(STDERR_FILENO) == 1; }

StatusOr<std::unique_ptr<MetricsSink>> MetricsSink::Open(const std::string& jsonl_path, int events_fd,
                                                         bool progress_bar, int64_t log_interval) {
  std::unique_ptr<MetricsSink> m(new MetricsSink());
  if (!jsonl_path.empty()) {
    m->file_ = std::fopen(jsonl_path.c_str(), "a");
    if (m->file_ == nullptr) return ErrnoError("cannot open metrics file", jsonl_path, errno);
  }
  m->events_fd_ = events_fd;
  m->bar_ = progress_bar;
  m->log_interval_ = log_interval;
  return m;
}

std::unique_ptr<MetricsSink> MetricsSink::Silent() {
  std::unique_ptr<MetricsSink> m(new MetricsSink());
  m->silent_ = true;
  return m;
}

MetricsSink::~MetricsSink() {
  Finish();
  if (file_) std::fclose(file_);
}

Status MetricsSink::EnableTensorBoard(const std::string& dir, const std::string& spec_text) {
  if (silent_) return OkStatus();
  SFT_ASSIGN_OR_RETURN(tensorboard_, tensorboard::EventFileWriter::Open(dir));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return tensorboard_->WriteTextOnce(tensorboard::kSpecTag, spec_text, now);
}

void MetricsSink::SetResourceMetrics(std::unique_ptr<ResourceMetrics> resources) {
  resources_ = std::move(resources);
}

void MetricsSink::Emit(nlohmann::json record) {
  if (silent_) return;
  if (record.value("event", std::string()) == "step") {
    if (resources_) resources_->AddTo(&record);
    last_step_ = record;
  }
  record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (tensorboard_) {
    if (Status s = tensorboard_->WriteMetrics(record); !s.ok()) {
      spdlog::warn("TensorBoard event files stopped: {}", s.message());
      tensorboard_.reset();
    }
  }
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (file_) {
    std::fputs(line.c_str(), file_);
    std::fflush(file_);
  }
  // A failed write means the supervisor went away; metrics.jsonl still has everything.
  if (events_fd_ >= 0) (void)WriteFully(events_fd_, line, "--events-fd " + std::to_string(events_fd_));
}

void MetricsSink::ShowStep(const nlohmann::json& r, int64_t total_steps) {
  if (silent_) return;
  const int64_t step = r.value("step", int64_t{0});
  const double loss = r.value("loss", 0.0), tps = r.value("tokens_per_s", 0.0),
               elapsed = r.value("elapsed_s", 0.0);
  const nlohmann::json& full = last_step_.value("step", int64_t{-1}) == step ? last_step_ : r;
  if (!bar_) {
    if (step % log_interval_ == 0 || step == total_steps) {
      spdlog::info("step {}/{} loss {:.4f} lr {:.3g} grad_norm {:.3f} {:.0f} tok/s{}", step, total_steps,
                   loss, r.value("lr", 0.0), r.value("grad_norm", 0.0), tps, ResourceText(full));
    }
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (step != total_steps && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double frac = total_steps > 0 ? static_cast<double>(step) / total_steps : 0.0;
  const int width = 24, filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  const double eta = step > 0 ? elapsed / step * (total_steps - step) : NAN;
  std::fprintf(stderr, "\r\033[K[%s] %3.0f%% step %lld/%lld loss %.4f %.1fk tok/s%s ETA %s", bar.c_str(),
               frac * 100, static_cast<long long>(step), static_cast<long long>(total_steps), loss,
               tps / 1000.0, ResourceText(full).c_str(), Duration(eta).c_str());
  std::fflush(stderr);
  bar_drawn_ = true;
}

void MetricsSink::Say(const std::string& line) {
  if (silent_) return;
  if (bar_drawn_) std::fprintf(stderr, "\r\033[K");
  spdlog::info("{}", line);
  bar_drawn_ = false;
  last_draw_ = {};
}

void MetricsSink::Finish() {
  if (bar_drawn_) {
    std::fprintf(stderr, "\n");
    bar_drawn_ = false;
  }
}

}  // namespace sftctl::trainer
