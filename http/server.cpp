#include "http/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <regex>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "blend/rag_prompt.h"
#include "http/api_access.h"
#include "http/api_error.h"
#include "http/connection_socket.h"
#include "http/cluster_tls.h"
#include "http/listen_backlog.h"
#include "http/console_page.h"
#include "http/metrics.h"
#include "http/openai_request.h"
#include "http/openai_response.h"
#include "http/runtime_gauges.h"
#include "http/tokenize_routes.h"
#include "kernels/backend.h"
#include "model/llama_model.h"
#include "model/random_model.h"
#include "kernels/kv_view.h"

namespace bs::http {
namespace {

using json = nlohmann::json;
using clock = std::chrono::steady_clock;

// How often a waiting response writes something harmless (an SSE comment, or
// whitespace before a JSON body) to learn whether the client is still there:
// once the response has begun, a closed connection shows when a write fails.
constexpr auto kHeartbeat = std::chrono::milliseconds(250);
// How often a completion that has sent nothing yet (queued, or in its prefill)
// peeks at its connection to learn whether the client hung up.
constexpr auto kProbe = std::chrono::milliseconds(100);

// One completion's hand-off between the runtime's threads (callbacks) and the
// HTTP thread that answers it.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;  // final text not yet sent
  bool done = false;
  RequestResult result;
  std::atomic<bool> client_gone{false};
};

void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

// The runtime's refusals -> the status the OpenAI SDKs map to their exceptions.
ApiError api_error_of(const RequestError& e) {
  switch (e.code) {
    case RequestErrc::invalid: return bad_request(e.what());
    case RequestErrc::too_long: return bad_request(e.what(), "messages", "context_length_exceeded");
    case RequestErrc::overloaded: return ApiError(429, e.what(), "rate_limit_error", "", "rate_limit_exceeded");
    case RequestErrc::shutting_down: return ApiError(503, e.what(), "server_error", "", "service_unavailable");
    case RequestErrc::unavailable: return ApiError(503, e.what(), "server_error", "", "service_unavailable");
    case RequestErrc::internal: break;
  }
  return ApiError(500, e.what(), "server_error");
}

// A request that was accepted and then failed: 504 when it ran past
// limits.max_request_seconds, else 500; the message says what happened.
ApiError failed_request_error(const RequestResult& r) {
  if (r.deadline_exceeded) return ApiError(504, "the request failed: " + r.error, "server_error", "", "timeout");
  return ApiError(500, "the request failed: " + r.error, "server_error");
}

std::string random_hex(int chars) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < chars; ++i) s += digits[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Metrics label for a path: one per route, never the client's free text.
std::string route_of(const std::string& path) {
  for (const char* r : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/live", "/metrics", "/console",
                        "/tokenize", "/detokenize"})
    if (path == r) return r;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path == "/v1/documents") return path;
  if (path.rfind("/v1/documents/", 0) == 0) return "/v1/documents/{id}";
  if (path.rfind("/v1/inspect/", 0) == 0) return "/v1/inspect";
  return "other";
}

}  // namespace

struct Server::Impl {
  Impl(Runtime& rt, const RuntimeConfig& cfg)
      : runtime(rt), config(cfg), owned_svr(make_member_server(cfg.server_tls, cfg.server_tls_peers)),
        svr(*owned_svr) {
    // What users call the model (model_display_name: a checkpoint's directory, a GGUF
    // file's name without its quantization suffix; general.name is often a
    // training-run label), unless the config names it.
    model = runtime.model_id();
    fingerprint = "blendserve-" + runtime.backend().kernel_id() + "-" + kernels::precision_name(runtime.precision());
    if (runtime.model().kv_dtype() != kernels::TensorType::F32)
      fingerprint += std::string("-kv") + kernels::kv_dtype_name(runtime.model().kv_dtype());
    created = unix_now();
    context_length = runtime.model().config().context_length;
    metrics.declare_tiers(runtime.tier_names());
    // Every admitted or queued completion holds its connection's thread until it
    // ends; a few more answer health checks, metrics and refusals meanwhile.
    const int threads = cfg.server_threads > 0 ? cfg.server_threads : cfg.max_requests + cfg.max_queue + 8;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    svr.set_payload_max_length(static_cast<size_t>(cfg.max_body_bytes));
    svr.set_keep_alive_max_count(1000);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    routes();
  }

  // ---- helpers --------------------------------------------------------------

