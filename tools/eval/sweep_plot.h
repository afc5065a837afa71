// The blend ratio trade-off chart of `blendctl eval --sweep-ratio ... --plot F.svg`:
// quality (F1, top-1 agreement, first-token KL) and TTFT against the recompute ratio,
// as one self-contained SVG file.
//
// Why hand-written SVG and no plotting library: the chart is a few dozen lines,
// circles and labels; a library (matplotlib, gnuplot, a C++ charting package) would
// be a new dependency of a C++ binary that otherwise needs none, and its output
// would depend on the library's version and fonts. Written here the file is
// deterministic, has no scripts, no external fonts (the generic `sans-serif`
// family), no links or images, and the writer is a pure function a unit test reads.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace bs::tools {

// One ratio of the sweep: the means over the evaluated cases. NaN where a value is
// missing (no teacher-forced case: no KL or agreement; no full run: no ttft_vs_full).
struct SweepPoint {
  static constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();
  double ratio = kMissing;
  double f1 = kMissing;
  double kl = kMissing;         // first-token KL from full, nats
  double agreement = kMissing;  // teacher-forced top-1 agreement with full
  double ttft_s = kMissing;
  double ttft_vs_full = kMissing;
  double recomputed_fraction = kMissing;  // recomputed / cached chunk tokens
};

struct SweepChart {
  std::string title;     // first heading line (model, dataset, cases, CPU)
  std::string subtitle;  // below it (blend and run settings); '\n' starts another line
  std::vector<SweepPoint> points;  // any order; drawn sorted by ratio
  double full_f1 = SweepPoint::kMissing;      // dashed reference lines
  double full_ttft_s = SweepPoint::kMissing;
};

// The chart as an SVG document (UTF-8, XML declaration first). Two panels sharing the
// ratio axis: top, F1 and agreement on a fixed 0..1 left axis with full's F1 dashed,
// KL on its own right axis; bottom, TTFT in seconds with full's TTFT dashed and a
// right axis in multiples of full's TTFT. Every point is marked and labelled with its
// value; the x axis is ticked at each swept ratio. Each series is one <polyline>
// (data-series = f1, agreement, kl, ttft). Values outside an axis are drawn at its
// edge (+inf labelled "inf"); a NaN value has no marker and no label, and is left out
// of its polyline. Text is XML-escaped; every coordinate is finite.
std::string sweep_svg(const SweepChart& chart);

// The "model name" of /proc/cpuinfo (first one), or "unknown CPU".
std::string cpu_model_name(const std::string& cpuinfo_path = "/proc/cpuinfo");

}  // namespace bs::tools
