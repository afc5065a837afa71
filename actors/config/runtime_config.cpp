// The runtime's YAML configuration. Every key is known and checked: each section is
// a table of fields (actors/config/yaml_reader.h: a key, how its value is read,
// checked and stored), walked entry by entry, so an unknown or repeated key, a wrong
// type or an impossible value stops the parse with a ConfigError that names the key's
// full dotted path ("tiers.ram.budget: ...") and, where yaml-cpp knows it, the line.
// Checks that tie keys together (a tier's budget and enabled, the blend's layers and
// schedule) run once the section is read.
#include "actors/config/runtime_config.h"

#include <yaml-cpp/yaml.h>

#include "actors/config/runtime_config_yaml.h"
#include "actors/config/yaml_reader.h"

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
using namespace config_yaml;
using Fields = std::vector<Field<RuntimeConfig>>;

std::string fmt(float v) {  // 0.4, not 0.400000
  std::ostringstream s;
  s << v;
  return s.str();
}

// A number of seconds in [least, most] (`least` itself only with `from_least`);
// `what` ends the message: "must be <what>, got 3".
double get_seconds(const YAML::Node& v, const std::string& key, double least, bool from_least, double most,
                   const std::string& what) {
  const double s = get_number(v, key);
  if (!std::isfinite(s) || s < least || (!from_least && s == least) || s > most)
    fail(key, v, "must be " + what + ", got " + v.Scalar());
  return s;
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

// device.kind (`device`) or device.communicator: a name that exists and is compiled
// into this build.
std::string get_built_kind(const YAML::Node& v, const std::string& key, bool device) {
  const std::string d = get_string(v, key);
  const auto built = device ? kernels::device_kinds_built() : kernels::communicator_kinds_built();
  std::string names;
  for (const auto& b : built) names += (names.empty() ? "" : ", ") + b;
  if (device) {
    if (!kernels::is_device_kind(d)) fail(key, v, "unknown device kind '" + d + "' (" + names + ")");
    if (std::find(built.begin(), built.end(), d) == built.end())
      fail(key, v, "the " + std::string(d == "cuda" ? "CUDA" : d) +
                       " backend is not in this build (nvcc was not found when it was configured; device kinds: " +
                       names + ")");
  } else {
    if (!kernels::is_communicator_kind(d)) fail(key, v, "unknown communicator '" + d + "' (auto, " + names + ")");
    if (d != "auto" && std::find(built.begin(), built.end(), d) == built.end())
      fail(key, v, "the " + d + " communicator is not in this build (the CUDA toolkit's NCCL was not found when it "
                   "was configured; communicators: auto, " + names + ")");
  }
  return d;
}

// ---- sections ----------------------------------------------------------------

const Fields& model_fields() {
  static const Fields f = {
      string_field("path", &RuntimeConfig::model_path),
      name_field("precision", &RuntimeConfig::precision, {"auto", "bf16", "f32"}, "precision"),
      name_field("decode_activations", &RuntimeConfig::decode_activations, {"auto", "exact", "int8"},
                 "decode activations"),
      bool_field("batch_invariant", &RuntimeConfig::batch_invariant),
      {"chat_template",
       [](const YAML::Node& v, const std::string& k, RuntimeConfig& c) {
         c.chat_template = get_string(v, k);
         if (c.chat_template.empty()) fail(k, v, "give a Jinja file's path or the template itself, or leave the key out");
       }},
  };
  return f;
}

const Fields& device_fields() {
  static const Fields f = {
      {"kind", [](const YAML::Node& v, const std::string& k,
                  RuntimeConfig& c) { c.device_kind = get_built_kind(v, k, true); }},
      {"gpus",
       [](const YAML::Node& v, const std::string& k, RuntimeConfig& c) {
         c.gpus = get_list<int>(v, k, "device indices", get_int);
         if (c.gpus.empty()) fail(k, v, "must name at least one device (e.g. [0])");
         for (int g : c.gpus)
           if (g < 0) fail(k, v, "device indices are >= 0, got " + std::to_string(g));
       }},
      int_field("threads", &RuntimeConfig::threads, 0, " (0 = all cores)"),
      int_field("tp", &RuntimeConfig::tp, 1, " (1 = no tensor parallelism)"),
      {"communicator", [](const YAML::Node& v, const std::string& k,
                          RuntimeConfig& c) { c.communicator = get_built_kind(v, k, false); }},
      size_field("kv_cache_bytes", &RuntimeConfig::kv_cache_bytes),
      {"kv_dtype",
       [](const YAML::Node& v, const std::string& k, RuntimeConfig& c) {
         const std::string d = get_string(v, k);
         kernels::TensorType type;
         if (!kernels::kv_dtype_from_name(d, type)) fail(k, v, "unknown KV dtype '" + d + "' (f32, f16, bf16)");
         c.kv_dtype = d;
       }},
      {"wait_timeout",
       [](const YAML::Node& v, const std::string& k, RuntimeConfig& c) {
         c.device_wait_timeout = get_seconds(v, k, 0, false, 86400, "a number of seconds in (0, 86400]");
       }},
  };
  return f;
}

// tiers.ram and tiers.ssd (`ssd`: with the SSD's keys), in the order the messages list them.
std::vector<Field<TierConfig>> tier_fields(bool ssd) {
  using T = TierConfig;
  const Field<T> write_queue{"write_queue", [](const YAML::Node& v, const std::string& k, T& t) {
                               t.write_queue_bytes = get_size(v, k);
                               if (t.write_queue_bytes == 0)
                                 fail(k, v, "a write queue of 0 bytes stores nothing written back; give it room for "
                                            "a few chunks (e.g. 256MiB)");
                             }};
  const Field<T> throttle{"throttle", [](const YAML::Node& v, const std::string& k, T& t) {
                            if (!v.IsScalar()) wrong_type(k, v, "a bandwidth in bytes/s (e.g. 100MB) or 0");
                            std::string s = v.Scalar();
                            if (s.size() > 2 && s.compare(s.size() - 2, 2, "/s") == 0) s.resize(s.size() - 2);  // "100MB/s"
                            try {
                              t.throttle_bytes_per_s = static_cast<double>(parse_byte_size(s));
                            } catch (const ConfigError& e) {
                              fail(k, v, e.what());
                            }
                          }};
  const auto enabled = bool_field("enabled", &T::enabled);
  const auto budget = size_field("budget", &T::budget_bytes);
  const auto loaders = int_field("loaders", &T::loaders, 1, " (loader actors of the tier)");
  if (!ssd) return {enabled, budget, loaders};
  return {enabled, string_field("path", &T::path), budget, bool_field("direct_io", &T::direct_io), throttle,
          write_queue, loaders};
}

void parse_tier(const YAML::Node& sec, const std::string& path, bool is_ssd, TierConfig& t) {
  static const auto ram = tier_fields(false), ssd = tier_fields(true);
  read_section(sec, path, is_ssd ? ssd : ram, t);
  // Checked after the whole section: `enabled: false` may come after the budget.
  if (t.enabled && t.budget_bytes == 0)
    fail(path + ".budget", sec["budget"],
         "a budget of 0 stores nothing; set " + path + ".enabled: false to turn the tier off");
  if (is_ssd && t.enabled && t.path.empty())
    fail(path + ".path", sec["path"], "the SSD tier needs a directory (relative paths are under data_dir)");
}

void parse_remote_tls(const YAML::Node& v, const std::string& key, RemoteTierConfig& r) {
  for_each_key(v, key, {"ca", "cert", "key", "peer_name"}, [&](std::string_view tk, const YAML::Node& tv) {
    std::string& out = tk == "ca" ? r.tls.ca : tk == "cert" ? r.tls.cert : tk == "key" ? r.tls.key : r.tls_peer_name;
    out = get_string(tv, join_path(key, tk));
  });
  if (r.tls.enabled() && (r.tls.ca.empty() || r.tls.cert.empty() || r.tls.key.empty())) {
    const char* missing = r.tls.ca.empty() ? "ca" : r.tls.cert.empty() ? "cert" : "key";
    fail(join_path(key, missing), v,
         std::string("TLS to the storage node needs ca, cert and key (") + missing + " is not set)");
  }
}

const std::vector<Field<RemoteTierConfig>>& remote_fields() {
  using R = RemoteTierConfig;
  static const std::vector<Field<R>> f = {
      bool_field("enabled", &R::enabled),
      string_field("host", &R::host),
      port_field("port", &R::port, true),
      {"secret",
       [](const YAML::Node& v, const std::string& k, R& r) {
         const std::string text = get_string(v, k);
         try {
           r.secret = text.empty() ? std::string() : resolve_secret(text);  // "": not set
         } catch (const ConfigError& e) {
           fail(k, v, e.what());
         }
       }},
      int_field("loaders", &R::loaders, 1, " (loader actors of the tier)"),
      int_field("layers_in_flight", &R::layers_in_flight, 1),
      int_field("max_connections", &R::max_connections, 1),
      bool_field("write_back", &R::write_back),
      duration_field("connect_timeout", &R::connect_timeout_s),
      duration_field("io_timeout", &R::io_timeout_s),
      duration_field("retry_after", &R::retry_after_s),
      {"tls", parse_remote_tls},
  };
  return f;
}

void parse_tiers(const YAML::Node& sec, RuntimeConfig& c) {
  for_each_key(sec, "tiers", {"ram", "ssd", "remote"}, [&](std::string_view k, const YAML::Node& v) {
    if (k == "ram") parse_tier(v, "tiers.ram", false, c.ram);
    if (k == "ssd") parse_tier(v, "tiers.ssd", true, c.ssd);
    if (k == "remote") read_section(v, "tiers.remote", remote_fields(), c.remote);
  });
}

// The blend's keys; the nodes of the keys its cross-key checks name, for their positions.
struct BlendNodes {
  std::optional<YAML::Node> checks, schedule, selection, filtering;
};

std::vector<Field<RuntimeConfig>> blend_fields(BlendNodes& nodes) {
  using C = RuntimeConfig;
  return {
      {"mode", [](const YAML::Node& v, const std::string& k, C& c) { c.blend.mode = get_named(v, k, parse_mode); }},
      {"ratio",
       [](const YAML::Node& v, const std::string& k, C& c) {
         const double r = get_number(v, k);
         if (!(r >= 0.0 && r <= 1.0)) fail(k, v, "must be in [0, 1], got " + v.Scalar());
         c.blend.ratio = static_cast<float>(r);
       }},
      bool_field("adaptive_ratio", &C::adaptive_ratio),
      {"check_layers",
       [&nodes](const YAML::Node& v, const std::string& k, C& c) {
         c.blend.check_layers = get_list<int>(v, k, "layers", get_int);
         nodes.checks = v;
       }},
      {"schedule",
       [&nodes](const YAML::Node& v, const std::string& k, C& c) {
         c.blend.schedule = get_list<float>(v, k, "fractions", [](const YAML::Node& n, const std::string& item) {
           return static_cast<float>(get_number(n, item));
         });
         nodes.schedule = v;
       }},
      {"min_tokens", [](const YAML::Node& v, const std::string& k, C& c) { c.blend.min_tokens = get_int_at_least(v, k, 0); }},
      {"deviation",
       [](const YAML::Node& v, const std::string& k, C& c) { c.blend.deviation = get_named(v, k, parse_deviation); }},
      {"quota", [](const YAML::Node& v, const std::string& k, C& c) { c.blend.quota = get_named(v, k, parse_quota); }},
      {"filtering",
       [&nodes](const YAML::Node& v, const std::string& k, C& c) {
         c.blend.filtering = get_named(v, k, parse_filtering);
         nodes.filtering = v;
       }},
      {"selection",
       [&nodes](const YAML::Node& v, const std::string& k, C& c) {
         c.blend.selection = get_named(v, k, parse_selection);
         nodes.selection = v;
       }},
      {"sink_tokens", [](const YAML::Node& v, const std::string& k, C& c) { c.blend.sink_tokens = get_int_at_least(v, k, 0); }},
      {"query_first_from_layer",
       [](const YAML::Node& v, const std::string& k, C& c) { c.blend.query_first_from_layer = get_int_at_least(v, k, 0); }},
      string_field("chunk_prelude", &C::chunk_prelude),
      bool_field("write_back", &C::write_back),
      bool_field("find_pasted", &C::find_pasted),
      {"prefix_block_tokens",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.prefix_block_tokens = get_int(v, k);
         if (c.prefix_block_tokens != 0 && (c.prefix_block_tokens < 16 || c.prefix_block_tokens > 4096))
           fail(k, v, "must be 0 (off) or 16..4096 tokens, got " + v.Scalar());
       }},
      int_field("learn_passage_tokens", &C::learn_passage_tokens, 0),
  };
}

