// The runtime's YAML configuration. Every key is known and checked: each section
// is walked entry by entry, so an unknown or repeated key, a wrong type or an
// impossible value stops the parse with a ConfigError that names the key's full
// dotted path ("tiers.ram.budget: ...") and, where yaml-cpp knows it, the line.
#include "actors/config/runtime_config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "actors/config/runtime_config_yaml.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>

#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"
#include "kernels/kv_view.h"

namespace bs {

// configs/default.yaml, compiled in: ${CMAKE_BINARY_DIR}/generated/default_config_yaml.cpp (bs_embed_text_file)
// (actors/config/CMakeLists.txt generates it at configure time).
namespace generated {
extern const char default_config_yaml[];
extern const std::size_t default_config_yaml_size;
}  // namespace generated

namespace {

namespace fs = std::filesystem;
using Keys = std::initializer_list<std::string_view>;

std::string join_path(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

std::string list_keys(Keys keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

// " (line 3, column 7)" where yaml-cpp kept the position (1-based, as editors count).
std::string position(const YAML::Node& n) {
  if (!n.IsDefined()) return "";  // a key that is absent
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.line < 0) return "";
  return " (line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1) + ")";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Undefined: break;
  }
  return "an undefined node";
}

std::string fmt(float v) {  // 0.4, not 0.400000
  std::ostringstream s;
  s << v;
  return s.str();
}

[[noreturn]] void fail(const std::string& key, const YAML::Node& n, const std::string& what) {
  throw ConfigError(key + ": " + what + position(n));
}
[[noreturn]] void wrong_type(const std::string& key, const YAML::Node& n, const std::string& expected) {
  fail(key, n, "expected " + expected + ", got " + describe(n));
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Walks a section (a map): every key must be a known, unrepeated string; `on` gets
// each entry. Nothing (`section:` with every key commented out) is an empty section.
void for_each_key(const YAML::Node& map, const std::string& path, Keys keys,
                  const std::function<void(std::string_view, const YAML::Node&)>& on) {
  if (map.IsNull()) return;
  if (!map.IsMap())
    wrong_type(path.empty() ? "config" : path, map,
               "a map" + std::string(path.empty() ? " of sections (" : " with keys (") + list_keys(keys) + ")");
  std::vector<std::string> seen;
  for (const auto& entry : map) {
    const YAML::Node& k = entry.first;
    if (!k.IsScalar()) wrong_type(path.empty() ? "config" : path, k, "string keys");
    const std::string name = k.Scalar();
    const std::string full = join_path(path, name);
    const auto known = std::find(keys.begin(), keys.end(), std::string_view(name));
    if (known == keys.end()) {
      std::string msg = "unknown key (valid keys " + (path.empty() ? std::string("at the top level") : "in " + path) +
                        ": " + list_keys(keys) + ")";
      std::string_view best;
      size_t best_d = 3;  // suggest only close misspellings
      for (std::string_view cand : keys) {
        const size_t d = edit_distance(name, cand);
        if (d < best_d) best_d = d, best = cand;
      }
      if (!best.empty()) msg += "; did you mean '" + join_path(path, best) + "'?";
      fail(full, k, msg);
    }
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) fail(full, k, "key given twice");
    seen.push_back(name);
    on(*known, entry.second);
  }
}

// ---- scalars -----------------------------------------------------------------

std::string get_string(const YAML::Node& n, const std::string& key) {
  if (n.IsNull()) return "";  // `data_dir:` with nothing after it
  if (!n.IsScalar()) wrong_type(key, n, "a string");
  return n.Scalar();
}

int get_int(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) wrong_type(key, n, "an integer");
  const std::string& s = n.Scalar();
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == s.data() + s.size() &&
                                               (v > std::numeric_limits<int>::max() ||
                                                v < std::numeric_limits<int>::min())))
    fail(key, n, "integer '" + s + "' is out of range");
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) wrong_type(key, n, "an integer");
  return static_cast<int>(v);
}

double get_number(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) wrong_type(key, n, "a number");
  const std::string& s = n.Scalar();
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) wrong_type(key, n, "a number");
  return v;
}

bool get_bool(const YAML::Node& n, const std::string& key) {
  bool b = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b)) wrong_type(key, n, "true or false");
  return b;
}

int64_t get_size(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) wrong_type(key, n, "a byte size (e.g. 4096, 512MiB, 2GiB)");
  try {
    return parse_byte_size(n.Scalar());
  } catch (const ConfigError& e) {
    fail(key, n, e.what());
  }
}

