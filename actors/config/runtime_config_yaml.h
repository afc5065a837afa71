// The runtime config's YAML entry point for parsers that embed runtime keys in a
// larger document (actors/config/cluster_config.cpp: a cluster's `defaults` and each
// node's own keys). Internal to bs_config: it exposes yaml-cpp, which the library
// links privately, so only its own sources include it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "actors/config/runtime_config.h"

namespace bs {

// Reads the runtime sections of `root` (a map with the top-level keys of
// configs/default.yaml) over `config`: the keys present replace what `config`
// holds, the others keep it, so applying several maps in turn overlays them. The
// checks of parse_runtime_config apply (a ConfigError naming the key's dotted path
// from `root`, and the line where the node came from a parsed text), except that an
// enabled remote tier need not name its host, port and secret: the caller fills them.
void apply_runtime_config(const YAML::Node& root, RuntimeConfig& config);

// The runtime config's reading helpers, for other configs of the same style (the
// messages read alike: "key: what (line L, column C)").
namespace config_yaml {

using Keys = std::initializer_list<std::string_view>;

// The one document of a YAML text (an empty text: a null node); ConfigError "invalid
// YAML at line L, column C: ..." or for several documents.
YAML::Node load_document(const std::string& yaml_text);
// " (line L, column C)" where yaml-cpp kept the node's position, else "".
std::string position(const YAML::Node& node);
// Throws ConfigError("<key>: <what><position of node>").
[[noreturn]] void fail(const std::string& key, const YAML::Node& node, const std::string& what);
// Walks a map whose keys must be among `keys`, each at most once (else a ConfigError
// naming `path`.key, the valid keys and a close spelling); `on` gets each entry. A
// null node is an empty map. `path` is the map's dotted path ("" at the top level).
void for_each_key(const YAML::Node& map, const std::string& path, Keys keys,
                  const std::function<void(std::string_view, const YAML::Node&)>& on);
// A scalar's value as a string, an int, true/false, or a duration in seconds (> 0:
// a number or "500ms", "2s"); ConfigError naming `key` otherwise.
std::string get_string(const YAML::Node& node, const std::string& key);
int get_int(const YAML::Node& node, const std::string& key);
bool get_bool(const YAML::Node& node, const std::string& key);
double get_duration(const YAML::Node& node, const std::string& key);
// The node at a path of map keys, or an undefined node where the path stops (never
// adds a key to `root`).
YAML::Node find_node(const YAML::Node& root, std::initializer_list<const char*> path);

}  // namespace config_yaml

}  // namespace bs
