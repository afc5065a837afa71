#include "http/frontend.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "blend/rag_prompt.h"
#include "http/api_access.h"
#include "http/api_error.h"
#include "http/cluster_tls.h"
#include "http/console_page.h"
#include "http/frontend_reports.h"
#include "http/listen_backlog.h"
#include "http/openai_request.h"
#include "http/server.h"
#include "http/upstream.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"
#include "http/tokenize_routes.h"

namespace bs::http {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

// The model's context length from its metadata (0 when the file has none).
int64_t context_length_of(const gguf::GgufFile& f) {
  const auto arch = f.get_string("general.architecture");
  if (!arch) return 0;
  return f.get_int(*arch + ".context_length").value_or(0);
}

ApiError no_worker(const std::string& why) {
  return ApiError(503, "no worker can take the request: " + why, "server_error", "", "no_worker");
}

double now_s() { return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); }

}  // namespace

struct FrontendServer::Impl {
  FrontendOptions opt;
  ClusterMonitor& monitor;
  gguf::GgufFile gguf_file;
  Tokenizer tokenizer;
  int64_t context_length;  // <architecture>.context_length: /tokenize's max_model_len
  RequestRouter router;
  httplib::Server svr;
  std::map<std::string, FrontendWorker> workers;
  FrontendMetrics metrics;  // /metrics
  // The forwards in flight (aborted at shutdown), pruned as they end.
  std::mutex live_mu;
  std::vector<std::weak_ptr<Upstream>> live;
  std::atomic<bool> draining{false};

  // Forwards whose client is still being answered (its handler or stream holds it).
  size_t forwards_in_flight() {
    std::lock_guard<std::mutex> lock(live_mu);
    std::erase_if(live, [](const std::weak_ptr<Upstream>& x) { return x.expired(); });
    return live.size();
  }
  // During a drain: the refusal of a new request (the client retries elsewhere).
  bool refused_while_draining(httplib::Response& res) {
    if (!draining.load()) return false;
    send_error(res, ApiError(503, "the frontend is shutting down (draining); retry", "server_error", "", "draining"));
    return true;
  }
  // Last: destroyed first, after ~Impl aborted the live forwards.
  std::unique_ptr<ForwardPool> pool;

  Impl(FrontendOptions o, ClusterMonitor& m)
      : opt(std::move(o)),
        monitor(m),
        gguf_file(open_model_file(opt.model_path)),
        tokenizer(Tokenizer::from_gguf(gguf_file)),
        context_length(context_length_of(gguf_file)),
        router(opt.routing) {
    for (const auto& w : opt.workers) workers[w.name] = w;
    const int threads = opt.threads;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    svr.set_payload_max_length(static_cast<size_t>(opt.max_body_bytes));
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    // A completion holds one HTTP thread and one forward; warm and delete fan out to
    // every worker at once.
    pool = std::make_unique<ForwardPool>(static_cast<size_t>(threads) + 2 * opt.workers.size());
    routes();
  }

  ~Impl() {
    std::vector<std::shared_ptr<Upstream>> running;
    {
      std::lock_guard<std::mutex> lock(live_mu);
      for (auto& w : live)
        if (auto u = w.lock()) running.push_back(std::move(u));
    }
    for (auto& u : running) u->abort();
    pool.reset();
  }

  // Why `worker` has failed the requests it holds, or "" while it is fine: down in
  // the monitor, or silent past two heartbeat intervals (a frozen process keeps its
  // connection open, but its reports stop), so a request on a frozen worker ends
  // within two intervals whatever its own timeouts.
  std::string worker_lost(const std::string& worker) const {
    const auto view = monitor.view();
    const MemberView* m = view->find(worker);
    if (!m) return "";
    if (!m->up) return "worker " + worker + " is down (" + m->last_error + ")";
    const double age = now_s() - m->last_report_s;
    if (m->last_report_s > 0 && age > 2 * opt.heartbeat_interval_s)
      return "worker " + worker + " missed its heartbeats (no report for " + std::to_string(age) + " s)";
    return "";
  }

