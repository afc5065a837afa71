#include "actors/runtime/decode_steps.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <caf/all.hpp>

namespace bs {
namespace {

// How long a drain job waits at most for the requests of the previous step to come
// back from the decoder before it steps without them (DecodeBatcher::take). Each
// of them comes back or finishes (forget), usually within a millisecond; the bound
// only matters when the decoder is slow (a loaded machine, a slow on_text), and
// the decoder is then what every stream waits for anyway.
constexpr auto kGather = std::chrono::milliseconds(50);

// One decode step for the taken entries. A cancelled request is not computed, but
// still goes back to the decoder, which finishes it. If the batched step throws,
// each request is stepped alone, so only the one that fails gets the error.
void run_decode_batch(const WorkerEnv& env, const HandlesRef& h, DecodeBatcher& batcher,
                      std::vector<DecodeBatcher::Entry> entries, bool interleaved) {
  std::vector<DecodeBatcher::Entry> live;
  for (auto& e : entries) {
    if (e.slot->cancelled.load()) caf::anon_send(h->decoder(), logits_atom::value, e.slot->id, DecodeStep{});
    else live.push_back(std::move(e));
  }
  TpRanks* tp = env.tp;
  if (live.empty()) {
    // Tensor parallel, between two layers: the followers wait for a decision.
    if (tp && interleaved) tp->announce(RankDecision{RankDecision::Continue, {}, {}});
    return;
  }
  const int64_t B = static_cast<int64_t>(live.size());
  const int64_t vocab = env.model->full_config().vocab;
  std::vector<int32_t> tokens;
  std::vector<uint64_t> ids;
  std::vector<KvCache*> caches;
  for (const auto& e : live) {
    tokens.push_back(e.token);
    ids.push_back(e.slot->id);
    caches.push_back(&e.slot->cache);
  }
  batcher.step_began(ids);
  std::vector<DecodeStep> out(static_cast<size_t>(B));
  try {
    if (tp) {
      // The followers step the same requests: told inside the running job, or as a job.
      if (interleaved) tp->announce(RankDecision{RankDecision::Decode, ids, tokens});
      else tp->dispatch(RankJob{RankJob::Decode, 0, {}, false, ids, tokens, false});
    }
    if (!tp && !env.backend->host_accessible()) {
      // A device backend picks the next tokens where the logits are (one id per request
      // crosses to the host), with the draws the decoder made for them.
      std::vector<kernels::SampleRow> rows;
      for (const auto& e : live) rows.push_back(e.next);
      const std::vector<int32_t> picked = env.tf->decode_step_sampled(tokens, caches, rows);
      for (int64_t b = 0; b < B; ++b) out[b].token = picked[b];
    } else {
      const std::vector<float> logits = env.tf->decode_step(tokens, caches);
      for (int64_t b = 0; b < B; ++b)
        out[b].logits.assign(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
    }
  } catch (const std::exception& e) {
    if (tp) {
      // A rank failed (or a collective): every request of the batch fails with it;
      // the group is rebuilt before the next job.
      tp->fail(e.what());
      for (auto& o : out) o.error = std::string("tensor-parallel decode step failed: ") + e.what();
    } else {
      // decode_step checks every cache before it writes any: stepping alone is safe.
      for (int64_t b = 0; b < B; ++b) {
        try {
          out[b].logits = env.tf->forward(std::span<const int32_t>(&tokens[b], 1), live[b].slot->cache);
        } catch (const std::exception& e) {
          out[b].error = e.what();
        }
      }
    }
  }
  env.decode_steps.fetch_add(1);
  env.decode_tokens.fetch_add(B);
  if (interleaved) env.interleaved_steps.fetch_add(1);
  for (int64_t b = 0; b < B; ++b) {
    out[b].batch = static_cast<int32_t>(B);
    out[b].interleaved = interleaved;
    caf::anon_send(h->decoder(), logits_atom::value, live[b].slot->id, std::move(out[b]));
  }
}

}  // namespace

std::chrono::steady_clock::duration interleave_interval(const WorkerEnv& env) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(env.config.decode_interleave, 0.0, 86400.0)));
}

void drain_decode(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher) {
  bool more = false;
  auto entries = batcher->take(env.config.max_decode_batch, kGather, more);
  if (more && !env.compute->submit([env, h, batcher] { drain_decode(env, h, batcher); })) {
    // Shutting down: whatever waits goes back to the decoder uncomputed (cancelled).
    for (auto& e : batcher->take_all()) {
      e.slot->cancelled = true;
      entries.push_back(std::move(e));
    }
  }
  run_decode_batch(env, h, *batcher, std::move(entries), false);
}

double interleave_decode(const WorkerEnv& env, const HandlesRef& h, DecodeBatcher& batcher) {
  if (!batcher.due(interleave_interval(env))) {
    if (env.tp) env.tp->announce(RankDecision{RankDecision::Continue, {}, {}});
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  run_decode_batch(env, h, batcher, batcher.take_now(env.config.max_decode_batch), true);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace bs