template <typename T, typename Get>
std::vector<T> get_list(const YAML::Node& n, const std::string& key, const std::string& item, Get get) {
  if (n.IsNull()) return {};
  if (!n.IsSequence()) wrong_type(key, n, "a list of " + item + " (e.g. [1, 2])");
  std::vector<T> out;
  for (size_t i = 0; i < n.size(); ++i) out.push_back(get(n[i], key + "[" + std::to_string(i) + "]"));
  return out;
}

template <typename T>
void check_at_least(T v, T lo, const YAML::Node& n, const std::string& key, const std::string& note = "") {
  if (v < lo) fail(key, n, "must be >= " + std::to_string(lo) + note + ", got " + n.Scalar());
}

// ---- sections ----------------------------------------------------------------

void parse_model(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "model", {"path", "precision", "decode_activations", "chat_template"},
               [&](std::string_view k, const YAML::Node& v) {
    const std::string key = join_path("model", k);
    if (k == "path") {
      c.model_path = get_string(v, key);
    } else if (k == "chat_template") {
      c.chat_template = get_string(v, key);
      if (c.chat_template.empty()) fail(key, v, "give a Jinja file's path or the template itself, or leave the key out");
    } else if (k == "precision") {
      const std::string p = get_string(v, key);
      if (p != "auto" && p != "bf16" && p != "f32") fail(key, v, "unknown precision '" + p + "' (auto, bf16, f32)");
      c.precision = p;
    } else if (k == "decode_activations") {
      const std::string d = get_string(v, key);
      if (d != "auto" && d != "exact" && d != "int8")
        fail(key, v, "unknown decode activations '" + d + "' (auto, exact, int8)");
      c.decode_activations = d;
    }
  });
}

void parse_device(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "device",
               {"kind", "gpus", "threads", "tp", "communicator", "kv_cache_bytes", "kv_dtype", "wait_timeout"},
               [&](std::string_view k, const YAML::Node& v) {
    const std::string key = join_path("device", k);
    if (k == "kind") {
      const std::string d = get_string(v, key);
      const auto built = kernels::device_kinds_built();
      std::string names;
      for (const auto& b : built) names += (names.empty() ? "" : ", ") + b;
      if (!kernels::is_device_kind(d)) fail(key, v, "unknown device kind '" + d + "' (" + names + ")");
      if (std::find(built.begin(), built.end(), d) == built.end())
        fail(key, v, "the " + std::string(d == "cuda" ? "CUDA" : d) +
                         " backend is not in this build (nvcc was not found when it was configured; device kinds: " +
                         names + ")");
      c.device_kind = d;
    } else if (k == "gpus") {
      c.gpus = get_list<int>(v, key, "device indices", get_int);
      if (c.gpus.empty()) fail(key, v, "must name at least one device (e.g. [0])");
      for (int g : c.gpus)
        if (g < 0) fail(key, v, "device indices are >= 0, got " + std::to_string(g));
    } else if (k == "threads") {
      c.threads = get_int(v, key);
      check_at_least(c.threads, 0, v, key, " (0 = all cores)");
    } else if (k == "tp") {
      c.tp = get_int(v, key);
      check_at_least(c.tp, 1, v, key, " (1 = no tensor parallelism)");
    } else if (k == "communicator") {
      const std::string d = get_string(v, key);
      const auto built = kernels::communicator_kinds_built();
      std::string names;
      for (const auto& b : built) names += ", " + b;
      if (!kernels::is_communicator_kind(d)) fail(key, v, "unknown communicator '" + d + "' (auto" + names + ")");
      if (d != "auto" && std::find(built.begin(), built.end(), d) == built.end())
        fail(key, v, "the " + d + " communicator is not in this build (the CUDA toolkit's NCCL was not found when it "
                     "was configured; communicators: auto" + names + ")");
      c.communicator = d;
    } else if (k == "kv_cache_bytes") {
      c.kv_cache_bytes = get_size(v, key);
    } else if (k == "kv_dtype") {
      const std::string d = get_string(v, key);
      kernels::TensorType type;
      if (!kernels::kv_dtype_from_name(d, type)) fail(key, v, "unknown KV dtype '" + d + "' (f32, f16, bf16)");
      c.kv_dtype = d;
    } else if (k == "wait_timeout") {
      c.device_wait_timeout = get_number(v, key);
      if (!std::isfinite(c.device_wait_timeout) || c.device_wait_timeout <= 0 || c.device_wait_timeout > 86400)
        fail(key, v, "must be a number of seconds in (0, 86400], got " + v.Scalar());
    }
  });
}

