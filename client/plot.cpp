#include "client/plot.h"

#include <cairo.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string_view>

#include "common/file_system.h"
#include "common/json_parse.h"

namespace sftctl::client {
namespace {

struct Point {
  double x, y;
};

// A number from a record field, if present and finite.
bool Finite(const nlohmann::json& rec, const char* key, double* out) {
  auto it = rec.find(key);
  if (it == rec.end() || !it->is_number()) return false;
  double v = it->get<double>();
  if (!std::isfinite(v)) return false;
  *out = v;
  return true;
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

StatusOr<std::vector<nlohmann::json>> ReadMetricsFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoError("cannot open metrics file", path, errno);
  std::vector<nlohmann::json> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(line, path + ":" + std::to_string(n)));
    if (!j.is_object()) return InvalidArgumentError(path + ":" + std::to_string(n) + ": not a JSON object");
    out.push_back(std::move(j));
  }
  if (f.bad()) return ErrnoError("cannot read metrics file", path, errno);
  return out;
}

Status RenderLossPlot(const std::vector<nlohmann::json>& metric_records, const std::string& title,
                      const std::string& png_path, const PlotOptions& options) {
  const int W = options.width, H = options.height;
  if (W < 200 || W > 8192 || H < 150 || H > 8192) {
    return InvalidArgumentError("plot size " + std::to_string(W) + "x" + std::to_string(H) +
                                " is out of range (200..8192 x 150..8192)");
  }
  std::vector<Point> train, eval;
  for (const nlohmann::json& rec : metric_records) {
    if (!rec.is_object()) continue;
    auto ev = rec.find("event");
    if (ev == rec.end() || !ev->is_string()) continue;
    Point p{};
    if (*ev == "step" && Finite(rec, "step", &p.x) && Finite(rec, "loss", &p.y)) train.push_back(p);
    if (*ev == "eval" && Finite(rec, "step", &p.x) && Finite(rec, "eval_loss", &p.y)) eval.push_back(p);
  }
  if (train.empty() && eval.empty()) {
    return InvalidArgumentError(
        "nothing to plot: no \"step\" record with a loss and no \"eval\" record with an "
        "eval_loss among " +
        std::to_string(metric_records.size()) + " record(s)");
  }
  auto by_x = [](const Point& a, const Point& b) { return a.x < b.x; };
  std::stable_sort(train.begin(), train.end(), by_x);

  // Data ranges, padded so that flat or single-point series still get an axis.
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto* s : {&train, &eval}) {
    for (const Point& p : *s) {
      x0 = std::min(x0, p.x);
      x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y);
      y1 = std::max(y1, p.y);
    }
  }
  if (x1 - x0 < 1e-12) {
    x0 -= 1;
    x1 += 1;
  }
  if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y0))) {
    double pad = std::max(0.5, std::fabs(y0) * 0.1);
    y0 -= pad;
    y1 += pad;
  }
  // A little room so that markers at the ends are not cut by the frame.
  const double xpad = (x1 - x0) * 0.02, ypad = (y1 - y0) * 0.05;
  x0 -= xpad;
  x1 += xpad;
  y0 -= ypad;
  y1 += ypad;

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

  // Plot area.
  const double left = 80, right = W - 24.0, top = 56, bottom = H - 64.0;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  // Grid, ticks and tick labels.
  cairo_set_font_size(cr, 12);
  cairo_set_line_width(cr, 1);
  const double xs = NiceStep(x0, x1, 8), ys = NiceStep(y0, y1, 6);
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + xs * 1e-9; v += xs) {
    double x = std::round(px(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, x, top);
    cairo_line_to(cr, x, bottom);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_move_to(cr, x, bottom);
    cairo_line_to(cr, x, bottom + 5);
    cairo_stroke(cr);
    Text(cr, TickLabel(v, xs), x, bottom + 8, 0.5, 0);
  }
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + ys * 1e-9; v += ys) {
    double y = std::round(py(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, left, y);
    cairo_line_to(cr, right, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_move_to(cr, left - 5, y);
    cairo_line_to(cr, left, y);
    cairo_stroke(cr);
    Text(cr, TickLabel(v, ys), left - 8, y, 1, 0.5);
  }
  // Axes.
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, left + 0.5, top + 0.5, right - left, bottom - top);
  cairo_stroke(cr);
  // Axis titles and the plot title.
  cairo_set_font_size(cr, 14);
  Text(cr, "step", (left + right) / 2, H - 8.0, 0.5, 1);
  cairo_save(cr);
  cairo_translate(cr, 18, (top + bottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  Text(cr, "loss", 0, 0, 0.5, 0.5);
  cairo_restore(cr);
  cairo_set_font_size(cr, 16);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  Text(cr, title, W / 2.0, 16, 0.5, 0);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  // Series, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, left, top, right - left, bottom - top);
  cairo_clip(cr);
  if (!train.empty()) {
    SetColor(cr, kTrainColor);
    cairo_set_line_width(cr, 2.5);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_move_to(cr, px(train[0].x), py(train[0].y));
    for (size_t i = 1; i < train.size(); ++i) cairo_line_to(cr, px(train[i].x), py(train[i].y));
    cairo_stroke(cr);
    if (train.size() == 1) {
      cairo_arc(cr, px(train[0].x), py(train[0].y), 3, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  }
  for (const Point& p : eval) {
    SetColor(cr, kEvalColor);
    cairo_arc(cr, px(p.x), py(p.y), 5, 0, 2 * M_PI);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.35, 0.2, 0.0);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
  }
  cairo_restore(cr);

  // Legend (top right, inside the plot area): the series present.
  cairo_set_font_size(cr, 12);
  std::vector<std::pair<std::string, bool>> entries;  // label, is_line
  if (!train.empty()) entries.push_back({"train loss", true});
  if (!eval.empty()) entries.push_back({"eval loss", false});
  const double lw = 130, lh = 10 + 20.0 * entries.size();
  const double lx = right - lw - 10, ly = top + 10;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_rectangle(cr, lx, ly, lw, lh);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < entries.size(); ++i) {
    double cy = ly + 15 + 20.0 * i;
    if (entries[i].second) {
      SetColor(cr, kTrainColor);
      cairo_set_line_width(cr, 2.5);
      cairo_move_to(cr, lx + 10, cy);
      cairo_line_to(cr, lx + 38, cy);
      cairo_stroke(cr);
    } else {
      SetColor(cr, kEvalColor);
      cairo_arc(cr, lx + 24, cy, 5, 0, 2 * M_PI);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    Text(cr, entries[i].first, lx + 46, cy, 0, 0.5);
  }
  cairo_surface_flush(surface.get());
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    return InternalError(std::string("cairo: drawing failed: ") + cairo_status_to_string(cairo_status(cr)));

  // Atomic write: a temporary file next to the target, fsynced, renamed over it.
  const std::string tmp = png_path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot write plot", png_path, errno);
  PngWriter w{fd, tmp, OkStatus()};
  cairo_status_t cs = cairo_surface_write_to_png_stream(surface.get(), WritePng, &w);
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

}  // namespace sftctl::client