void parse_blend(const YAML::Node& sec, RuntimeConfig& c) {
  BlendNodes nodes;
  read_section(sec, "blend", blend_fields(nodes), c);
  // The checks below tie keys together, so they run once every key is read.
  const BlendOptions& b = c.blend;
  const auto item_of = [](const std::optional<YAML::Node>& list, size_t i) {
    return list && list->IsSequence() ? static_cast<const YAML::Node&>(*list)[i] : YAML::Node();
  };
  if (b.check_layers.empty())
    fail("blend.check_layers", nodes.checks.value_or(YAML::Node()), "needs at least one layer");
  if (b.filtering == Filtering::TwoPass && !nodes.selection)  // the default selection is query-first
    fail("blend.filtering", nodes.filtering.value_or(YAML::Node()),
         "two-pass filters by deviation: it needs blend.selection: deviation (the default, query-first, runs its "
         "own two passes)");
  if (b.selection != Selection::Deviation && b.filtering == Filtering::TwoPass)
    fail("blend.selection", nodes.selection.value_or(YAML::Node()),
         std::string(selection_name(b.selection)) +
             (b.selection == Selection::QueryFirst
                  ? " runs its own two passes and does not take blend.filtering: two-pass"
                  : " reads the question's rows, which only single-pass filtering computes at the check layers "
                    "(blend.filtering is two-pass)"));
  for (size_t i = 0; i < b.check_layers.size(); ++i) {
    const std::string key = "blend.check_layers[" + std::to_string(i) + "]";
    const YAML::Node item = item_of(nodes.checks, i);
    if (b.check_layers[i] < 1)
      fail(key, item, "check layers must be >= 1 (layer 0 shows no deviation), got " + std::to_string(b.check_layers[i]));
    if (i > 0 && b.check_layers[i] <= b.check_layers[i - 1])
      fail(key, item, "check layers must increase (" + std::to_string(b.check_layers[i - 1]) + " then " +
                          std::to_string(b.check_layers[i]) + ")");
  }
  if (b.schedule.empty()) return;
  if (b.schedule.size() + 1 != b.check_layers.size())
    fail("blend.schedule", nodes.schedule.value_or(YAML::Node()),
         "needs one fraction per check layer but the last (" + std::to_string(b.check_layers.size() - 1) +
             " for " + std::to_string(b.check_layers.size()) +
             (b.check_layers.size() == 1 ? " check layer), got " : " check layers), got ") +
             std::to_string(b.schedule.size()));
  // The same comparisons as the blend engine (in float), so what passes here runs there.
  for (size_t i = 0; i < b.schedule.size(); ++i) {
    const std::string key = "blend.schedule[" + std::to_string(i) + "]";
    const YAML::Node item = item_of(nodes.schedule, i);
    const float v = b.schedule[i];
    if (!(v >= b.ratio && v <= 1.0f))
      fail(key, item, "must be in [ratio, 1] = [" + fmt(b.ratio) + ", 1], got " + fmt(v));
    if (i > 0 && v > b.schedule[i - 1])
      fail(key, item, "the schedule must not increase (" + fmt(b.schedule[i - 1]) + " then " + fmt(v) + ")");
  }
}

