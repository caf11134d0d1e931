// Loss-curve plots: a run's metric records (metrics.jsonl, or the events the agent journaled) drawn as a
// PNG with Cairo, for `sftctl plot`.
//
// What is drawn: the train loss of "step" records ({"event":"step","step":N,"loss":X}) as a line in
// kTrainColor, the eval loss of "eval" records ({"event":"eval","step":N,"eval_loss":X}) as round markers
// in kEvalColor, on a white background with x ("step") and y ("loss") axes, tick labels, a legend naming
// the series present, and the title on top. Other records, and points whose step or loss is missing,
// not a number or not finite, are ignored.
//
// Thread safety: the functions share no state; each call renders into its own surface.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

struct PlotRgb {
  uint8_t r, g, b;
};
inline constexpr PlotRgb kTrainColor{31, 119, 180};  // blue
inline constexpr PlotRgb kEvalColor{255, 127, 14};   // orange
inline constexpr PlotRgb kPlotBackground{255, 255, 255};

struct PlotOptions {
  int width = 960;   // pixels, 200..8192
  int height = 600;  // pixels, 150..8192
};

// Reads a JSON-lines metrics file (blank lines skipped). Errors: NOT_FOUND / errno errors naming the
// path; INVALID_ARGUMENT "<path>:<line>: not valid JSON: ..." or "<path>:<line>: not a JSON object".
StatusOr<std::vector<nlohmann::json>> ReadMetricsFile(const std::string& path);

// Renders the plot and writes it to `png_path` atomically (a temporary file in the same folder, fsynced,
// then renamed over `png_path`; nothing is left behind on failure). Errors: INVALID_ARGUMENT when no
// record has a train or eval loss to draw ("nothing to plot: ...") or the size is out of range; errno
// errors naming the path when the file cannot be written (missing folder, no permission);
// INTERNAL for a Cairo failure.
Status RenderLossPlot(const std::vector<nlohmann::json>& metric_records, const std::string& title,
                      const std::string& png_path, const PlotOptions& options = {});

}  // namespace sftctl::client
