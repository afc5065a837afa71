// A blend prefill served directly from one store (any tier): the stored KV of the
// prompt's prefix and chunks is read up front, then the engine computes. For tools,
// benchmarks, evaluation and tests; the runtime never uses it: its path plans the
// parts and streams them with loaders beside the engine's steps, and after a stored
// entry fails mid-load it begins the prefill again from a new plan with that part
// computed (no store is read on the compute thread). The engine itself holds no store.
#pragma once

#include "blend/blend_engine.h"
#include "storage/kv_store.h"

namespace bs {

class StoreBackedBlend {
 public:
  // One rank only: whether a part is stored is decided here, by this caller's lookup,
  // and tensor-parallel ranks must never decide apart (one could hit while another
  // misses and computes). Their plan comes from the leader (the runtime's
  // controller), their KV from the loaders. std::invalid_argument for an engine over
  // a tensor-parallel Transformer.
  StoreBackedBlend(const BlendEngine& engine, KvStore& store);

  // Prefill of a RAG prompt in the given mode. The cache gets room for
  // `extra_capacity` more tokens (decode). logit_rows > 1 returns the logits of the
  // last rows too (teacher forcing over an appended answer). A missed exact prefix
  // is computed alone and stored (a prefix at position 0 is the same in every
  // prompt); missed chunks are computed in context and not stored (warm() does).
  // between_layers, if set, is called before each layer (the runtime runs decode
  // steps of other requests there); it may throw to abort. `into`, if given, is the
  // cache to fill (a server's, from its page pool; capacity >= prompt + extra_capacity,
  // its contents overwritten); it ends up in the result. Else a cache is made.
  BlendPrefill prefill(const RagPrompt& prompt, const BlendOptions& options, int64_t extra_capacity = 0,
                       int64_t logit_rows = 1, const LayerWait& between_layers = {}, KvCache* into = nullptr) const;

  // The up-front read of prefill(): copies the stored KV of the prompt's parts into
  // `cache` as stored (capacity >= the prompt) and returns which parts it holds, for
  // BlendEngine::begin. A missed exact prefix is computed and stored; `prefix_hit`
  // (optional) says whether it was found.
  PrefillPlan read_stored(const RagPrompt& prompt, const BlendOptions& options, KvCache& cache,
                          bool* prefix_hit = nullptr) const;

  // Computes and stores the prompt's prefix and chunk KV that are not stored yet.
  // A request whose chunks missed computes them in context for its answer; running
  // this afterwards (off the first-token path) makes the next request hit.
  void warm(const RagPrompt& prompt) const;

  const BlendEngine& engine() const { return engine_; }
  KvStore& store() const { return store_; }

 private:
  const BlendEngine& engine_;
  KvStore& store_;
};

}  // namespace bs
