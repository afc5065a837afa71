// The Llama-family forward pass over a KvCache, on any backend (the block's variants:
// model/architecture.h). Layers are exposed one
// at a time, and split in halves, so the blend pipeline can compare fresh K/V with
// loaded K/V and carry only some tokens forward.
//
// Memory: hidden states, q/k/v and positions passed to the layer calls are the
// backend's memory (kernels/backend.h); token ids come from the host and logits go
// back to it. Scratch between ops lives in the backend's per-thread workspace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/communicator.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace bs {

class Transformer {
 public:
  // How long a rank waits in one collective before the group fails (CommError).
  static constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{60000};

  explicit Transformer(const LlamaModel& model) : model_(model) {}
  // One rank of a tensor-parallel model (model/tensor_parallel.h): `comm` joins the
  // ranks (its size and rank are the model's shard; std::invalid_argument otherwise)
  // and must outlive this. The output and down projections' partial sums are
  // all-reduced, the LM head's rows gathered, so every call returns on every rank what
  // it returns at tp 1 (up to the order of the sums). Every rank must make the same
  // calls in the same order with the same arguments (token ids, positions, rows); a
  // collective that fails or times out throws kernels::CommError on every rank.
  //
  // A group of one (tp 1) is dropped unless `solo` is Run: then the model's
  // all-reduces still go through it (device.communicator: nccl at tp 1 — the
  // single-GPU path through NCCL, what a rank pays per layer apart from the traffic),
  // while comm() stays null (nothing else is tensor parallel).
  //
  // On a device backend the buffers of a collective are the backend's: the collective
  // runs on the communicator's own stream, so the backend is synchronized before it
  // (sync_for_collective) and the communicator returns once the collective completed.
  enum class Solo { Skip, Run };
  Transformer(const LlamaModel& model, kernels::Communicator* comm,
              std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout, Solo solo = Solo::Skip);

  // A new communicator for the same rank (the group was rebuilt after a failure);
  // checked as the constructor does. Not while a call runs.
  void set_communicator(kernels::Communicator* comm);
  // The tensor-parallel group (nullptr at tp 1) and its timeout.
  kernels::Communicator* comm() const { return comm_; }
  // Before a collective over backend buffers: the backend's work on them is done (a
  // device backend waits for its stream; a host backend's ops are done when they return).
  void sync_for_collective() const;
  std::chrono::milliseconds collective_timeout() const { return collective_timeout_; }
  // Sums a rank's partial values over the group, in rank order (nothing at tp 1):
  // buf is backend memory.
  void all_reduce(float* buf, int64_t count) const;
  // The collectives this rank's calls issued (all-reduces and logit gathers) and the
  // seconds spent in them (the wait for the slowest rank included): what tensor
  // parallelism costs. Read between calls, from the thread that makes them or after
  // handing over (TpGroup::run).
  struct CollectiveStats {
    int64_t calls = 0;
    double seconds = 0;
  };
  CollectiveStats collective_stats() const { return collective_stats_; }

  // Workspace slots [0, kWorkspaceSlots) of the backend are the Transformer's
  // (transformer.cpp); callers that keep scratch between its calls use higher ones.
  static constexpr int kWorkspaceSlots = 16;

  // A cache with a page pool of its own on the model's backend, exactly its pages
  // (tools, tests, chunk computes); a server's caches come from its shared KvPagePool.
  KvCache make_cache(int64_t capacity) const;

  // Token embeddings of host token ids: hidden [n, dim], backend memory (scaled by
  // sqrt(dim) where the architecture says so: Gemma 3).
  void embed(std::span<const int32_t> tokens, float* hidden) const;

  // Layer `layer`'s view of the cache for the attention ops: cache.view(layer) with the
  // layer's sliding window (LlamaModel::window; none but on a local layer). Every
  // attention over the model's caches reads through it (the blend's attention_mass too).
  kernels::KvView attention_view(const KvCache& cache, int layer) const;

  // One layer for n tokens at the given positions: writes their K/V into the cache
  // at those positions, attends causally by position over cache rows [0, n_kv),
  // and updates hidden in place (residual stream).
  void run_layer(int layer,
                 float* hidden,        // [n, dim]
                 const int32_t* pos,   // [n]
                 int64_t n, KvCache& cache, int64_t n_kv) const;

