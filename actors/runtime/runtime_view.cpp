// What a Runtime shows its callers, read-only: the model, backend and tiers it serves
// with, and its counters (actors/runtime/runtime.h). The HTTP layer and the tools read the
// runtime through these, never through its RuntimeContext.
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "model/hf_checkpoint.h"

namespace bs {

const LlamaModel& Runtime::model() const { return *ctx_->model; }

const kernels::Backend& Runtime::backend() const { return *ctx_->backend; }

kernels::Precision Runtime::precision() const { return ctx_->precision; }

std::string Runtime::model_id() const {
  if (!ctx_->config.model_name.empty()) return ctx_->config.model_name;
  return model_display_name(ctx_->model->path());
}

std::vector<std::string> Runtime::tier_names() const {
  std::vector<std::string> names;
  for (const auto& t : ctx_->tiers) names.push_back(t.name);
  return names;
}

bool Runtime::has_storage_node() const { return ctx_->remote != nullptr; }

std::optional<std::string> Runtime::storage_node_unreachable() const {
  if (!ctx_->remote || ctx_->remote->reachable()) return std::nullopt;
  return ctx_->remote->last_error();
}

int Runtime::in_flight() const { return ctx_->in_flight.load(); }

int Runtime::queued() const { return ctx_->queued.load(); }

Runtime::KvPages Runtime::kv_pages() const {
  const auto& pool = *ctx_->kv_pool;
  return {pool.total_pages(), pool.total_pages() - pool.free_pages(), pool.reserved_pages(), pool.page_positions(),
          pool.page_bytes()};
}

int64_t Runtime::actor_restarts() const { return ctx_->restarts.load(); }

Runtime::DecodeStats Runtime::decode_stats() const {
  return {ctx_->decode_steps.load(), ctx_->decode_tokens.load(), ctx_->interleaved_steps.load()};
}

Runtime::ReuseStats Runtime::reuse_stats() const {
  const auto f = ctx_->flights.stats();
  return {f.computed, f.joined, f.provisional, f.in_flight, ctx_->write_backs_refused.load()};
}

Runtime::TensorParallelStats Runtime::tensor_parallel_stats() const {
  if (!ctx_->tp) return {};
  return {ctx_->tp->size(), ctx_->tp->failures(), ctx_->tp->rebuilds()};
}

}  // namespace bs
