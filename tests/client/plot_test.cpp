// client/metrics/plot.h: the PNG is valid and has the requested size, the curves are drawn in their colors,
// metrics files are read with line-numbered errors, and failures are specific and leave nothing behind.
#include "client/metrics/plot.h"

#include <cairo.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

namespace fs = std::filesystem;
using ::sftctl::testing::MakeTempDir;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::HasSubstr;

std::vector<nlohmann::json> Records() {
  std::vector<nlohmann::json> r = {{{"event", "start"}}};
  for (int s = 1; s <= 50; ++s)
    r.push_back({{"event", "step"}, {"step", s}, {"loss", 3.0 * std::exp(-s / 15.0) + 0.5}});
  for (int s = 10; s <= 50; s += 10)
    r.push_back({{"event", "eval"}, {"step", s}, {"eval_loss", 3.2 * std::exp(-s / 15.0) + 0.7}});
  r.push_back({{"event", "done"}});
  return r;
}

// Pixels of `surface` within `tol` of `c` (per channel), counted inside the rectangle.
int CountColor(cairo_surface_t* surface, PlotRgb c, int tol, int x0, int y0, int x1, int y1) {
  const unsigned char* data = cairo_image_surface_get_data(surface);
  const int stride = cairo_image_surface_get_stride(surface);
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      uint32_t px = *reinterpret_cast<const uint32_t*>(data + y * stride + x * 4);
      int r = (px >> 16) & 0xff, g = (px >> 8) & 0xff, b = px & 0xff;
      n += std::abs(r - c.r) <= tol && std::abs(g - c.g) <= tol && std::abs(b - c.b) <= tol;
    }
  }
  return n;
}

TEST(Plot, WritesAValidPngWithBothCurves) {
  const std::string dir = MakeTempDir("plot-ok");
  const std::string png = dir + "/loss.png";
  PlotOptions opts;
  opts.width = 800;
  opts.height = 500;
  ASSERT_TRUE(RenderLossPlot(Records(), "tiny run", png, opts).ok());

  std::ifstream f(png, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8));

  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(s), 800);
  EXPECT_EQ(cairo_image_surface_get_height(s), 500);
  cairo_surface_flush(s);
  // Inside the plot area (margins are 80 left, 24 right, 56 top, 64 bottom) something is drawn ...
  const int area = (800 - 24 - 80) * (500 - 64 - 56);
  EXPECT_LT(CountColor(s, kPlotBackground, 0, 80, 56, 800 - 24, 500 - 64), area * 98 / 100);
  // ... including the train line and the eval markers in their colors (not only the legend's samples).
  EXPECT_GT(CountColor(s, kTrainColor, 12, 80, 56, 560, 500 - 64), 200);
  EXPECT_GT(CountColor(s, kEvalColor, 12, 80, 56, 560, 500 - 64), 100);
  cairo_surface_destroy(s);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "loss.png") << "temp left";
  fs::remove_all(dir);
}

TEST(Plot, TrainOnlyAndSinglePointsStillPlot) {
  const std::string dir = MakeTempDir("plot-one");
  ASSERT_TRUE(
      RenderLossPlot({{{"event", "step"}, {"step", 1}, {"loss", 2.0}}}, "one step", dir + "/a.png").ok());
  cairo_surface_t* s = cairo_image_surface_create_from_png((dir + "/a.png").c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(s), PlotOptions().width);
  EXPECT_EQ(CountColor(s, kEvalColor, 12, 0, 0, PlotOptions().width, PlotOptions().height), 0)
      << "no eval series";
  cairo_surface_destroy(s);
  fs::remove_all(dir);
}

// Runs `body` in a child process: true when it exited 0 within `seconds` (else the child is killed).
bool FinishesWithin(int seconds, const std::function<bool()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body() ? 0 : 1);
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    ::usleep(50000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return false;
}