void parse_tier(const YAML::Node& sec, const std::string& path, bool is_ssd, TierConfig& t) {
  const Keys ram_keys{"enabled", "budget", "loaders"};
  const Keys ssd_keys{"enabled", "path", "budget", "direct_io", "throttle", "write_queue", "loaders"};
  for_each_key(sec, path, is_ssd ? ssd_keys : ram_keys, [&](std::string_view k, const YAML::Node& v) {
    const std::string key = join_path(path, k);
    if (k == "enabled") {
      t.enabled = get_bool(v, key);
    } else if (k == "budget") {
      t.budget_bytes = get_size(v, key);
    } else if (k == "loaders") {
      t.loaders = get_int(v, key);
      check_at_least(t.loaders, 1, v, key, " (loader actors of the tier)");
    } else if (k == "path") {
      t.path = get_string(v, key);
    } else if (k == "direct_io") {
      t.direct_io = get_bool(v, key);
    } else if (k == "write_queue") {
      t.write_queue_bytes = get_size(v, key);
      if (t.write_queue_bytes == 0)
        fail(key, v, "a write queue of 0 bytes stores nothing written back; give it room for a few chunks (e.g. 256MiB)");
    } else if (k == "throttle") {
      if (!v.IsScalar()) wrong_type(key, v, "a bandwidth in bytes/s (e.g. 100MB) or 0");
      std::string s = v.Scalar();
      if (s.size() > 2 && s.compare(s.size() - 2, 2, "/s") == 0) s.resize(s.size() - 2);  // "100MB/s"
      try {
        t.throttle_bytes_per_s = static_cast<double>(parse_byte_size(s));
      } catch (const ConfigError& e) {
        fail(key, v, e.what());
      }
    }
  });
  // Checked after the whole section: `enabled: false` may come after the budget.
  if (t.enabled && t.budget_bytes == 0)
    fail(path + ".budget", sec["budget"],
         "a budget of 0 stores nothing; set " + path + ".enabled: false to turn the tier off");
  if (is_ssd && t.enabled && t.path.empty())
    fail(path + ".path", sec["path"], "the SSD tier needs a directory (relative paths are under data_dir)");
}

// Seconds as a number (5, 0.25) or with a unit ("500ms", "2s"); > 0.
double get_duration(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) wrong_type(key, n, "a duration (e.g. 5, 500ms, 2s)");
  double s = 0;
  try {
    s = parse_duration(n.Scalar());
  } catch (const ConfigError& e) {
    fail(key, n, e.what());
  }
  if (!(s > 0)) fail(key, n, "must be a duration > 0, got " + n.Scalar());
  return s;
}

void parse_remote_tier(const YAML::Node& sec, RemoteTierConfig& r) {
  const std::string path = "tiers.remote";
  for_each_key(sec, path,
               {"enabled", "host", "port", "secret", "loaders", "layers_in_flight", "max_connections", "write_back",
                "connect_timeout", "io_timeout", "retry_after", "tls"},
               [&](std::string_view k, const YAML::Node& v) {
                 const std::string key = join_path(path, k);
                 if (k == "enabled") {
                   r.enabled = get_bool(v, key);
                 } else if (k == "host") {
                   r.host = get_string(v, key);
                 } else if (k == "port") {
                   r.port = get_int(v, key);
                   if (r.port < 0 || r.port > 65535)
                     fail(key, v, "must be in 1..65535 (0: not set), got " + v.Scalar());
                 } else if (k == "secret") {
                   const std::string text = get_string(v, key);
                   try {
                     r.secret = text.empty() ? std::string() : resolve_secret(text);  // "": not set
                   } catch (const ConfigError& e) {
                     fail(key, v, e.what());
                   }
                 } else if (k == "loaders") {
                   r.loaders = get_int(v, key);
                   check_at_least(r.loaders, 1, v, key, " (loader actors of the tier)");
                 } else if (k == "layers_in_flight") {
                   r.layers_in_flight = get_int(v, key);
                   check_at_least(r.layers_in_flight, 1, v, key);
                 } else if (k == "max_connections") {
                   r.max_connections = get_int(v, key);
                   check_at_least(r.max_connections, 1, v, key);
                 } else if (k == "write_back") {
                   r.write_back = get_bool(v, key);
                 } else if (k == "connect_timeout") {
                   r.connect_timeout_s = get_duration(v, key);
                 } else if (k == "io_timeout") {
                   r.io_timeout_s = get_duration(v, key);
                 } else if (k == "retry_after") {
                   r.retry_after_s = get_duration(v, key);
                 } else if (k == "tls") {
                   for_each_key(v, key, {"ca", "cert", "key", "peer_name"}, [&](std::string_view tk, const YAML::Node& tv) {
                     const std::string tkey = join_path(key, tk);
                     std::string& out = tk == "ca"     ? r.tls.ca
                                        : tk == "cert" ? r.tls.cert
                                        : tk == "key"  ? r.tls.key
                                                       : r.tls_peer_name;
                     out = get_string(tv, tkey);
                   });
                   if (r.tls.enabled() && (r.tls.ca.empty() || r.tls.cert.empty() || r.tls.key.empty())) {
                     const char* missing = r.tls.ca.empty() ? "ca" : r.tls.cert.empty() ? "cert" : "key";
                     fail(join_path(key, missing), v,
                          std::string("TLS to the storage node needs ca, cert and key (") + missing + " is not set)");
                   }
                 }
               });
}

