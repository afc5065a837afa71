// The ratio trade-off chart as hand-written SVG (why no library: sweep_plot.h).
#include "tools/eval/sweep_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string_view>

namespace bs::tools {
namespace {

// Geometry (px). Two panels share the x range [kX0, kX1]; the margins hold the axes'
// labels, the x tick labels (two rows when ratios are close) and a legend. Vertical
// positions follow the number of subtitle lines (sweep_svg).
constexpr double kWidth = 960;
constexpr double kX0 = 80, kX1 = 850;
constexpr double kQualityHeight = 300, kTtftHeight = 280, kBetweenPanels = 140, kBelowLastPanel = 90;
struct Panel {
  double top, bottom;
};
constexpr double kMinLabelGap = 34;  // px between two x tick labels on one row

const char* const kF1Color = "#1f77b4";
const char* const kAgreeColor = "#2ca02c";
const char* const kKlColor = "#d62728";
const char* const kTtftColor = "#9467bd";
const char* const kFullColor = "#555555";

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters even escaped.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += ' ';
        else out += c;
    }
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
// A coordinate: finite by construction (every caller clamps), one decimal.
std::string px(double v) { return fmt("%.1f", std::isfinite(v) ? v : 0.0); }
// A value as a label: three significant digits; "inf" / "-inf" as such.
std::string value_label(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt("%.3g", v);
}

// A "nice" tick step (1, 2, 2.5 or 5 times a power of ten) giving about `ticks` steps
// over [0, range].
double nice_step(double range, int ticks = 5) {
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double f = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  return f * mag;
}
// The axis top: v rounded up to its nice step; `fallback` when v is not a positive
// finite number.
double nice_ceil(double v, double fallback) {
  if (!(v > 0) || !std::isfinite(v)) return fallback;
  const double step = nice_step(v);
  return std::ceil(v / step - 1e-9) * step;
}
std::vector<double> ticks_to(double top) {
  const double step = nice_step(top);
  std::vector<double> t;
  const int n = static_cast<int>(std::lround(top / step));
  for (int i = 0; i <= n; ++i) t.push_back(i * step);
  return t;
}

double clamp_value(double v, double top) {
  if (std::isnan(v)) return 0;
  return std::clamp(v, 0.0, top);
}

struct Axes {
  double x_top;  // ratio axis: [0, x_top]
  double x(double ratio) const { return kX0 + clamp_value(ratio, x_top) / x_top * (kX1 - kX0); }
  static double y(double v, double top, const Panel& p) {
    return p.bottom - clamp_value(v, top) / top * (p.bottom - p.top);
  }
};

// The largest finite value of a member over the points (0 if none).
double finite_max(const std::vector<SweepPoint>& pts, double SweepPoint::*m, double extra = 0) {
  double best = std::isfinite(extra) ? extra : 0;
  for (const auto& p : pts)
    if (std::isfinite(p.*m)) best = std::max(best, p.*m);
  return best;
}

class Svg {
 public:
  std::string out;
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1,
            const char* dash = nullptr) {
    out += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
           "\" stroke=\"" + stroke + "\" stroke-width=\"" + fmt("%g", width) + "\"" +
           (dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string()) + "/>\n";
  }
  void text(double x, double y, std::string_view s, const char* anchor = "middle", double size = 12,
            const char* fill = "#222222", const char* extra = "") {
    out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" + anchor + "\" font-size=\"" +
           fmt("%g", size) + "\" fill=\"" + fill + "\"" + extra + ">" + escape(s) + "</text>\n";
  }
  void vertical_text(double x, double y, std::string_view s, const char* fill = "#222222") {
    out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"middle\" font-size=\"12\" fill=\"" + fill +
           "\" transform=\"rotate(-90 " + px(x) + " " + px(y) + ")\">" + escape(s) + "</text>\n";
  }
  // Marker shapes: circle, square, triangle.
  void marker(char shape, double x, double y, const char* color) {
    if (shape == 'o') {
      out += "<circle cx=\"" + px(x) + "\" cy=\"" + px(y) + "\" r=\"4\" fill=\"" + color + "\"/>\n";
    } else if (shape == 's') {
      out += "<rect x=\"" + px(x - 3.5) + "\" y=\"" + px(y - 3.5) + "\" width=\"7\" height=\"7\" fill=\"" + color +
             "\"/>\n";
    } else {
      out += "<polygon points=\"" + px(x) + "," + px(y - 5) + " " + px(x - 4.5) + "," + px(y + 3.5) + " " +
             px(x + 4.5) + "," + px(y + 3.5) + "\" fill=\"" + color + "\"/>\n";
    }
  }
};