// Issue 37, item 6: steps 1e16 and 1e16 + 2 made `sftctl plot` spin until killed (an absolute flat-range
// guard, and tick positions reached by adding a step below one ulp). Now it draws them, and huge or
// nearly equal values on either axis, at once.
TEST(Plot, HugeNearlyEqualStepsAndValuesStillPlot) {
  const std::string dir = MakeTempDir("plot-huge");
  const int64_t big = 10000000000000000;  // 1e16: doubles there are 2 apart
  const std::vector<std::vector<nlohmann::json>> cases = {
      {{{"event", "step"}, {"step", big}, {"loss", 1.0}},
       {{"event", "step"}, {"step", big + 2}, {"loss", 2.0}}},
      {{{"event", "step"}, {"step", 1}, {"loss", 1e16}},
       {{"event", "step"}, {"step", 2}, {"loss", 1e16 + 2}}},
      {{{"event", "step"}, {"step", 1}, {"loss", 1e300}}, {{"event", "step"}, {"step", 2}, {"loss", -1e300}}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string png = dir + "/" + std::to_string(i) + ".png";
    EXPECT_TRUE(FinishesWithin(60, [&] { return RenderLossPlot(cases[i], "huge", png).ok(); }))
        << "case " << i << " did not finish";
    cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
    EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << "case " << i;
    cairo_surface_destroy(s);
  }
  fs::remove_all(dir);
}

TEST(Plot, ErrorsAreSpecific) {
  const std::string dir = MakeTempDir("plot-err");
  // No data: only records without losses (a non-finite loss, written as null, does not count; a record
  // whose loss is not a number is no trainer record and is not counted at all).
  Status none = RenderLossPlot({{{"event", "start"}},
                                {{"event", "step"}, {"step", 1}, {"loss", nullptr}},
                                {{"event", "step"}, {"step", 2}, {"loss", "nan"}}},
                               "t", dir + "/x.png");
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      none.message(),
      "nothing to plot: no \"step\" record with a loss and no \"eval\" record with an eval_loss among 2 "
      "record(s)");
  EXPECT_FALSE(fs::exists(dir + "/x.png"));
  // A folder that does not exist: the message names the target.
  Status missing = RenderLossPlot(Records(), "t", dir + "/no/such/dir/x.png");
  EXPECT_THAT(missing,
              StatusIs(StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr("cannot write plot '" + dir + "/no/such/dir/x.png'"),
                                        HasSubstr("No such file or directory"))));
  // An unwritable folder (unless running as root, who may write anyway).
  if (::geteuid() != 0) {
    fs::create_directories(dir + "/ro");
    ::chmod((dir + "/ro").c_str(), 0555);
    Status ro = RenderLossPlot(Records(), "t", dir + "/ro/x.png");
    EXPECT_THAT(ro, StatusIs(StatusCode::kPermissionDenied, HasSubstr("Permission denied")));
    EXPECT_TRUE(fs::is_empty(dir + "/ro")) << "no temporary file is left behind";
    ::chmod((dir + "/ro").c_str(), 0755);
  }
  PlotOptions tiny;
  tiny.width = 10;
  EXPECT_EQ(RenderLossPlot(Records(), "t", dir + "/x.png", tiny).message(),
            "plot size 10x600 is out of range (200..8192 x 150..8192)");
  fs::remove_all(dir);
}

TEST(Plot, ReadMetricsFileNamesTheBadLine) {
  const std::string dir = MakeTempDir("plot-read");
  const std::string path = dir + "/metrics.jsonl";
  std::ofstream(path) << "{\"event\": \"start\"}\n\n{\"event\": \"step\", \"step\": 1, \"loss\": 2}\n";
  auto ok = ReadMetricsFile(path);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[1].loss, 2.0);
  EXPECT_EQ((*ok)[1].json["loss"], 2);

  std::ofstream(path) << "{\"event\": \"start\"}\n{\"event\": \"step\", \"step\": 1, \"lo\n";
  auto bad = ReadMetricsFile(path);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind(path + ":2: invalid JSON: ", 0), 0u) << bad.status().message();

  std::ofstream(path) << "{\"event\": \"start\"}\n[1, 2]\n";
  EXPECT_EQ(ReadMetricsFile(path).status().message(), path + ":2: expected a JSON object, got array");
  // Issue 49: each line is read as an event line (common/event_line.h), the field named.
  std::ofstream(path) << "{\"event\": \"start\"}\n{\"event\": \"step\", \"step\": \"1\"}\n";
  EXPECT_EQ(ReadMetricsFile(path).status().message(),
            path + ":2: field 'step': expected an integer, got string");
  std::ofstream(path) << "{\"step\": 1, \"loss\": 2}\n";
  EXPECT_EQ(ReadMetricsFile(path).status().message(),
            path + ":1: field 'event': missing (expected a string)");

  auto missing = ReadMetricsFile(dir + "/nope.jsonl");
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound, HasSubstr(dir + "/nope.jsonl")));
  fs::remove_all(dir);
}

// A run whose loss falls as a * exp(-s / 12) + c, with eval exact_match rising (faster with a larger a).
std::vector<EventLine> DecayRun(double a, double c) {
  std::vector<nlohmann::json> r;
  for (int s = 1; s <= 50; ++s)
    r.push_back({{"event", "step"}, {"step", s}, {"loss", a * std::exp(-s / 12.0) + c}});
  for (int s = 10; s <= 50; s += 10) {
    r.push_back({{"event", "eval"},
                 {"step", s},
                 {"eval_loss", a * std::exp(-s / 12.0) + c + 0.2},
                 {"exact_match", s / 60.0 * a / 3}});
  }
  std::vector<EventLine> lines;
  for (const nlohmann::json& rec : r) {
    StatusOr<EventLine> ev = ReadEventLine(rec, "record");
    EXPECT_TRUE(ev.ok()) << ev.status().ToString();
    if (ev.ok()) lines.push_back(std::move(*ev));
  }
  return lines;
}

