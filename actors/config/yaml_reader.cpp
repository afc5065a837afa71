#include "actors/config/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "actors/config/runtime_config.h"

namespace bs::config_yaml {

std::string read_config_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("cannot read config '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read config '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read config '" + path + "': read error");
  return text.str();
}

namespace {

std::string list_keys(const Keys& keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
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

std::string join_path(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

// " (line 3, column 7)" where yaml-cpp kept the position (1-based, as editors count).
std::string position(const YAML::Node& n) {
  if (!n.IsDefined()) return "";  // a key that is absent
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.line < 0) return "";
  return " (line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1) + ")";
}

[[noreturn]] void fail(const std::string& key, const YAML::Node& n, const std::string& what) {
  throw ConfigError(key + ": " + what + position(n));
}
[[noreturn]] void wrong_type(const std::string& key, const YAML::Node& n, const std::string& expected) {
  fail(key, n, "expected " + expected + ", got " + describe(n));
}

// Walks a section (a map): every key must be a known, unrepeated string; `on` gets
// each entry. Nothing (`section:` with every key commented out) is an empty section.
void for_each_key(const YAML::Node& map, const std::string& path, const Keys& keys,
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

// Seconds as a number (5, 0.25) or with a unit ("500ms", "2s"); > 0.
int get_port(const YAML::Node& node, const std::string& key, bool zero_unset) {
  const int p = get_int(node, key);
  if (p < (zero_unset ? 0 : 1) || p > 65535)
    fail(key, node,
         std::string("must be in 1..65535") + (zero_unset ? " (0: not set)" : "") + ", got " + node.Scalar());
  return p;
}

int get_int_at_least(const YAML::Node& n, const std::string& key, int least, const std::string& note) {
  const int v = get_int(n, key);
  if (v < least) fail(key, n, "must be >= " + std::to_string(least) + note + ", got " + n.Scalar());
  return v;
}

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

}  // namespace bs::config_yaml
