// `blendctl bench remote`: the remote-disk tier's data path on loopback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bs::tools {

// Starts a StorageServer on 127.0.0.1 over a DiskKvStore in a temp dir (buffered
// reads: the page cache, so it measures the network path, not the disk), stores
// `chunks` random entries of the given shape (default: SmolLM2-135M's KV, 30 layers,
// 3 KV heads, head dim 64, f16), then reads every layer of every chunk through a
// RemoteKvStore, `repeats` times per layers_in_flight value, for each transport:
// plain TCP, and TLS 1.3 with mutual authentication (certificates of a CA made in
// the temp dir, storage/tls.h). One JSON line per measurement on stdout, one summary
// line per transport and layers_in_flight (the best repeat), and with both transports
// one line per layers_in_flight with TLS's throughput over plain's; progress on
// stderr. Exit 1 if any read failed.
struct RemoteBenchOptions {
  int64_t tokens = 512;  // per chunk
  int chunks = 8;
  int layers = 30, kv_heads = 3, head_dim = 64;
  std::string kv_dtype = "f16";  // f32 | f16 | bf16
  std::vector<int> layers_in_flight{1, 4};
  int repeats = 3;
  int server_threads = 2;
  // layer: layer l of every chunk, then l+1 (the loaders' order; each chunk's reader
  // holds its own connection); chunk: each chunk's layers in turn, one reader at a time.
  std::string order = "layer";
  std::vector<std::string> transports{"plain", "tls"};  // each a run: plain | tls
  std::string data_dir;  // where the node's SSD tier lives (default: a temp dir, removed after)
};
int bench_remote(const RemoteBenchOptions& opt);

}  // namespace bs::tools