  enum class Waited { ready, timed_out, worker_lost };
  // Waits (holding `lock` on u.mu) until `ready` or `deadline`, looking at the
  // worker's heartbeats every quarter interval (`why` says what was found).
  template <class Ready>
  Waited wait_on_worker(std::unique_lock<std::mutex>& lock, Upstream& u, clock_type::time_point deadline,
                        const std::string& worker, Ready ready, std::string& why) {
    const auto slice = std::chrono::duration_cast<clock_type::duration>(
        std::chrono::duration<double>(std::max(0.01, opt.heartbeat_interval_s / 4)));
    for (;;) {
      if (ready()) return Waited::ready;
      const auto now = clock_type::now();
      if (now >= deadline) return Waited::timed_out;
      if (u.cv.wait_until(lock, std::min(deadline, now + slice), ready)) return Waited::ready;
      lock.unlock();
      why = worker_lost(worker);
      lock.lock();
      if (!why.empty()) return Waited::worker_lost;
    }
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) { return http::authorized(opt.api_keys, req, res); }

  int workers_up(const ClusterView& v) const {
    int n = 0;
    for (const auto& m : v.members) n += m.member.role == "worker" && m.up;
    return n;
  }

  // A forward on the pool. Refused (every forward thread busy, or shutting down):
  // it comes back ended and failed, `refused` set.
  std::shared_ptr<Upstream> start(const FrontendWorker& w, const std::string& method, const std::string& path,
                                  std::string body, bool stream) {
    auto u = std::make_shared<Upstream>();
    const bool queued = pool->submit([u, w, tls = opt.tls, key = opt.worker_api_key, method, path,
                                      body = std::move(body), connect = opt.connect_timeout_s,
                                      read = stream ? opt.idle_timeout_s : opt.first_token_timeout_s, stream]() mutable {
      run_upstream(u, w, tls, key, method, path, std::move(body), connect, read, stream);
    });
    if (!queued) {
      std::lock_guard<std::mutex> lock(u->mu);
      u->done = u->failed = u->refused = true;
      u->error = "the frontend has " + std::to_string(pool->size()) + " forwards in flight, its limit";
      std::lock_guard<std::mutex> mlock(metrics.mu);
      ++metrics.forwards_refused;
      return u;
    }
    std::lock_guard<std::mutex> lock(live_mu);
    std::erase_if(live, [](const std::weak_ptr<Upstream>& x) { return x.expired(); });
    live.push_back(u);
    return u;
  }

  // A worker failed the request (it never answered, or answered 5xx).
  static bool worker_failed(const Upstream& u) { return u.failed || (u.got_status && u.status >= 500); }

