// Documents stored and erased through the runtime (POST and DELETE /v1/documents,
// `blendserve generate --documents`): a document's KV computed or fetched once and
// kept in this node's tiers (and the storage node's).
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/runtime_actors.h"
#include "blend/rag_prompt.h"

namespace bs {
using namespace runtime_detail;

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
    auto& a = *actors_;
    worker_actor worker;
    {
      std::lock_guard<std::mutex> lock(a.mu);
      if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
      worker = a.h->worker();
      ++a.documents;  // the actor system outlives this call (shutdown waits)
    }
    std::optional<RequestError> failure;  // shutting down (the worker or the compute thread stopped), internal
    {
      CallerActor self{*a.system};
      // The compute waits behind prefills and decode steps; ten load timeouts bound it.
      const auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::duration<double>(10 * ctx_->config.load_timeout));
      self->request(worker, bound, document_atom::value, tokens)
          .receive([&](KeyedKv& kk) { kv = std::move(kk.kv); },
                   [&](caf::error& e) {
                     if (e.category() == runtime_error_category())
                       failure = request_error_of(*a.system, e);
                     else if (e == caf::sec::request_timeout)
                       failure = RequestError(RequestErrc::internal, "the document's compute did not finish within " +
                                                                         std::to_string(bound.count() / 1000) + " s");
                     else
                       failure = RequestError(RequestErrc::shutting_down, "the runtime is shut down");
                   });
    }
    {
      std::lock_guard<std::mutex> lock(a.mu);
      --a.documents;
    }
    if (failure) throw *failure;
    out.source = "computed";
  }
  out.on_storage_node = on_node;
  if (ctx_->remote && ctx_->config.remote.write_back && !on_node) {
    if (!kv) kv = ctx_->tiered->get(key);  // held here only: the node gets this node's copy
    // Synchronous (bounded by the remote tier's I/O timeout): the caller learns
    // whether the cluster has the document, unlike write-back's best-effort queue.
    out.on_storage_node = kv && ctx_->remote->put(key, kv);
  }
  if (!out.already_stored && kv) ctx_->tiered->put(key, std::move(kv));
  for (const auto& t : ctx_->tiers)
    if (t.store != ctx_->remote.get() && t.store->contains(key)) out.tiers.push_back(t.name);
  if (out.tiers.empty() && !out.on_storage_node)
    throw RequestError(RequestErrc::internal, "the document could not be stored: every tier of this node refused "
                                              "it (GET /v1/inspect/stores shows the write errors)");
  if (ctx_->pasted) ctx_->pasted->add(tokens);
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
  const bool here = ctx_->tiered->erase(key);
  const bool on_node = ctx_->remote && ctx_->remote->erase(key);
  return here || on_node;
}

}  // namespace bs
