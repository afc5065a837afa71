// The cluster's frontend (`blendserve --config cluster.yaml --node <frontend>`):
// the OpenAI-compatible endpoint users call, with no model weights of its own. It
// sends each chat completion to a worker (actors/cluster/request_router.h: where the
// request's document KV already is, by the reports actors/cluster/cluster_monitor.h
// collects over the cluster's control plane: storage/framed_link.h, TLS 1.3 with
// mutual authentication unless the cluster file asks for plaintext; CAF's network
// layer is not used) and relays the answer, streamed or not.
//
// Failures: a worker that fails (connection refused or lost, 5xx, or silent past
// two heartbeat intervals in the cluster monitor — a frozen process keeps its
// sockets open, so its requests are failed by its missing reports, not by their
// own timeouts) before the request's first token reached the client is replaced
// once by another worker — a non-streamed answer is retried whenever nothing was
// sent yet; a streamed one is held back until its first token, so the client sees
// one clean stream. After the first token was sent, the stream ends with an error
// event (code 503). No worker up: 503 with Retry-After. A forward that ends early
// (a failure, a timeout, the client gone) shuts its connection to the worker, which
// cancels the request there.
//
// Forwards run on a fixed pool of threads (`threads` plus two per worker, for the
// fan-out of warm and delete), never a thread per request; when all are busy a
// request is refused with 503 (frontend_busy) at once.
//
// Routes: POST /v1/chat/completions, GET /v1/models, POST /v1/documents (to the
// worker holding it, else the least loaded, whose write-back pushes it to the
// storage node; "warm": true also to every other worker up, which load it from the
// node), DELETE /v1/documents/{id} (every worker up), GET /health (200 while a worker is up), GET /metrics, GET /v1/inspect/cluster
// (members, up/down, reports), GET /v1/inspect/snapshot (every node's snapshot:
// the workers' own, fetched when asked, plus the frontend's and the storage
// node's), GET /v1/inspect/requests/<id>?node=<worker> (that worker's trace), GET
// /console (the inspection page over all of them). Users' API keys are checked
// here; workers are called
// with the key derived from the cluster secret (tools/cluster/cluster_member.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/cluster_monitor.h"
#include "actors/cluster/request_router.h"
#include "storage/tls.h"

namespace bs::http {

struct FrontendWorker {
  std::string name, host;  // as in the cluster config
  int http_port = 0;       // the worker's own OpenAI endpoint
};

struct FrontendOptions {
  std::string node = "frontend";
  std::vector<std::string> api_keys;  // users' keys; empty: none needed
  std::string worker_api_key;         // what the frontend presents to workers
  std::string model_path;             // GGUF whose tokenizer makes chunk keys (weights are not read)
  RoutingPolicy routing = RoutingPolicy::kv_aware;
  std::vector<FrontendWorker> workers;
  double connect_timeout_s = 5;        // to a worker
  double first_token_timeout_s = 300;  // a worker that sends nothing this long has failed the request
  double idle_timeout_s = 120;         // silence within a streamed answer, at most
  double heartbeat_interval_s = 1;     // the monitor's: a worker without a report for two has failed its requests
  int64_t max_body_bytes = int64_t{8} << 20;
  int threads = 64;                    // HTTP threads (each completion holds one), and as many forward threads
  // The frontend's TLS files: its forwards to the workers are HTTPS (the workers
  // require its certificate; http/cluster_tls.h). Empty: plain HTTP.
  tls::Files tls{};
};

class FrontendServer {
 public:
  // The monitor must outlive the server. Loads the tokenizer (std::runtime_error
  // if the model file cannot be read).
  FrontendServer(FrontendOptions opt, ClusterMonitor& monitor);
  ~FrontendServer();
  FrontendServer(const FrontendServer&) = delete;
  FrontendServer& operator=(const FrontendServer&) = delete;

  // As http::Server: bind (port 0 = any; returns it), serve (blocks), stop.
  int bind(const std::string& host, int port);
  bool serve();
  // New completions and documents get 503 ("draining") and /health, /ready say
  // so; waits up to `seconds` for the forwards in flight (streams included) to end.
  void drain(double seconds);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs::http
