#include "http/runtime_gauges.h"

#include <exception>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"

namespace bs::http {

using json = nlohmann::json;

std::vector<Gauge> runtime_gauges(Runtime& runtime) {
  std::vector<Gauge> g;
  {  // Which backend and hardware compute (Prometheus' info idiom: labels, value 1).
    const auto& be = runtime.backend();
    g.push_back({"blendserve_backend_info", "The compute backend (device.kind), its kernels and device.",
                 "backend=\"" + label_escape(be.name()) + "\",kernels=\"" + label_escape(be.kernel_id()) +
                     "\",device=\"" + label_escape(be.device_name().empty() ? "cpu" : be.device_name()) + "\"",
                 1.0});
  }
  g.push_back({"blendserve_requests_in_flight", "Requests admitted and not finished.", "",
               static_cast<double>(runtime.in_flight())});
  g.push_back({"blendserve_queue_depth", "Requests waiting for a slot (limits.max_queue bounds it).", "",
               static_cast<double>(runtime.queued())});
  const auto kv = runtime.kv_pages();
  g.push_back({"blendserve_kv_cache_pages", "Pages of the paged KV cache (device.kv_cache_bytes).", "",
               static_cast<double>(kv.total)});
  g.push_back({"blendserve_kv_cache_pages_used", "KV cache pages held by requests' caches.", "",
               static_cast<double>(kv.used)});
  g.push_back({"blendserve_kv_cache_pages_reserved", "KV cache pages promised to admitted requests (admission "
               "counts these: a request waits in the queue until its pages fit).", "",
               static_cast<double>(kv.reserved)});
  g.push_back({"blendserve_kv_cache_page_bytes", "Bytes of K and V one page holds.", "",
               static_cast<double>(kv.page_bytes)});
  const auto ds = runtime.decode_stats();
  g.push_back({"blendserve_decode_steps", "Decode steps run since start (monotonic).", "",
               static_cast<double>(ds.steps)});
  g.push_back({"blendserve_decode_step_tokens", "Tokens produced by decode steps since start (monotonic); "
               "divided by blendserve_decode_steps: the mean batch.", "", static_cast<double>(ds.tokens)});
  g.push_back({"blendserve_actor_restarts", "Actors the supervisor started again after they died, since start "
               "(monotonic).", "", static_cast<double>(runtime.actor_restarts())});
  g.push_back({"blendserve_failed", "1 when a role of the runtime died more often than limits.max_restarts "
               "allows and the server refuses every request (/health says which), else 0.", "",
               runtime.failure().empty() ? 0.0 : 1.0});
  const auto tps = runtime.tensor_parallel_stats();
  g.push_back({"blendserve_tp_ranks", "Tensor-parallel ranks (device.tp).", "", static_cast<double>(tps.ranks)});
  g.push_back({"blendserve_tp_failures", "Jobs that failed on a tensor-parallel rank, each failing its requests "
               "(monotonic).", "", static_cast<double>(tps.failures)});
  g.push_back({"blendserve_tp_rebuilds", "Times the ranks' communicators were rebuilt after a failure "
               "(monotonic).", "", static_cast<double>(tps.rebuilds)});
  g.push_back({"blendserve_decode_steps_interleaved", "Decode steps run between the layers of a long prefill "
               "(monotonic).", "", static_cast<double>(ds.interleaved_steps)});
  g.push_back({"blendserve_write_backs_refused", "Missed chunks not stored because the compute thread's "
               "background queue was full (computed again at their next miss; monotonic).", "",
               static_cast<double>(runtime.reuse_stats().write_backs_refused)});
  const auto rs = runtime.reuse_stats();
  g.push_back({"blendserve_chunks_computed", "Chunks computed alone in the background and stored (monotonic).", "",
               static_cast<double>(rs.chunks_computed)});
  g.push_back({"blendserve_chunk_computes_joined", "Requests that missed a chunk whose compute another request had "
               "queued, and joined it (single flight; monotonic).", "", static_cast<double>(rs.computes_joined)});
  g.push_back({"blendserve_chunk_computes_in_flight", "Background chunk computes claimed now (queued or running).",
               "", static_cast<double>(rs.computes_in_flight)});
  g.push_back({"blendserve_provisional_entries", "Chunks stored at once from a request's own cache, serving until "
               "computed alone (monotonic).", "", static_cast<double>(rs.provisional_entries)});
  try {
    const json stores = json::parse(runtime.stores_json());
    for (const char* field : {"bytes", "entries", "budget"})
      for (const auto& [tier, st] : stores.items())
        g.push_back({std::string("blendserve_store_") + field, std::string("KV store tier ") + field + ".",
                     "tier=\"" + tier + "\"", st.value(field, 0.0)});
    for (const char* field : {"hits", "misses", "evictions", "corrupt", "write_errors"})
      for (const auto& [tier, st] : stores.items())
        g.push_back({std::string("blendserve_store_") + field, std::string("KV store tier ") + field +
                                                                   " since start (monotonic).",
                     "tier=\"" + tier + "\"", st.value(field, 0.0)});
    // The writer's queue of a tier that writes to a device (ssd, remote): bounded in
    // bytes; what did not fit was dropped (a cache: the chunk is computed again on a miss).
    const std::pair<const char*, const char*> writer_fields[] = {
        {"write_queue_bytes", "Chunk KV waiting for the tier's writer."},
        {"write_queue_limit", "The bound of that queue in bytes (tiers.<tier>.write_queue)."},
        {"writes_dropped", "Writes refused because the queue was full, since start (monotonic)."}};
    for (const auto& [field, help] : writer_fields)
      for (const auto& [tier, st] : stores.items())
        if (st.contains(field))
          g.push_back({std::string("blendserve_store_") + field, help, "tier=\"" + tier + "\"", st.value(field, 0.0)});
    // What each tier's loaders moved into requests' caches.
    const std::tuple<const char*, const char*, const char*> load_fields[] = {
        {"load_bytes", "blendserve_tier_load_bytes_total", "K/V bytes the tier's loaders moved into requests' caches."},
        {"load_s", "blendserve_tier_load_seconds_total", "Loader time spent on those bytes (read and place)."},
        {"loads", "blendserve_tier_loads_total", "Requests' loads from the tier that ended (stopped ones too)."}};
    for (const auto& [field, name, help] : load_fields)
      for (const auto& [tier, st] : stores.items())
        if (st.contains(field))
          g.push_back({name, help, "tier=\"" + tier + "\"", st.value(field, 0.0), "counter"});
  } catch (const std::exception&) {
  }
  // Per actor (and compute thread): what the inspector's table holds.
  try {
    const json actors = json::parse(runtime.actors_json());
    auto labels = [](const json& a) {
      return "actor=\"" + a.value("actor", "") + "\",kind=\"" + a.value("kind", "") + "\",node=\"" +
             a.value("node", "") + "\",rank=\"" + std::to_string(a.value("rank", 0)) + "\"";
    };
    const std::tuple<const char*, const char*, const char*, const char*> actor_fields[] = {
        {"messages", "blendserve_actor_messages_total", "Messages an actor handled (jobs, for a compute thread).",
         "counter"},
        {"busy_s", "blendserve_actor_busy_seconds_total", "Time an actor spent handling messages.", "counter"},
        {"mailbox", "blendserve_actor_mailbox_depth",
         "Messages waiting for an actor, as it saw when it took its last one (self-reported).", "gauge"},
        {"busy_share", "blendserve_actor_busy_share", "Share of the last interval an actor was busy.", "gauge"},
        {"restarts", "blendserve_actor_restarts_total", "Times the supervisor started an actor again.", "counter"}};
    for (const auto& [field, name, help, type] : actor_fields)
      for (const auto& a : actors) g.push_back({name, help, labels(a), a.value(field, 0.0), type});
  } catch (const std::exception&) {
  }
  return g;
}

}  // namespace bs::http
