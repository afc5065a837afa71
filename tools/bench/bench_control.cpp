// blendctl bench control (tools/bench/bench_control.h): a storage node's control-plane
// round trip, idle and behind a stream of large data-plane transfers.
#include "tools/bench/bench_control.h"
#include "tools/cli/child_process.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/scratch_dir.h"
#include "tools/cli/process_report.h"
#include "tools/cli/tcp_probe.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/cluster/cluster_messages.h"
#include "actors/cluster/cluster_report.h"
#include "actors/config/cluster_secret.h"
#include "actors/cluster/control_endpoint.h"
#include "actors/cluster/control_wire.h"
#include "storage/framed_link.h"
#include "storage/chunk_kv.h"
#include "storage/disk_store.h"
#include "storage/remote_store.h"
#include "storage/storage_server.h"
#include "tools/cli/progress.h"
#include "tools/bench/json_line.h"

namespace bs::tools {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The nearest-rank percentile (q in [0, 1]) of `v`; 0 for an empty one.
double nearest_rank_percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[rank == 0 ? 0 : rank - 1];
}

// Tokens of an entry of the shape (f16) whose K+V total at least `bytes`.
int64_t tokens_for_bytes(int64_t bytes, int layers, int kv_heads, int head_dim) {
  if (bytes < 1 || layers < 1 || kv_heads < 1 || head_dim < 1)
    throw std::invalid_argument("tokens_for_bytes: sizes must be positive");
  const int64_t per_token = int64_t{2} * layers * kv_heads * head_dim * 2;  // K and V, f16
  return (bytes + per_token - 1) / per_token;
}

constexpr const char* kSelf = "bench-control";  // who the proofs say asks (a frontend's name)
constexpr const char* kNode = "storage";

// ------------------------------------------------------------ the storage node

std::string random_secret() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 32; ++i) s += "0123456789abcdef"[rd() % 16];
  return s;
}

// `blendserve --config F --node storage` as a child of this process (its output in
// `log`); it gets SIGTERM if this process dies (PR_SET_PDEATHSIG), and is stopped
// (SIGTERM, SIGKILL after 10 s) and reaped when this goes out of scope.
class NodeProcess {
 public:
  NodeProcess(const std::string& bin, const std::string& config, const std::string& log) : log_(log) {
    if (::access(bin.c_str(), X_OK) != 0)
      throw std::runtime_error("no executable " + bin + " (build the blendserve target, or pass --blendserve)");
    pid_ = spawn_child({bin, "--config", config, "--node", kNode}, log);
    set_interrupt_child(pid_);
  }
  ~NodeProcess() { stop(); }
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Whether it has exited (reaped here; `why` says how).
  bool exited(std::string* why = nullptr) {
    if (pid_ <= 0) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    if (why) *why = describe_status(status);
    pid_ = 0;
    set_interrupt_child(0);
    return true;
  }
  std::string log_tail() const {
    std::string out(1, '\n');
    out += tools::log_tail(log_, 15);
    return out;
  }
  // SIGTERM, then SIGKILL after 10 s; reaped. Idempotent.
  void stop() {
    if (pid_ <= 0) return;
    stop_child_saying(pid_, 10, "bench control: the storage node");
    pid_ = 0;
    set_interrupt_child(0);
  }

 private:
  std::string log_;
  pid_t pid_ = 0;
};

// A cluster config whose storage node serves on `control_port` / `data_port` (the
// frontend and worker entries are required by the format; they are never started).
std::string cluster_yaml(const ControlBenchOptions& opt, const std::string& secret, const fs::path& data_dir,
                         int control_port, int data_port, int64_t budget) {
  std::ostringstream y;
  y << "cluster: {name: bench-control, secret: \"" << secret << "\", data_dir: \"" << data_dir.string()
    << "\", heartbeat_interval: " << opt.heartbeat_s << ", connection_timeout: " << opt.connection_timeout_s
    << ", tls: {mode: plaintext}}\n"
    << "nodes:\n"
    << "  - {name: frontend, role: frontend, host: 127.0.0.1, port: " << free_loopback_port()
    << ", http_port: " << free_loopback_port() << "}\n"
    << "  - {name: worker, role: worker, host: 127.0.0.1, port: " << free_loopback_port()
    << ", http_port: " << free_loopback_port() << "}\n"
    << "  - {name: " << kNode << ", role: storage, host: 127.0.0.1, port: " << control_port
    << ", data_port: " << data_port << ", tiers: {ssd: {budget: " << budget
    << ", direct_io: " << (opt.direct_io ? "true" : "false") << "}}}\n";
  return y.str();
}