const Fields& limits_fields() {
  using C = RuntimeConfig;
  static const Fields f = {
      int_field("max_requests", &C::max_requests, 1),
      int_field("max_queue", &C::max_queue, 0, " (0 = no queue)"),
      int_field("max_decode_batch", &C::max_decode_batch, 1),
      {"decode_interleave",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.decode_interleave = get_seconds(v, k, 0, true, HUGE_VAL, "a number of seconds >= 0");
       }},
      int_field("max_prompt_tokens", &C::max_prompt_tokens, 0, " (0 = the model's context)"),
      int_field("trace_history", &C::trace_history, 0),
      {"load_timeout",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.load_timeout = get_seconds(v, k, 0, false, HUGE_VAL, "a number of seconds > 0");
       }},
      {"max_request_seconds",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.max_request_seconds = get_seconds(v, k, 0, true, HUGE_VAL, "a number of seconds >= 0 (0 = no limit)");
       }},
      int_field("max_restarts", &C::max_restarts, 0, " (0 = a role fails at its first death)"),
      duration_field("restart_window", &C::restart_window),
      duration_field("restart_backoff", &C::restart_backoff),
      duration_field("restart_backoff_max", &C::restart_backoff_max),
  };
  return f;
}

const Fields& server_fields() {
  using C = RuntimeConfig;
  static const Fields f = {
      {"host",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.host = get_string(v, k);
         if (c.host.empty()) fail(k, v, "must not be empty (e.g. 127.0.0.1, or 0.0.0.0 for every interface)");
       }},
      port_field("port", &C::port),
      {"api_keys",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.api_keys = get_list<std::string>(v, k, "keys", get_string);
         for (size_t i = 0; i < c.api_keys.size(); ++i)
           if (c.api_keys[i].size() < 8)
             fail(k + "[" + std::to_string(i) + "]", v[i], "an API key needs at least 8 characters");
       }},
      {"max_body",
       [](const YAML::Node& v, const std::string& k, C& c) {
         c.max_body_bytes = get_size(v, k);
         if (c.max_body_bytes < 1024) fail(k, v, "must be at least 1KiB");
       }},
      int_field("threads", &C::server_threads, 0, " (0 = enough for every request in flight or queued)"),
      string_field("model_name", &C::model_name),
  };
  return f;
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
                 if (k == "model") read_section(v, "model", model_fields(), c);
                 else if (k == "device") read_section(v, "device", device_fields(), c);
                 else if (k == "data_dir") c.data_dir = get_string(v, "data_dir");
                 else if (k == "tiers") parse_tiers(v, c);
                 else if (k == "blend") parse_blend(v, c);
                 else if (k == "limits") read_section(v, "limits", limits_fields(), c);
                 else if (k == "server") read_section(v, "server", server_fields(), c);
               });
}

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
  check_runtime_config(c);  // the rules across keys (each value was checked as it was read)
  return c;
}

RuntimeConfig load_runtime_config(const std::string& path) {
  return config_yaml::load_config_file(path, [&](const std::string& text) { return parse_runtime_config(text); });
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

// `text` without the white space around it.
static std::string_view trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

double parse_duration(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return ConfigError("invalid duration '" + text + "': " + why + " (e.g. 5, 500ms, 2s, 1.5m)");
  };
  const std::string_view s = trimmed(text);
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
  const std::string_view s = trimmed(text);
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