  bool authorized(const httplib::Request& req, httplib::Response& res) { return http::authorized(config.api_keys, req, res); }

  int retry_after_seconds() const {
    const double mean = metrics_latency_mean.load();
    return static_cast<int>(std::clamp(std::ceil(mean > 0 ? mean : 1.0), 1.0, 60.0));
  }

  void note_latency(double seconds) {
    // An exponential moving average of request latency, for Retry-After.
    double old = metrics_latency_mean.load();
    const double next = old <= 0 ? seconds : 0.8 * old + 0.2 * seconds;
    metrics_latency_mean.compare_exchange_strong(old, next);
  }

  // ---- routes ---------------------------------------------------------------

  void routes() {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    // Anything that ends >= 400 without a body (no route, too large, a request
    // httplib could not read) still gets an OpenAI-shaped error body.
    svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (res.status == 413) {
        send_error(res, ApiError(413, "the request body is larger than the limit (" +
                                          std::to_string(config.max_body_bytes) + " bytes, server.max_body)",
                                 "invalid_request_error", "", "request_too_large"));
      } else {
        send_error(res, status_error(req, res.status));
      }
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) { send_exception(res, ep); });
    // Counted before the response is written (httplib calls the post-routing
    // handler just before the status line; its logger only after the body): a
    // client that reads /metrics right after its answer must see that answer
    // counted, whichever server thread takes its next connection.
    svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics.count_response(route_of(req.path), res.status);
    });

    // /health: able to serve — the model is loaded (the server listens only after),
    // the runtime has not failed, it is not draining. A worker whose storage node is
    // down still serves (it recomputes), so this stays 200 then. /ready adds the
    // peers: with a remote tier, a storage node answers a PING (a node seen down
    // answers false at once, so a probe never waits out a dead node twice) — an
    // orchestrator's readiness. /live is liveness: only a failed runtime makes it
    // 503, so a storage node's outage never restarts a worker.
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) { answer_health(res, false); });
    svr.Get("/ready", [this](const httplib::Request&, httplib::Response& res) { answer_health(res, true); });
    svr.Get("/live", [this](const httplib::Request&, httplib::Response& res) { answer_live(res); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, models_json(model, created));
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != model)
        return send_error(res, ApiError(404, "The model '" + std::string(req.matches[1]) + "' does not exist",
                                        "invalid_request_error", "model", "model_not_found"));
      send_json(res, 200, model_json(model, created));
    });
    svr.Get("/console", [](const httplib::Request&, httplib::Response& res) { send_console_page(res); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(runtime_gauges(runtime)), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get(R"(/v1/inspect/requests/(\d{1,19}))", [this](const httplib::Request& req, httplib::Response& res) {
      uint64_t id = 0;
      try {
        id = std::stoull(std::string(req.matches[1]));
      } catch (const std::exception&) {
      }
      const std::string trace = id == 0 ? std::string() : runtime.request_trace_json(id);
      if (trace.empty())
        return send_error(res, ApiError(404, "no request " + std::string(req.matches[1]) +
                                                 " in flight or among the last traces (limits.trace_history)",
                                        "invalid_request_error", "id", "request_not_found"));
      send_json(res, 200, trace);
    });
    svr.Get(R"(/v1/inspect/(actors|traces|stores|profile|requests|snapshot))", [this](const httplib::Request& req,
                                                                                      httplib::Response& res) {
      const std::string what = req.matches[1];
      if (what == "actors") return send_json(res, 200, runtime.actors_json());
      if (what == "requests") return send_json(res, 200, runtime.requests_json());
      if (what == "snapshot") return send_json(res, 200, runtime.snapshot_json());
      if (what == "stores") return send_json(res, 200, runtime.stores_json());
      if (what == "profile") return send_json(res, 200, runtime.profile_json());
      int n = 1;
      if (req.has_param("n")) {
        try {
          n = std::clamp(std::stoi(req.get_param_value("n")), 1, 1000);
        } catch (const std::exception&) {
          return send_error(res, bad_request("'n' must be an integer", "n"));
        }
      }
      send_json(res, 200, runtime.traces_json(n));
    });
    svr.Post("/v1/documents", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        const std::string text = parse_document_body(req.body);
        const auto d = runtime.store_document(text);
        json out{{"id", d.id},         {"object", "document"}, {"tokens", d.tokens}, {"already_stored", d.already_stored},
                 {"source", d.source}, {"tiers", d.tiers}};
        if (runtime.has_storage_node()) out["on_storage_node"] = d.on_storage_node;
        send_json(res, 200, out.dump());
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const RequestError& e) {
        ApiError a = api_error_of(e);
        if (a.param == "messages") a.param = "text";
        send_error(res, a);
      }
    });
    svr.Delete(R"(/v1/documents/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string key = req.matches[1];
      try {
        if (!runtime.erase_document(key))
          return send_error(res, ApiError(404, "no stored document with id '" + key + "'", "invalid_request_error",
                                          "id", "document_not_found"));
      } catch (const RequestError& e) {  // shutting down, or the write-back actor did not answer in time
        return send_error(res, api_error_of(e));
      }
      send_json(res, 200, json{{"id", key}, {"object", "document"}, {"deleted", true}}.dump());
    });
    svr.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { chat_completion(req, res); });
    svr.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { text_completion(req, res); });
    // The model's tokenizer (http/tokenize_routes.h says what each takes and answers).
    svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        send_json(res, 200, tokenize_response(runtime.model().tokenizer(), parse_tokenize_request(req.body),
                                              context_length));
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        const auto& tok = runtime.model().tokenizer();
        send_json(res, 200, detokenize_response(tok, parse_detokenize_request(req.body, tok.vocab_size())));
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
  }

  // ---- chat completions -----------------------------------------------------

  void check_model(const std::string& asked) const {
    if (asked != model)
      throw ApiError(404, "The model '" + asked + "' does not exist; this server serves '" + model + "'",
                     "invalid_request_error", "model", "model_not_found");
  }

  // A completion that arrives while the server drains: 503, service_unavailable.
  void refuse_while_draining() const {
    if (draining.load())
      throw ApiError(503, "the server is shutting down", "server_error", "", "service_unavailable");
  }

  void chat_completion(const httplib::Request& req, httplib::Response& res) {
    ChatCompletionRequest parsed;
    ToolsOffered tools;
    try {
      refuse_while_draining();
      parsed = parse_chat_completion(req.body, context_length);
      check_model(parsed.model);
      tools = offered_tools(parsed);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    serve_completion(req, res, std::move(parsed.request), parsed, false, std::move(tools));
  }

  // A request's tools, where the model's template writes them into the prompt and its
  // calls are in a format we read back (model/tool_calls.h); else a 400 saying which
  // is missing.
  ToolsOffered offered_tools(const ChatCompletionRequest& parsed) const {
    ToolsOffered t;
    if (parsed.request.tools.empty()) return t;
    const ChatTemplate& tmpl = runtime.model().chat_template();
    if (!tmpl.takes_tools())
      throw bad_request(tmpl.origin() + " does not take tools (it renders the same prompt with them as without); "
                            "serve the model with a template that does (--chat-template FILE)",
                        "tools", "unsupported_parameter");
    if (tmpl.tool_call_format() == ToolCallFormat::none)
      throw bad_request(tmpl.origin() + " takes tools, but its model writes calls in a format blendserve does not "
                            "read back (it reads Hermes' <tool_call> JSON, as Qwen 2.5 and 3 write it, and Llama 3's "
                            "JSON)",
                        "tools", "unsupported_parameter");
    t.format = tmpl.tool_call_format();
    t.names = parsed.tool_names;
    t.parallel = parsed.parallel_tool_calls;
    return t;
  }

  // POST /v1/completions: the prompt as given (no chat template), the model's BOS in
  // front where it adds one and the prompt does not start with it (token ids are used
  // as they are), each document one cached chunk before it, as chat's documents are
  // (the same chunk tokens and keys: a document stored by either route is found by
  // both). Control tokens written in the text are read as tokens, as Hugging Face's
  // tokenizers and vLLM read them.
  void text_completion(const httplib::Request& req, httplib::Response& res) {
    TextCompletionRequest parsed;
    try {
      refuse_while_draining();
      parsed = parse_text_completion(req.body, context_length);
      check_model(parsed.model);
      const Tokenizer& tok = runtime.model().tokenizer();
      // As the runtime refuses a chat prompt too long by its bytes alone before
      // tokenizing it (actors/runtime/intake.cpp).
      size_t bytes = parsed.prompt_text.size();
      for (const auto& d : parsed.request.documents) bytes += d.size();
      const size_t at_least = (bytes + tok.max_token_bytes() - 1) / tok.max_token_bytes();
      if (static_cast<int64_t>(at_least) >= context_length)
        throw bad_request("the prompt has at least " + std::to_string(at_least) + " tokens (" + std::to_string(bytes) +
                              " bytes of text); the context holds " + std::to_string(context_length),
                          "prompt", "context_length_exceeded");
      RagPrompt prompt;
      for (const auto& d : parsed.request.documents) prompt.chunks.push_back(document_chunk_tokens(tok, d));
      // After documents the prompt continues the text (no SentencePiece space prefix).
      std::vector<int32_t> ids = parsed.prompt_is_ids  ? parsed.prompt_ids
                                 : prompt.chunks.empty() ? tok.encode(parsed.prompt_text, true)
                                                         : tok.encode_continuation(parsed.prompt_text, true);
      if (prompt.chunks.empty()) {
        prompt.suffix = parsed.prompt_is_ids ? std::move(ids) : with_bos(tok, std::move(ids));
      } else {
        prompt.prefix = parsed.prompt_is_ids ? std::vector<int32_t>{} : with_bos(tok, {});
        prompt.suffix = std::move(ids);
      }
      parsed.request.documents.clear();  // they are the prompt's chunks now
      parsed.request.prompt = std::move(prompt);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    serve_completion(req, res, std::move(parsed.request), parsed, true);
  }

  // Submits a parsed request and answers it, streaming or not, in chat's shapes or as
  // a text completion.
  void serve_completion(const httplib::Request& req, httplib::Response& res, RuntimeRequest request,
                        const CompletionCommon& parsed, bool text, ToolsOffered tools = {}) {
    const std::string id_prefix = text ? "cmpl-" : "chatcmpl-";
    auto ex = std::make_shared<Exchange>();
    RequestCallbacks callbacks;
    callbacks.on_text = [ex](std::string_view piece) {
      {
        std::lock_guard<std::mutex> lock(ex->mu);
        ex->pending.append(piece);
      }
      ex->cv.notify_all();
      return !ex->client_gone.load();
    };
    callbacks.on_done = [this, ex](const RequestResult& r) {
      if (r.finish_reason != "error") metrics.observe_completion(r);
      note_latency(r.total_seconds);
      {
        std::lock_guard<std::mutex> lock(ex->mu);
        ex->result = r;
        ex->done = true;
      }
      ex->cv.notify_all();
    };
    uint64_t id = 0;
    try {
      id = runtime.submit(std::move(request), std::move(callbacks));
    } catch (const RequestError& e) {
      if (e.code == RequestErrc::overloaded) res.set_header("Retry-After", std::to_string(retry_after_seconds()));
      return send_error(res, api_error_of(e));
    }

    CompletionMeta meta;
    meta.id = id_prefix + random_hex(24);
    meta.created = unix_now();
    meta.model = model;
    meta.system_fingerprint = fingerprint;
    meta.text = text;
    meta.tools = std::move(tools);

    // Until the first text (or the end) nothing is sent, so a request that fails
    // in its prefill still gets a proper error status. Meanwhile the connection is
    // peeked at every kProbe: a client that hung up while its request is queued or
    // in its prefill is noticed now and the request cancelled, not when its first
    // token fails to be written.
    {
      int sock = -2;  // -2: not looked up yet (fast requests never are); -1: not found
      std::unique_lock<std::mutex> lock(ex->mu);
      while (!ex->cv.wait_for(lock, kProbe, [&] { return ex->done || !ex->pending.empty(); })) {
        lock.unlock();
        if (sock == -2) sock = connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
        const bool gone = sock >= 0 && peer_closed(sock);
        lock.lock();
        if (gone && !ex->done) {
          ex->client_gone = true;  // on_text refuses further text
          lock.unlock();
          metrics.count_disconnect();
          // Queued: finished now. In its prefill: stops at the next layer boundary.
          runtime.cancel(id);
          // Nobody reads this; it names the end in the responses metric (nginx's 499).
          return send_error(res, ApiError(499, "the client closed the connection before the first token",
                                          "invalid_request_error", "", "client_closed_request"));
        }
      }
      if (ex->done && ex->result.finish_reason == "error") return send_error(res, failed_request_error(ex->result));
      if (ex->done && ex->result.finish_reason == "cancelled")
        return send_error(res, ApiError(503, "the request was cancelled: the server is shutting down", "server_error",
                                        "", "service_unavailable"));
      if (ex->done && !parsed.stream) return send_json(res, 200, completion_json(meta, ex->result));
    }
    // If the response ends before the request does (the client left, or the
    // server stops), the request is cancelled: its KV is freed at its next step.
    auto release = [this, ex, id](bool) {
      bool done;
      {
        std::lock_guard<std::mutex> lock(ex->mu);
        done = ex->done;
      }
      if (!done) {
        ex->client_gone = true;
        metrics.count_disconnect();
        runtime.cancel(id);
      }
    };
    if (parsed.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, ex, meta, include_usage = parsed.include_usage](size_t, httplib::DataSink& sink) {
            return stream_events(*ex, meta, include_usage, sink);
          },
          release);
    } else {
      res.set_chunked_content_provider(
          "application/json",
          [ex, meta](size_t, httplib::DataSink& sink) { return write_when_done(*ex, meta, sink); }, release);
    }
  }

  // SSE: the role chunk, one chunk per batch of new text, the tool calls (one chunk,
  // where the answer holds any), the finish chunk, the usage chunk (include_usage),
  // [DONE]. Comments keep a quiet stream probing.
  bool stream_events(Exchange& ex, const CompletionMeta& meta, bool include_usage, httplib::DataSink& sink) {
    auto event = [&sink](const std::string& payload) {
      const std::string e = "data: " + payload + "\n\n";
      return sink.write(e.data(), e.size());
    };
    // A chat stream opens with the assistant's role; a text completion has none.
    if (!meta.text && !event(chunk_json(meta, "", true, "", include_usage))) return false;
    // With tools offered, text a call may start within is held (model/tool_calls.h) until
    // more text or the end says whether it is a call.
    const ToolCallFormat calls = meta.tools.format;
    std::string answer;
    size_t sent = 0;
    auto send_content = [&](size_t upto) {
      if (upto <= sent) return true;
      const bool ok = event(chunk_json(meta, std::string_view(answer).substr(sent, upto - sent), false, "", include_usage));
      sent = upto;
      return ok;
    };
    while (true) {
      std::string text;
      bool done = false;
      {
        std::unique_lock<std::mutex> lock(ex.mu);
        ex.cv.wait_for(lock, kHeartbeat * 4, [&] { return ex.done || !ex.pending.empty(); });
        text.swap(ex.pending);
        done = ex.done;
      }
      if (!text.empty() && calls != ToolCallFormat::none) {
        answer += text;
        if (!send_content(tool_call_free_prefix(answer, calls))) return false;
      } else if (!text.empty()) {
        if (!event(chunk_json(meta, text, false, "", include_usage))) return false;
      } else if (!done) {
        static const std::string ping = ": keep-alive\n\n";
        if (!sink.write(ping.data(), ping.size())) return false;
      }
      if (done) break;
    }
    const RequestResult& r = ex.result;  // written before done; read after
    if (r.finish_reason == "error") {
      if (!event(error_body(failed_request_error(r)))) return false;
    } else {
      std::string finish = client_finish_reason(r.finish_reason);
      if (calls != ToolCallFormat::none) {
        const ParsedAnswer a = read_answer(meta, answer);
        if (a.calls.empty()) {
          if (!send_content(answer.size())) return false;
        } else {
          if (!send_content(tool_call_free_prefix(answer, calls))) return false;  // the text before the calls
          if (!event(tool_calls_chunk_json(meta, a.calls, include_usage))) return false;
          finish = "tool_calls";
        }
      }
      if (!event(chunk_json(meta, "", false, finish, include_usage))) return false;
      if (include_usage && !event(usage_chunk_json(meta, r))) return false;
    }
    static const std::string done_event = "data: [DONE]\n\n";
    if (!sink.write(done_event.data(), done_event.size())) return false;
    sink.done();
    return true;
  }

  // A non-streaming answer that is still being generated: whitespace (valid
  // before a JSON value) every heartbeat, then the whole body.
  static bool write_when_done(Exchange& ex, const CompletionMeta& meta, httplib::DataSink& sink) {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(ex.mu);
        if (ex.cv.wait_for(lock, kHeartbeat, [&] { return ex.done; })) break;
      }
      if (!sink.write(" ", 1)) return false;
    }
    const RequestResult& r = ex.result;
    const std::string body = r.finish_reason == "error" ? error_body(failed_request_error(r)) : completion_json(meta, r);
    if (!sink.write(body.data(), body.size())) return false;
    sink.done();
    return true;
  }

  void answer_health(httplib::Response& res, bool with_peers) {
    // Failed (a role died more often than limits.max_restarts allows): not ready and
    // not live, so an orchestrator replaces the process; the reason names the role.
    if (const std::string failure = runtime.failure(); !failure.empty())
      send_json(res, 503, nlohmann::json{{"status", "failed"}, {"reason", failure}}.dump());
    else if (draining.load())
      send_json(res, 503, R"({"status":"draining"})");
    else if (const auto why = with_peers ? runtime.storage_node_unreachable() : std::nullopt)
      send_json(res, 503, nlohmann::json{{"status", "storage_unreachable"}, {"reason", *why}}.dump());
    else
      send_json(res, 200, R"({"status":"ok"})");
  }
  void answer_live(httplib::Response& res) {
    if (const std::string failure = runtime.failure(); !failure.empty())
      send_json(res, 503, nlohmann::json{{"status", "failed"}, {"reason", failure}}.dump());
    else
      send_json(res, 200, R"({"status":"alive"})");
  }

  Runtime& runtime;
  RuntimeConfig config;
  std::unique_ptr<httplib::Server> owned_svr;  // HTTPS in a TLS cluster (http/cluster_tls.h)
  // bind_probes: plain HTTP, /health and /live only, on its own thread.
  httplib::Server probe_svr;
  std::thread probe_thread;
  std::atomic<bool> probe_returned{false};
  httplib::Server& svr;
  ServerMetrics metrics;
  std::string model, fingerprint;
  int64_t created = 0;
  int context_length = 0;
  std::atomic<bool> draining{false};
  std::atomic<double> metrics_latency_mean{0};
};