// The mean row of the pixels of colour `c` in column x (-1 when none).
double MeanRow(cairo_surface_t* s, PlotRgb c, int x, int y0, int y1) {
  double sum = 0;
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    if (CountColor(s, c, 12, x, y, x + 1, y + 1)) sum += y, ++n;
  }
  return n ? sum / n : -1;
}

TEST(Plot, SeveralRunsShareOneChartEachInItsColour) {
  TempDir dir("plot-runs");
  const std::string png = dir.path() + "/cmp.png";
  ASSERT_TRUE(RenderPlot({{"a", DecayRun(3, 0.5)}, {"b", DecayRun(2, 0.8)}, {"c", DecayRun(1, 1.0)}},
                         "a vs b vs c", png)
                  .ok());
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  // Each run's line and markers, in the plot area left of the legend.
  for (int i = 0; i < 3; ++i) EXPECT_GT(CountColor(s, kRunColors[i], 12, 80, 56, 700, 600 - 64), 200) << i;
  EXPECT_EQ(CountColor(s, kRunColors[3], 12, 0, 0, 960, 600), 0);
  cairo_surface_destroy(s);
}

TEST(Plot, LogYDrawsExponentialDecayAsAStraightLine) {
  TempDir dir("plot-log");
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 50; ++s)
    records.push_back({{"event", "step"}, {"step", s}, {"loss", 100 * std::exp(-s / 8.0)}});
  records.push_back({{"event", "step"}, {"step", 51}, {"loss", 0.0}});  // not drawable on a log axis
  for (bool log_y : {true, false}) {
    const std::string png = dir.path() + (log_y ? "/log.png" : "/lin.png");
    PlotOptions o;
    o.log_y = log_y;
    ASSERT_TRUE(RenderLossPlot(records, "decay", png, o).ok());
    cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
    ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
    // The line's columns: its first and last, and the middle (step 25.5 on a linear x axis).
    int first = -1, last = -1;
    for (int x = 81; x < 960 - 24; ++x) {
      if (MeanRow(s, kTrainColor, x, 57, 600 - 64) >= 0) (first < 0 ? first : last) = x;
    }
    ASSERT_GT(last, first + 100);
    const double y_first = MeanRow(s, kTrainColor, first + 3, 57, 600 - 64);
    const double y_last = MeanRow(s, kTrainColor, last - 3, 57, 600 - 64);
    const double y_mid = MeanRow(s, kTrainColor, (first + last) / 2, 57, 600 - 64);
    if (log_y) {
      EXPECT_NEAR(y_mid, (y_first + y_last) / 2, 4) << first << " " << last;
    } else {
      EXPECT_GT(y_mid - (y_first + y_last) / 2, 100);  // the linear axis bends it far below the chord
    }
    cairo_surface_destroy(s);
  }
  PlotOptions o;
  o.log_y = true;
  EXPECT_EQ(
      RenderLossPlot({{{"event", "step"}, {"step", 1}, {"loss", -1.0}}}, "t", dir.path() + "/x.png", o)
          .message(),
      "nothing to plot: no \"step\" record with a loss and no \"eval\" record with an eval_loss among 1 "
      "record(s) (--log-y: above 0)");
}

TEST(Plot, AnotherMetricIsDrawnFromTheRecordsThatHaveIt) {
  TempDir dir("plot-metric");
  PlotOptions o;
  o.metric = "exact_match";
  const std::string png = dir.path() + "/em.png";
  ASSERT_TRUE(RenderPlot({{"a", DecayRun(3, 0.5)}, {"b", DecayRun(2, 0.8)}}, "exact match", png, o).ok());
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  EXPECT_GT(CountColor(s, kRunColors[0], 12, 80, 56, 700, 600 - 64), 100);
  EXPECT_GT(CountColor(s, kRunColors[1], 12, 80, 56, 700, 600 - 64), 100);
  cairo_surface_destroy(s);
  o.metric = "gpu_util_pct";
  EXPECT_EQ(RenderPlot({{"a", DecayRun(3, 0.5)}}, "t", dir.path() + "/x.png", o).message(),
            "nothing to plot: no record with a step and a number 'gpu_util_pct' among 55 record(s)");
  EXPECT_FALSE(fs::exists(dir.path() + "/x.png"));
}

}  // namespace
}  // namespace sftctl::client
