// The runtime's configuration: YAML (yaml-cpp), `configs/default.yaml` is the
// embedded default. Every key is known: an unknown key, a wrong type or an
// impossible value is a ConfigError naming the key ("tiers.ram.budget: ...").
// No CAF here: the config is read before any actor exists.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "storage/file_io.h"
#include "storage/tls.h"

namespace bs {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TierConfig {
  bool enabled = true;
  int64_t budget_bytes = 0;       // byte budget of the tier ("2GiB", "512MiB", plain integers)
  std::string path;               // ssd: the directory (relative paths are under data_dir)
  bool direct_io = false;         // ssd: O_DIRECT reads (real reads, not the page cache)
  double throttle_bytes_per_s = 0;  // > 0: reads limited to this bandwidth (benchmarks)
  // ssd: bytes of chunk KV waiting for the tier's writer at most; a write-back or
  // demotion beyond it is dropped (counted), never queued without bound.
  int64_t write_queue_bytes = 0;
  // Loader actors of the tier: this many requests' loads from it proceed at once.
  int loaders = 2;
  // ssd: the file system calls of the tier (storage/file_io.h); null: the real ones.
  // Not a YAML key: tests and soaks put faults here (a full disk, EIO).
  std::shared_ptr<FileIo> file_io;
  bool operator==(const TierConfig&) const = default;
};

// The remote tier (tiers.remote): chunk KV on a storage node's SSD, read layer by
// layer over TCP (storage/remote_store.h). Off by default. A cluster member gets
// host, port and secret from its cluster config (the storage node's host and
// data_port, the cluster secret); a single node pointing at a storage node sets them
// here, and enabling the tier without them is a ConfigError naming the key.
// One storage node of the remote tier (a cluster's storage nodes; outside a cluster
// the one node host:port names).
struct RemoteNodeAddress {
  std::string name;  // its node name: the replicas' hash input, and its TLS name
  std::string host;
  int port = 0;
  bool operator==(const RemoteNodeAddress&) const = default;
};

struct RemoteTierConfig {
  bool enabled = false;
  std::string host;    // the storage node's address
  int port = 0;        // its data_port (KV bytes)
  // A cluster's storage nodes (set by the cluster file); empty: the one at host:port.
  std::vector<RemoteNodeAddress> nodes{};
  // Copies of each chunk, on that many of `nodes` (cluster.replication, capped at
  // their number); 1 outside a cluster.
  int replication = 1;
  std::string secret;  // the cluster secret, resolved ("env:NAME" read at parse time), >= 16 characters
  // Loader actors of the tier: this many requests' loads from it proceed at once.
  int loaders = 2;
  // Layers of one chunk requested ahead of the one being read (read-ahead depth).
  int layers_in_flight = 4;
  // Connections to the storage node at most (pooled; a chunk being read holds one).
  int max_connections = 16;
  // Push chunks this node computed (write-back) to the storage node too.
  bool write_back = true;
  double connect_timeout_s = 2;  // seconds to connect and authenticate
  double io_timeout_s = 5;       // seconds any one reply (or sending one request) may take
  // Seconds the tier counts as down (lookups miss at once) after a connection
  // failure, before it is tried again.
  double retry_after_s = 1;
  // TLS to the storage nodes (storage/tls.h): this worker's files; each node's
  // certificate must carry its name (RemoteNodeAddress::name; outside a cluster
  // tls_peer_name, else the host). In a cluster set by the cluster file
  // (cluster.tls); a single node sets tiers.remote.tls {ca, cert, key, peer_name}.
  // All empty: plaintext.
  tls::Files tls{};
  std::string tls_peer_name{};
  bool operator==(const RemoteTierConfig&) const = default;
};

// The KV dtype of the embedded default (configs/default.yaml says the same; a test
// checks): the tools' --kv-dtype defaults to it too.
inline constexpr const char* kDefaultKvDtype = "f16";

struct RuntimeConfig {
  // model
  std::string model_path;          // empty: $BLENDSERVE_MODEL or the embedded default model
  std::string precision = "auto";  // auto | bf16 | f32
  // The chat template in place of the model's own (model/chat_template.h): a Jinja file's
  // path, or the template itself; empty: the model's (--chat-template FILE sets it).
  std::string chat_template;
  // Activations of the decode-size products of block-quantized weights
  // (kernels::DecodeActivations): auto | exact | int8; auto =
  // $BLENDSERVE_DECODE_ACTIVATIONS, else exact.
  std::string decode_activations = "auto";
  // Every prefill product and attention row computed as that row alone
  // (kernels::Backend::batch_invariant): a prefix-cache hit then answers bit for bit
  // what a cold prefill answers, at a cost in prefill speed; f32 only; CPU only.
  bool batch_invariant = false;
  // device
  // cpu | cuda (kernels/backend_choice.h; cuda only in a build configured with nvcc).
  std::string device_kind = "cpu";
  // cuda: the GPU of each tensor-parallel rank, by CUDA index ([0]: one GPU, device 0).
  std::vector<int> gpus{0};
  // cuda: seconds the host waits at most for the GPU in one wait (a step's tokens, a
  // copy back, a loader's copies); past them the device counts as lost and its
  // requests fail with that sentence instead of hanging (kernels/cuda/device_waits.h).
  double device_wait_timeout = 60;
  int threads = 0;                 // compute threads; 0 = all cores (tensor parallel: split between the ranks)
  // Tensor-parallel ranks (actors/runtime/tp_ranks.h): each holds 1/tp of the heads and
  // feed-forward rows on threads / tp cores. Must divide the model's query heads, KV
  // heads and feed-forward width (checked at start-up, naming the degrees that fit).
  int tp = 1;
  // What joins the ranks (kernels/communicator_choice.h): auto (nccl on cuda,
  // inprocess on cpu), inprocess (CPU ranks) or nccl (one GPU per rank; at tp 1 the
  // model's all-reduces still go through NCCL: the single-GPU path over NCCL).
  std::string communicator = "auto";
  // Bytes of the paged KV cache every request's context is allocated from (admission
  // counts its pages); 0 = room for max_requests full contexts, at most half the
  // machine's memory, or 90% of a GPU's free memory (kv_cache_default_bytes).
  int64_t kv_cache_bytes = 0;
  // How the KV cache (and so every stored chunk) holds K and V: f32 | f16 | bf16.
  // Attention widens half-precision K/V to fp32 as it reads; part of every chunk key.
  std::string kv_dtype = kDefaultKvDtype;
  // where the SSD tier and traces live; empty: $BLENDSERVE_DATA_DIR, else
  // $XDG_CACHE_HOME/blendserve, else ~/.cache/blendserve, else /tmp/blendserve
  std::string data_dir;
  // This node's name in the inspection reports (actor table, console). A cluster
  // member is named by its cluster config; a single node is "local".
  std::string node_name = "local";
  // The member defaults equal configs/default.yaml (a test checks it).
  TierConfig ram{.enabled = true, .budget_bytes = int64_t{2} << 30, .path = "", .direct_io = false,
                 .throttle_bytes_per_s = 0, .write_queue_bytes = 0, .loaders = 2, .file_io = nullptr};
  TierConfig ssd{.enabled = true, .budget_bytes = int64_t{8} << 30, .path = "kv", .direct_io = true,
                 .throttle_bytes_per_s = 0, .write_queue_bytes = int64_t{256} << 20, .loaders = 2,
                 .file_io = nullptr};
  RemoteTierConfig remote;
  // blend: mode, ratio (the floor the loading controller never goes below),
  // check layers, schedule, min_tokens, deviation, quota, filtering, selection, sink_tokens,
  // query_first_from_layer
  BlendOptions blend;
  bool adaptive_ratio = true;      // the loading controller may raise the ratio above the floor
  bool write_back = true;          // store missed chunks after the first token
  // Automatic prefix caching (blend.prefix_block_tokens): every prompt's first tokens
  // are stored in blocks of this many (their exact KV, from the request's own cache),
  // and a later prompt that begins with the same blocks loads them instead of computing
  // them. 0 turns it off.
  int prefix_block_tokens = 16;
  // Passages learnt on first sight (blend.learn_passage_tokens): a plain message's
  // blank-line separated paragraphs of at least this many tokens that are not stored
  // yet are computed alone in the background and stored like documents, so the next
  // message that pastes them is blended. 0 turns it off.
  int learn_passage_tokens = 48;
  // A plain request (no documents) is searched for stored chunks pasted into its
  // message (blend/pasted_chunks.h); found ones are blended like documents.
  bool find_pasted = true;
  // Text every chunk is computed behind and dropped (special tokens parsed; empty:
  // chunks computed alone). Part of every chunk key.
  std::string chunk_prelude;
  // limits
  int max_requests = 8;            // requests in flight at once
  int max_queue = 64;              // prepared requests waiting for a slot (FIFO); beyond: overloaded
  int max_decode_batch = 16;       // requests sharing one decode step (continuous batching)
  double decode_interleave = 0.05; // seconds: the decoding streams' step waits behind prefills at most this long
  int max_prompt_tokens = 0;       // 0 = the model's context
  int trace_history = 64;          // traces the inspector keeps
  // Seconds a prefill waits at most for one layer of stored KV (and for the loaders
  // to stop after a failure or cancel); past it the request fails, never hangs.
  double load_timeout = 60;
  // Seconds a request may take from submit to its last token (its queue wait
  // included); past them it is cancelled and ends with an error saying so (HTTP
  // 504), and if it has not stopped 10 s later it is failed where it stands. 0 = no limit.
  double max_request_seconds = 600;
  // Supervision (actors/runtime/supervisor.cpp): an actor that dies is restarted at once, but
  // after its second death within restart_window seconds new requests wait
  // restart_backoff seconds before they are admitted (doubling with each further
  // death, at most restart_backoff_max), and at death max_restarts + 1 within the
  // window its role is failed for good: /health and every request say which.
  int max_restarts = 5;
  double restart_window = 60;
  double restart_backoff = 0.1;
  double restart_backoff_max = 10;
  // server (used by `blendserve serve`)
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;   // empty: no authentication (loopback default)
  // HTTPS for this server (http/cluster_tls.h): a cluster's worker serves its
  // frontend (and the cluster's tools) over TLS 1.3 with the member's certificate,
  // and requires a client certificate of the cluster's CA naming one of
  // server_tls_peers. Set by the cluster file (cluster.tls), not a runtime config
  // key; empty: plain HTTP.
  tls::Files server_tls{};
  std::vector<std::string> server_tls_peers{};
  int64_t max_body_bytes = int64_t{8} << 20;  // larger request bodies get 413
  int server_threads = 0;              // HTTP worker threads; 0 = max_requests + queue + spare
  std::string model_name;              // the id in /v1/models; empty: the file name minus quantization
};

// Parses YAML text. Keys absent from the text keep the defaults above (an empty
// document or `{}` is the default config). Errors are ConfigError naming the key.
RuntimeConfig parse_runtime_config(const std::string& yaml_text);
// Every rule a runtime config must keep, however it was made (a YAML file, CLI flags,
// code): each value in its set or range (the field readers refuse a file's bad value
// at its key as they read it; a config built in code meets the rule here), and the
// rules across keys: the communicator fits device.kind, tensor-parallel GPU ranks each
// have a GPU of their own. parse_runtime_config ends with it; the Runtime starts with
// it. Throws ConfigError naming the key.
void check_runtime_config(const RuntimeConfig& c);
// A file; ConfigError if unreadable. Errors are prefixed with the path.
RuntimeConfig load_runtime_config(const std::string& path);
// The embedded default (configs/default.yaml, compiled into the binary).
RuntimeConfig default_runtime_config();
const std::string& default_config_text();
// data_dir resolved (env / XDG / HOME as above, "~/" expanded; always absolute);
// ssd.path: an absolute path is kept, a relative one is joined under data_dir.
std::string resolve_data_dir(const RuntimeConfig& c);
std::string resolve_ssd_path(const RuntimeConfig& c);
// "500ms" -> 0.5, "2s" -> 2, "1.5m" -> 90, a plain number is seconds ("5", 0.25);
// ConfigError on a malformed or negative duration.
double parse_duration(const std::string& text);
// A secret as configs give it: "env:NAME" is the variable's value (ConfigError naming
// the variable when it is unset or empty), anything else is the secret itself;
// ConfigError when the result has fewer than 16 characters. `text`: the config value.
std::string resolve_secret(const std::string& text);
// "2GiB" -> 2147483648; accepts B, KB/MB/GB/TB (10^3), KiB/MiB/GiB/TiB (2^10), plain
// integers; decimals with a unit ("1.5GiB", rounded down to whole bytes). ConfigError
// on a negative, malformed or out-of-range (> int64) size.
int64_t parse_byte_size(const std::string& text);

}  // namespace bs