Server::Server(Runtime& runtime, const RuntimeConfig& config) : impl_(std::make_unique<Impl>(runtime, config)) {}

Server::~Server() { stop(); }

int Server::bind(const std::string& host, int port) {
  if (port == 0) {
    port = impl_->svr.bind_to_any_port(host);
    if (port <= 0) throw std::runtime_error("cannot listen on " + host + " (any port)");
  } else if (!impl_->svr.bind_to_port(host, port)) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             " (in use, or not an address of this machine)");
  }
  // httplib listens with a backlog of 5: a burst of clients would be reset (listen_backlog.h).
  if (raise_listen_backlog(port) == 0)
    std::fprintf(stderr, "blendserve: could not raise the listen backlog of port %d (stays httplib's 5)\n", port);
  return port;
}

bool Server::serve() { return impl_->svr.listen_after_bind(); }

int Server::bind_probes(const std::string& host, int port) {
  Impl& im = *impl_;
  if (im.probe_thread.joinable()) throw std::logic_error("bind_probes: already listening");
  im.probe_svr.Get("/health", [&im](const httplib::Request&, httplib::Response& res) { im.answer_health(res, false); });
  im.probe_svr.Get("/ready", [&im](const httplib::Request&, httplib::Response& res) { im.answer_health(res, true); });
  im.probe_svr.Get("/live", [&im](const httplib::Request&, httplib::Response& res) { im.answer_live(res); });
  im.probe_svr.set_read_timeout(5, 0);
  im.probe_svr.set_write_timeout(5, 0);
  im.probe_svr.new_task_queue = [] { return new httplib::ThreadPool(2); };
  if (port == 0) {
    port = im.probe_svr.bind_to_any_port(host);
    if (port <= 0) throw std::runtime_error("cannot listen for probes on " + host + " (any port)");
  } else if (!im.probe_svr.bind_to_port(host, port)) {
    throw std::runtime_error("cannot listen for probes on " + host + ":" + std::to_string(port) +
                             " (in use, or not an address of this machine)");
  }
  im.probe_thread = std::thread([&im] {
    im.probe_svr.listen_after_bind();
    im.probe_returned = true;
  });
  return port;
}

void Server::drain(double seconds) {
  impl_->draining = true;
  const auto until = clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->runtime.in_flight() + impl_->runtime.queued() > 0 && clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void Server::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
  Impl& im = *impl_;
  if (im.probe_thread.joinable()) {
    // A stop() before the thread listens is lost: stop until it has returned.
    while (!im.probe_returned.load()) {
      im.probe_svr.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    im.probe_thread.join();
  }
}

const std::string& Server::model_id() const { return impl_->model; }

}  // namespace bs::http
