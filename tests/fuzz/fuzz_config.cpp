// libFuzzer target for the YAML loaders: the runtime config (actors/config/runtime_config.h)
// and the cluster file (actors/config/cluster_config.h). The first byte picks which (even:
// runtime, odd: cluster), the rest is the YAML text. Any text must either parse into
// a config whose values hold the documented ranges, or throw ConfigError with a
// message — never crash, hang, or escape as another exception (a yaml-cpp conversion
// error that slipped past the key checks would).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "actors/config/cluster_config.h"
#include "actors/config/runtime_config.h"

namespace {

void check_runtime(const bs::RuntimeConfig& c) {
  const auto& b = c.blend;
  if (!(b.ratio >= 0.0f && b.ratio <= 1.0f)) std::abort();
  if (b.check_layers.empty()) std::abort();
  for (size_t i = 0; i < b.check_layers.size(); ++i)
    if (b.check_layers[i] < 1 || (i > 0 && b.check_layers[i] <= b.check_layers[i - 1])) std::abort();
  if (!b.schedule.empty() && b.schedule.size() + 1 != b.check_layers.size()) std::abort();
  if (c.max_requests < 1 || c.max_queue < 0 || c.max_decode_batch < 1 || c.max_prompt_tokens < 0) std::abort();
  if (!(c.load_timeout > 0) || !(c.max_request_seconds >= 0) || c.max_restarts < 0) std::abort();
  if (!(c.restart_window > 0) || !(c.restart_backoff > 0) || !(c.restart_backoff_max > 0)) std::abort();
  if (c.tp < 1 || c.threads < 0 || c.gpus.empty()) std::abort();
  if (c.port < 1 || c.port > 65535 || c.max_body_bytes < 1024 || c.host.empty()) std::abort();
  if (c.ram.budget_bytes < 0 || c.ssd.budget_bytes < 0 || c.ssd.write_queue_bytes < 0) std::abort();
  for (const auto& key : c.api_keys)
    if (key.size() < 8) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 16384) return 0;  // configs are small; long inputs add time, not paths
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      check_runtime(bs::parse_runtime_config(text));
    } else {
      const bs::ClusterConfig cluster = bs::parse_cluster_config(text, "/fuzz/cluster.yaml");
      if (cluster.nodes.empty() || cluster.workers().empty() || cluster.secret.size() < 16) std::abort();
      if (cluster.frontend().role != bs::NodeRole::Frontend) std::abort();
      for (const auto& n : cluster.nodes) {
        if (n.name.empty() || cluster.find(n.name) != &n) std::abort();
        check_runtime(bs::member_runtime_config(cluster, n.name));
      }
    }
  } catch (const bs::ConfigError& e) {
    if (std::string(e.what()).empty()) std::abort();  // an error always says what is wrong
  }
  return 0;
}
