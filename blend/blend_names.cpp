// The blend's option words: each enum's name in configs, on the command line and in
// reports, and its parser (blend/blend_engine.h).
#include <stdexcept>
#include <string>

#include "blend/blend_engine.h"

namespace bs {

const char* mode_name(BlendMode m) {
  switch (m) {
    case BlendMode::Full: return "full";
    case BlendMode::Prefix: return "prefix";
    case BlendMode::Reuse: return "reuse";
    case BlendMode::Blend: return "blend";
  }
  return "?";
}

const char* deviation_name(Deviation d) {
  switch (d) {
    case Deviation::K: return "k";
    case Deviation::V: return "v";
    case Deviation::KV: return "kv";
  }
  return "?";
}
Deviation parse_deviation(const std::string& s) {
  if (s == "k") return Deviation::K;
  if (s == "v") return Deviation::V;
  if (s == "kv") return Deviation::KV;
  throw std::invalid_argument("unknown deviation '" + s + "' (k, v, kv)");
}
const char* quota_name(Quota q) { return q == Quota::Global ? "global" : "per-chunk"; }
Quota parse_quota(const std::string& s) {
  if (s == "global") return Quota::Global;
  if (s == "per-chunk") return Quota::PerChunk;
  throw std::invalid_argument("unknown quota '" + s + "' (global, per-chunk)");
}
const char* selection_name(Selection s) {
  switch (s) {
    case Selection::Deviation: return "deviation";
    case Selection::Attention: return "attention";
    case Selection::Impact: return "impact";
    case Selection::QueryFirst: return "query-first";
  }
  return "?";
}
Selection parse_selection(const std::string& s) {
  if (s == "deviation") return Selection::Deviation;
  if (s == "attention") return Selection::Attention;
  if (s == "impact") return Selection::Impact;
  if (s == "query-first") return Selection::QueryFirst;
  throw std::invalid_argument("unknown selection '" + s + "' (deviation, attention, impact, query-first)");
}
const char* filtering_name(Filtering f) { return f == Filtering::SinglePass ? "single-pass" : "two-pass"; }
Filtering parse_filtering(const std::string& s) {
  if (s == "single-pass") return Filtering::SinglePass;
  if (s == "two-pass") return Filtering::TwoPass;
  throw std::invalid_argument("unknown filtering '" + s + "' (single-pass, two-pass)");
}

BlendMode parse_mode(const std::string& s) {
  if (s == "full") return BlendMode::Full;
  if (s == "prefix") return BlendMode::Prefix;
  if (s == "reuse") return BlendMode::Reuse;
  if (s == "blend") return BlendMode::Blend;
  throw std::invalid_argument("unknown mode '" + s + "' (full, prefix, reuse, blend)");
}

}  // namespace bs
