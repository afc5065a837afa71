// The ratio trade-off chart (tools/eval/sweep_plot.h): well-formed XML, one polyline
// per series, every ratio labelled, finite coordinates inside the plot, clamping,
// missing values, escaping. No model.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tools/eval/sweep_plot.h"

namespace {

using bs::tools::SweepChart;
using bs::tools::SweepPoint;

// A minimal XML reader, enough to say an SVG is well-formed: one root element, tags
// balanced, attributes quoted, no raw '<' or bare '&' in text or values, comments
// without "--", only whitespace outside the root. Keeps each element's name,
// attributes (entities decoded) and direct text.
struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;
};

struct Parsed {
  std::string error;  // empty: well-formed
  std::vector<Element> elements;
};

bool decode(const std::string& raw, std::string& out) {
  out.clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '<') return false;
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    static const std::pair<const char*, char> entities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool ok = false;
    for (const auto& [name, ch] : entities) {
      if (raw.compare(i, std::strlen(name), name) == 0) {
        out += ch;
        i += std::strlen(name) - 1;
        ok = true;
        break;
      }
    }
    if (!ok) return false;
  }
  return true;
}

Parsed parse_xml(const std::string& doc) {
  Parsed r;
  size_t i = 0;
  auto fail = [&](const std::string& why) {
    r.error = why + " at offset " + std::to_string(i);
    return r;
  };
  if (doc.rfind("<?xml ", 0) == 0) {
    i = doc.find("?>");
    if (i == std::string::npos) return fail("unterminated XML declaration");
    i += 2;
  }
  std::vector<size_t> open;  // indices into elements
  bool had_root = false;
  while (i < doc.size()) {
    if (doc[i] != '<') {
      const size_t e = doc.find('<', i);
      const std::string raw = doc.substr(i, e == std::string::npos ? std::string::npos : e - i);
      std::string text;
      if (!decode(raw, text)) return fail("bad text");
      if (open.empty()) {
        if (raw.find_first_not_of(" \t\r\n") != std::string::npos) return fail("text outside the root");
      } else {
        r.elements[open.back()].text += text;
      }
      if (e == std::string::npos) break;
      i = e;
      continue;
    }
    if (doc.compare(i, 4, "<!--") == 0) {
      const size_t e = doc.find("-->", i + 4);
      if (e == std::string::npos) return fail("unterminated comment");
      if (doc.substr(i + 4, e - i - 4).find("--") != std::string::npos) return fail("\"--\" in a comment");
      i = e + 3;
      continue;
    }
    const size_t e = doc.find('>', i);
    if (e == std::string::npos) return fail("unterminated tag");
    std::string tag = doc.substr(i + 1, e - i - 1);
    if (tag.find('<') != std::string::npos) return fail("'<' in a tag");
    if (!tag.empty() && tag[0] == '/') {
      if (open.empty() || r.elements[open.back()].name != tag.substr(1)) return fail("unbalanced </" + tag.substr(1));
      open.pop_back();
      i = e + 1;
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    Element el;
    size_t p = 0;
    while (p < tag.size() && !std::isspace(static_cast<unsigned char>(tag[p]))) el.name += tag[p++];
    if (el.name.empty()) return fail("empty tag name");
    while (true) {
      while (p < tag.size() && std::isspace(static_cast<unsigned char>(tag[p]))) ++p;
      if (p >= tag.size()) break;
      const size_t eq = tag.find('=', p);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"') return fail("bad attribute");
      const std::string name = tag.substr(p, eq - p);
      const size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return fail("unterminated attribute");
      std::string value;
      if (!decode(tag.substr(eq + 2, close - eq - 2), value)) return fail("bad attribute value");
      if (el.attrs.count(name)) return fail("repeated attribute " + name);
      el.attrs[name] = value;
      p = close + 1;
      if (p < tag.size() && !std::isspace(static_cast<unsigned char>(tag[p]))) return fail("no space after attribute");
    }
    if (open.empty()) {
      if (had_root) return fail("a second root");
      had_root = true;
    }
    r.elements.push_back(el);
    if (!self_closing) open.push_back(r.elements.size() - 1);
    i = e + 1;
  }
  if (!open.empty()) {
    r.error = "unclosed <" + r.elements[open.back()].name + ">";
  } else if (!had_root) {
    r.error = "no root element";
  }
  return r;
}

std::vector<const Element*> all(const Parsed& p, const std::string& name) {
  std::vector<const Element*> out;
  for (const auto& e : p.elements)
    if (e.name == name) out.push_back(&e);
  return out;
}

std::vector<std::pair<double, double>> polyline_points(const Element& e) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(e.attrs.at("points"));
  std::string xy;
  while (in >> xy) {
    const size_t comma = xy.find(',');
    out.emplace_back(std::stod(xy.substr(0, comma)), std::stod(xy.substr(comma + 1)));
  }
  return out;
}