void parse_tiers(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "tiers", {"ram", "ssd", "remote"}, [&](std::string_view k, const YAML::Node& v) {
    if (k == "ram") parse_tier(v, "tiers.ram", false, c.ram);
    if (k == "ssd") parse_tier(v, "tiers.ssd", true, c.ssd);
    if (k == "remote") parse_remote_tier(v, c.remote);
  });
}

// The node at a path of map keys, or an undefined node where the path stops.
YAML::Node find_node(const YAML::Node& root, std::initializer_list<const char*> path) {
  // Copies only: assigning to a YAML::Node overwrites the node it refers to, and a
  // non-const lookup adds the key.
  std::vector<YAML::Node> chain{root};
  for (const char* k : path) {
    const YAML::Node& at = chain.back();
    if (!at.IsDefined() || !at.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    chain.push_back(at[k]);
  }
  return chain.back().IsDefined() ? chain.back() : YAML::Node(YAML::NodeType::Undefined);
}

// A name from a fixed set (blend mode, deviation, quota, filtering): `parse` throws
// std::invalid_argument naming the value and the alternatives, reported at the key.
template <class Parse>
auto get_named(const YAML::Node& v, const std::string& key, Parse parse) {
  const std::string name = get_string(v, key);
  try {
    return parse(name);
  } catch (const std::invalid_argument& e) {
    fail(key, v, e.what());
  }
}

void parse_blend(const YAML::Node& sec, RuntimeConfig& c) {
  BlendOptions& b = c.blend;
  // for the positions of the cross-key checks
  std::optional<YAML::Node> checks_node, schedule_node, selection_node, filtering_node;
  for_each_key(sec, "blend",
               {"mode", "ratio", "adaptive_ratio", "check_layers", "schedule", "min_tokens", "deviation", "quota",
                "filtering", "selection", "sink_tokens", "query_first_from_layer", "chunk_prelude", "write_back",
                "find_pasted", "prefix_block_tokens", "learn_passage_tokens"},
               [&](std::string_view k, const YAML::Node& v) {
                 const std::string key = join_path("blend", k);
                 if (k == "mode") {
                   b.mode = get_named(v, key, parse_mode);
                 } else if (k == "ratio") {
                   const double r = get_number(v, key);
                   if (!(r >= 0.0 && r <= 1.0)) fail(key, v, "must be in [0, 1], got " + v.Scalar());
                   b.ratio = static_cast<float>(r);
                 } else if (k == "adaptive_ratio") {
                   c.adaptive_ratio = get_bool(v, key);
                 } else if (k == "check_layers") {
                   b.check_layers = get_list<int>(v, key, "layers", get_int);
                   checks_node = v;
                 } else if (k == "schedule") {
                   b.schedule = get_list<float>(v, key, "fractions", [](const YAML::Node& n, const std::string& item) {
                     return static_cast<float>(get_number(n, item));
                   });
                   schedule_node = v;
                 } else if (k == "min_tokens") {
                   b.min_tokens = get_int(v, key);
                   check_at_least(b.min_tokens, 0, v, key);
                 } else if (k == "deviation") {
                   b.deviation = get_named(v, key, parse_deviation);
                 } else if (k == "quota") {
                   b.quota = get_named(v, key, parse_quota);
                 } else if (k == "filtering") {
                   b.filtering = get_named(v, key, parse_filtering);
                   filtering_node = v;
                 } else if (k == "selection") {
                   b.selection = get_named(v, key, parse_selection);
                   selection_node = v;
                 } else if (k == "chunk_prelude") {
                   c.chunk_prelude = get_string(v, key);
                 } else if (k == "sink_tokens") {
                   b.sink_tokens = get_int(v, key);
                   check_at_least(b.sink_tokens, 0, v, key);
                 } else if (k == "query_first_from_layer") {
                   b.query_first_from_layer = get_int(v, key);
                   check_at_least(b.query_first_from_layer, 0, v, key);
                 } else if (k == "write_back") {
                   c.write_back = get_bool(v, key);
                 } else if (k == "find_pasted") {
                   c.find_pasted = get_bool(v, key);
                 } else if (k == "prefix_block_tokens") {
                   c.prefix_block_tokens = get_int(v, key);
                   if (c.prefix_block_tokens != 0 && (c.prefix_block_tokens < 16 || c.prefix_block_tokens > 4096))
                     fail(key, v, "must be 0 (off) or 16..4096 tokens, got " + v.Scalar());
                 } else if (k == "learn_passage_tokens") {
                   c.learn_passage_tokens = get_int(v, key);
                   check_at_least(c.learn_passage_tokens, 0, v, key);
                 }
               });
  // The checks below tie keys together, so they run once every key is read.
  const auto item_of = [](const std::optional<YAML::Node>& list, size_t i) {
    return list && list->IsSequence() ? static_cast<const YAML::Node&>(*list)[i] : YAML::Node();
  };
  if (b.check_layers.empty())
    fail("blend.check_layers", checks_node.value_or(YAML::Node()), "needs at least one layer");
  if (b.filtering == Filtering::TwoPass && !selection_node)  // the default selection is query-first
    fail("blend.filtering", filtering_node.value_or(YAML::Node()),
         "two-pass filters by deviation: it needs blend.selection: deviation (the default, query-first, runs its "
         "own two passes)");
  if (b.selection != Selection::Deviation && b.filtering == Filtering::TwoPass)
    fail("blend.selection", selection_node.value_or(YAML::Node()),
         std::string(selection_name(b.selection)) +
             (b.selection == Selection::QueryFirst
                  ? " runs its own two passes and does not take blend.filtering: two-pass"
                  : " reads the question's rows, which only single-pass filtering computes at the check layers "
                    "(blend.filtering is two-pass)"));
  for (size_t i = 0; i < b.check_layers.size(); ++i) {
    const std::string key = "blend.check_layers[" + std::to_string(i) + "]";
    const YAML::Node item = item_of(checks_node, i);
    if (b.check_layers[i] < 1)
      fail(key, item, "check layers must be >= 1 (layer 0 shows no deviation), got " + std::to_string(b.check_layers[i]));
    if (i > 0 && b.check_layers[i] <= b.check_layers[i - 1])
      fail(key, item, "check layers must increase (" + std::to_string(b.check_layers[i - 1]) + " then " +
                          std::to_string(b.check_layers[i]) + ")");
  }
  if (b.schedule.empty()) return;
  if (b.schedule.size() + 1 != b.check_layers.size())
    fail("blend.schedule", schedule_node.value_or(YAML::Node()),
         "needs one fraction per check layer but the last (" + std::to_string(b.check_layers.size() - 1) +
             " for " + std::to_string(b.check_layers.size()) +
             (b.check_layers.size() == 1 ? " check layer), got " : " check layers), got ") +
             std::to_string(b.schedule.size()));
  // The same comparisons as the blend engine (in float), so what passes here runs there.
  for (size_t i = 0; i < b.schedule.size(); ++i) {
    const std::string key = "blend.schedule[" + std::to_string(i) + "]";
    const YAML::Node item = item_of(schedule_node, i);
    const float v = b.schedule[i];
    if (!(v >= b.ratio && v <= 1.0f))
      fail(key, item, "must be in [ratio, 1] = [" + fmt(b.ratio) + ", 1], got " + fmt(v));
    if (i > 0 && v > b.schedule[i - 1])
      fail(key, item, "the schedule must not increase (" + fmt(b.schedule[i - 1]) + " then " + fmt(v) + ")");
  }
}

void parse_limits(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "limits",
               {"max_requests", "max_queue", "max_decode_batch", "decode_interleave", "max_prompt_tokens",
                "trace_history", "load_timeout", "max_request_seconds", "max_restarts", "restart_window",
                "restart_backoff", "restart_backoff_max"},
               [&](std::string_view k, const YAML::Node& v) {
                 const std::string key = join_path("limits", k);
                 if (k == "max_requests") {
                   c.max_requests = get_int(v, key);
                   check_at_least(c.max_requests, 1, v, key);
                 } else if (k == "max_queue") {
                   c.max_queue = get_int(v, key);
                   check_at_least(c.max_queue, 0, v, key, " (0 = no queue)");
                 } else if (k == "max_decode_batch") {
                   c.max_decode_batch = get_int(v, key);
                   check_at_least(c.max_decode_batch, 1, v, key);
                 } else if (k == "decode_interleave") {
                   c.decode_interleave = get_number(v, key);
                   if (!std::isfinite(c.decode_interleave) || c.decode_interleave < 0)
                     fail(key, v, "must be a number of seconds >= 0, got " + v.Scalar());
                 } else if (k == "max_prompt_tokens") {
                   c.max_prompt_tokens = get_int(v, key);
                   check_at_least(c.max_prompt_tokens, 0, v, key, " (0 = the model's context)");
                 } else if (k == "trace_history") {
                   c.trace_history = get_int(v, key);
                   check_at_least(c.trace_history, 0, v, key);
                 } else if (k == "load_timeout") {
                   c.load_timeout = get_number(v, key);
                   if (!std::isfinite(c.load_timeout) || c.load_timeout <= 0)
                     fail(key, v, "must be a number of seconds > 0, got " + v.Scalar());
                 } else if (k == "max_request_seconds") {
                   c.max_request_seconds = get_number(v, key);
                   if (!std::isfinite(c.max_request_seconds) || c.max_request_seconds < 0)
                     fail(key, v, "must be a number of seconds >= 0 (0 = no limit), got " + v.Scalar());
                 } else if (k == "max_restarts") {
                   c.max_restarts = get_int(v, key);
                   check_at_least(c.max_restarts, 0, v, key, " (0 = a role fails at its first death)");
                 } else if (k == "restart_window") {
                   c.restart_window = get_duration(v, key);
                 } else if (k == "restart_backoff") {
                   c.restart_backoff = get_duration(v, key);
                 } else if (k == "restart_backoff_max") {
                   c.restart_backoff_max = get_duration(v, key);
                 }
               });
}