// The node in this process: what run_storage_member runs, on ports of its own.
struct InProcessNode {
  DiskKvStore store;
  StorageServer server;
  ControlEndpoint control;
  InProcessNode(const ControlBenchOptions& opt, const std::string& dir, int64_t budget, const std::string& secret)
      : store(dir, budget, opt.direct_io),
        server(store, StorageServerOptions{.bind_host = "127.0.0.1", .port = 0, .secret = secret}),
        control(ControlEndpointOptions{.node = kNode, .host = "127.0.0.1", .port = 0, .secret = secret,
                                       .heartbeat_interval_s = opt.heartbeat_s,
                                       .connection_timeout_s = opt.connection_timeout_s, .tls = {},
                                       .tls_peers = {}},
                [this] { return make_storage_report(store, kNode); }) {}
};

// ------------------------------------------------------------ the control client

struct ProbeSample {
  double start_s = 0, end_s = 0;  // since the bench's epoch
  bool ok = false, timed_out = false;
  double rtt_ms() const { return (end_s - start_s) * 1e3; }
};

struct ProbeSpec {
  std::string secret;
  double connect_timeout_s = 5;
  int count = 0;
  Clock::duration interval{}, timeout{};
  Clock::time_point epoch;
};

struct ProbeRun {
  std::vector<ProbeSample> samples;
  bool dropped = false;
  std::string error;
};

// The ClusterMonitor's ask, timed: one report request at a time over the control
// link (the monitor never has two pending per member), a fresh proof each, every
// `interval` from the previous start (at once when a reply took longer), `count`
// of them; the connection stays up across them, as the monitor's does.
ProbeRun probe(FramedClient& client, const ProbeSpec& spec) {
  ProbeRun run;
  const double timeout_s = std::chrono::duration<double>(spec.timeout).count();
  for (int i = 0; i < spec.count && !stop_requested(); ++i) {
    const auto t0 = Clock::now();
    ControlRequest req;
    req.from = kSelf;
    req.to = kNode;
    req.unix_ms = unix_ms_now();
    req.proof = control_proof(spec.secret, req.from, req.to, req.unix_ms);
    const bool was_connected = client.connected();
    std::string why;
    const auto reply = client.call(encode_control_request(req), spec.connect_timeout_s, timeout_s, &why);
    const bool ok = reply && decode_report_reply(*reply, &why).has_value();
    const bool timed_out = !reply && why.rfind("no reply within", 0) == 0;
    const auto t1 = Clock::now();
    run.samples.push_back({std::chrono::duration<double>(t0 - spec.epoch).count(),
                           std::chrono::duration<double>(t1 - spec.epoch).count(), ok, timed_out});
    if (!ok && run.error.empty()) run.error = "control request failed: " + why;
    if (!reply && was_connected && !timed_out) {
      run.dropped = true;  // the connection went down under the load
      break;
    }
    const auto next = t0 + spec.interval;
    if (next > t1) std::this_thread::sleep_for(next - t1);
  }
  return run;
}

// ------------------------------------------------------------ the data-plane load

struct Transfer {
  double start_s = 0, end_s = 0;
  bool ok = false;
};

// Reads the entry whole, layer by layer as the loaders do, one transfer after
// another on its own thread, until stopped.
class TransferLoop {
 public:
  TransferLoop(RemoteKvStore& store, const ChunkKey& key, int layers, int64_t layer_bytes, Clock::time_point epoch)
      : store_(store), key_(key), layers_(layers), epoch_(epoch), k_(static_cast<size_t>(layer_bytes)),
        v_(static_cast<size_t>(layer_bytes)) {
    thread_ = std::thread([this] { run(); });
  }
  ~TransferLoop() { stop(); }
  TransferLoop(const TransferLoop&) = delete;
  TransferLoop& operator=(const TransferLoop&) = delete;