const Element* series(const Parsed& p, const std::string& name) {
  for (const auto* e : all(p, "polyline"))
    if (e->attrs.count("data-series") && e->attrs.at("data-series") == name) return e;
  return nullptr;
}

bool has_text(const Parsed& p, const std::string& text) {
  for (const auto* e : all(p, "text"))
    if (e->text == text) return true;
  return false;
}

// The plot frames: the unfilled rects with the frame's stroke.
struct Box {
  double x0, y0, x1, y1;
  bool contains(double x, double y) const {
    return x >= x0 - 0.05 && x <= x1 + 0.05 && y >= y0 - 0.05 && y <= y1 + 0.05;
  }
};
std::vector<Box> frames(const Parsed& p) {
  std::vector<Box> out;
  for (const auto* e : all(p, "rect"))
    if (e->attrs.at("fill") == "none") {
      const double x = std::stod(e->attrs.at("x")), y = std::stod(e->attrs.at("y"));
      out.push_back({x, y, x + std::stod(e->attrs.at("width")), y + std::stod(e->attrs.at("height"))});
    }
  return out;
}

// Every coordinate attribute is a finite number inside the canvas.
void expect_finite_coordinates_inside(const Parsed& p) {
  const auto& svg = p.elements.at(0);
  const double w = std::stod(svg.attrs.at("width")), h = std::stod(svg.attrs.at("height"));
  for (const auto& e : p.elements) {
    for (const auto& [k, v] : e.attrs) {
      const bool is_x = k == "x" || k == "x1" || k == "x2" || k == "cx";
      const bool is_y = k == "y" || k == "y1" || k == "y2" || k == "cy";
      if (!is_x && !is_y && k != "width" && k != "height" && k != "points") continue;
      if (e.name == "svg") continue;
      if (k == "points") {
        std::istringstream in(v);
        std::string xy;
        while (in >> xy) {
          const size_t comma = xy.find(',');
          ASSERT_NE(comma, std::string::npos) << xy;
          const double x = std::stod(xy.substr(0, comma)), y = std::stod(xy.substr(comma + 1));
          EXPECT_TRUE(std::isfinite(x) && std::isfinite(y)) << e.name << " " << v;
          EXPECT_TRUE(x >= 0 && x <= w && y >= 0 && y <= h) << e.name << " " << v;
        }
        continue;
      }
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      EXPECT_EQ(*end, '\0') << e.name << " " << k << "=" << v;
      EXPECT_TRUE(std::isfinite(d)) << e.name << " " << k << "=" << v;
      if (is_x) {
        EXPECT_TRUE(d >= 0 && d <= w) << e.name << " " << k << "=" << v;
      }
      if (is_y) {
        EXPECT_TRUE(d >= 0 && d <= h) << e.name << " " << k << "=" << v;
      }
    }
  }
}

