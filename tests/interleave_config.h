// The runtime configuration of the tests that watch decode steps run between the
// layers of another compute (a prefill, a stored document): everything under one
// temp dir, and no background write-back computes, so every interleaved step the
// test counts belongs to the compute it started.
#pragma once

#include <filesystem>

#include "actors/config/runtime_config.h"

namespace bs::testing {

inline RuntimeConfig interleave_config_in(const std::filesystem::path& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.direct_io = false;  // the temp dir may be a tmpfs
  c.write_back = false;
  return c;
}

}  // namespace bs::testing
