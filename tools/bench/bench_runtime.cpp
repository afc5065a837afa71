// blendctl bench ttft --tier ram|ssd|remote: blend TTFT through the actor runtime,
// with the chunks stored in one tier, against a direct BlendEngine call on the same
// request over the same stores (which reads whole entries first, then computes),
// plus `full` through the runtime for reference. Each tier runs in its own
// runtime (RAM-only, SSD-only or remote-only), so a chunk comes from exactly that
// tier. The trace of every runtime request gives the load span and the fraction of
// it hidden behind compute.
//
// The remote tier: a storage node (StorageServer over its own DiskKvStore in the
// data dir) in this process on 127.0.0.1, reached over TCP as a worker reaches it;
// the runtime has RAM and SSD off, so every chunk crosses the loopback. Its store
// is filled as the other tiers' are: the first pass misses, computes and writes
// back (tiers.remote.write_back pushes to the node). --direct-io and --throttle-mbps
// apply to the node's disk as to the local SSD's, so remote_vs_ssd compares the
// same reads with the network added.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/store_backed_blend.h"
#include "model/generate.h"
#include "storage/disk_store.h"
#include "storage/storage_server.h"
#include "storage/tls.h"
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kNodeSecret = "blendctl bench ttft: a loopback storage node's secret";

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Samples {
  std::vector<double> ttft, hidden, load_span, wait, ratio, predicted;
  std::set<std::string> selection;  // the rules the runs blended by (their traces')
};

