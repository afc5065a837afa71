#include "tools/bench/bench_remote.h"
#include "tools/cli/scratch_dir.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "storage/disk_store.h"
#include "storage/remote_store.h"
#include "storage/storage_server.h"
#include "storage/tls.h"
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"
#include "tools/bench/json_line.h"

namespace bs::tools {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;


}  // namespace

int bench_remote(const RemoteBenchOptions& opt) {
  if (opt.tokens < 1 || opt.chunks < 1 || opt.layers < 1 || opt.kv_heads < 1 || opt.head_dim < 1 || opt.repeats < 1 ||
      opt.layers_in_flight.empty())
    throw std::invalid_argument("bench remote: sizes must be positive");
  if (opt.order != "layer" && opt.order != "chunk") throw std::invalid_argument("bench remote: --order layer|chunk");
  const kernels::TensorType dtype = kv_dtype_option(opt.kv_dtype);

  const ScratchDir scratch(opt.data_dir, "bench_remote");
  const fs::path& dir = scratch.path();

  DiskKvStore disk(dir.string(), int64_t{1} << 40, /*direct_io=*/false);
  // The chunks: random bytes in the shape (the values do not matter to the data path).
  std::mt19937_64 rng(42);
  std::vector<ChunkKey> keys;
  int64_t bytes_per_pass = 0;
  for (int c = 0; c < opt.chunks; ++c) {
    auto kv = std::make_shared<ChunkKv>();
    kv->n_layers = opt.layers, kv->kv_heads = opt.kv_heads, kv->head_dim = opt.head_dim;
    kv->dtype = dtype;
    for (int64_t t = 0; t < opt.tokens; ++t) kv->tokens.push_back(static_cast<int32_t>(rng() % 49152));
    kv->allocate();
    for (auto* buf : {&kv->k, &kv->v})
      for (size_t i = 0; i + 8 <= buf->size(); i += 8) {
        const uint64_t x = rng();
        std::memcpy(buf->data() + i, &x, 8);
      }
    const ChunkKey key = make_chunk_key(0xbe7c4, KvKind::Chunk, kv->tokens);
    if (!disk.put(key, kv)) throw std::runtime_error("bench remote: could not store a chunk in " + dir.string());
    keys.push_back(key);
    bytes_per_pass += 2 * static_cast<int64_t>(opt.layers) * kv->layer_bytes();
  }

  // TLS: a CA and the two ends' certificates, beside the node's files.
  const bool any_tls = std::find(opt.transports.begin(), opt.transports.end(), "tls") != opt.transports.end();
  tls::Files node_tls, worker_tls;
  if (any_tls) {
    const fs::path t = dir / "tls";
    fs::create_directories(t);
    tls::make_ca("bench remote CA", (t / "ca.pem").string(), (t / "ca.key").string());
    for (const char* name : {"bench-node", "bench-worker"})
      tls::issue_member((t / "ca.pem").string(), (t / "ca.key").string(), name, {"127.0.0.1"},
                        (t / (std::string(name) + ".pem")).string(), (t / (std::string(name) + ".key")).string());
    node_tls = {(t / "ca.pem").string(), (t / "bench-node.pem").string(), (t / "bench-node.key").string()};
    worker_tls = {(t / "ca.pem").string(), (t / "bench-worker.pem").string(), (t / "bench-worker.key").string()};
  }

  const int64_t layer_bytes = static_cast<int64_t>(opt.kv_heads) * opt.tokens * opt.head_dim *
                              (dtype == kernels::TensorType::F32 ? 4 : 2);
  std::vector<std::byte> k(static_cast<size_t>(layer_bytes)), v(static_cast<size_t>(layer_bytes));
  Progress progress("bench remote",
                    static_cast<int>(opt.transports.size() * opt.layers_in_flight.size()) * opt.repeats);
  bool failed = false;
  std::map<std::string, std::map<int, double>> best_of;  // transport -> layers_in_flight -> best GB/s
  for (const std::string& transport : opt.transports) {
    if (transport != "plain" && transport != "tls")
      throw std::invalid_argument("bench remote: --transport plain|tls, got " + transport);
    const bool use_tls = transport == "tls";
    StorageServerOptions sopt;
    sopt.secret = "blendctl bench remote: a loopback secret";
    sopt.threads = opt.server_threads;
    if (use_tls) {
      sopt.tls = node_tls;
      sopt.tls_peers = {"bench-worker"};
    }
    StorageServer server(disk, sopt);
    std::fprintf(stderr,
                 "bench remote: %d chunks of %lld tokens (%d layers, %d KV heads, head dim %d, %s), %.1f MB per pass, "
                 "node on 127.0.0.1:%d (%s)\n",
                 opt.chunks, static_cast<long long>(opt.tokens), opt.layers, opt.kv_heads, opt.head_dim,
                 opt.kv_dtype.c_str(), bytes_per_pass / 1e6, server.port(), use_tls ? "TLS 1.3, mutual" : "plain TCP");
    for (const int lif : opt.layers_in_flight) {
      RemoteStoreOptions ropt;
      ropt.port = server.port();
      ropt.secret = sopt.secret;
      ropt.layers_in_flight = std::max(1, lif);
      ropt.max_connections = std::max(16, opt.chunks);
      if (use_tls) {
        ropt.tls = worker_tls;
        ropt.tls_peer_name = "bench-node";
      }
      RemoteKvStore remote(ropt);
      double best = 0;
      for (int rep = 0; rep < opt.repeats; ++rep) {
        const auto t0 = clock_type::now();
        bool ok = true;
        if (opt.order == "layer") {
          std::vector<std::unique_ptr<LayerReader>> readers;
          for (const auto& key : keys) {
            readers.push_back(remote.open_layers(key));
            ok = ok && readers.back();
          }
          for (int l = 0; ok && l < opt.layers; ++l)
            for (auto& r : readers) ok = ok && r->read_layer(l, k.data(), v.data());
        } else {
          for (const auto& key : keys) {
            auto r = remote.open_layers(key);
            ok = ok && r;
            for (int l = 0; ok && l < opt.layers; ++l) ok = r->read_layer(l, k.data(), v.data());
          }
        }
        const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (!ok) {
          std::fprintf(stderr, "bench remote: a read failed: %s\n", remote.last_error().c_str());
          failed = true;
        }
        const double gbps = bytes_per_pass / s / 1e9;
        best = std::max(best, gbps);
        print_json_line({{"bench", "remote"}, {"transport", transport}, {"order", opt.order}, {"layers_in_flight", lif},
               {"repeat", rep}, {"chunks", opt.chunks}, {"tokens", opt.tokens}, {"layers", opt.layers},
               {"kv_dtype", opt.kv_dtype}, {"bytes", bytes_per_pass}, {"seconds", s}, {"gb_per_s", gbps}, {"ok", ok}});
        progress.tick();
      }
      best_of[transport][lif] = best;
      print_json_line({{"bench", "remote_summary"}, {"transport", transport}, {"order", opt.order}, {"layers_in_flight", lif},
             {"best_gb_per_s", best}, {"repeats", opt.repeats}, {"bytes", bytes_per_pass}});
    }
    const auto st = server.stats();
    std::fprintf(stderr, "bench remote: node served %lld layers, %.1f MB, %lld connections (%s)\n",
                 static_cast<long long>(st.layers_served), st.bytes_served / 1e6,
                 static_cast<long long>(st.connections), transport.c_str());
  }
  if (best_of.count("plain") && best_of.count("tls"))
    for (const int lif : opt.layers_in_flight)
      if (best_of["plain"][lif] > 0)
        print_json_line({{"bench", "remote_tls_cost"}, {"layers_in_flight", lif}, {"plain_gb_per_s", best_of["plain"][lif]},
               {"tls_gb_per_s", best_of["tls"][lif]}, {"tls_over_plain", best_of["tls"][lif] / best_of["plain"][lif]}});
  return failed ? 1 : 0;
}

}  // namespace bs::tools