// One series: its polyline (finite values only; clamped to the axis), a marker and a
// value label per point. `label` formats a point's label; label_dy places it.
template <class Label>
void series(Svg& svg, const Axes& ax, const std::vector<SweepPoint>& pts, double SweepPoint::*m, double top,
            const Panel& panel, const char* name, char shape, const char* color, double label_dy, Label label) {
  std::string points;
  for (const auto& p : pts) {
    if (std::isnan(p.*m) || std::isnan(p.ratio)) continue;
    if (!points.empty()) points += ' ';
    points += px(ax.x(p.ratio)) + "," + px(Axes::y(p.*m, top, panel));
  }
  svg.out += std::string("<polyline data-series=\"") + name + "\" points=\"" + points + "\" fill=\"none\" stroke=\"" +
             color + "\" stroke-width=\"2\"/>\n";
  for (const auto& p : pts) {
    if (std::isnan(p.*m) || std::isnan(p.ratio)) continue;
    const double x = ax.x(p.ratio), y = Axes::y(p.*m, top, panel);
    svg.marker(shape, x, y, color);
    svg.text(x, y + label_dy, label(p), "middle", 11, color);
  }
}

// A legend row below a panel: (sample kind, color, text); kind 'o'/'s'/'^' a marker
// on a line, '-' a dashed line.
struct LegendItem {
  char kind;
  const char* color;
  std::string text;
};
void legend(Svg& svg, double y, const std::vector<LegendItem>& items) {
  double x = kX0;
  for (const auto& it : items) {
    if (it.kind == '-') {
      svg.line(x, y - 4, x + 26, y - 4, it.color, 1.5, "6 4");
    } else {
      svg.line(x, y - 4, x + 26, y - 4, it.color, 2);
      svg.marker(it.kind, x + 13, y - 4, it.color);
    }
    svg.text(x + 32, y, it.text, "start", 12);
    x += 32 + 6.5 * static_cast<double>(it.text.size()) + 24;
  }
}

// The x axis of a panel: a tick, a grid line and a label at 0 and at each ratio;
// a label too close to the one before it on its row goes to a second row.
void ratio_axis(Svg& svg, const Axes& ax, const std::vector<double>& ratios, const Panel& panel) {
  double last_x[2] = {-1e9, -1e9};
  std::vector<double> at{0.0};
  at.insert(at.end(), ratios.begin(), ratios.end());
  for (double r : at) {
    const double x = ax.x(r);
    if (r > 0) svg.line(x, panel.top, x, panel.bottom, "#e6e6e6");
    svg.line(x, panel.bottom, x, panel.bottom + 5, "#888888");
    const int row = x - last_x[0] >= kMinLabelGap ? 0 : 1;
    last_x[row] = x;
    svg.text(x, panel.bottom + 18 + 14 * row, fmt("%g", r), "middle", 11);
  }
  svg.text((kX0 + kX1) / 2, panel.bottom + 50, "blend recompute ratio (fraction of cached chunk tokens recomputed)",
           "middle", 12);
}

// A y axis: grid (left axis only), ticks and labels at `ticks` (values in the axis'
// unit), positioned by `pos` (value -> y).
template <class Pos>
void y_axis(Svg& svg, const std::vector<double>& ticks, Pos pos, bool right, const char* color,
            const std::string& suffix, bool grid) {
  for (double t : ticks) {
    const double y = pos(t);
    if (grid && t > 0) svg.line(kX0, y, kX1, y, "#e6e6e6");
    if (right) {
      svg.line(kX1, y, kX1 + 5, y, color);
      svg.text(kX1 + 8, y + 4, fmt("%g", t) + suffix, "start", 11, color);
    } else {
      svg.line(kX0 - 5, y, kX0, y, color);
      svg.text(kX0 - 8, y + 4, fmt("%g", t) + suffix, "end", 11, color);
    }
  }
}

