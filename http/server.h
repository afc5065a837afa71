// The OpenAI-compatible REST server of `blendserve serve`, a front end of the
// actor Runtime (actors/runtime/runtime.h): every completion is one Runtime::submit, its
// text streamed by the runtime's callbacks. cpp-httplib stays inside server.cpp.
//
// Routes (http/README.md has the full contract):
//   POST /v1/chat/completions   stream or not; RAG documents; usage with cached tokens
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/documents          precompute + store a document's KV -> its key
//   DELETE /v1/documents/{key}
//   GET  /health                200 ok; 503 while draining or failed (no key needed)
//   GET  /ready                 readiness: /health, and with a remote tier a storage
//                               node answering (503 storage_unreachable; no key needed)
//   GET  /live                  liveness: 200 unless the runtime failed (no key needed)
//   GET  /metrics               Prometheus text
//   GET  /v1/inspect/{actors,traces,stores,profile}   the inspection console's JSON
// Errors are OpenAI-shaped JSON with the status the SDKs map to exception types.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/runtime.h"
#include "http/api_error.h"

namespace bs::http {

class Server {
 public:
  // The runtime must outlive the server. Reads server.* and limits.* from config.
  Server(Runtime& runtime, const RuntimeConfig& config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; port 0 picks a free one. Returns the port.
  // Throws std::runtime_error when the address cannot be bound.
  int bind(const std::string& host, int port);
  // Also answers GET /health, /ready and /live (the same answers) in plain HTTP on
  // host:port, on a thread of its own until stop(): the probes of an orchestrator,
  // which carry no client certificate for a TLS cluster's worker endpoint. Returns
  // the port (0 picks one); throws std::runtime_error as bind.
  int bind_probes(const std::string& host, int port);
  // Serves on the bound socket until stop(); blocks. False if listening failed.
  bool serve();
  // New completions get 503 and /health reports "draining"; waits up to
  // `seconds` for the requests in flight and queued to finish.
  void drain(double seconds);
  // Closes the listener and ends the connections; serve() returns.
  void stop();

  const std::string& model_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs::http