void parse_server(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "server", {"host", "port", "api_keys", "max_body", "threads", "model_name"},
               [&](std::string_view k, const YAML::Node& v) {
    const std::string key = join_path("server", k);
    if (k == "host") {
      c.host = get_string(v, key);
      if (c.host.empty()) fail(key, v, "must not be empty (e.g. 127.0.0.1, or 0.0.0.0 for every interface)");
    } else if (k == "port") {
      c.port = get_int(v, key);
      if (c.port < 1 || c.port > 65535) fail(key, v, "must be in 1..65535, got " + v.Scalar());
    } else if (k == "api_keys") {
      c.api_keys = get_list<std::string>(v, key, "keys", get_string);
      for (size_t i = 0; i < c.api_keys.size(); ++i)
        if (c.api_keys[i].size() < 8)
          fail(key + "[" + std::to_string(i) + "]", v[i], "an API key needs at least 8 characters");
    } else if (k == "max_body") {
      c.max_body_bytes = get_size(v, key);
      if (c.max_body_bytes < 1024) fail(key, v, "must be at least 1KiB");
    } else if (k == "threads") {
      c.server_threads = get_int(v, key);
      check_at_least(c.server_threads, 0, v, key, " (0 = enough for every request in flight or queued)");
    } else if (k == "model_name") {
      c.model_name = get_string(v, key);
    }
  });
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// "~" and "~/x" from $HOME; other paths unchanged.
fs::path expand_home(const std::string& p, const char* key) {
  if (p != "~" && p.rfind("~/", 0) != 0) return p;
  const std::string home = env_or_empty("HOME");
  if (home.empty()) throw ConfigError(std::string(key) + ": '" + p + "' needs $HOME, which is not set");
  return p.size() <= 2 ? fs::path(home) : fs::path(home) / p.substr(2);
}

