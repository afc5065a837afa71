#include "actors/cluster/cluster_report.h"

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"

namespace bs {

namespace {

// Mixes a tier's counters into a change mark (any change of the key set moves at
// least one of puts, evictions, entries).
uint64_t mix(uint64_t h, const StoreStats& s) {
  for (const int64_t v : {s.puts, s.evictions, s.entries}) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
  return h;
}

}  // namespace

NodeReport make_worker_report(const Runtime& runtime, const std::string& node) {
  const RuntimeContext& ctx = runtime.context();
  NodeReport r;
  r.node = node;
  r.role = "worker";
  r.in_flight = ctx.in_flight.load();
  r.queued = ctx.queued.load();
  r.max_requests = ctx.config.max_requests;
  r.max_queue = ctx.config.max_queue;
  r.fingerprint = ctx.model->fingerprint();
  r.prelude = chunk_prelude_tokens(ctx.model->tokenizer(), ctx.config.chunk_prelude);
  r.uses_storage = ctx.remote != nullptr;
  return r;
}

NodeReport make_storage_report(const DiskKvStore& store, const std::string& node) {
  NodeReport r;
  r.node = node;
  r.role = "storage";
  const StoreStats s = store.stats();
  r.store_bytes = s.bytes;
  r.store_entries = s.entries;
  r.store_budget = store.budget();
  return r;
}

std::shared_ptr<HoldingsLog> worker_holdings(const Runtime& runtime) {
  const RuntimeContext* ctx = &runtime.context();
  return std::make_shared<HoldingsLog>(
      [ctx] {
        std::vector<ChunkKey> keys;
        if (ctx->ram) keys = ctx->ram->keys();
        if (ctx->ssd) {
          auto more = ctx->ssd->keys();
          keys.insert(keys.end(), more.begin(), more.end());
        }
        return keys;
      },
      [ctx] {
        uint64_t h = 0xcbf29ce484222325ull;
        if (ctx->ram) h = mix(h, ctx->ram->stats());
        if (ctx->ssd) h = mix(h, ctx->ssd->stats());
        return h;
      });
}

std::shared_ptr<HoldingsLog> storage_holdings(const DiskKvStore& store) {
  const DiskKvStore* s = &store;
  return std::make_shared<HoldingsLog>([s] { return s->keys(); },
                                       [s] { return mix(0xcbf29ce484222325ull, s->stats()); });
}

}  // namespace bs