SweepChart shipped_like() {
  SweepChart c;
  c.title = "Blend ratio trade-off: SmolLM2-135M-Instruct.Q4_1.gguf on rag_qa.jsonl, 240 cases, AMD EPYC";
  c.subtitle = "blend: check layers 1,2,3,4,5,6\nkernels cpu/avx2, f32, KV f16";
  const double ratio[] = {0.05, 0.1, 0.15, 0.25, 0.5};
  for (int i = 0; i < 5; ++i) {
    SweepPoint p;
    p.ratio = ratio[i];
    p.f1 = 0.10 + 0.01 * i;
    p.kl = 0.12 - 0.02 * i;
    p.agreement = 0.78 + 0.03 * i;
    p.ttft_s = 1.2 + 4 * ratio[i];
    p.ttft_vs_full = p.ttft_s / 6.5;
    p.recomputed_fraction = ratio[i];
    c.points.push_back(p);
  }
  c.full_f1 = 0.133;
  c.full_ttft_s = 6.5;
  return c;
}

// The checker itself: it rejects what an XML parser rejects.
TEST(SweepPlot, TheWellFormednessCheckRejectsBrokenXml) {
  EXPECT_EQ(parse_xml("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t &amp; u</a>\n").error, "");
  for (const char* bad : {"<a><b></a>", "<a>", "<a></a><b/>", "<a>x &y</a>", "<a x=1/>", "<a x=\"<\"/>",
                          "<!-- a -- b --><a/>", "t<a/>", "<a/>t", "<a x=\"1\"y=\"2\"/>", "<a x=\"1\" x=\"2\"/>", ""})
    EXPECT_NE(parse_xml(bad).error, "") << bad;
}

