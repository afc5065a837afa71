// How the configs read YAML (the runtime's, actors/config/runtime_config.cpp, and a
// cluster's, actors/config/cluster_config.cpp), so every message reads alike:
// "key: what (line L, column C)". A section is a table of fields: each key's name and
// what reads, checks and stores its value; the walk refuses unknown and repeated keys
// (suggesting a close spelling) and names each key by its dotted path. Internal to
// bs_config: it exposes yaml-cpp, which the library links privately.
#pragma once

#include <yaml-cpp/yaml.h>

#include "actors/config/runtime_config.h"  // ConfigError

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace bs::config_yaml {

using Keys = std::vector<std::string_view>;

// The text of the config file at `path`; ConfigError "cannot read config 'path': why"
// (a directory, a missing or unreadable file, a read error).
std::string read_config_text(const std::string& path);
// parse(the text of the file at `path`), its ConfigError prefixed with "path: ".
template <class Parse>
auto load_config_file(const std::string& path, Parse parse) -> decltype(parse(std::string())) {
  const std::string text = read_config_text(path);
  try {
    return parse(text);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

// The one document of a YAML text (an empty text: a null node); ConfigError "invalid
// YAML at line L, column C: ..." or for several documents.
YAML::Node load_document(const std::string& yaml_text);
// " (line L, column C)" where yaml-cpp kept the node's position, else "".
std::string position(const YAML::Node& node);
// `prefix`.`key`, or `key` at the top level.
std::string join_path(const std::string& prefix, std::string_view key);
// Throws ConfigError("<key>: <what><position of node>").
[[noreturn]] void fail(const std::string& key, const YAML::Node& node, const std::string& what);
// fail(key, node, "expected <expected>, got <what the node is>").
[[noreturn]] void wrong_type(const std::string& key, const YAML::Node& node, const std::string& expected);
// Walks a map whose keys must be among `keys`, each at most once (else a ConfigError
// naming `path`.key, the valid keys and a close spelling); `on` gets each entry. A
// null node is an empty map. `path` is the map's dotted path ("" at the top level).
void for_each_key(const YAML::Node& map, const std::string& path, const Keys& keys,
                  const std::function<void(std::string_view, const YAML::Node&)>& on);
// A scalar's value as a string (null: ""), an int, a number, true/false, a byte size
// ("512MiB"), or a duration in seconds (> 0: a number or "500ms", "2s"); ConfigError
// naming `key` otherwise.
std::string get_string(const YAML::Node& node, const std::string& key);
int get_int(const YAML::Node& node, const std::string& key);
double get_number(const YAML::Node& node, const std::string& key);
bool get_bool(const YAML::Node& node, const std::string& key);
int64_t get_size(const YAML::Node& node, const std::string& key);
double get_duration(const YAML::Node& node, const std::string& key);
// An integer >= `least`; `note` follows the bound in the message ("must be >= 0 (0 =
// no queue), got -1").
// A TCP port: 1..65535, and with `zero_unset` also 0 (not set).
int get_port(const YAML::Node& node, const std::string& key, bool zero_unset = false);
int get_int_at_least(const YAML::Node& node, const std::string& key, int least, const std::string& note = "");
// A list (null: empty) of items read by `get`, each named key[i].
template <typename T, typename Get>
std::vector<T> get_list(const YAML::Node& n, const std::string& key, const std::string& item, Get get) {
  if (n.IsNull()) return {};
  if (!n.IsSequence()) wrong_type(key, n, "a list of " + item + " (e.g. [1, 2])");
  std::vector<T> out;
  for (size_t i = 0; i < n.size(); ++i) out.push_back(get(n[i], key + "[" + std::to_string(i) + "]"));
  return out;
}
// The node at a path of map keys, or an undefined node where the path stops (never
// adds a key to `root`).
YAML::Node find_node(const YAML::Node& root, std::initializer_list<const char*> path);

// ---- sections as tables ----------------------------------------------------------

// One key of a section: its name and what reads, checks and stores its value in `out`
// (`key` is its dotted path, for messages).
template <class T>
struct Field {
  std::string_view key;
  std::function<void(const YAML::Node& value, const std::string& key, T& out)> read;
};

// Reads the section (a map, or null: empty) at `path` into `out`, one field per key
// present; keys not in `fields` are refused as for_each_key refuses them.
template <class T>
void read_section(const YAML::Node& section, const std::string& path, const std::vector<Field<T>>& fields, T& out) {
  Keys keys;
  for (const auto& f : fields) keys.push_back(f.key);
  for_each_key(section, path, keys, [&](std::string_view k, const YAML::Node& v) {
    for (const auto& f : fields)
      if (f.key == k) return f.read(v, join_path(path, k), out);
  });
}

// The common fields: a value of the key's type stored in member `m` of T.
template <class T>
Field<T> string_field(std::string_view key, std::string T::*m) {
  return {key, [m](const YAML::Node& v, const std::string& k, T& out) { out.*m = get_string(v, k); }};
}
template <class T>
Field<T> bool_field(std::string_view key, bool T::*m) {
  return {key, [m](const YAML::Node& v, const std::string& k, T& out) { out.*m = get_bool(v, k); }};
}
template <class T>
Field<T> size_field(std::string_view key, int64_t T::*m) {
  return {key, [m](const YAML::Node& v, const std::string& k, T& out) { out.*m = get_size(v, k); }};
}
template <class T>
Field<T> duration_field(std::string_view key, double T::*m) {
  return {key, [m](const YAML::Node& v, const std::string& k, T& out) { out.*m = get_duration(v, k); }};
}
// A TCP port (get_port).
template <class T>
Field<T> port_field(std::string_view key, int T::*m, bool zero_unset = false) {
  return {key, [m, zero_unset](const YAML::Node& v, const std::string& k, T& out) {
            out.*m = get_port(v, k, zero_unset);
          }};
}
// An integer >= `least` (get_int_at_least).
template <class T>
Field<T> int_field(std::string_view key, int T::*m, int least, std::string note = "") {
  return {key, [m, least, note](const YAML::Node& v, const std::string& k, T& out) {
            out.*m = get_int_at_least(v, k, least, note);
          }};
}
// A string among `names`; `what` names the kind in the message ("unknown precision
// 'x' (auto, bf16, f32)").
template <class T>
Field<T> name_field(std::string_view key, std::string T::*m, std::vector<std::string> names, std::string what) {
  return {key, [m, names, what](const YAML::Node& v, const std::string& k, T& out) {
            const std::string s = get_string(v, k);
            std::string list;
            for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
            bool known = false;
            for (const auto& n : names) known = known || n == s;
            if (!known) fail(k, v, "unknown " + what + " '" + s + "' (" + list + ")");
            out.*m = s;
          }};
}

}  // namespace bs::config_yaml