  static std::string failure_text(const std::string& worker, const Upstream& u) {
    if (u.failed) return "worker " + worker + " failed: " + u.error;
    return "worker " + worker + " answered HTTP " + std::to_string(u.status);
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    if (refused_while_draining(res)) return;
    ChatCompletionRequest parsed;
    try {
      parsed = parse_chat_completion(req.body, 16);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    relay_completion(req, res, "/v1/chat/completions", parsed.request.documents, parsed.stream);
  }

  // /v1/completions: routed by its documents as chat is (a worker assembles the prompt).
  void text_completion(const httplib::Request& req, httplib::Response& res) {
    if (refused_while_draining(res)) return;
    TextCompletionRequest parsed;
    try {
      parsed = parse_text_completion(req.body, 16);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    relay_completion(req, res, "/v1/completions", parsed.request.documents, parsed.stream);
  }

  // Sends a completion to the worker the router picks for its documents' chunks, once
  // more elsewhere if that worker fails before anything reached the client, and relays
  // the answer (streamed or whole).
  void relay_completion(const httplib::Request& req, httplib::Response& res, const char* path,
                        const std::vector<std::string>& documents, bool stream) {
    std::vector<std::vector<int32_t>> chunks;
    int64_t doc_tokens = 0;
    for (const auto& d : documents) {
      chunks.push_back(document_chunk_tokens(tokenizer, d));
      doc_tokens += static_cast<int64_t>(chunks.back().size());
    }
    std::set<std::string> exclude;
    std::string first_failure;
    for (int attempt = 0;; ++attempt) {
      const auto view = monitor.view();
      const auto choice = router.choose(*view, chunks, exclude);
      if (!choice) {
        std::lock_guard<std::mutex> lock(metrics.mu);
        ++metrics.refused_no_worker;
        res.set_header("Retry-After", "1");
        return send_error(res, no_worker(first_failure.empty() ? "no worker is up" : first_failure +
                                                                                       "; no other worker is up"));
      }
      const FrontendWorker& w = workers.at(choice->worker);
      router.started(*view, w.name, chunks);
      {
        std::lock_guard<std::mutex> lock(metrics.mu);
        ++metrics.routed[w.name];
        metrics.held_tokens += choice->held_tokens;
        metrics.storage_tokens += choice->storage_tokens;
        metrics.request_tokens += doc_tokens;
      }
      auto u = start(w, "POST", path, req.body, stream);
      if (u->refused) {
        router.finished(w.name);
        res.set_header("Retry-After", "1");
        return send_error(res, ApiError(503, u->error, "server_error", "", "frontend_busy"));
      }
      Waited waited;
      std::string lost;
      {
        std::unique_lock<std::mutex> lock(u->mu);
        const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                      std::chrono::duration<double>(opt.first_token_timeout_s));
        waited = wait_on_worker(lock, *u, deadline, w.name, [&] {
          // Streamed: wait for the first token (or an answer that is not a stream: an error).
          return u->done || (stream && (u->first_token || (u->got_status && u->status != 200)));
        }, lost);
      }
      if (waited != Waited::ready) {
        u->abort();
        std::lock_guard<std::mutex> lock(u->mu);
        u->failed = true;
        u->error = waited == Waited::timed_out
                       ? "no first token within " + std::to_string(opt.first_token_timeout_s) + " s"
                       : lost;
      }
      if (waited == Waited::worker_lost) {
        std::lock_guard<std::mutex> lock(metrics.mu);
        ++metrics.heartbeat_failures;
      }
      bool failed_here;
      {
        std::lock_guard<std::mutex> lock(u->mu);
        failed_here = worker_failed(*u);
        if (failed_here) first_failure = waited == Waited::worker_lost ? lost : failure_text(w.name, *u);
      }
      if (failed_here) {
        u->abort();
        router.finished(w.name);
        std::lock_guard<std::mutex> lock(metrics.mu);
        ++metrics.failed[w.name];
        if (attempt == 0) {  // nothing went to the client yet: once more, elsewhere
          ++metrics.retries;
          exclude.insert(w.name);
          continue;
        }
        res.set_header("Retry-After", "1");
        return send_error(res, no_worker(first_failure));
      }
      res.set_header("X-Blendserve-Worker", w.name);
      std::unique_lock<std::mutex> lock(u->mu);
      if (!stream || u->status != 200) {
        res.status = u->status;
        res.set_content(u->pending, u->content_type.empty() ? "application/json" : u->content_type);
        lock.unlock();
        router.finished(w.name);
        return;
      }
      lock.unlock();
      relay_stream(res, u, w.name);
      return;
    }
  }

  // Streams what the worker sends on to the client; from here a worker failure
  // ends the stream with an error event (the client already has tokens).
  void relay_stream(httplib::Response& res, std::shared_ptr<Upstream> u, const std::string& worker) {
    const double idle = opt.idle_timeout_s;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, u, worker, idle](size_t, httplib::DataSink& sink) {
          for (;;) {
            std::string out;
            bool done = false, upstream_failed = false;
            std::string why;
            Waited waited;
            {
              std::unique_lock<std::mutex> lock(u->mu);
              const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                            std::chrono::duration<double>(idle));
              std::string lost;
              waited = wait_on_worker(lock, *u, deadline, worker, [&] { return !u->pending.empty() || u->done; }, lost);
              if (waited != Waited::ready) {
                u->failed = u->done = true;
                u->error = waited == Waited::timed_out ? "no data for " + std::to_string(idle) + " s" : lost;
              }
              out.swap(u->pending);
              done = u->done;
              upstream_failed = u->failed;
              why = u->error;
            }
            if (!out.empty() && !sink.write(out.data(), out.size())) {
              u->abort();  // the client went away: the worker's request is cancelled with our connection
              return false;
            }
            if (done) {
              if (waited != Waited::ready) u->abort();  // the worker's request ends too
              if (upstream_failed) {
                {
                  std::lock_guard<std::mutex> lock(metrics.mu);
                  ++metrics.mid_stream_failures;
                  ++metrics.failed[worker];
                  if (waited == Waited::worker_lost) ++metrics.heartbeat_failures;
                }
                const json err = {{"error",
                                   {{"message", "worker " + worker + " failed after the first token: " + why},
                                    {"type", "server_error"},
                                    {"param", nullptr},
                                    {"code", 503}}}};
                const std::string ev = "data: " + err.dump() + "\n\n";
                sink.write(ev.data(), ev.size());
              }
              sink.done();
              return true;
            }
          }
        },
        [this, u, worker](bool) {
          u->abort();
          router.finished(worker);
        });
  }

  // One whole (not streamed) answer from a worker.
  struct WorkerAnswer {
    std::string worker;
    int status = 0;
    std::string body, content_type;
  };

  // Sends a small request to the worker the router picks for `chunks` (none: the
  // least loaded up), waits for the whole answer, and tries once more elsewhere if
  // that worker fails. nullopt with `why` when no worker answered.
  std::optional<WorkerAnswer> call_routed(const std::string& method, const std::string& path, const std::string& body,
                                          const std::vector<std::vector<int32_t>>& chunks, std::string& why) {
    std::set<std::string> exclude;
    why = "no worker is up";
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto view = monitor.view();
      const auto c = router.choose(*view, chunks, exclude);
      if (!c) break;
      const FrontendWorker& w = workers.at(c->worker);
      auto a = call_whole(w, method, path, body);
      if (!a.status) {
        why = a.body;
        exclude.insert(w.name);
        continue;
      }
      return a;
    }
    return std::nullopt;
  }

  // A whole answer from one worker; status 0 with the failure in `body` when it
  // failed (no answer within first_token_timeout_s, transport error, 5xx).
  WorkerAnswer call_whole(const FrontendWorker& w, const std::string& method, const std::string& path,
                          const std::string& body) {
    return wait_whole(w, start(w, method, path, body, false));
  }
  WorkerAnswer wait_whole(const FrontendWorker& w, const std::shared_ptr<Upstream>& u) {
    std::unique_lock<std::mutex> lock(u->mu);
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(opt.first_token_timeout_s));
    std::string lost;
    const Waited waited = wait_on_worker(lock, *u, deadline, w.name, [&] { return u->done; }, lost);
    if (waited != Waited::ready) {
      lock.unlock();
      u->abort();
      if (waited == Waited::worker_lost) return {w.name, 0, lost, ""};
      return {w.name, 0, "worker " + w.name + " did not answer within " + std::to_string(opt.first_token_timeout_s) + " s", ""};
    }
    if (worker_failed(*u)) return {w.name, 0, failure_text(w.name, *u), ""};
    return {w.name, u->status, u->pending, u->content_type.empty() ? "application/json" : u->content_type};
  }

  // Forwards a small request whole (models) with one retry elsewhere.
  void forward_whole(const httplib::Request& req, httplib::Response& res, const std::string& path) {
    std::string why;
    const auto a = call_routed(req.method, path, req.body, {}, why);
    if (!a) {
      res.set_header("Retry-After", "1");
      return send_error(res, no_worker(why));
    }
    res.status = a->status;
    res.set_header("X-Blendserve-Worker", a->worker);
    res.set_content(a->body, a->content_type);
  }

  // The workers up now, by name.
  std::vector<FrontendWorker> workers_up_now() {
    std::vector<FrontendWorker> out;
    const auto view = monitor.view();
    for (const auto& m : view->members)
      if (m.member.role == "worker" && m.up && workers.count(m.member.name)) out.push_back(workers.at(m.member.name));
    return out;
  }

  // POST /v1/documents: to the worker that already holds the document, else the
  // least loaded, which stores it (and with its remote tier's write-back pushes it
  // to the storage node before answering). "warm": true then sends it to every
  // other worker up, at once: each loads it from the storage node when the node has
  // it, or computes it. The answer is the storing worker's, plus "worker" and, when
  // warmed, "warmed": one entry per other worker (its source, or its error).
  void store_document(const httplib::Request& req, httplib::Response& res) {
    if (refused_while_draining(res)) return;
    ClusterDocumentRequest d;
    try {
      d = parse_cluster_document_body(req.body);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    const std::string body = json{{"text", d.text}}.dump();
    std::string why;
    const auto first = call_routed("POST", "/v1/documents", body, {document_chunk_tokens(tokenizer, d.text)}, why);
    if (!first) {
      res.set_header("Retry-After", "1");
      return send_error(res, no_worker(why));
    }
    res.set_header("X-Blendserve-Worker", first->worker);
    json out = json::parse(first->body, nullptr, false);
    if (first->status != 200 || !out.is_object()) {  // the worker's refusal (400 too long, ...) as it said it
      res.status = first->status;
      return res.set_content(first->body, first->content_type);
    }
    out["worker"] = first->worker;
    if (d.warm) {
      std::vector<std::pair<FrontendWorker, std::shared_ptr<Upstream>>> calls;
      for (const auto& w : workers_up_now())
        if (w.name != first->worker) calls.emplace_back(w, start(w, "POST", "/v1/documents", body, false));
      json warmed = json::array();
      for (const auto& [w, u] : calls) {
        const WorkerAnswer a = wait_whole(w, u);
        const json j = json::parse(a.body, nullptr, false);
        json entry = {{"worker", w.name}};
        if (a.status == 200 && j.is_object()) {
          entry["source"] = j.value("source", "");
          entry["already_stored"] = j.value("already_stored", false);
          entry["tiers"] = j.value("tiers", json::array());
        } else {
          entry["error"] = a.status ? "HTTP " + std::to_string(a.status) + ": " + a.body.substr(0, 300) : a.body;
        }
        warmed.push_back(std::move(entry));
      }
      out["warmed"] = std::move(warmed);
    }
    res.set_content(out.dump(), "application/json");
  }

  // DELETE /v1/documents/{id}: to every worker up, at once (each removes it from its
  // tiers; the first with a remote tier from the storage node too). 200 when any
  // held it, with "workers": those that did and, if any, "not_reached": workers that
  // failed or are down (they may still hold it); 404 when every worker reached said
  // so; 503 when none was reached.
  void erase_document(const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const auto up = workers_up_now();
    std::vector<std::shared_ptr<Upstream>> calls;
    for (const auto& w : up) calls.push_back(start(w, "DELETE", "/v1/documents/" + id, "", false));
    json deleted = json::array();
    std::set<std::string> reached, not_reached;
    std::optional<WorkerAnswer> refusal;  // a 4xx other than 404 (a malformed id): every worker says the same
    for (size_t i = 0; i < up.size(); ++i) {
      const WorkerAnswer a = wait_whole(up[i], calls[i]);
      if (!a.status) {
        not_reached.insert(up[i].name);
        continue;
      }
      reached.insert(up[i].name);
      if (a.status == 200) deleted.push_back(up[i].name);
      else if (a.status != 404 && !refusal) refusal = a;
    }
    for (const auto& entry : workers)  // down ones included
      if (!reached.count(entry.first)) not_reached.insert(entry.first);
    if (!deleted.empty()) {
      json out{{"id", id}, {"object", "document"}, {"deleted", true}, {"workers", deleted}};
      if (!not_reached.empty()) out["not_reached"] = not_reached;
      return res.set_content(out.dump(), "application/json");
    }
    if (refusal) {
      res.status = refusal->status;
      return res.set_content(refusal->body, refusal->content_type);
    }
    if (reached.empty()) {
      res.set_header("Retry-After", "1");
      return send_error(res, no_worker("no worker is up to delete the document"));
    }
    send_error(res, ApiError(404, "no stored document with id '" + id + "'", "invalid_request_error", "id",
                             "document_not_found"));
  }

  void routes() {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, status_error(req, res.status));
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) { send_exception(res, ep); });
    // Liveness: it answers. /health (and /ready, its readiness) below: some worker is up.
    svr.Get("/live", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"alive","role":"frontend"})", "application/json");
    });
    svr.Get(R"(/(health|ready))", [this](const httplib::Request&, httplib::Response& res) {
      const auto view = monitor.view();
      const int up = workers_up(*view);
      const bool drain = draining.load();
      res.status = up > 0 && !drain ? 200 : 503;
      res.set_content(json{{"status", drain ? "draining" : up > 0 ? "ok" : "no_worker"},
                           {"role", "frontend"},
                           {"workers_up", up},
                           {"workers", opt.workers.size()}}
                          .dump(),
                      "application/json");
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
    svr.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { text_completion(req, res); });
    // The model's tokenizer, answered here: the frontend loads the same one the workers do.
    svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        res.set_content(tokenize_response(tokenizer, parse_tokenize_request(req.body), context_length),
                        "application/json");
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        res.set_content(detokenize_response(tokenizer, parse_detokenize_request(req.body, tokenizer.vocab_size())),
                        "application/json");
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      forward_whole(req, res, "/v1/models");
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      forward_whole(req, res, req.path);
    });
    svr.Post("/v1/documents", [this](const httplib::Request& req, httplib::Response& res) { store_document(req, res); });
    svr.Delete(R"(/v1/documents/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) { erase_document(req, res); });
    svr.Get("/v1/inspect/cluster", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"node", opt.node}, {"members", cluster_members_json(*monitor.view(), router)}}.dump(),
                      "application/json");
    });
    svr.Get("/v1/inspect/snapshot", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(cluster_snapshot(opt, *monitor.view(), router, workers), "application/json");
    });
    svr.Get("/console", [](const httplib::Request&, httplib::Response& res) { send_console_page(res); });
    // A request's trace lives on the worker that ran it: ?node=<worker> says which
    // (request ids are each worker's own).
    svr.Get(R"(/v1/inspect/requests/(\d{1,19}))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string node = req.get_param_value("node");
      const auto it = workers.find(node);
      if (it == workers.end()) {
        std::string names;
        for (const auto& entry : workers) names += (names.empty() ? "" : ", ") + entry.first;
        return send_error(res, ApiError(400, "a cluster's requests are per worker: add ?node=<worker> (" + names + ")",
                                        "invalid_request_error", "node", "unknown_node"));
      }
      const WorkerAnswer a = call_whole(it->second, "GET", "/v1/inspect/requests/" + std::string(req.matches[1]), "");
      if (!a.status) {
        res.set_header("Retry-After", "1");
        return send_error(res, no_worker(a.body));
      }
      res.status = a.status;
      res.set_header("X-Blendserve-Worker", a.worker);
      res.set_content(a.body, a.content_type);
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.text(*monitor.view()), "text/plain; version=0.0.4");
    });
  }
};

FrontendServer::FrontendServer(FrontendOptions opt, ClusterMonitor& monitor)
    : impl_(std::make_unique<Impl>(std::move(opt), monitor)) {}

FrontendServer::~FrontendServer() { stop(); }

int FrontendServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? impl_->svr.bind_to_any_port(host) : (impl_->svr.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  // httplib listens with a backlog of 5: a burst of clients would be reset (listen_backlog.h).
  if (raise_listen_backlog(bound) == 0)
    std::fprintf(stderr, "blendserve: could not raise the listen backlog of port %d (stays httplib's 5)\n", bound);
  return bound;
}

bool FrontendServer::serve() { return impl_->svr.listen_after_bind(); }

void FrontendServer::drain(double seconds) {
  impl_->draining = true;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->forwards_in_flight() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void FrontendServer::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

}  // namespace bs::http