  // The two halves of run_layer, for callers that continue only some of the
  // tokens whose K/V they computed (the blend pipeline).
  // Attention input projections: q after RoPE, k after RoPE, v.
  void project_qkv(int layer,
                   const float* hidden,  // [n, dim]
                   const int32_t* pos,   // [n]
                   int64_t n,
                   float* q,             // [n, q_heads, head_dim]
                   float* k,             // [n, kv_heads, head_dim]
                   float* v              // [n, kv_heads, head_dim]
                   ) const;
  // Writes K/V rows into the cache at the given positions.
  void store_kv(int layer, const int32_t* pos, int64_t n, const float* k, const float* v, KvCache& cache) const;
  // Attention over the cache + output projection + MLP, residual added into hidden.
  void attend_and_mlp(int layer,
                      float* hidden,        // [n, dim]
                      const float* q,       // [n, q_heads, head_dim]
                      const int32_t* pos,   // [n]
                      int64_t n, const KvCache& cache, int64_t n_kv) const;

  // Final norm + LM head for n rows of hidden (backend memory), copied back into the
  // host array out [n, vocab] (tensor parallel: every rank's rows of the head gathered).
  void logits(const float* hidden, int64_t n, float* out) const;

  // Full forward of host tokens at positions cache.length ... cache.length + n - 1;
  // extends cache.length. Returns logits of the last token, or of every token
  // when all_logits ([n, vocab]).
  std::vector<float> forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits = false) const;

  // One decode step of B sequences at once (continuous batching): token b goes to
  // caches[b] at position caches[b]->length, which advances by 1. The products run
  // as one [B, dim] batch (a decode GEMV becomes a small GEMM, the weights are read
  // once for all rows); RoPE, the K/V store and attention are per sequence. Row b
  // is bit-identical to forward() of that token alone: batches larger than the
  // backend's linear_exact_rows() run in parts. Throws std::length_error, before
  // touching any cache, when one is full; std::invalid_argument on mismatched
  // sizes or a cache given twice. Returns [B, vocab].
  std::vector<float> decode_step(std::span<const int32_t> tokens,     // [B]
                                 std::span<KvCache* const> caches) const;  // [B]

  // decode_step with each row's next token picked on the backend from its logits
  // (Backend::sample_rows, with rows[b]'s settings and draw) instead of the logits
  // coming back: on a device backend only the B ids cross to the host. Returns [B]
  // tokens. Not with tensor parallelism (each rank holds a share of the vocabulary):
  // std::logic_error.
  std::vector<int32_t> decode_step_sampled(std::span<const int32_t> tokens,       // [B]
                                           std::span<KvCache* const> caches,      // [B]
                                           std::span<const kernels::SampleRow> rows) const;  // [B]

  const LlamaModel& model() const { return model_; }

 private:
  // hidden [n, dim] *= sqrt(dim) where the architecture scales its embeddings.
  void scale_embeddings(float* hidden, int64_t n) const;
  // Output projection + MLP for n rows whose attention output is in attn, residual
  // added into hidden (the second half of attend_and_mlp).
  void project_and_mlp(int layer,
                       float* hidden,      // [n, dim]
                       const float* attn,  // [n, q_heads, head_dim]
                       int64_t n) const;
  // decode_step's checks: every cache fits, has room and is given once; every token is
  // in the vocabulary. Throws before anything is touched.
  void check_decode(std::span<const int32_t> tokens, std::span<KvCache* const> caches) const;
  // decode_step for at most linear_exact_rows() sequences: their logits [B, vocab]
  // into `logits` (host), or with `rows` their tokens picked on the backend into
  // `picked` (host [B]).
  void decode_rows(std::span<const int32_t> tokens, std::span<KvCache* const> caches, float* logits,
                   const kernels::SampleRow* rows = nullptr, int32_t* picked = nullptr) const;

  const LlamaModel& model_;
  kernels::Communicator* comm_ = nullptr;    // the group, at tp > 1
  kernels::Communicator* reduce_ = nullptr;  // the all-reduces' group: comm_, or a group of one (Solo::Run)
  Solo solo_ = Solo::Skip;
  std::chrono::milliseconds collective_timeout_ = kDefaultCollectiveTimeout;
  mutable CollectiveStats collective_stats_;  // only this rank's calling thread adds to it
};

}  // namespace bs
