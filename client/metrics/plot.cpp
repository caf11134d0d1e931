#include "client/metrics/plot.h"

#include <cairo.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>

#include "common/event_line.h"
#include "common/os/file_system.h"

namespace sftctl::client {
namespace {

struct Point {
  double x, y;
};

// Field `key` of a record, when it is a number (not a bool).
std::optional<double> Number(const nlohmann::json& rec, const std::string& key) {
  auto it = rec.find(key);
  if (it == rec.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// Tick spacing of 1, 2 or 5 times a power of ten giving about `target` intervals over [lo, hi].
double NiceStep(double lo, double hi, int target) {
  double raw = (hi - lo) / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  double nice = f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10;
  return nice * mag;
}

std::string TickLabel(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0" or "1e-17"
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

void SetColor(cairo_t* cr, PlotRgb c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

// Draws `text` with its anchor point at (x, y): ax/ay in 0..1 pick left/centre/right and top/middle/bottom.
void Text(cairo_t* cr, const std::string& text, double x, double y, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  cairo_move_to(cr, x - e.x_bearing - e.width * ax, y - e.y_bearing - e.height * ay);
  cairo_show_text(cr, text.c_str());
}

struct PngWriter {
  int fd;
  std::string path;
  Status status;
};

cairo_status_t WritePng(void* closure, const unsigned char* data, unsigned int length) {
  auto* w = static_cast<PngWriter*>(closure);
  w->status = WriteFully(w->fd, std::string_view(reinterpret_cast<const char*>(data), length), w->path);
  return w->status.ok() ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

}  // namespace

StatusOr<std::vector<EventLine>> ReadMetricsFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoError("cannot open metrics file", path, errno);
  std::vector<EventLine> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    SFT_ASSIGN_OR_RETURN(EventLine ev, ParseEventLine(line, path + ":" + std::to_string(n)));
    out.push_back(std::move(ev));
  }
  if (f.bad()) return ErrnoError("cannot read metrics file", path, errno);
  return out;
}

namespace {

// One drawn series: a line (with markers when `markers`) or markers alone.
struct Series {
  std::string label;
  PlotRgb color;
  bool line = true, markers = false;
  std::vector<Point> points;
};

// The series of `runs` for `o.metric` (see plot.h), each sorted by step; series without points dropped.
std::vector<Series> BuildSeries(const std::vector<PlotRun>& runs, const PlotOptions& o) {
  std::vector<Series> out;
  const bool several = runs.size() > 1;
  // A point at the record's step, when `y` is a finite number (with log_y: above 0).
  auto keep = [&](const EventLine& ev, std::optional<double> y, Point* p) {
    if (!ev.step || !y || !std::isfinite(*y) || (o.log_y && *y <= 0)) return false;
    *p = {static_cast<double>(*ev.step), *y};
    return true;
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const PlotRgb color = kRunColors[i % (sizeof(kRunColors) / sizeof(kRunColors[0]))];
    const std::string prefix = several ? runs[i].label + " " : "";
    Series train;
    train.label = prefix + (o.metric == "loss" ? "train loss" : o.metric);
    train.color = several ? color : kTrainColor;
    Series eval;
    eval.label = prefix + "eval loss";
    eval.color = several ? color : kEvalColor;
    eval.line = false;
    eval.markers = true;
    for (const EventLine& ev : runs[i].records) {
      Point p{};
      if (o.metric != "loss") {
        if (keep(ev, Number(ev.json, o.metric), &p)) train.points.push_back(p);
      } else if (ev.type == EventKind::kStep && keep(ev, ev.loss, &p)) {
        train.points.push_back(p);
      } else if (ev.type == EventKind::kEval && keep(ev, ev.eval_loss, &p)) {
        eval.points.push_back(p);
      }
    }
    if (o.metric != "loss") train.markers = train.points.size() <= 60;
    for (Series* s : {&train, &eval}) {
      std::stable_sort(s->points.begin(), s->points.end(),
                       [](const Point& a, const Point& b) { return a.x < b.x; });
      if (!s->points.empty()) out.push_back(std::move(*s));
    }
  }
  return out;
}

Status NothingToPlot(const std::vector<PlotRun>& runs, const PlotOptions& o) {
  size_t n = 0;
  for (const PlotRun& r : runs) n += r.records.size();
  const std::string among =
      " among " + std::to_string(n) + " record(s)" + (o.log_y ? " (--log-y: above 0)" : "");
  if (o.metric == "loss")
    return InvalidArgumentError(
        "nothing to plot: no \"step\" record with a loss and no \"eval\" record with an "
        "eval_loss" +
        among);
  return InvalidArgumentError("nothing to plot: no record with a step and a number '" + o.metric + "'" +
                              among);
}

// The axes' ranges over all series (y as log10 with log_y), padded so that flat or single-point series
// still get an axis and markers at the ends are not cut by the frame.
struct Ranges {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
};

// The smallest span an axis gets, relative to the magnitude of its values: far above a double's
// resolution (1 part in 2^53), so that a tick step is always many units in the last place of the
// values it separates (steps 1e16 and 1e16 + 2 are 2 apart: a tick step of 0.2 would not move).
constexpr double kMinRelativeSpan = 1e-9;

// Widens [*lo, *hi] about its middle, to `pad` each side or more, when it spans less than
// kMinRelativeSpan of its magnitude (a flat or single-point series, or nearly equal huge values).
void WidenFlatRange(double* lo, double* hi, double pad) {
  const double scale = std::max({1.0, std::fabs(*lo), std::fabs(*hi)});
  if (*hi - *lo >= kMinRelativeSpan * scale) return;
  const double mid = *lo / 2 + *hi / 2, half = std::max(pad, kMinRelativeSpan * scale);
  *lo = mid - half;
  *hi = mid + half;
}

// At most this many ticks on an axis, whatever the range and step.
constexpr int kMaxTicks = 64;

// The multiples of `step` in [lo, hi] (with a little slack at hi), each computed from its index rather
// than by adding `step` to the previous one, and at most kMaxTicks of them: no range can make it spin.
std::vector<double> LinearTicks(double lo, double hi, double step) {
  std::vector<double> out;
  if (!(step > 0) || !std::isfinite(step) || !std::isfinite(lo) || !std::isfinite(hi)) return out;
  const double first = std::ceil(lo / step);
  for (int i = 0; i < kMaxTicks; ++i) {
    const double v = (first + i) * step;
    if (v > hi + step * 1e-9) break;
    out.push_back(v);
  }
  return out;
}

Ranges ComputeRanges(const std::vector<Series>& series, bool log_y) {
  Ranges r;
  for (const Series& s : series) {
    for (const Point& p : s.points) {
      const double y = log_y ? std::log10(p.y) : p.y;
      r.x0 = std::min(r.x0, p.x);
      r.x1 = std::max(r.x1, p.x);
      r.y0 = std::min(r.y0, y);
      r.y1 = std::max(r.y1, y);
    }
  }
  WidenFlatRange(&r.x0, &r.x1, 1);
  WidenFlatRange(&r.y0, &r.y1, log_y ? 0.5 : std::max(0.5, std::fabs(r.y0) * 0.1));
  const double xpad = (r.x1 - r.x0) * 0.02, ypad = (r.y1 - r.y0) * 0.05;
  r.x0 -= xpad;
  r.x1 += xpad;
  r.y0 -= ypad;
  r.y1 += ypad;
  return r;
}

// The y ticks: (value, position in axis units). Linear: NiceStep. Log: 1, 2, 3, 5 x each decade over a
// span under one decade, 1, 2, 5 under two, else every decade (every few decades over a wide span).
std::vector<std::pair<double, double>> YTicks(const Ranges& r, bool log_y) {
  std::vector<std::pair<double, double>> ticks;
  if (!log_y) {
    const double ys = NiceStep(r.y0, r.y1, 6);
    for (double v : LinearTicks(r.y0, r.y1, ys)) ticks.push_back({std::fabs(v) < ys * 1e-9 ? 0.0 : v, v});
    return ticks;
  }
  const double span = r.y1 - r.y0;
  const int every = span > 12 ? static_cast<int>(std::ceil(span / 8)) : 1;
  for (int k = static_cast<int>(std::floor(r.y0)); k <= static_cast<int>(std::ceil(r.y1)); ++k) {
    if (k % every != 0) continue;
    const std::vector<double> marks = span < 1   ? std::vector<double>{1, 2, 3, 5}
                                      : span < 2 ? std::vector<double>{1, 2, 5}
                                                 : std::vector<double>{1};
    for (double m : marks) {
      const double pos = k + std::log10(m);
      if (pos >= r.y0 && pos <= r.y1) ticks.push_back({m * std::pow(10.0, k), pos});
    }
  }
  return ticks;
}

struct Frame {
  double left, right, top, bottom;
  Ranges r;
  double px(double x) const { return left + (x - r.x0) / (r.x1 - r.x0) * (right - left); }
  double py(double y) const { return bottom - (y - r.y0) / (r.y1 - r.y0) * (bottom - top); }
};

void DrawGridLine(cairo_t* cr, double x0, double y0, double x1, double y1) {
  cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
  cairo_move_to(cr, x0, y0);
  cairo_line_to(cr, x1, y1);
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
}

void DrawAxes(cairo_t* cr, const Frame& f, const PlotOptions& o, const std::string& title) {
  cairo_set_font_size(cr, 12);
  cairo_set_line_width(cr, 1);
  const double xs = NiceStep(f.r.x0, f.r.x1, 8);
  for (double v : LinearTicks(f.r.x0, f.r.x1, xs)) {
    const double x = std::round(f.px(v)) + 0.5;
    DrawGridLine(cr, x, f.top, x, f.bottom);
    cairo_move_to(cr, x, f.bottom);
    cairo_line_to(cr, x, f.bottom + 5);
    cairo_stroke(cr);
    Text(cr, TickLabel(v, xs), x, f.bottom + 8, 0.5, 0);
  }
  for (const auto& [value, pos] : YTicks(f.r, o.log_y)) {
    const double y = std::round(f.py(pos)) + 0.5;
    DrawGridLine(cr, f.left, y, f.right, y);
    cairo_move_to(cr, f.left - 5, y);
    cairo_line_to(cr, f.left, y);
    cairo_stroke(cr);
    Text(cr, TickLabel(value, 0.0), f.left - 8, y, 1, 0.5);
  }
  cairo_rectangle(cr, f.left + 0.5, f.top + 0.5, f.right - f.left, f.bottom - f.top);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 14);
  Text(cr, "step", (f.left + f.right) / 2, f.bottom + 56, 0.5, 1);
  cairo_save(cr);
  cairo_translate(cr, 18, (f.top + f.bottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  Text(cr, o.metric + (o.log_y ? " (log scale)" : ""), 0, 0, 0.5, 0.5);
  cairo_restore(cr);
  cairo_set_font_size(cr, 16);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  Text(cr, title, (f.left + f.right) / 2, 16, 0.5, 0);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

void DrawMarker(cairo_t* cr, const Series& s, double x, double y, double radius) {
  SetColor(cr, s.color);
  cairo_new_path(cr);  // no segment from the current point (a label's end) to the circle
  cairo_arc(cr, x, y, radius, 0, 2 * M_PI);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
}

// The series, clipped to the plot area.
void DrawSeries(cairo_t* cr, const Frame& f, const std::vector<Series>& series, bool log_y) {
  auto y_of = [&](const Point& p) { return f.py(log_y ? std::log10(p.y) : p.y); };
  cairo_save(cr);
  cairo_rectangle(cr, f.left, f.top, f.right - f.left, f.bottom - f.top);
  cairo_clip(cr);
  for (const Series& s : series) {
    if (s.line) {
      SetColor(cr, s.color);
      cairo_set_line_width(cr, 2.5);
      cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
      cairo_move_to(cr, f.px(s.points[0].x), y_of(s.points[0]));
      for (size_t i = 1; i < s.points.size(); ++i) cairo_line_to(cr, f.px(s.points[i].x), y_of(s.points[i]));
      cairo_stroke(cr);
      if (s.points.size() == 1 && !s.markers) {
        cairo_arc(cr, f.px(s.points[0].x), y_of(s.points[0]), 3, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    }
    if (s.markers) {
      for (const Point& p : s.points) DrawMarker(cr, s, f.px(p.x), y_of(p), s.line ? 3.5 : 5);
    }
  }
  cairo_restore(cr);
}

// Top right, inside the plot area: one entry a series.
void DrawLegend(cairo_t* cr, const Frame& f, const std::vector<Series>& series) {
  cairo_set_font_size(cr, 12);
  double text_w = 0;
  for (const Series& s : series) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.label.c_str(), &e);
    text_w = std::max(text_w, e.x_advance);
  }
  const double lw = 56 + text_w, lh = 10 + 20.0 * series.size();
  const double lx = f.right - lw - 10, ly = f.top + 10;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_rectangle(cr, lx, ly, lw, lh);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const double cy = ly + 15 + 20.0 * i;
    if (s.line) {
      SetColor(cr, s.color);
      cairo_set_line_width(cr, 2.5);
      cairo_move_to(cr, lx + 10, cy);
      cairo_line_to(cr, lx + 38, cy);
      cairo_stroke(cr);
    }
    if (s.markers) DrawMarker(cr, s, lx + 24, cy, s.line ? 3.5 : 5);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    Text(cr, s.label, lx + 46, cy, 0, 0.5);
  }
}

// Atomic write: a temporary file next to the target, fsynced, renamed over it.
Status WritePngAtomically(cairo_surface_t* surface, const std::string& png_path) {
  const std::string tmp = png_path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot write plot", png_path, errno);
  PngWriter w{fd, tmp, OkStatus()};
  cairo_status_t cs = cairo_surface_write_to_png_stream(surface, WritePng, &w);
  Status st = w.status;
  if (st.ok() && cs != CAIRO_STATUS_SUCCESS)
    st = InternalError(std::string("cairo: cannot encode PNG: ") + cairo_status_to_string(cs));
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("cannot sync", tmp, errno);
  if (::close(fd) != 0 && st.ok()) st = ErrnoError("cannot close", tmp, errno);
  if (st.ok() && ::rename(tmp.c_str(), png_path.c_str()) != 0)
    st = ErrnoError("cannot write plot", png_path, errno);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace

Status RenderPlot(const std::vector<PlotRun>& runs, const std::string& title, const std::string& png_path,
                  const PlotOptions& options) {
  const int W = options.width, H = options.height;
  if (W < 200 || W > 8192 || H < 150 || H > 8192) {
    return InvalidArgumentError("plot size " + std::to_string(W) + "x" + std::to_string(H) +
                                " is out of range (200..8192 x 150..8192)");
  }
  const std::vector<Series> series = BuildSeries(runs, options);
  if (series.empty()) return NothingToPlot(runs, options);

  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H), cairo_surface_destroy);
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS) {
    return InternalError(std::string("cairo: cannot create a surface: ") +
                         cairo_status_to_string(cairo_surface_status(surface.get())));
  }
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> ctx(cairo_create(surface.get()), cairo_destroy);
  cairo_t* cr = ctx.get();
  SetColor(cr, kPlotBackground);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  const Frame frame{80, W - 24.0, 56, H - 64.0, ComputeRanges(series, options.log_y)};
  DrawAxes(cr, frame, options, title);
  DrawSeries(cr, frame, series, options.log_y);
  DrawLegend(cr, frame, series);
  cairo_surface_flush(surface.get());
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    return InternalError(std::string("cairo: drawing failed: ") + cairo_status_to_string(cairo_status(cr)));
  return WritePngAtomically(surface.get(), png_path);
}

Status RenderLossPlot(const std::vector<nlohmann::json>& metric_records, const std::string& title,
                      const std::string& png_path, const PlotOptions& options) {
  PlotRun run{title, {}};
  for (const nlohmann::json& rec : metric_records) {
    StatusOr<EventLine> ev = ReadEventLine(rec, "metric record");
    if (ev.ok()) run.records.push_back(std::move(*ev));  // else not a trainer record, or a mistyped field
  }
  return RenderPlot({std::move(run)}, title, png_path, options);
}

}  // namespace sftctl::client