std::string normal(const fs::path& p) {
  fs::path n = p.lexically_normal();
  if (!n.has_filename() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();  // "/a/b/" -> "/a/b"
  return n.string();
}

bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

}  // namespace

void apply_runtime_config(const YAML::Node& root, RuntimeConfig& c) {
  for_each_key(root, "", {"model", "device", "data_dir", "tiers", "blend", "limits", "server"},
               [&](std::string_view k, const YAML::Node& v) {
                 if (k == "model") parse_model(v, c);
                 else if (k == "device") parse_device(v, c);
                 else if (k == "data_dir") c.data_dir = get_string(v, "data_dir");
                 else if (k == "tiers") parse_tiers(v, c);
                 else if (k == "blend") parse_blend(v, c);
                 else if (k == "limits") parse_limits(v, c);
                 else if (k == "server") parse_server(v, c);
               });
}

namespace config_yaml {

namespace {

// Where each document of a YAML stream starts and whether the parser stalled. yaml-cpp
// 0.7 (Debian's) loops for ever in YAML::LoadAll on a stray top-level ',' (",", ",a: 1":
// its parser reports an empty document at the same token again and again, allocating
// as it goes; jbeder/yaml-cpp#1040, fixed upstream by #1319 in 0.8.0), and YAML::Load
// then returns a null node, which would read as an empty config. So the stream is
// walked here first: a document that makes no progress past the previous one is an
// error naming its place. Found by tests/fuzz/fuzz_config.cpp.
struct DocumentWalk final : YAML::EventHandler {
  std::vector<YAML::Mark> starts;  // each document's start
  std::vector<YAML::Mark> firsts;  // each document's first node event
  std::vector<int> events;         // node events per document
  void OnDocumentStart(const YAML::Mark& m) override {
    starts.push_back(m);
    firsts.push_back(YAML::Mark::null_mark());
    events.push_back(0);
  }
  void OnDocumentEnd() override {}
  void node(const YAML::Mark& m) {
    if (events.back()++ == 0) firsts.back() = m;
  }
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { node(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}
};

std::string at_mark(const YAML::Mark& m) {
  return m.is_null() ? std::string() : " at line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1);
}

}  // namespace

YAML::Node load_document(const std::string& yaml_text) {
  try {
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    DocumentWalk walk;
    while (parser.HandleNextDocument(walk)) {
      const size_t n = walk.starts.size();
      if (n >= 2 && walk.events[n - 1] <= 1 && walk.events[n - 2] <= 1 && walk.starts[n - 1].pos == walk.starts[n - 2].pos &&
          walk.firsts[n - 1].pos == walk.firsts[n - 2].pos) {
        const YAML::Mark m = walk.firsts[n - 1];
        const char c = m.pos >= 0 && static_cast<size_t>(m.pos) < yaml_text.size() ? yaml_text[static_cast<size_t>(m.pos)] : ' ';
        throw ConfigError("invalid YAML" + at_mark(m) + ": unexpected '" + std::string(1, c) +
                          "' (not the start of a key, a value or a document)");
      }
    }
    if (walk.starts.size() > 1)
      throw ConfigError("config: expected one YAML document, got " + std::to_string(walk.starts.size()) + " (line " +
                        std::to_string(walk.starts[1].line + 1) + ", column " + std::to_string(walk.starts[1].column + 1) + ")");
    return walk.starts.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("invalid YAML" + at_mark(e.mark) + ": " + e.msg);
  }
}
std::string position(const YAML::Node& node) { return bs::position(node); }
void fail(const std::string& key, const YAML::Node& node, const std::string& what) { bs::fail(key, node, what); }
void for_each_key(const YAML::Node& map, const std::string& path, Keys keys,
                  const std::function<void(std::string_view, const YAML::Node&)>& on) {
  bs::for_each_key(map, path, keys, on);
}
std::string get_string(const YAML::Node& node, const std::string& key) { return bs::get_string(node, key); }
int get_int(const YAML::Node& node, const std::string& key) { return bs::get_int(node, key); }
bool get_bool(const YAML::Node& node, const std::string& key) { return bs::get_bool(node, key); }
double get_duration(const YAML::Node& node, const std::string& key) { return bs::get_duration(node, key); }
YAML::Node find_node(const YAML::Node& root, std::initializer_list<const char*> path) {
  return bs::find_node(root, path);
}

}  // namespace config_yaml

RuntimeConfig parse_runtime_config(const std::string& yaml_text) {
  const YAML::Node root = config_yaml::load_document(yaml_text);
  RuntimeConfig c;
  if (root.IsNull()) return c;
  apply_runtime_config(root, c);
  // Outside a cluster nothing else says where the storage node is.
  if (c.remote.enabled) {
    const YAML::Node enabled = find_node(root, {"tiers", "remote", "enabled"});
    const char* missing = c.remote.host.empty() ? "host"
                          : c.remote.port == 0  ? "port"
                          : c.remote.secret.empty() ? "secret"
                                                    : nullptr;
    if (missing)
      fail("tiers.remote." + std::string(missing), enabled,
           "the remote tier is enabled but has no " + std::string(missing) +
               " (outside a cluster, tiers.remote needs the storage node's host, its data_port as port and the "
               "cluster secret)");
  }
  return c;
}

RuntimeConfig load_runtime_config(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ConfigError("cannot read config '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read config '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read config '" + path + "': read error");
  try {
    return parse_runtime_config(text.str());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

const std::string& default_config_text() {
  static const std::string text(generated::default_config_yaml, generated::default_config_yaml_size);
  return text;
}

RuntimeConfig default_runtime_config() {
  static const RuntimeConfig c = parse_runtime_config(default_config_text());
  return c;
}

std::string resolve_data_dir(const RuntimeConfig& c) {
  fs::path dir;
  const std::string from_env = env_or_empty("BLENDSERVE_DATA_DIR");
  const std::string xdg = env_or_empty("XDG_CACHE_HOME");
  const std::string home = env_or_empty("HOME");
  if (!c.data_dir.empty()) dir = expand_home(c.data_dir, "data_dir");
  else if (!from_env.empty()) dir = expand_home(from_env, "BLENDSERVE_DATA_DIR");
  // The XDG spec: a relative XDG_CACHE_HOME is invalid and ignored.
  else if (!xdg.empty() && fs::path(xdg).is_absolute()) dir = fs::path(xdg) / "blendserve";
  else if (!home.empty()) dir = fs::path(home) / ".cache" / "blendserve";
  else dir = "/tmp/blendserve";
  return normal(fs::absolute(dir));
}

std::string resolve_ssd_path(const RuntimeConfig& c) {
  const fs::path p = expand_home(c.ssd.path, "tiers.ssd.path");
  if (p.is_absolute()) return normal(p);
  return normal(fs::path(resolve_data_dir(c)) / p);
}

double parse_duration(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return ConfigError("invalid duration '" + text + "': " + why + " (e.g. 5, 500ms, 2s, 1.5m)");
  };
  std::string_view s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) throw bad("empty");
  if (s.front() == '-') throw bad("negative");
  size_t i = 0;
  while (i < s.size() && (is_digit(s[i]) || s[i] == '.')) ++i;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + i, v);
  if (i == 0 || ec != std::errc() || end != s.data() + i) throw bad("expected a number");
  std::string_view unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "m") scale = 60;
  else throw bad("unknown unit '" + std::string(unit) + "' (ms, s, m)");
  if (!std::isfinite(v * scale)) throw bad("too large");
  return v * scale;
}

