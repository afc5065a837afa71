// blendserve: the inference runtime's command line.
//   blendserve [--config F] [--device cpu|cuda [--gpu N]] [--tp N] [--communicator K] serve [--host H] [--port P]
//   blendserve [--config F] generate --prompt TEXT [--chat] [--document TEXT]... [--max-tokens N] [--tp N] ...
//   blendserve check-config F          validate a cluster's or one node's config (exit 2 on an error)
//   blendserve --config F --node NAME  start member NAME of cluster config F
// Every request goes through the actor runtime (actors/runtime/runtime.h): the same path
// the HTTP server uses.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <iostream>
#include <string>

#include <pthread.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "actors/config/cluster_config.h"
#include "actors/cluster/cluster_report.h"
#include "actors/cluster/control_endpoint.h"
#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "http/server.h"
#include "kernels/backend.h"
#include "kernels/kv_view.h"
#include "tools/cluster/cluster_member.h"

namespace {

// SIGINT/SIGTERM: the first one cancels the request (the runtime then shuts down
// cleanly: queued SSD writes finish); a second one exits at once.
std::atomic<bool> interrupted{false};
extern "C" void on_signal(int sig) {
  if (interrupted.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

struct GenerateArgs {
  std::string prompt, system, precision, kv_dtype, mode;
  std::vector<std::string> documents;
  bool chat = false, stats = false, trace = false;
  float ratio = -1;
  bs::SamplingParams params;
};

int run_generate(bs::RuntimeConfig config, const GenerateArgs& g) {
  if (!g.precision.empty()) config.precision = g.precision;
  if (!g.kv_dtype.empty()) config.kv_dtype = g.kv_dtype;
  bs::Runtime runtime(config);
  const auto& ctx = runtime.context();
  bs::RuntimeRequest req;
  req.sampling = g.params;
  if (g.chat || !g.documents.empty()) {
    if (!g.system.empty()) req.messages.push_back({"system", g.system});
    req.messages.push_back({"user", g.prompt});
    req.documents = g.documents;
  } else {
    req.raw = true;
    req.raw_prompt = g.prompt;
  }
  if (!g.mode.empty()) req.mode = bs::parse_mode(g.mode);
  if (g.ratio >= 0) req.ratio = g.ratio;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  bs::RequestResult r;
  try {
    r = runtime.run(std::move(req), [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return !interrupted.load();
    });
  } catch (const bs::RequestError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (r.finish_reason == "error") {
    std::cerr << "error: " << r.error << "\n";
    return 1;
  }
  std::string by_tier;  // "3 ram, 0 ssd, ": every stored tier, in lookup order
  for (const auto& tier : ctx.tiers) by_tier += std::to_string(r.chunks_from(tier.name)) + " " + tier.name + ", ";
  if (g.stats)
    std::fprintf(stderr,
                 "kernels %s%s%s, precision %s, %d threads, tp %d; prompt %lld tokens (%lld cached, %lld recomputed; chunks: "
                 "%s%d missed; ratio %.3f), first token %.3f s; %zu tokens in %.3f s (%.1f tok/s); "
                 "finish: %s\n",
                 ctx.backend->kernel_id().c_str(), ctx.backend->device_name().empty() ? "" : " on ",
                 ctx.backend->device_name().c_str(), bs::kernels::precision_name(ctx.precision),
                 bs::kernels::cpu_compute_threads(), ctx.config.tp, static_cast<long long>(r.prompt_tokens),
                 static_cast<long long>(r.cached_tokens), static_cast<long long>(r.recomputed_tokens), by_tier.c_str(),
                 r.chunks_missed, r.ratio, r.ttft_seconds, r.tokens.size(), r.decode_seconds,
                 r.tokens.size() / std::max(r.decode_seconds, 1e-9), r.finish_reason.c_str());
  if (g.trace) std::fprintf(stderr, "%s\n", runtime.traces_json(1).c_str());
  // A finished run stores what it computed (the next run hits); an interrupted one
  // only completes the writes in progress.
  runtime.shutdown(/*finish_write_back=*/!interrupted.load());
  return interrupted.load() ? 130 : 0;
}

// serve: SIGINT/SIGTERM are blocked in every thread and taken by one waiting
// thread (sigwait), which drains the server (new requests 503, those in flight
// finish, up to drain_seconds) and stops it; a second signal stops at once.
// `attach`, when given, runs once the runtime is up and what it returns lives as
// long as the server (a cluster worker's control endpoint).
using ServeAttachment = std::function<std::shared_ptr<void>(bs::Runtime&)>;
// probe_port > 0: /health and /live in plain HTTP there too (Server::bind_probes).
int run_serve(bs::RuntimeConfig config, const std::string& host, int port, double drain_seconds,
              const ServeAttachment& attach = {}, int probe_port = 0) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread exists: all inherit it
  std::signal(SIGPIPE, SIG_IGN);                  // a client that left is a failed write, not a death

  const std::string bind_host = host.empty() ? config.host : host;
  const int bind_port = port >= 0 ? port : config.port;
  bs::Runtime runtime(config);
  bs::http::Server server(runtime, config);
  const int bound = server.bind(bind_host, bind_port);
  if (probe_port > 0)
    std::fprintf(stderr, "blendserve: probes (/health, /ready, /live) on http://%s:%d\n", bind_host.c_str(),
                 server.bind_probes(bind_host, probe_port));
  const std::shared_ptr<void> attached = attach ? attach(runtime) : nullptr;
  const auto& ctx = runtime.context();
  std::fprintf(stderr, "blendserve: model %s (%s kernels%s%s, %s, %s KV), serving on %s://%s:%d%s%s\n",
               server.model_id().c_str(), ctx.backend->kernel_id().c_str(),
               ctx.backend->device_name().empty() ? "" : " on ", ctx.backend->device_name().c_str(),
               bs::kernels::precision_name(ctx.precision),
               bs::kernels::kv_dtype_name(ctx.model->kv_dtype()), config.server_tls.enabled() ? "https" : "http",
               bind_host.c_str(), bound, config.api_keys.empty() ? "" : " (API keys required)",
               config.server_tls.enabled() ? " (TLS 1.3: client certificate of the cluster's CA required)" : "");
  std::fflush(stderr);

  std::atomic<bool> stopping{false}, serve_returned{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (stopping.exchange(true)) return;  // serve() ended by itself
    std::fprintf(stderr, "blendserve: signal %d: draining (up to %.0f s; again to stop now)\n", sig, drain_seconds);
    std::thread second([&] {
      int again = 0;
      sigwait(&signals, &again);
      std::_Exit(130);
    });
    second.detach();
    server.drain(drain_seconds);
    // A signal that came before serve() started listening (while the model loaded):
    // a stop() then is lost, so stop until serve() has returned.
    while (!serve_returned.load()) {
      server.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const bool ok = server.serve();
  serve_returned = true;
  if (!stopping.exchange(true)) {
    // The listener failed on its own: wake the waiter so it can be joined.
    pthread_kill(waiter.native_handle(), SIGTERM);
  }
  waiter.join();
  server.stop();
  runtime.shutdown(/*finish_write_back=*/false);
  std::fprintf(stderr, "blendserve: stopped\n");
  return ok ? 0 : 1;
}

// Exit code of a config that does not validate (check-config, --node).
constexpr int kConfigErrorExit = 2;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();  // unreadable: the loaders report it
}

// check-config: validates F (a cluster config when it has `cluster`/`nodes`, else
// one node's runtime config) without loading a model; one JSON line per member.
int run_check_config(const std::string& path) {
  try {
    if (bs::is_cluster_config(read_file(path))) {
      const bs::ClusterConfig cluster = bs::load_cluster_config(path);
      for (const bs::ClusterNode& n : cluster.nodes) {
        nlohmann::json line{{"name", n.name}, {"role", bs::role_name(n.role)}, {"host", n.host}, {"port", n.port}};
        if (n.bind != n.host) line["bind"] = n.bind;
        if (const auto gpus = bs::worker_gpus(n.runtime); !gpus.empty()) line["gpus"] = gpus;
        if (n.data_port) line["data_port"] = n.data_port;
        if (n.http_port) line["http_port"] = n.http_port;
        if (n.probe_port) line["probe_port"] = n.probe_port;
        line["data_dir"] = cluster.member_data_dir(n.name);
        std::printf("%s\n", line.dump().c_str());
      }
    } else {
      const bs::RuntimeConfig c = bs::load_runtime_config(path);
      const nlohmann::json line{{"name", c.node_name}, {"role", "single"},          {"host", c.host},
                                {"http_port", c.port}, {"data_dir", bs::resolve_data_dir(c)}};
      std::printf("%s\n", line.dump().c_str());
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kConfigErrorExit;
  }
  return 0;
}

// --node NAME: one member of the cluster config F. A worker serves its runtime (the
// serve path, on its host:http_port); storage and frontend run their roles.
int run_member(const std::string& config_path, const std::string& node, const std::string& model_path) {
  bs::ClusterConfig cluster;
  bs::RuntimeConfig config;
  try {
    if (config_path.empty()) throw bs::ConfigError("--node " + node + " needs --config F (the cluster config)");
    cluster = bs::load_cluster_config(config_path);
    config = bs::member_runtime_config(cluster, node);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kConfigErrorExit;
  }
  if (!model_path.empty()) config.model_path = model_path;
  switch (cluster.member(node).role) {
    case bs::NodeRole::Storage: return bs::tools::run_storage_member(cluster, node);
    case bs::NodeRole::Frontend: return bs::tools::run_frontend_member(cluster, node);
    case bs::NodeRole::Worker: break;
  }
  // A worker also answers the frontend's heartbeat on its control port.
  const bs::ClusterNode& me = cluster.member(node);
  auto control = [&](bs::Runtime& runtime) -> std::shared_ptr<void> {
    auto endpoint = std::make_shared<bs::ControlEndpoint>(
        bs::tools::control_options(cluster, me), [&runtime, node] { return bs::make_worker_report(runtime, node); },
        bs::worker_holdings(runtime));
    std::fprintf(stderr, "blendserve: worker %s of cluster %s: control on %s:%d (%s)\n", node.c_str(),
                 cluster.name.c_str(), me.bind.c_str(), endpoint->port(),
                 cluster.tls ? "TLS 1.3, mutual" : "plaintext");
    return endpoint;
  };
  try {
    return run_serve(std::move(config), /*host=*/"", /*port=*/-1, cluster.drain_timeout_s, control, me.probe_port);
  } catch (const std::exception& e) {  // a port in use, a model that does not load
    std::cerr << "error: worker " << node << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"blendserve: RAG inference runtime with CacheBlend KV reuse"};
  app.fallthrough();  // --model, --device, --gpu, --tp also after the subcommand (serve --device cuda --tp 2)
  app.require_subcommand(0, 1);  // none: --node
  std::string model_path, config_path, node;
  app.add_option("--model", model_path, "GGUF model file (default: the config's, else $BLENDSERVE_MODEL or the embedded default)");
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "Jinja chat template file to render chats with instead of the model's own (model.chat_template)");
  std::string device_kind;
  int gpu = -1;
  app.add_option("--device", device_kind, "Compute backend: cpu or cuda (device.kind; cuda in builds made with nvcc)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--gpu", gpu, "With --device cuda: the GPU's CUDA index (device.gpus: [N])")->check(CLI::NonNegativeNumber);
  int tp = 0;  // 0: the config's device.tp
  app.add_option("--tp", tp,
                 "Tensor-parallel ranks (device.tp; must divide the heads): on cpu they split the cores, on cuda each "
                 "rank has a GPU of its own (the first N unless the config's device.gpus lists N)")
      ->check(CLI::Range(1, 64));
  std::string communicator;
  app.add_option("--communicator", communicator,
                 "What joins the ranks: auto, inprocess (cpu) or nccl (cuda; at tp 1 the all-reduces through NCCL) "
                 "(device.communicator)")
      ->check(CLI::IsMember({"auto", "inprocess", "nccl"}));
  app.add_option("--config", config_path, "YAML config (default: $BLENDSERVE_CONFIG, else the embedded configs/default.yaml)");
  app.add_option("--node", node,
                 "Start this member of the cluster config given with --config (worker: serves its OpenAI endpoint; "
                 "storage, frontend: their roles); default $BLENDSERVE_NODE");

  auto* check = app.add_subcommand(
      "check-config", "Validate a config without loading a model: a cluster's (one JSON line per member) or one "
                      "node's; exit 2 with the error (key and line) on stderr");
  std::string check_path;
  check->add_option("FILE", check_path, "The YAML config")->required();

  auto* serve = app.add_subcommand("serve", "Serve the OpenAI-compatible REST API (chat completions, documents, metrics)");
  std::string host;
  int port = -1;
  double drain_seconds = 30;
  serve->add_option("--host", host, "Address to listen on (default: the config's server.host, 127.0.0.1)");
  serve->add_option("--port", port, "Port (default: the config's server.port, 8000; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--drain-seconds", drain_seconds, "On SIGINT/SIGTERM, wait this long for requests in flight")
      ->check(CLI::Range(0.0, 3600.0));

  auto* gen = app.add_subcommand("generate", "Answer one prompt, streaming the text to stdout");
  GenerateArgs g;
  gen->add_option("--prompt", g.prompt, "Prompt text (with --chat or --document: the user's question)")->required();
  gen->add_flag("--chat", g.chat, "Apply the model's chat template (user turn + assistant header)");
  gen->add_option("--system", g.system, "System prompt for --chat (default: the template's own)");
  gen->add_option("--document", g.documents, "A retrieved document (repeatable; each one a cached chunk; implies --chat)");
  gen->add_option("--mode", g.mode, "full, prefix, reuse or blend (default: the config's)")
      ->check(CLI::IsMember({"full", "prefix", "reuse", "blend"}));
  gen->add_option("--ratio", g.ratio, "Recompute ratio (default: the loading controller's choice, >= the config's floor)")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--max-tokens", g.params.max_tokens, "Maximum new tokens")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--temperature", g.params.temperature, "0 = greedy")->check(CLI::Range(0.0, 2.0));
  gen->add_option("--top-p", g.params.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  gen->add_option("--top-k", g.params.top_k, "Sample among the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", g.params.seed, "Sampling seed");
  gen->add_option("--stop", g.params.stop, "Stop string (repeatable)");
  gen->add_option("--precision", g.precision, "GEMM/attention precision: auto (bf16 where the CPU has native bf16), bf16, f32")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  gen->add_option("--kv-dtype", g.kv_dtype, "How the KV cache holds K and V: f32, f16, bf16 (device.kv_dtype)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  gen->add_flag("--stats", g.stats, "Print timing and cache use to stderr");
  gen->add_flag("--trace", g.trace, "Print the request's trace (JSON) to stderr");

  CLI11_PARSE(app, argc, argv);
  if (check->parsed()) return run_check_config(check_path);
  // The environment fills what the command line leaves out (a container's image
  // runs `blendserve` alone; its pod or job says which config and which member).
  if (const char* c = std::getenv("BLENDSERVE_CONFIG"); config_path.empty() && c && *c) config_path = c;
  if (const char* n = std::getenv("BLENDSERVE_NODE"); node.empty() && n && *n && !gen->parsed() && !serve->parsed())
    node = n;
  if (!node.empty()) {
    if (gen->parsed() || serve->parsed()) {
      std::cerr << "error: --node starts a cluster member by itself; give no subcommand\n";
      return kConfigErrorExit;
    }
    return run_member(config_path, node, model_path);
  }
  if (!gen->parsed() && !serve->parsed()) {
    std::cerr << app.help() << "\nerror: give a subcommand (serve, generate, check-config) or --config F --node NAME\n";
    return kConfigErrorExit;
  }
  if (!config_path.empty() && bs::is_cluster_config(read_file(config_path))) {
    std::cerr << "error: " << config_path << " is a cluster config: start one of its members with --node NAME\n";
    return kConfigErrorExit;
  }
  try {
    bs::RuntimeConfig config = config_path.empty() ? bs::default_runtime_config() : bs::load_runtime_config(config_path);
    if (!model_path.empty()) config.model_path = model_path;
    if (!chat_template.empty()) config.chat_template = chat_template;
    if (!device_kind.empty()) config.device_kind = device_kind;
    if (gpu >= 0) config.gpus = {gpu};
    if (tp > 0) config.tp = tp;
    if (!communicator.empty()) config.communicator = communicator;
    // --tp N on cuda without as many GPUs listed: the first N, one per rank.
    if (config.device_kind == "cuda" && gpu < 0 && static_cast<int>(config.gpus.size()) < config.tp) {
      config.gpus.clear();
      for (int r = 0; r < config.tp; ++r) config.gpus.push_back(r);
    }
    if (gen->parsed()) return run_generate(std::move(config), g);
    if (serve->parsed()) return run_serve(std::move(config), host, port, drain_seconds);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
