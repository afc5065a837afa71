// `blendctl bench control`: how much a large KV transfer on a storage node's data
// plane (Boost.Asio, storage/storage_server.h) delays its control plane (its own
// link and thread, actors/cluster/control_endpoint.h). Issue 21's target: a 64 MB transfer delays
// a control message by <= 10 ms, and no heartbeat is lost.
//
// Setup: the storage node is `blendserve --config <temp cluster yaml> --node storage`
// (next to blendctl), a process of its own on 127.0.0.1 with its SSD tier in a temp
// dir (buffered reads unless --direct-io: the page cache, the fastest transfer); with
// in_process, a StorageServer and ControlEndpoint in this process instead. This
// process is the client of both planes: one entry whose layers total `megabytes` MiB
// (SmolLM2-135M's KV shape by default: 30 layers, 3 KV heads, head dim 64, f16) is
// pushed to the node as a worker's write-back does (one PUT), then read back layer by
// layer through a RemoteKvStore as the loaders do (layers_in_flight pipelined READs,
// every slice's checksum verified), one whole transfer after another on a reader
// thread; and a control link as the frontend's ClusterMonitor holds one per member
// (storage/framed_link.h) sends the monitor's request (with a fresh HMAC proof of
// the cluster secret) to the node's control endpoint, one at a time every
// interval_ms, with the monitor's timeout (two heartbeat intervals), and times each
// round trip. (Plaintext: the bench's node runs without TLS.)
//
// Phases, `repeats` times: idle (no transfer), then loaded (the transfers running
// the whole time; only control requests whose round trip overlapped a transfer
// count). One JSON line per phase on stdout, then a summary: idle and loaded
// p50/p99/max, delay = loaded p99 - idle p50 (and loaded max - idle p50), the
// transfers' bytes/s, requests failed, timed out, and whether the control
// connection dropped. Progress on stderr. Exit 1 when a control request failed or
// timed out, the connection dropped or a transfer failed; 2 when the node could not
// be started; 130 after SIGINT/SIGTERM (the phases end early, the summary says
// "interrupted"; a second signal kills the node and exits at once). The child node
// is stopped (SIGTERM, SIGKILL after 10 s) and reaped on every exit path, and gets
// SIGTERM if this process dies (PR_SET_PDEATHSIG).
#pragma once

#include <string>

namespace bs::tools {

struct ControlBenchOptions {
  double megabytes = 64;  // one transfer: MiB (2^20 bytes) of K+V in one entry, rounded up to whole tokens
  int layers = 30, kv_heads = 3, head_dim = 64;  // the entry's shape (SmolLM2-135M); f16
  int samples = 200;        // control requests per phase
  double interval_ms = 20;  // between the starts of consecutive control requests
  int repeats = 1;          // idle + loaded phase pairs
  int layers_in_flight = 4;  // the reader's pipelined layer READs (tiers.remote.layers_in_flight)
  double heartbeat_s = 1;    // cluster.heartbeat_interval: a control request times out after two
  double connection_timeout_s = 5;  // cluster.connection_timeout (CAF's silent-connection limit)
  bool direct_io = false;    // the node reads its SSD tier with O_DIRECT
  bool in_process = false;   // the node in this process (no `blendserve` child)
  std::string blendserve;    // the binary; empty: blendserve next to blendctl
  double startup_timeout_s = 30;  // the child node's ports must answer within this
  std::string data_dir;      // the node's files (default: a temp dir, removed after)
  // One JSON line per control request too ({"bench":"control_sample"}: phase, start,
  // round trip, and in the loaded phase how far into its transfer it started).
  bool print_samples = false;
};
int bench_control(const ControlBenchOptions& opt);

}  // namespace bs::tools