TEST(SweepPlot, IsWellFormedWithOnePolylinePerSeriesAndEveryRatioLabelled) {
  const std::string svg = bs::tools::sweep_svg(shipped_like());
  const Parsed p = parse_xml(svg);
  ASSERT_EQ(p.error, "") << svg;
  ASSERT_FALSE(p.elements.empty());
  EXPECT_EQ(p.elements[0].name, "svg");
  EXPECT_EQ(all(p, "polyline").size(), 4u);
  for (const char* s : {"f1", "agreement", "kl", "ttft"}) {
    const Element* e = series(p, s);
    ASSERT_NE(e, nullptr) << s;
    EXPECT_EQ(polyline_points(*e).size(), 5u) << s;
  }
  for (const char* r : {"0.05", "0.1", "0.15", "0.25", "0.5"}) EXPECT_TRUE(has_text(p, r)) << r;
  // Title and subtitle lines, the values as labels, full's dashed lines and legend.
  EXPECT_TRUE(has_text(p, shipped_like().title));
  EXPECT_TRUE(has_text(p, "blend: check layers 1,2,3,4,5,6"));
  EXPECT_TRUE(has_text(p, "kernels cpu/avx2, f32, KV f16"));
  EXPECT_EQ(all(p, "title").size(), 1u);
  EXPECT_TRUE(has_text(p, "0.13"));    // f1 of the 4th point (0.10 + 0.03)
  EXPECT_TRUE(has_text(p, "0.08"));    // KL of the 3rd (0.12 - 0.04)
  EXPECT_TRUE(has_text(p, "3.2 s"));   // TTFT at 0.5
  EXPECT_TRUE(has_text(p, "full F1 0.133"));
  EXPECT_TRUE(has_text(p, "full prefill 6.5 s"));
  EXPECT_TRUE(has_text(p, "full prefill TTFT"));
  EXPECT_TRUE(has_text(p, "blend token F1"));
  int dashed = 0;
  for (const auto* e : all(p, "line")) dashed += e->attrs.count("stroke-dasharray") > 0;
  EXPECT_GE(dashed, 2);
  EXPECT_EQ(frames(p).size(), 2u);  // two panels
  // Markers: a circle per F1 and TTFT point, a rect per agreement point, a polygon per KL point
  // (plus the legend's samples: one each).
  EXPECT_EQ(all(p, "circle").size(), 5u + 5u + 2u);
  EXPECT_EQ(all(p, "polygon").size(), 5u + 1u);
  expect_finite_coordinates_inside(p);
  // Self-contained: no scripts, links, external resources; the only URL is the namespace.
  for (const char* bad : {"<script", "href", "url(", "@import", "<image", "<foreignObject"})
    EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
  EXPECT_EQ(svg.find("http"), svg.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(svg.find("http", svg.find("http") + 1), std::string::npos);
  // Points sorted by ratio: x increases along each polyline.
  for (const char* s : {"f1", "ttft"}) {
    const auto pts = polyline_points(*series(p, s));
    for (size_t i = 1; i < pts.size(); ++i) EXPECT_LT(pts[i - 1].first, pts[i].first) << s;
  }
  // Higher is up: TTFT grows with the ratio, so its y falls.
  const auto ttft = polyline_points(*series(p, "ttft"));
  EXPECT_GT(ttft.front().second, ttft.back().second);
}

TEST(SweepPlot, UnsortedPointsAreDrawnInRatioOrder) {
  SweepChart c = shipped_like();
  std::swap(c.points[0], c.points[4]);
  std::swap(c.points[1], c.points[3]);
  EXPECT_EQ(bs::tools::sweep_svg(c), bs::tools::sweep_svg(shipped_like()));
}

TEST(SweepPlot, ValuesOutsideTheAxesAreClampedInsideThePlot) {
  SweepChart c = shipped_like();
  c.points[0].f1 = 1.7;         // above the fixed 0..1 axis
  c.points[1].agreement = -0.3;  // below it
  c.points[2].kl = std::numeric_limits<double>::infinity();
  c.points[3].ttft_s = -2;
  c.points[4].ratio = 1.5;  // past the ratio axis' end (at most 1)
  c.points[4].f1 = -std::numeric_limits<double>::infinity();
  c.full_f1 = 3;
  const std::string svg = bs::tools::sweep_svg(c);
  const Parsed p = parse_xml(svg);
  ASSERT_EQ(p.error, "") << svg;
  const auto boxes = frames(p);
  ASSERT_EQ(boxes.size(), 2u);
  for (const char* s : {"f1", "agreement", "kl", "ttft"}) {
    const auto pts = polyline_points(*series(p, s));
    EXPECT_EQ(pts.size(), 5u) << s;
    for (const auto& [x, y] : pts) EXPECT_TRUE(boxes[0].contains(x, y) || boxes[1].contains(x, y)) << s << " " << x << "," << y;
  }
  // Clamped to the edges: F1 1.7 on the top of the quality panel, -0.3 on its bottom.
  EXPECT_DOUBLE_EQ(polyline_points(*series(p, "f1"))[0].second, boxes[0].y0);
  EXPECT_DOUBLE_EQ(polyline_points(*series(p, "agreement"))[1].second, boxes[0].y1);
  EXPECT_DOUBLE_EQ(polyline_points(*series(p, "kl"))[2].second, boxes[0].y0);
  EXPECT_DOUBLE_EQ(polyline_points(*series(p, "ttft"))[3].second, boxes[1].y1);
  EXPECT_DOUBLE_EQ(polyline_points(*series(p, "f1"))[4].first, boxes[0].x1);
  // The labels keep the true values.
  EXPECT_TRUE(has_text(p, "1.7"));
  EXPECT_TRUE(has_text(p, "inf"));
  EXPECT_TRUE(has_text(p, "-inf"));
  EXPECT_TRUE(has_text(p, "1.5"));
  expect_finite_coordinates_inside(p);
  for (const char* bad : {"nan", "NaN", "=\"inf", "=\"-inf"}) EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
}

TEST(SweepPlot, MissingValuesHaveNoMarkerAndNoPolylinePoint) {
  SweepChart c = shipped_like();
  c.points[1].kl = SweepPoint::kMissing;
  c.points[1].agreement = SweepPoint::kMissing;
  c.points[3].ttft_vs_full = SweepPoint::kMissing;
  c.full_f1 = SweepPoint::kMissing;
  c.full_ttft_s = SweepPoint::kMissing;
  const std::string svg = bs::tools::sweep_svg(c);
  const Parsed p = parse_xml(svg);
  ASSERT_EQ(p.error, "") << svg;
  EXPECT_EQ(polyline_points(*series(p, "kl")).size(), 4u);
  EXPECT_EQ(polyline_points(*series(p, "agreement")).size(), 4u);
  EXPECT_EQ(polyline_points(*series(p, "f1")).size(), 5u);
  EXPECT_EQ(all(p, "polygon").size(), 4u + 1u);
  EXPECT_FALSE(has_text(p, "full F1 0.133"));
  EXPECT_EQ(svg.find("full prefill 6.5 s"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  expect_finite_coordinates_inside(p);
}

TEST(SweepPlot, OnePointAndNoPointsStillDrawTheAxes) {
  SweepChart one;
  one.title = "one";
  SweepPoint pt;
  pt.ratio = 0.1;
  pt.f1 = 0.2;
  pt.ttft_s = 0.4;
  one.points.push_back(pt);
  one.full_ttft_s = 1.6;
  Parsed p = parse_xml(bs::tools::sweep_svg(one));
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(has_text(p, "0.1"));
  EXPECT_EQ(polyline_points(*series(p, "f1")).size(), 1u);
  EXPECT_EQ(polyline_points(*series(p, "kl")).size(), 0u);
  expect_finite_coordinates_inside(p);

  const std::string empty = bs::tools::sweep_svg(SweepChart{});
  p = parse_xml(empty);
  ASSERT_EQ(p.error, "") << empty;
  EXPECT_EQ(all(p, "polyline").size(), 4u);
  EXPECT_EQ(frames(p).size(), 2u);
  expect_finite_coordinates_inside(p);
}

TEST(SweepPlot, TextIsEscaped) {
  SweepChart c = shipped_like();
  c.title = "a <b> & \"c\" 'd' --> e\x01";
  c.subtitle = "x < y";
  const std::string svg = bs::tools::sweep_svg(c);
  const Parsed p = parse_xml(svg);
  ASSERT_EQ(p.error, "") << svg;
  EXPECT_TRUE(has_text(p, "a <b> & \"c\" 'd' --> e "));
  EXPECT_TRUE(has_text(p, "x < y"));
}

TEST(SweepPlot, CloseRatiosGetTheirLabelsOnTwoRows) {
  SweepChart c = shipped_like();
  c.points[1].ratio = 0.052;  // next to 0.05
  const Parsed p = parse_xml(bs::tools::sweep_svg(c));
  ASSERT_EQ(p.error, "");
  double y005 = -1, y0052 = -1;
  for (const auto* e : all(p, "text")) {
    if (e->text == "0.05" && y005 < 0) y005 = std::stod(e->attrs.at("y"));
    if (e->text == "0.052" && y0052 < 0) y0052 = std::stod(e->attrs.at("y"));
  }
  ASSERT_GT(y005, 0);
  ASSERT_GT(y0052, 0);
  EXPECT_NE(y005, y0052);
}

TEST(SweepPlot, CpuModelNameReadsCpuinfo) {
  const auto file = std::filesystem::temp_directory_path() / ("bs_cpuinfo_" + std::to_string(::getpid()));
  std::ofstream(file) << "processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000 @ 2.0GHz  \n"
                      << "processor\t: 1\nmodel name\t: Other\n";
  EXPECT_EQ(bs::tools::cpu_model_name(file.string()), "Test CPU 9000 @ 2.0GHz");
  std::filesystem::remove(file);
  EXPECT_EQ(bs::tools::cpu_model_name(file.string()), "unknown CPU");
  EXPECT_FALSE(bs::tools::cpu_model_name().empty());
}

}  // namespace
