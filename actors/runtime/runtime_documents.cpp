// Documents stored and erased through the runtime (POST and DELETE /v1/documents,
// `blendserve generate --documents`): a document's KV computed (by the layer worker)
// or fetched once and kept in this node's tiers (and the storage node's), written
// and erased by the write-back actor, which owns the tiers' writes.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/runtime_actors.h"
#include "blend/rag_prompt.h"

namespace bs {
using namespace runtime_detail;

namespace {

// A document call in flight: the runtime's shutdown waits for it (Actors::documents),
// and it holds the handles it asks. Throws shutting_down once the runtime stopped.
class DocumentCall {
 public:
  // The runtime's actor system, and its Actors' lock, stopped flag, document count
  // and handles.
  DocumentCall(caf::actor_system& sys, std::mutex& mu, const bool& stopped, int& documents, const Handles& h)
      : sys_(sys), mu_(mu), documents_(documents) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
    worker = h.worker();
    write_back = h.write_back();
    ++documents_;  // the actor system outlives this call (shutdown waits)
  }
  ~DocumentCall() {
    std::lock_guard<std::mutex> lock(mu_);
    --documents_;
  }
  DocumentCall(const DocumentCall&) = delete;
  DocumentCall& operator=(const DocumentCall&) = delete;

  // Asks `to` and waits for its answer within `bound`; a failure is a RequestError
  // (the actor's own, a timeout naming `what`, or shutting_down).
  template <class Reply, class Actor, class... Ts>
  Reply ask(const Actor& to, std::chrono::milliseconds bound, const std::string& what, Ts&&... xs) {
    std::optional<Reply> reply;
    std::optional<RequestError> failure;
    {
      CallerActor self{sys_};
      self->request(to, bound, std::forward<Ts>(xs)...)
          .receive([&](Reply& r) { reply = std::move(r); },
                   [&](caf::error& e) {
                     if (e.category() == runtime_error_category())
                       failure = request_error_of(sys_, e);
                     else if (e == caf::sec::request_timeout)
                       failure = RequestError(RequestErrc::internal, what + " did not finish within " +
                                                                         std::to_string(bound.count() / 1000) + " s");
                     else
                       failure = RequestError(RequestErrc::shutting_down, "the runtime is shut down");
                   });
    }
    if (failure) throw *failure;
    return std::move(*reply);
  }

  worker_actor worker;
  write_back_actor write_back;

 private:
  caf::actor_system& sys_;
  std::mutex& mu_;
  int& documents_;
};

// A document's compute waits behind prefills and decode steps, its writes behind the
// write-back actor's queue: ten load timeouts bound each.
std::chrono::milliseconds document_bound(const RuntimeContext& ctx) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(10 * ctx.config.load_timeout));
}

}  // namespace

Runtime::StoredDocument Runtime::store_document(const std::string& text) {
  const auto tokens = document_chunk_tokens(ctx_->model->tokenizer(), text);
  if (tokens.empty()) throw RequestError(RequestErrc::invalid, "the document is empty");
  if (static_cast<int64_t>(tokens.size()) >= ctx_->model->config().context_length)
    throw RequestError(RequestErrc::too_long, "the document has " + std::to_string(tokens.size()) +
                                                  " tokens; the model's context is " +
                                                  std::to_string(ctx_->model->config().context_length));
  const ChunkKey key = ctx_->engine->chunk_key(tokens);
  StoredDocument out;
  out.id = key.hex();
  out.tokens = static_cast<int64_t>(tokens.size());
  out.already_stored = ctx_->tiered->contains(key);
  out.source = "local";
  auto& a = *actors_;
  DocumentCall call(*a.system, a.mu, a.stopped, a.documents, *a.h);
  // The storage node's copy: checked once here, so a document already there is
  // neither computed again nor pushed again. A node that is down answers false at
  // once (RemoteKvStore's retry_after), which costs a compute, never a wrong answer.
  const bool on_node = ctx_->remote && ctx_->remote->contains(key);
  std::shared_ptr<const ChunkKv> kv;
  if (!out.already_stored && on_node) {
    kv = ctx_->remote->get(key);  // every layer checked against the node's checksums; nullptr on any failure
    if (kv) out.source = "remote";
  }
  if (!out.already_stored && !kv) {
    // The layer worker computes it on the compute thread, like every other
    // compute, with the decoding streams' steps between its layers.
    kv = call.ask<KeyedKv>(call.worker, document_bound(*ctx_), "the document's compute", document_atom::value, tokens)
             .kv;
    out.source = "computed";
  }
  // The tiers' writes are the write-back actor's.
  const auto written = call.ask<DocumentWritten>(call.write_back, document_bound(*ctx_), "the document's writes",
                                                 doc_write_atom::value,
                                                 DocumentWrite{key, std::move(kv), tokens, out.already_stored, on_node});
  out.on_storage_node = written.on_storage_node;
  out.tiers = written.tiers;
  if (out.tiers.empty() && !out.on_storage_node)
    throw RequestError(RequestErrc::internal, "the document could not be stored: every tier of this node refused "
                                              "it (GET /v1/inspect/stores shows the write errors)");
  return out;
}

bool Runtime::erase_document(const std::string& key_hex) {
  if (key_hex.size() != 32) return false;
  ChunkKey key;
  try {
    key.hi = std::stoull(key_hex.substr(0, 16), nullptr, 16);
    key.lo = std::stoull(key_hex.substr(16), nullptr, 16);
  } catch (const std::exception&) {
    return false;
  }
  if (key.hex() != key_hex) return false;
  auto& a = *actors_;
  DocumentCall call(*a.system, a.mu, a.stopped, a.documents, *a.h);
  return call.ask<bool>(call.write_back, document_bound(*ctx_), "the document's erase", doc_erase_atom::value, key);
}

}  // namespace bs
