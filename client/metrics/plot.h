// Metric plots: runs' metric records (metrics.jsonl, or the events the agent journaled) drawn as one PNG
// with Cairo, for `sftctl plot` (docs/observability.md).
//
// What is drawn, for metric "loss" (the default): each run's train loss of "step" records
// ({"event":"step","step":N,"loss":X}) as a line and its eval loss of "eval" records ({"event":"eval",
// "step":N,"eval_loss":X}) as round markers; for another metric (e.g. "exact_match", "lr",
// "gpu_mem_allocated_mb"), that field of every record that has it, as a line with markers. One run is
// drawn in kTrainColor (line) and kEvalColor (markers); several runs take kRunColors in order, the line
// and the markers of a run in its colour. White background, x ("step") and y (the metric) axes, tick
// labels (decades with log_y), a legend naming each series, the title on top. Other records, and points
// whose step or value is missing, not a number or not finite (with log_y: not above 0), are ignored.
//
// Thread safety: the functions share no state; each call renders into its own surface.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/event_line.h"
#include "common/status.h"

namespace sftctl::client {

struct PlotRgb {
  uint8_t r, g, b;
};
inline constexpr PlotRgb kTrainColor{31, 119, 180};  // blue
inline constexpr PlotRgb kEvalColor{255, 127, 14};   // orange
inline constexpr PlotRgb kPlotBackground{255, 255, 255};

// Several runs: run i is drawn in kRunColors[i % 8] (tab10's first eight).
inline constexpr PlotRgb kRunColors[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                         {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}};

struct PlotOptions {
  int width = 960;              // pixels, 200..8192
  int height = 600;             // pixels, 150..8192
  bool log_y = false;           // logarithmic y axis
  std::string metric = "loss";  // "loss" (train + eval loss) or a record field
};

// One run's records, each read once as an event line (common/event_line.h), and its legend label.
struct PlotRun {
  std::string label;
  std::vector<EventLine> records;
};

// Reads a JSON-lines metrics file (blank lines skipped); every line must read as an event line
// (common/event_line.h). Errors: NOT_FOUND / errno errors naming the path; INVALID_ARGUMENT
// "<path>:<line>: ..." with ParseEventLine's reason (not JSON, not an object, no "event", a field of
// the wrong type).
StatusOr<std::vector<EventLine>> ReadMetricsFile(const std::string& path);

// Renders the plot and writes it to `png_path` atomically (a temporary file in the same folder, fsynced,
// then renamed over `png_path`; nothing is left behind on failure). Errors: INVALID_ARGUMENT when no
// run has a point to draw ("nothing to plot: ...", naming the metric) or the size is out of range; errno
// errors naming the path when the file cannot be written (missing folder, no permission);
// INTERNAL for a Cairo failure.
Status RenderPlot(const std::vector<PlotRun>& runs, const std::string& title, const std::string& png_path,
                  const PlotOptions& options = {});

// RenderPlot of one run whose records were built in code (each read with ReadEventLine; one that does
// not read as an event line is left out).
Status RenderLossPlot(const std::vector<nlohmann::json>& metric_records, const std::string& title,
                      const std::string& png_path, const PlotOptions& options = {});

}  // namespace sftctl::client