void frame(Svg& svg, const Panel& p) {
  svg.out += "<rect x=\"" + px(kX0) + "\" y=\"" + px(p.top) + "\" width=\"" + px(kX1 - kX0) + "\" height=\"" +
             px(p.bottom - p.top) + "\" fill=\"none\" stroke=\"#888888\"/>\n";
}

}  // namespace

std::string sweep_svg(const SweepChart& chart) {
  std::vector<SweepPoint> pts = chart.points;
  std::stable_sort(pts.begin(), pts.end(), [](const SweepPoint& a, const SweepPoint& b) {
    return std::isnan(b.ratio) ? !std::isnan(a.ratio) : a.ratio < b.ratio;  // NaN ratios last
  });
  std::vector<double> ratios;
  for (const auto& p : pts)
    if (std::isfinite(p.ratio) && (ratios.empty() || p.ratio != ratios.back())) ratios.push_back(p.ratio);

  // The ratio axis: up to the largest ratio with a little room, at most 1 (a ratio is
  // a fraction; a larger one is drawn at the edge).
  const Axes ax{std::min(nice_ceil(finite_max(pts, &SweepPoint::ratio) * 1.05, 1.0), 1.0)};
  const double kl_top = nice_ceil(finite_max(pts, &SweepPoint::kl) * 1.15, 0.1);
  const double ttft_top = nice_ceil(finite_max(pts, &SweepPoint::ttft_s, chart.full_ttft_s) * 1.12, 1.0);

  std::vector<std::string> subtitle;
  for (size_t b = 0; b <= chart.subtitle.size();) {
    size_t e = chart.subtitle.find('\n', b);
    if (e == std::string::npos) e = chart.subtitle.size();
    if (e > b) subtitle.push_back(chart.subtitle.substr(b, e - b));
    b = e + 1;
  }
  const double head = 40 + 16 * static_cast<double>(subtitle.size());  // below title and subtitle
  const Panel q{head + 36, head + 36 + kQualityHeight};
  const Panel t{q.bottom + kBetweenPanels, q.bottom + kBetweenPanels + kTtftHeight};
  const double kHeight = t.bottom + kBelowLastPanel;

  Svg svg;
  svg.out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg.out += "<!-- The blend ratio trade-off of blendctl eval, written by tools/eval/sweep_plot.cpp -->\n";
  svg.out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(kWidth) + "\" height=\"" + px(kHeight) +
             "\" viewBox=\"0 0 " + px(kWidth) + " " + px(kHeight) + "\" font-family=\"sans-serif\">\n";
  svg.out += "<title>" + escape(chart.title) + "</title>\n";
  svg.out += "<rect x=\"0\" y=\"0\" width=\"" + px(kWidth) + "\" height=\"" + px(kHeight) + "\" fill=\"#ffffff\"/>\n";
  svg.text(kWidth / 2, 30, chart.title, "middle", 16, "#111111", " font-weight=\"bold\"");
  for (size_t i = 0; i < subtitle.size(); ++i)
    svg.text(kWidth / 2, 50 + 16 * static_cast<double>(i), subtitle[i], "middle", 12, "#444444");

  // Quality: F1 and agreement (left, 0..1), KL (right).
  svg.text(kX0, q.top - 24, "Quality vs full prefill", "start", 13, "#111111", " font-weight=\"bold\"");
  y_axis(svg, ticks_to(1.0), [&](double v) { return Axes::y(v, 1.0, q); }, false, "#222222", "", true);
  y_axis(svg, ticks_to(kl_top), [&](double v) { return Axes::y(v, kl_top, q); }, true, kKlColor, "", false);
  svg.vertical_text(28, (q.top + q.bottom) / 2, "token F1 / top-1 agreement");
  svg.vertical_text(kWidth - 22, (q.top + q.bottom) / 2, "first-token KL from full (nats)", kKlColor);
  ratio_axis(svg, ax, ratios, q);
  frame(svg, q);
  if (std::isfinite(chart.full_f1)) {
    const double y = Axes::y(chart.full_f1, 1.0, q);
    svg.line(kX0, y, kX1, y, kFullColor, 1.5, "6 4");
    svg.text(kX1 - 4, y - 5, "full F1 " + value_label(chart.full_f1), "end", 11, kFullColor);
  }
  series(svg, ax, pts, &SweepPoint::f1, 1.0, q, "f1", 'o', kF1Color, -9,
         [](const SweepPoint& p) { return value_label(p.f1); });
  series(svg, ax, pts, &SweepPoint::agreement, 1.0, q, "agreement", 's', kAgreeColor, -9,
         [](const SweepPoint& p) { return value_label(p.agreement); });
  series(svg, ax, pts, &SweepPoint::kl, kl_top, q, "kl", '^', kKlColor, 17,
         [](const SweepPoint& p) { return value_label(p.kl); });
  legend(svg, q.bottom + 74,
         {{'o', kF1Color, "blend token F1"},
          {'-', kFullColor, "full token F1"},
          {'s', kAgreeColor, "blend top-1 agreement with full"},
          {'^', kKlColor, "blend first-token KL (right axis)"}});

  // TTFT: seconds (left), multiples of full's (right).
  svg.text(kX0, t.top - 24, "Time to first token", "start", 13, "#111111", " font-weight=\"bold\"");
  y_axis(svg, ticks_to(ttft_top), [&](double v) { return Axes::y(v, ttft_top, t); }, false, "#222222", "", true);
  svg.vertical_text(28, (t.top + t.bottom) / 2, "TTFT (s)");
  const bool have_full_ttft = std::isfinite(chart.full_ttft_s) && chart.full_ttft_s > 0;
  if (have_full_ttft) {
    const double full = chart.full_ttft_s;
    const double m_top = ttft_top / full;
    std::vector<double> multiples;
    for (double m : ticks_to(nice_ceil(m_top, 1.0)))
      if (m <= m_top + 1e-9) multiples.push_back(m);
    y_axis(svg, multiples, [&](double m) { return Axes::y(m * full, ttft_top, t); }, true, kFullColor, "x", false);
    svg.vertical_text(kWidth - 22, (t.top + t.bottom) / 2, "TTFT / full prefill's TTFT", kFullColor);
  }
  ratio_axis(svg, ax, ratios, t);
  frame(svg, t);
  if (std::isfinite(chart.full_ttft_s)) {
    const double y = Axes::y(chart.full_ttft_s, ttft_top, t);
    svg.line(kX0, y, kX1, y, kFullColor, 1.5, "6 4");
    svg.text(kX1 - 4, y - 5, "full prefill " + value_label(chart.full_ttft_s) + " s", "end", 11, kFullColor);
  }
  // Seconds above the marker, the multiple of full's below (short labels: close
  // ratios stay readable).
  series(svg, ax, pts, &SweepPoint::ttft_s, ttft_top, t, "ttft", 'o', kTtftColor, -9,
         [](const SweepPoint& p) { return value_label(p.ttft_s) + " s"; });
  for (const auto& p : pts)
    if (!std::isnan(p.ratio) && !std::isnan(p.ttft_s) && !std::isnan(p.ttft_vs_full))
      svg.text(ax.x(p.ratio), Axes::y(p.ttft_s, ttft_top, t) + 17, value_label(p.ttft_vs_full) + "x", "middle", 11,
               kTtftColor);
  legend(svg, t.bottom + 74, {{'o', kTtftColor, "blend TTFT (labels: seconds above, multiple of full's below)"},
                              {'-', kFullColor, "full prefill TTFT"}});
  svg.out += "</svg>\n";
  return svg.out;
}

std::string cpu_model_name(const std::string& cpuinfo_path) {
  std::ifstream in(cpuinfo_path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto b = line.find_first_not_of(" \t", colon + 1);
    const auto e = line.find_last_not_of(" \t\r");
    if (b != std::string::npos && e >= b) return line.substr(b, e - b + 1);
  }
  return "unknown CPU";
}

}  // namespace bs::tools