  // Waits (at most timeout_s) until `n` transfers have finished; false if not.
  bool wait_finished(size_t n, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return transfers_.size() >= n; });
  }
  // Ends the loop after the transfer under way and joins the thread.
  std::vector<Transfer> stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return transfers_;
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void run() {
    while (!stop_.load() && !stop_requested()) {
      const auto t0 = Clock::now();
      bool ok = false;
      if (auto r = store_.open_layers(key_); r && r->n_layers() == layers_) {
        ok = true;
        for (int l = 0; ok && l < layers_; ++l) ok = r->read_layer(l, k_.data(), v_.data());
      }
      const auto t1 = Clock::now();
      {
        std::lock_guard<std::mutex> lock(mu_);
        transfers_.push_back({std::chrono::duration<double>(t0 - epoch_).count(),
                              std::chrono::duration<double>(t1 - epoch_).count(), ok});
        if (!ok && error_.empty()) error_ = "a transfer failed: " + store_.last_error();
      }
      cv_.notify_all();
      if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the node counts as down a while
    }
  }

  RemoteKvStore& store_;
  ChunkKey key_;
  int layers_;
  Clock::time_point epoch_;
  std::vector<std::byte> k_, v_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Transfer> transfers_;
  std::string error_;
  std::thread thread_;
};

// ------------------------------------------------------------ statistics

struct PhaseStats {
  int sent = 0, ok = 0, failed = 0, timed_out = 0;
  std::vector<double> rtt_ms;  // the counted successful round trips
};

json stats_json(const PhaseStats& s) {
  double mean = 0;
  for (double x : s.rtt_ms) mean += x;
  if (!s.rtt_ms.empty()) mean /= static_cast<double>(s.rtt_ms.size());
  return {{"requests", s.sent},
          {"counted", s.rtt_ms.size()},
          {"failed", s.failed},
          {"timed_out", s.timed_out},
          {"p50_ms", nearest_rank_percentile(s.rtt_ms, 0.5)},
          {"p99_ms", nearest_rank_percentile(s.rtt_ms, 0.99)},
          {"max_ms", s.rtt_ms.empty() ? 0.0 : *std::max_element(s.rtt_ms.begin(), s.rtt_ms.end())},
          {"mean_ms", mean}};
}

// Adds a run's samples; with `transfers`, only round trips that overlapped one count.
void add_samples(PhaseStats& s, const ProbeRun& run, const std::vector<Transfer>* transfers) {
  for (const auto& p : run.samples) {
    ++s.sent;
    if (!p.ok) {
      ++s.failed;
      if (p.timed_out) ++s.timed_out;
      continue;
    }
    ++s.ok;
    if (transfers) {
      const bool overlapped = std::any_of(transfers->begin(), transfers->end(), [&](const Transfer& t) {
        return t.start_s < p.end_s && t.end_s > p.start_s;
      });
      if (!overlapped) continue;
    }
    s.rtt_ms.push_back(p.rtt_ms());
  }
}

void print_samples(const ProbeRun& run, const char* phase, int rep, const std::vector<Transfer>& transfers) {
  for (size_t i = 0; i < run.samples.size(); ++i) {
    const auto& p = run.samples[i];
    json j = {{"bench", "control_sample"}, {"phase", phase}, {"repeat", rep}, {"i", i}, {"start_s", p.start_s},
              {"rtt_ms", p.rtt_ms()}, {"ok", p.ok}, {"timed_out", p.timed_out}};
    // The transfer under way when the request was sent: how far into it.
    for (const auto& t : transfers)
      if (t.start_s <= p.start_s && p.start_s < t.end_s) {
        j["transfer_offset_s"] = p.start_s - t.start_s;
        j["transfer_s"] = t.end_s - t.start_s;
      }
    print_json_line(j);
  }
}

}  // namespace

