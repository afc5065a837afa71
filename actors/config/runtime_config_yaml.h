// The runtime config's YAML entry point for parsers that embed runtime keys in a
// larger document (actors/config/cluster_config.cpp: a cluster's `defaults` and each
// node's own keys). Internal to bs_config: it exposes yaml-cpp, which the library
// links privately, so only its own sources include it.
#pragma once

#include <yaml-cpp/yaml.h>

#include "actors/config/runtime_config.h"
#include "actors/config/yaml_reader.h"

namespace bs {

// Reads the runtime sections of `root` (a map with the top-level keys of
// configs/default.yaml) over `config`: the keys present replace what `config`
// holds, the others keep it, so applying several maps in turn overlays them. The
// checks of parse_runtime_config apply (a ConfigError naming the key's dotted path
// from `root`, and the line where the node came from a parsed text), except that an
// enabled remote tier need not name its host, port and secret: the caller fills them.
void apply_runtime_config(const YAML::Node& root, RuntimeConfig& config);

// The reading helpers it uses, for other configs of the same style, are in
// actors/config/yaml_reader.h.

}  // namespace bs