std::string resolve_secret(const std::string& text) {
  std::string secret = text;
  std::string from;  // where it came from, for the length message
  if (text.rfind("env:", 0) == 0) {
    const std::string name = text.substr(4);
    if (name.empty()) throw ConfigError("'env:' names no environment variable (env:NAME)");
    secret = env_or_empty(name.c_str());
    if (secret.empty())
      throw ConfigError("the environment variable " + name + " (from '" + text + "') is " +
                        (std::getenv(name.c_str()) ? "empty" : "not set"));
    from = "$" + name + " holds ";
  } else {
    from = "the secret has ";
  }
  if (secret.size() < 16)
    throw ConfigError(from + std::to_string(secret.size()) +
                      " characters; a secret needs at least 16 (e.g. from `openssl rand -hex 16`)");
  return secret;
}

int64_t parse_byte_size(const std::string& text) {
  const auto bad = [&](const std::string& why, bool example = true) {
    return ConfigError("invalid byte size '" + text + "': " + why +
                       (example ? " (e.g. 4096, 512MiB, 1.5GiB, 100MB)" : ""));
  };
  constexpr unsigned __int128 kMax = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  std::string_view s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) throw bad("empty");
  if (s.front() == '-') throw bad("negative");
  size_t i = 0;
  unsigned __int128 whole = 0, frac = 0, scale = 1;
  bool digits = false;
  for (; i < s.size() && is_digit(s[i]); ++i, digits = true) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > kMax) throw bad("too large");
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    bool frac_digits = false;
    for (; i < s.size() && is_digit(s[i]); ++i, frac_digits = true)
      if (scale < static_cast<unsigned __int128>(1000000000000000000ULL)) {  // 18 digits are plenty
        frac = frac * 10 + static_cast<unsigned>(s[i] - '0');
        scale *= 10;
      }
    if (!frac_digits) throw bad("expected digits after '.'");
  }
  if (!digits && scale == 1) throw bad("expected a number");
  while (i < s.size() && s[i] == ' ') ++i;
  const std::string_view unit = s.substr(i);
  struct Unit {
    std::string_view name;
    uint64_t bytes;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"B", 1},
      {"KB", 1000ULL},  {"MB", 1000ULL * 1000},  {"GB", 1000ULL * 1000 * 1000},  {"TB", 1000ULL * 1000 * 1000 * 1000},
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30},           {"TiB", 1ULL << 40},
  };
  const Unit* u = std::find_if(std::begin(kUnits), std::end(kUnits), [&](const Unit& x) { return x.name == unit; });
  if (u == std::end(kUnits)) throw bad("unknown unit '" + std::string(unit) + "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", false);
  if (u->bytes == 1 && frac != 0) throw bad("a fraction of a byte");
  // Exact: 1.5GiB is 1610612736, not a float rounding of it; a fraction of a byte is dropped.
  const unsigned __int128 total = whole * u->bytes + frac * u->bytes / scale;
  if (total > kMax) throw bad("too large");
  return static_cast<int64_t>(total);
}

}  // namespace bs