// Waits (at most 120 s) until the background jobs queued on the compute thread so
// far have run (a marker job queued behind them, FIFO) and the remote writer's
// queue is empty.
void drain_background(RuntimeContext& ctx) {
  auto done = std::make_shared<std::promise<void>>();
  auto ran = done->get_future();
  if (!ctx.compute->submit([done] { done->set_value(); }, ComputeThread::Priority::Background)) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  if (ran.wait_until(deadline) != std::future_status::ready)
    throw std::runtime_error("the runtime's background work did not finish within 120 s");
  while (ctx.remote_write_queue.bytes.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

int bench_ttft_runtime(const RuntimeBenchOptions& opt) {
  const auto& t = opt.ttft;
  std::string data_dir = opt.data_dir;
  bool temp_dir = false;
  if (data_dir.empty()) {
    data_dir = (fs::temp_directory_path() / ("blendctl_bench_" + std::to_string(::getpid()))).string();
    temp_dir = true;
  }
  std::map<std::string, double> blend_ttft_by_tier, load_by_tier;
  json summary = {{"bench", "ttft_runtime_summary"}, {"chunks", t.chunks}, {"chunk_tokens", t.chunk_tokens},
                  {"ratio_floor", t.ratio}, {"adaptive", opt.adaptive}, {"direct_io", opt.direct_io},
                  {"throttle_bytes_per_s", opt.throttle_bytes_per_s}, {"communicator", opt.communicator}};
  Progress progress("bench ttft --tier", static_cast<int>(opt.tiers.size()) * t.requests * (2 + t.repeats));
  for (const auto& tier : opt.tiers) {
    if (tier != "ram" && tier != "ssd" && tier != "remote")
      throw std::invalid_argument("unknown tier '" + tier + "' (ram, ssd, remote)");
    RuntimeConfig cfg = bench_runtime_config(t.model_path, t.device, t.precision, t.kv_dtype, data_dir);
    cfg.communicator = opt.communicator;
    cfg.ssd.path = (fs::path(data_dir) / ("kv_" + tier)).string();
    fs::remove_all(cfg.ssd.path);  // cold store: every chunk is written by this run
    cfg.ram.enabled = tier == "ram";
    cfg.ram.budget_bytes = int64_t{16} << 30;
    cfg.ssd.enabled = tier == "ssd";
    cfg.ssd.direct_io = opt.direct_io;
    cfg.ssd.throttle_bytes_per_s = opt.throttle_bytes_per_s;
    // Every blend option asked for (--selection, --ratio, --check-layers, ...), not
    // only the ratio: the tiers' runs blend by the rule the command line names.
    {
      const BlendOptions asked = blend_options(t);
      cfg.blend.ratio = asked.ratio;
      cfg.blend.check_layers = asked.check_layers;
      cfg.blend.schedule = asked.schedule;
      cfg.blend.filtering = asked.filtering;
      cfg.blend.selection = asked.selection;
      cfg.blend.query_first_from_layer = asked.query_first_from_layer;
    }
    cfg.adaptive_ratio = opt.adaptive;
    // remote: the storage node, declared before the runtime so it outlives the
    // runtime's connections to it. A cold store, like the SSD tier's above.
    std::unique_ptr<DiskKvStore> node_store;
    std::unique_ptr<StorageServer> node;
    if (tier == "remote") {
      const std::string node_dir = (fs::path(data_dir) / "kv_remote_node").string();
      fs::remove_all(node_dir);
      node_store = std::make_unique<DiskKvStore>(node_dir, int64_t{16} << 30, opt.direct_io);
      if (opt.throttle_bytes_per_s > 0) node_store->set_read_throttle(opt.throttle_bytes_per_s);
      StorageServerOptions sopt{.bind_host = "127.0.0.1", .port = 0, .secret = kNodeSecret};
      if (opt.remote_transport == "tls") {
        // A CA and the two members' certificates of our own, as `blendctl cluster init` makes them.
        const fs::path t = fs::path(data_dir) / "tls";
        fs::create_directories(t);
        tls::make_ca("bench ttft CA", (t / "ca.pem").string(), (t / "ca.key").string());
        for (const char* name : {"bench-node", "bench-worker"})
          tls::issue_member((t / "ca.pem").string(), (t / "ca.key").string(), name, {"127.0.0.1"},
                            (t / (std::string(name) + ".pem")).string(), (t / (std::string(name) + ".key")).string());
        sopt.tls = {(t / "ca.pem").string(), (t / "bench-node.pem").string(), (t / "bench-node.key").string()};
        sopt.tls_peers = {"bench-worker"};
        cfg.remote.tls = {(t / "ca.pem").string(), (t / "bench-worker.pem").string(), (t / "bench-worker.key").string()};
        cfg.remote.tls_peer_name = "bench-node";
      } else if (opt.remote_transport != "plain") {
        throw std::invalid_argument("--remote-transport: tls or plain, got " + opt.remote_transport);
      }
      node = std::make_unique<StorageServer>(*node_store, sopt);
      cfg.remote.enabled = true;
      cfg.remote.host = "127.0.0.1";
      cfg.remote.port = node->port();
      cfg.remote.secret = kNodeSecret;
      cfg.remote.write_back = true;
      std::fprintf(stderr, "bench ttft --tier remote: storage node on 127.0.0.1:%d over %s (%s, %s)\n", node->port(),
                   node_dir.c_str(), opt.direct_io ? "O_DIRECT reads" : "page cache",
                   opt.remote_transport == "tls" ? "TLS 1.3, mutual" : "plain TCP");
    }
    Runtime rt(cfg);
    auto& ctx = rt.context();
    // Where the tier keeps its chunks, and the engine over that store (the remote
    // tier is not in ctx.tiered: its engine path reads whole entries over TCP).
    const StoreBackedBlend engine_path(*ctx.engine, tier == "remote" ? static_cast<KvStore&>(*ctx.remote)
                                                                     : static_cast<KvStore&>(*ctx.tiered));
    auto tier_holds = [&](const ChunkKey& key) {
      return node_store ? node_store->contains(key) : ctx.tiered->contains(key);
    };
    const auto& tok = ctx.model->tokenizer();

    std::vector<RuntimeRequest> reqs;
    for (int i = 0; i < t.requests; ++i) {
      RuntimeRequest r;
      RagPrompt p = assemble_rag_prompt(tok, ctx.model->chat_template(),
                                        {{"user", "Which of the facts above happened first? Answer briefly."}}, {});
      p.chunks = make_bench_chunks(tok, t.dataset, t.chunks, t.chunk_tokens, i * t.chunks * 3);
      r.prompt = std::move(p);
      r.sampling.max_tokens = 1;
      if (!opt.adaptive) r.ratio = t.ratio;
      reqs.push_back(std::move(r));
    }
    // Store every chunk (a miss computes and writes back), then one blend run per
    // request so one-time costs (oneDNN primitives per shape) are out of the way.
    for (const auto& r : reqs) {
      rt.run(r);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
      auto stored = [&] {
        // (The template's prefix is shorter than a prefix block: computed every time.)
        for (const auto& c : r.prompt->chunks)
          if (!tier_holds(ctx.engine->chunk_key(c))) return false;
        return true;
      };
      while (!stored() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!stored()) throw std::runtime_error("write-back did not store the chunks");
      progress.tick();
    }
    for (const auto& r : reqs) {
      rt.run(r);
      progress.tick();
    }

    Samples runtime_blend, engine_blend, runtime_full;
    int64_t prompt_tokens = 0;
    for (int rep = 0; rep < t.repeats; ++rep)
      for (const auto& r : reqs) {
        prompt_tokens = r.prompt->size();
        const auto res = rt.run(r);
        if (res.finish_reason == "error") throw std::runtime_error(res.error);
        if (res.chunks_missed > 0) throw std::runtime_error("a chunk missed in the measured run");
        if (res.chunks_from(tier) != static_cast<int>(r.prompt->chunks.size()))
          throw std::runtime_error("a chunk of the measured run did not come from the " + tier + " tier");
        const auto trace = json::parse(rt.traces_json(1)).at(0);
        runtime_blend.ttft.push_back(res.ttft_seconds);
        runtime_blend.ratio.push_back(res.ratio);
        runtime_blend.selection.insert(trace.value("selection", std::string("?")));
        runtime_blend.wait.push_back(trace.at("wait_s").get<double>());
        // The controller's prediction for this request, against what it measured.
        runtime_blend.predicted.push_back(trace.at("controller").at("est_ttft_s").get<double>());
        if (trace.contains("load_hidden_fraction")) {
          runtime_blend.hidden.push_back(trace.at("load_hidden_fraction").get<double>());
          runtime_blend.load_span.push_back(trace.at("load_span_s").get<double>());
        }
        // The same request straight through the engine, at the ratio the runtime ran.
        BlendOptions o = ctx.config.blend;
        o.ratio = res.ratio;
        if (const std::string ran = trace.value("selection", std::string("none")); ran != "none")
          o.selection = parse_selection(ran);  // the rule the runtime's run blended by
        const auto t0 = std::chrono::steady_clock::now();
        engine_blend.selection.insert(selection_name(o.selection));
        auto pre = engine_path.prefill(*r.prompt, o, 1);
        (void)argmax(pre.logits.data(), ctx.model->config().vocab);
        engine_blend.ttft.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        RuntimeRequest full = r;
        full.mode = BlendMode::Full;
        runtime_full.ttft.push_back(rt.run(full).ttft_seconds);
        // A full run queues its parts' write-back computes; with RAM and SSD off (the
        // remote tier) the "stored already?" check cannot see the node, so they
        // compute again: drain them before the next measured run.
        drain_background(ctx);
        progress.tick();
      }
    const double rb = median(runtime_blend.ttft), eb = median(engine_blend.ttft), rf = median(runtime_full.ttft);
    auto row = [&](const char* path, const char* mode, const Samples& s) {
      json j = {{"bench", "ttft_runtime"},
                {"isa", ctx.backend->kernel_id()},
                {"device", ctx.backend->device_name().empty() ? "cpu" : ctx.backend->device_name()},
                {"model", t.model_path},
                {"precision", kernels::precision_name(ctx.precision)},
                {"kv_dtype", t.kv_dtype},
                {"communicator", opt.communicator},
                {"tier", tier},
                {"path", path},
                {"mode", mode},
                {"prompt_tokens", prompt_tokens},
                {"samples", s.ttft.size()},
                {"ttft_s", median(s.ttft)}};
      if (!s.ratio.empty()) j["ratio"] = median(s.ratio);
      // The rules the measured runs blended by (the controller may change the asked one
      // where the load is the bound, --adaptive) beside the one asked for.
      if (!s.selection.empty()) {
        j["selection_asked"] = t.selection;
        j["selection"] = s.selection.size() == 1 ? json(*s.selection.begin()) : json(s.selection);
      }
      if (!s.predicted.empty()) {
        // Median over the samples of predicted / measured TTFT (1 = exact).
        std::vector<double> q;
        for (size_t i = 0; i < s.predicted.size(); ++i) q.push_back(s.predicted[i] / s.ttft[i]);
        j["predicted_ttft_s"] = median(s.predicted);
        j["predicted_vs_measured"] = median(q);
      }
      if (!s.hidden.empty()) {
        j["load_span_s"] = median(s.load_span);
        j["wait_s"] = median(s.wait);
        j["load_hidden_fraction"] = median(s.hidden);
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    };
    row("runtime", "blend", runtime_blend);
    row("engine", "blend", engine_blend);
    row("runtime", "full", runtime_full);
    summary[tier + "_runtime_blend_ttft_s"] = rb;
    summary[tier + "_engine_blend_ttft_s"] = eb;
    summary[tier + "_runtime_full_ttft_s"] = rf;
    summary[tier + "_runtime_vs_engine"] = rb / eb;
    summary[tier + "_blend_vs_full"] = rb / rf;
    if (!runtime_blend.hidden.empty()) {
      summary[tier + "_load_hidden_fraction"] = median(runtime_blend.hidden);
      summary[tier + "_load_span_s"] = median(runtime_blend.load_span);
      load_by_tier[tier] = median(runtime_blend.load_span);
    }
    summary[tier + "_ratio"] = median(runtime_blend.ratio);
    if (tier == "remote") summary["remote_transport"] = opt.remote_transport;
    summary[tier + "_predicted_ttft_s"] = median(runtime_blend.predicted);
    blend_ttft_by_tier[tier] = rb;
    if (node) {
      const auto st = node->stats();
      summary["remote_node_layers_served"] = st.layers_served;
      summary["remote_node_bytes_served"] = st.bytes_served;
      summary["remote_node_puts"] = st.puts;
      summary["remote_direct_io"] = opt.direct_io;
    }
  }
  if (blend_ttft_by_tier.count("ram") && blend_ttft_by_tier.count("ssd")) {
    summary["ssd_vs_ram"] = blend_ttft_by_tier["ssd"] / blend_ttft_by_tier["ram"];
    // TTFT against its floor: the slower of loading from SSD and computing at the
    // floor ratio (the RAM run's blend TTFT is that compute, loads being ~free).
    const double bound = std::max(load_by_tier["ssd"], blend_ttft_by_tier["ram"]);
    summary["ssd_bound_s"] = bound;
    summary["ssd_vs_bound"] = blend_ttft_by_tier["ssd"] / bound;
  }
  if (blend_ttft_by_tier.count("ssd") && blend_ttft_by_tier.count("remote"))
    summary["remote_vs_ssd"] = blend_ttft_by_tier["remote"] / blend_ttft_by_tier["ssd"];
  if (blend_ttft_by_tier.count("ram") && blend_ttft_by_tier.count("remote"))
    summary["remote_vs_ram"] = blend_ttft_by_tier["remote"] / blend_ttft_by_tier["ram"];
  std::printf("%s\n", summary.dump().c_str());
  if (temp_dir) fs::remove_all(data_dir);
  return 0;
}

}  // namespace bs::tools
