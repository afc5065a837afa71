// The storage and frontend roles of `blendserve --node` (tools/cluster/cluster_member.h).
// Both run until SIGINT/SIGTERM: the signals are blocked in every thread before
// any starts and taken by sigwait here, which then stops the role's servers.
#include "tools/cluster/cluster_member.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <thread>

#include <pthread.h>

#include "actors/cluster/cluster_monitor.h"
#include "actors/cluster/cluster_report.h"
#include "actors/cluster/control_endpoint.h"
#include "actors/runtime/runtime.h"
#include "http/frontend.h"
#include "storage/disk_store.h"
#include "storage/storage_server.h"

namespace bs::tools {
namespace {

sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread exists: all inherit it
  std::signal(SIGPIPE, SIG_IGN);
  return signals;
}

}  // namespace

ControlEndpointOptions control_options(const ClusterConfig& cluster, const ClusterNode& me) {
  // TLS: only the frontend asks, by the name in its certificate.
  return {.node = me.name, .host = me.bind, .port = me.port, .secret = cluster.secret,
          .heartbeat_interval_s = cluster.heartbeat_interval_s, .connection_timeout_s = cluster.connection_timeout_s,
          .tls = cluster.member_tls(me.name), .tls_peers = {cluster.frontend().name}};
}

namespace {

}  // namespace

int run_storage_member(const ClusterConfig& cluster, const std::string& name) {
  sigset_t signals = block_stop_signals();
  const ClusterNode& me = cluster.member(name);
  const RuntimeConfig config = member_runtime_config(cluster, name);
  try {
    DiskKvStore store(resolve_ssd_path(config), config.ssd.budget_bytes, config.ssd.direct_io, {}, config.ssd.file_io);
    StorageServerOptions opt;
    opt.bind_host = me.bind;
    opt.port = me.data_port;
    opt.secret = cluster.secret;
    opt.threads = me.data_plane.threads;
    opt.disk_threads = me.data_plane.disk_threads;
    opt.max_connections = me.data_plane.max_connections;
    opt.max_connections_per_peer = me.data_plane.max_connections_per_peer;
    opt.io_timeout_s = me.data_plane.io_timeout_s;
    opt.idle_timeout_s = me.data_plane.idle_timeout_s;
    // TLS: only the cluster's workers, by the names in their certificates.
    opt.tls = cluster.member_tls(name);
    for (const ClusterNode* w : cluster.workers()) opt.tls_peers.push_back(w->name);
    StorageServer server(store, opt);
    ControlEndpoint control(control_options(cluster, me), [&store, name] { return make_storage_report(store, name); },
                            storage_holdings(store));
    const auto st = store.stats();
    std::fprintf(stderr,
                 "blendserve: storage node %s of cluster %s: %lld chunks (%lld bytes) in %s, data on %s:%d (%s), "
                 "control on %s:%d (%s)\n",
                 name.c_str(), cluster.name.c_str(), static_cast<long long>(st.entries), static_cast<long long>(st.bytes),
                 store.dir().c_str(), me.bind.c_str(), server.port(),
                 cluster.tls ? "TLS 1.3, mutual" : "plaintext", me.bind.c_str(), control.port(),
                 cluster.tls ? "TLS 1.3, mutual" : "plaintext");
    std::fflush(stderr);
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "blendserve: signal %d: storage node stopping\n", sig);
    server.stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blendserve: storage node %s: %s\n", name.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "blendserve: stopped\n");
  return 0;
}

int run_frontend_member(const ClusterConfig& cluster, const std::string& name) {
  sigset_t signals = block_stop_signals();
  const ClusterNode& me = cluster.member(name);
  const RuntimeConfig config = member_runtime_config(cluster, name);
  try {
    ClusterMonitorOptions mopt;
    mopt.self = name;
    mopt.secret = cluster.secret;
    mopt.heartbeat_interval_s = cluster.heartbeat_interval_s;
    mopt.connection_timeout_s = cluster.connection_timeout_s;
    mopt.tls = cluster.member_tls(name);  // its asks of every member: TLS, its certificate
    http::FrontendOptions fopt;
    fopt.node = name;
    fopt.api_keys = config.api_keys;
    fopt.worker_api_key = worker_api_key(cluster.secret);
    fopt.max_body_bytes = config.max_body_bytes;
    fopt.heartbeat_interval_s = cluster.heartbeat_interval_s;
    fopt.tls = cluster.member_tls(name);  // its forwards to the workers: HTTPS
    fopt.connect_timeout_s = me.forward.connect_timeout_s;
    fopt.first_token_timeout_s = me.forward.first_token_timeout_s;
    fopt.idle_timeout_s = me.forward.idle_timeout_s;
    fopt.routing = parse_routing_policy(cluster.routing);
    for (const ClusterNode* w : cluster.workers()) {
      mopt.members.push_back({w->name, "worker", w->host, w->port});
      fopt.workers.push_back({w->name, w->host, w->http_port});
      // The workers' model: its tokenizer makes the chunk keys the frontend routes by.
      if (fopt.model_path.empty()) fopt.model_path = resolve_model_path(member_runtime_config(cluster, w->name));
    }
    for (const ClusterNode* s : cluster.storage_nodes()) mopt.members.push_back({s->name, "storage", s->host, s->port});
    ClusterMonitor monitor(mopt);
    http::FrontendServer server(fopt, monitor);
    const int bound = server.bind(me.bind, me.http_port);
    std::fprintf(stderr, "blendserve: frontend %s of cluster %s (%zu workers, %s routing), serving on http://%s:%d%s\n",
                 name.c_str(), cluster.name.c_str(), fopt.workers.size(), cluster.routing.c_str(), me.bind.c_str(),
                 bound, fopt.api_keys.empty() ? "" : " (API keys required)");
    std::fflush(stderr);
    std::atomic<bool> serve_returned{false};
    std::thread waiter([&] {
      int sig = 0;
      sigwait(&signals, &sig);
      if (serve_returned.load()) return;  // the listener failed by itself
      // New requests 503 while the streams in flight finish (cluster.drain_timeout);
      // a second signal stops at once.
      std::fprintf(stderr, "blendserve: signal %d: frontend draining (up to %.0f s; again to stop now)\n", sig,
                   cluster.drain_timeout_s);
      std::thread second([signals] {
        int again = 0;
        sigwait(&signals, &again);
        std::_Exit(130);
      });
      second.detach();
      server.drain(cluster.drain_timeout_s);
      std::fprintf(stderr, "blendserve: frontend stopping\n");
      // A stop() before serve() listens is lost: stop until serve() has returned.
      while (!serve_returned.load()) {
        server.stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    const bool ok = server.serve();
    serve_returned = true;
    if (!ok) pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    std::fprintf(stderr, "blendserve: stopped\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blendserve: frontend %s: %s\n", name.c_str(), e.what());
    return 1;
  }
}

}  // namespace bs::tools