int bench_control(const ControlBenchOptions& opt) {
  if (!(opt.megabytes > 0) || opt.layers < 1 || opt.kv_heads < 1 || opt.head_dim < 1 || opt.samples < 1 ||
      opt.repeats < 1 || opt.layers_in_flight < 1 || !(opt.interval_ms >= 0) || !(opt.heartbeat_s > 0) ||
      opt.connection_timeout_s < opt.heartbeat_s)
    throw std::invalid_argument("bench control: sizes and counts must be positive, connection timeout >= heartbeat");
  InterruptGuard signals;
  const auto epoch = Clock::now();

  // The entry: random K/V (the values do not matter to the data path).
  const int64_t want_bytes = static_cast<int64_t>(opt.megabytes * 1048576.0);
  const int64_t tokens = tokens_for_bytes(want_bytes, opt.layers, opt.kv_heads, opt.head_dim);
  auto kv = std::make_shared<ChunkKv>();
  kv->n_layers = opt.layers, kv->kv_heads = opt.kv_heads, kv->head_dim = opt.head_dim;
  kv->dtype = kernels::TensorType::F16;
  std::mt19937_64 rng(21);
  for (int64_t t = 0; t < tokens; ++t) kv->tokens.push_back(static_cast<int32_t>(rng() % 49152));
  kv->allocate();
  for (auto* buf : {&kv->k, &kv->v})
    for (size_t i = 0; i + 8 <= buf->size(); i += 8) {
      const uint64_t x = rng();
      std::memcpy(buf->data() + i, &x, 8);
    }
  const int64_t transfer_bytes = 2 * static_cast<int64_t>(opt.layers) * kv->layer_bytes();
  const ChunkKey key = make_chunk_key(0xc0e7a1, KvKind::Chunk, kv->tokens);
  const int64_t budget = std::max<int64_t>(int64_t{1} << 30, 4 * static_cast<int64_t>(kv->bytes()));
  const int64_t max_frame = int64_t{256} << 20;  // the node's and the store's default frame limit
  if (static_cast<int64_t>(kv->bytes()) + (int64_t{1} << 20) > max_frame)
    throw std::invalid_argument("bench control: --megabytes too large: the entry is pushed in one PUT frame (" +
                                std::to_string(max_frame >> 20) + " MiB at most)");

  const ScratchDir scratch(opt.data_dir, "bench_control");
  const fs::path& dir = scratch.path();
  const std::string secret = random_secret();

  // The node: a child process, or this process.
  std::unique_ptr<NodeProcess> child;
  std::unique_ptr<InProcessNode> local;
  int control_port = 0, data_port = 0;
  if (opt.in_process) {
    const fs::path store_dir = dir / "node-kv";
    fs::remove_all(store_dir);
    local = std::make_unique<InProcessNode>(opt, store_dir.string(), budget, secret);
    control_port = local->control.port();
    data_port = local->server.port();
  } else {
    control_port = free_loopback_port();
    data_port = free_loopback_port();
    while (data_port == control_port) data_port = free_loopback_port();
    const fs::path config = dir / "cluster.yaml";
    fs::remove_all(dir / "bench-control" / kNode);  // a cold store
    {
      std::ofstream out(config, std::ios::trunc);
      out << cluster_yaml(opt, secret, dir, control_port, data_port, budget);
      if (!out) throw std::runtime_error("cannot write " + config.string());
    }
    fs::permissions(config, fs::perms::owner_read | fs::perms::owner_write);  // it holds the secret
    const std::string bin = opt.blendserve.empty() ? self_dir() + "/blendserve" : opt.blendserve;
    const std::string log = (dir / "storage.log").string();
    std::fprintf(stderr, "bench control: starting %s --config %s --node %s (log %s)\n", bin.c_str(),
                 config.c_str(), kNode, log.c_str());
    child = std::make_unique<NodeProcess>(bin, config.string(), log);
    const auto t0 = Clock::now();
    while (!tcp_accepts("127.0.0.1", data_port, 0.5) || !tcp_accepts("127.0.0.1", control_port, 0.5)) {
      std::string why;
      if (child->exited(&why)) {
        std::fprintf(stderr, "bench control: the storage node %s:%s\n", why.c_str(), child->log_tail().c_str());
        return 2;
      }
      if (stop_requested()) throw Interrupted();
      if (seconds_since(t0) > opt.startup_timeout_s) {
        std::fprintf(stderr, "bench control: the storage node's ports did not answer within %.0f s:%s\n",
                     opt.startup_timeout_s, child->log_tail().c_str());
        return 2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::fprintf(stderr, "bench control: storage node %s, control on 127.0.0.1:%d, data on 127.0.0.1:%d (%s)\n",
               child ? ("pid " + std::to_string(child->pid())).c_str() : "in this process", control_port, data_port,
               opt.direct_io ? "O_DIRECT reads" : "page cache");

  // The data plane's client: the entry pushed as a worker's write-back does.
  RemoteStoreOptions ropt;
  ropt.port = data_port;
  ropt.secret = secret;
  ropt.layers_in_flight = opt.layers_in_flight;
  ropt.io_timeout_s = 30;  // the PUT's reply comes after the node's write and fsync
  RemoteKvStore remote(ropt);
  {
    const auto t0 = Clock::now();
    if (!remote.put(key, kv)) throw std::runtime_error("bench control: the PUT to the node failed: " + remote.last_error());
    std::fprintf(stderr, "bench control: stored one entry of %lld tokens, %d layers of %.2f MB (K+V), %.1f MB in all, in %.2f s\n",
                 static_cast<long long>(tokens), opt.layers, 2.0 * kv->layer_bytes() / 1e6, transfer_bytes / 1e6,
                 seconds_since(t0));
  }
  kv.reset();

  // The control plane's client: a link as the frontend's ClusterMonitor holds per
  // member, connected on the first ask and kept up across the phases, the
  // monitor's timeout per request.
  PhaseStats idle_all, loaded_all;
  std::vector<double> transfer_s;
  int64_t loaded_bytes = 0, transfers_failed = 0;
  double loaded_transfer_seconds = 0;
  bool dropped = false;
  std::string first_error;
  {
    FramedClientOptions copt;
    copt.host = "127.0.0.1";
    copt.port = control_port;
    FramedClient client(copt);
    ProbeSpec spec;
    spec.secret = secret;
    spec.connect_timeout_s = opt.connection_timeout_s;
    spec.count = opt.samples;
    spec.interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(opt.interval_ms));
    spec.timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(2 * opt.heartbeat_s));
    spec.epoch = epoch;
    Progress progress("bench control", 2 * opt.repeats);
    for (int rep = 0; rep < opt.repeats && !dropped && !stop_requested(); ++rep) {
      for (const bool loaded : {false, true}) {
        if (stop_requested()) break;  // the summary says "interrupted"
        std::unique_ptr<TransferLoop> loop;
        if (loaded) {
          loop = std::make_unique<TransferLoop>(remote, key, opt.layers, transfer_bytes / (2 * opt.layers), epoch);
          // The stream is under way (one whole transfer done) before the first request.
          if (!loop->wait_finished(1, 60)) throw std::runtime_error("bench control: the first transfer took over 60 s");
        }
        const ProbeRun run = probe(client, spec);
        const std::vector<Transfer> transfers = loop ? loop->stop() : std::vector<Transfer>{};
        if (loop && !loop->error().empty() && first_error.empty()) first_error = loop->error();
        PhaseStats phase;
        add_samples(phase, run, loop ? &transfers : nullptr);
        add_samples(loaded ? loaded_all : idle_all, run, loop ? &transfers : nullptr);
        if (run.dropped) dropped = true;
        if (!run.error.empty() && first_error.empty()) first_error = run.error;
        json j = {{"bench", "control"}, {"phase", loaded ? "loaded" : "idle"}, {"repeat", rep},
                  {"interval_ms", opt.interval_ms}};
        j.update(stats_json(phase));
        j["connection_dropped"] = run.dropped;
        if (loaded) {
          int64_t bytes = 0, failed = 0;
          double seconds = 0;
          std::vector<double> durations;
          for (const auto& t : transfers) {
            if (!t.ok) {
              ++failed;
              continue;
            }
            bytes += transfer_bytes;
            seconds += t.end_s - t.start_s;
            durations.push_back(t.end_s - t.start_s);
          }
          transfer_s.insert(transfer_s.end(), durations.begin(), durations.end());
          loaded_bytes += bytes;
          loaded_transfer_seconds += seconds;
          transfers_failed += failed;
          j["transfers"] = transfers.size();
          j["transfers_failed"] = failed;
          j["transfer_bytes"] = transfer_bytes;
          j["transfer_s_p50"] = nearest_rank_percentile(durations, 0.5);
          j["bytes_per_s"] = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
        }
        if (opt.print_samples) print_samples(run, loaded ? "loaded" : "idle", rep, transfers);
        print_json_line(j);
        progress.tick();
        if (run.dropped) break;
      }
    }
  }  // the actor system goes before the node

  const double idle_p50 = nearest_rank_percentile(idle_all.rtt_ms, 0.5);
  const json idle = stats_json(idle_all), loaded = stats_json(loaded_all);
  const double delay_p99 = loaded["p99_ms"].get<double>() - idle_p50;
  const double delay_max = loaded["max_ms"].get<double>() - idle_p50;
  const int failed = idle_all.failed + loaded_all.failed, timed_out = idle_all.timed_out + loaded_all.timed_out;
  constexpr double target_ms = 10;
  const bool clean = failed == 0 && !dropped && !loaded_all.rtt_ms.empty() && !idle_all.rtt_ms.empty();
  json summary = {{"bench", "control_summary"},
                  {"node", child ? "process" : "in-process"},
                  {"direct_io", opt.direct_io},
                  {"transfer_bytes", transfer_bytes},
                  {"tokens", tokens},
                  {"layers", opt.layers},
                  {"layer_slice_bytes", transfer_bytes / opt.layers},
                  {"layers_in_flight", opt.layers_in_flight},
                  {"repeats", opt.repeats},
                  {"samples_per_phase", opt.samples},
                  {"interval_ms", opt.interval_ms},
                  {"heartbeat_interval_s", opt.heartbeat_s},
                  {"request_timeout_s", 2 * opt.heartbeat_s},
                  {"idle_counted", idle["counted"]},
                  {"idle_p50_ms", idle["p50_ms"]},
                  {"idle_p99_ms", idle["p99_ms"]},
                  {"idle_max_ms", idle["max_ms"]},
                  {"loaded_counted", loaded["counted"]},
                  {"loaded_p50_ms", loaded["p50_ms"]},
                  {"loaded_p99_ms", loaded["p99_ms"]},
                  {"loaded_max_ms", loaded["max_ms"]},
                  {"delay_p99_ms", loaded_all.rtt_ms.empty() || idle_all.rtt_ms.empty() ? json() : json(delay_p99)},
                  {"delay_max_ms", loaded_all.rtt_ms.empty() || idle_all.rtt_ms.empty() ? json() : json(delay_max)},
                  {"transfers", transfer_s.size()},
                  {"transfers_failed", transfers_failed},
                  {"transfer_s_p50", nearest_rank_percentile(transfer_s, 0.5)},
                  {"bytes_per_s", loaded_transfer_seconds > 0 ? static_cast<double>(loaded_bytes) / loaded_transfer_seconds : 0.0},
                  {"control_failed", failed},
                  {"control_timed_out", timed_out},
                  {"connection_dropped", dropped},
                  {"target_delay_ms", target_ms},
                  {"within_target_p99", clean && delay_p99 <= target_ms},
                  {"within_target_max", clean && delay_max <= target_ms}};
  if (!first_error.empty()) summary["first_error"] = first_error;
  if (stop_requested()) summary["interrupted"] = true;  // the phases ended early
  print_json_line(summary);
  if (local) {
    const auto st = local->server.stats();
    std::fprintf(stderr, "bench control: node served %lld layers, %.1f MB\n", static_cast<long long>(st.layers_served),
                 st.bytes_served / 1e6);
  }
  if (child) {
    std::string why;
    if (child->exited(&why)) {
      std::fprintf(stderr, "bench control: the storage node %s during the run:%s\n", why.c_str(),
                   child->log_tail().c_str());
      return 1;
    }
    child->stop();
  }
  if (stop_requested()) return 130;
  return clean && transfers_failed == 0 ? 0 : 1;
}

}  // namespace bs::tools
