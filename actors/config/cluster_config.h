// A cluster's configuration: the members of one blendserve deployment, their roles
// and addresses, from one YAML file (configs/cluster.example.yaml documents every
// key). Every member reads the same file (`blendserve --config F --node NAME`), so
// each knows where the others are; `blendctl cluster up|status|down F` starts and
// stops them all on one host.
//
// Validation is the runtime config's (actors/config/runtime_config.h): every key is known,
// and a mistake is a ConfigError naming the dotted key from the top of the file
// ("nodes[1].tiers.ram.budget: ...") and its line. The runtime keys of `defaults` and
// of a node go through the runtime config's own parser, so they mean and check
// exactly what they do in configs/default.yaml. Plain C++ (no CAF): the config is
// read before any actor exists.
#pragma once

#include <string>
#include <vector>

#include "actors/config/runtime_config.h"
#include "storage/tls.h"

namespace bs {

// frontend: the users' OpenAI endpoint, forwards requests to the workers (one per
// cluster). worker: runs the model. storage: keeps chunk KV on its SSD and serves it
// to the workers' remote tier (any number; each chunk on `replication` of them).
enum class NodeRole { Frontend, Worker, Storage };
// "frontend", "worker", "storage".
const char* role_name(NodeRole role);

// A storage node's data_port server (storage/storage_server.h's options): the
// cluster file's nodes[i].data_plane, storage nodes only; these are the defaults.
struct DataPlaneLimits {
  int threads = 2;                    // network threads
  int disk_threads = 2;               // threads for the disk's reads and writes
  int max_connections = 64;           // in all
  int max_connections_per_peer = 32;  // from one IP address
  double io_timeout_s = 10;           // a frame half-received or half-sent, and the handshakes
  double idle_timeout_s = 120;        // an authenticated connection silent between requests
  bool operator==(const DataPlaneLimits&) const = default;
};

// The frontend's forwards to workers (http/frontend.h's options): the cluster
// file's nodes[i].forward, the frontend only; these are the defaults.
struct ForwardTimeouts {
  double connect_timeout_s = 5;        // connecting to a worker
  double first_token_timeout_s = 300;  // a worker that sends nothing this long has failed the request
  double idle_timeout_s = 120;         // silence within a streamed answer
  bool operator==(const ForwardTimeouts&) const = default;
};

struct ClusterNode {
  std::string name;  // unique in the cluster; letters, digits, '.', '_', '-' (it names files)
  NodeRole role = NodeRole::Worker;
  std::string host;   // the address the others reach it at (and, unless `bind` differs, where it listens)
  // The address it listens on: host, unless $BLENDSERVE_BIND says otherwise
  // (0.0.0.0 in a container or a Slurm job, where `host` is a DNS name).
  std::string bind;
  int port = 0;       // control port: the members' messages to each other
  int data_port = 0;  // storage: where it serves KV bytes (the remote tier's data plane); 0 for the others
  // frontend: the users' OpenAI endpoint; worker: its own OpenAI endpoint, which the
  // frontend forwards requests to; 0 for storage.
  int http_port = 0;
  // worker, optional: plain-HTTP /health and /live for an orchestrator's probes (a
  // TLS cluster's http_port answers only the frontend's certificate); 0: none.
  int probe_port = 0;
  int line = 0;  // 1-based line of the node's entry in the file (0: unknown), for messages
  DataPlaneLimits data_plane;  // storage: how it serves its data_port
  ForwardTimeouts forward;     // frontend: its forwards to the workers
  // The member's runtime config, resolved: what member_runtime_config returns.
  RuntimeConfig runtime;
};

// A machine of the cluster file's optional `hosts` list: what check-config places
// the members on. A host absent from the list is not checked.
struct ClusterHost {
  std::string host;  // as the nodes' host keys write it
  int gpus = 0;      // CUDA devices it has (indices 0..gpus-1)
  int line = 0;
};

// The CUDA devices a worker's runtime uses, by index on its machine: device.gpus
// (the first tp of them), else 0..tp-1 when it lists fewer; empty off cuda.
std::vector<int> worker_gpus(const RuntimeConfig& runtime);

// What the environment changes in a cluster file (precedence: the command line,
// then these, then the file, then the built-in defaults; README "Running on many
// machines"). Empty: not set. Each value describes the machine or the process it is
// read on, which is why it is not in the file every member shares.
struct ClusterEnvironment {
  // $BLENDSERVE_HOSTS, "name=address,name=address": where the named nodes are
  // reached, over their host keys (Kubernetes' DNS names, a Slurm job's machines).
  std::string hosts;
  std::string bind;      // $BLENDSERVE_BIND: the address every member started here listens on
  std::string data_dir;  // $BLENDSERVE_CLUSTER_DATA_DIR: over cluster.data_dir (a mounted volume)
  std::string tls_dir;   // $BLENDSERVE_TLS_DIR: over cluster.tls.dir (a mounted secret)
  // $BLENDSERVE_GPUS, "0,1": the CUDA indices a worker started here uses, over its
  // device.gpus (a pod sees only its own GPUs, numbered from 0).
  std::string gpus;
};
// The variables above, from this process's environment.
ClusterEnvironment cluster_environment();

struct ClusterConfig {
  std::string path;    // the file it was read from ("" when parsed from a text alone)
  std::string name;    // cluster.name; letters, digits, '.', '_', '-' (it names a directory)
  std::string secret;  // cluster.secret resolved ("env:NAME" read at parse time), >= 16 characters
  double heartbeat_interval_s = 1;  // how often members tell each other they are alive
  double connection_timeout_s = 5;  // silence after which a member counts as gone (>= heartbeat_interval)
  double startup_timeout_s = 120;   // how long `blendctl cluster up` waits for a member to be ready
  // cluster.drain_timeout: on SIGTERM the frontend and each worker finish their
  // requests in flight for at most this long (new ones get 503); Kubernetes'
  // terminationGracePeriodSeconds and a Slurm job's stop are sized from it.
  double drain_timeout_s = 30;
  // How the frontend picks a worker: "kv_aware" (where the request's document KV is,
  // actors/cluster/request_router.h) or "round_robin" (the baseline benchmarks compare with).
  std::string routing = "kv_aware";
  // cluster.replication: copies of each chunk across the storage nodes (default 2;
  // a worker uses min(this, the storage nodes)); storage/replicated_store.h.
  int replication = 2;
  // cluster.data_dir as written ("" when absent).
  std::string configured_data_dir;
  // The cluster's directory, absolute: <cluster.data_dir, or the runtime's data-dir
  // rule ($BLENDSERVE_DATA_DIR, XDG, ~/.cache/blendserve)>/<name>. A relative
  // cluster.data_dir is under the config file's directory.
  std::string data_dir;
  // cluster.tls.mode: true (mutual, the default): TLS 1.3 with mutual authentication
  // under the cluster's CA on the storage data path (storage/tls.h) and the
  // frontend's HTTPS to the workers (http/cluster_tls.h); false (plaintext): said
  // explicitly, for tests on loopback.
  bool tls = true;
  // cluster.tls.dir resolved: where the CA's and the members' files are (a relative
  // path is under the config file's directory); default <data_dir>/tls.
  std::string tls_dir;
  std::vector<ClusterNode> nodes;  // in file order
  std::vector<ClusterHost> hosts;  // the file's `hosts` (may be empty)

  // The node named `node_name`; ConfigError "--node NAME: no such node in F (nodes:
  // a, b, c)" otherwise.
  const ClusterNode& member(const std::string& node_name) const;
  // The node named `node_name`, or nullptr.
  const ClusterNode* find(const std::string& node_name) const;
  const ClusterNode& frontend() const;  // validation guarantees exactly one
  const ClusterNode* storage() const;   // the first storage node; nullptr: none
  std::vector<const ClusterNode*> storage_nodes() const;  // in file order
  std::vector<const ClusterNode*> workers() const;  // in file order; at least one
  // Where a member keeps its files (its data_dir: SSD tier, traces): <data_dir>/<node_name>.
  std::string member_data_dir(const std::string& node_name) const;
  // `blendctl cluster up`'s files for a member: <data_dir>/logs/<node_name>.log (its
  // stdout and stderr) and <data_dir>/pids/<node_name>.pid (its process id, one line).
  std::string log_path(const std::string& node_name) const;
  std::string pid_path(const std::string& node_name) const;
  // A member's TLS files: <tls_dir>/ca.pem, <tls_dir>/<node_name>.pem and .key (made
  // by `blendctl cluster init`); all empty when tls is off.
  tls::Files member_tls(const std::string& node_name) const;
  // The CA's own files, <tls_dir>/ca.pem and ca.key (the key never leaves the host
  // that runs `blendctl cluster init`; members need only ca.pem).
  std::string ca_cert_path() const;
  std::string ca_key_path() const;
};

// Parses a cluster config. `path` is the file the text came from: relative
// cluster.data_dir is under its directory (the working directory when empty) and
// member() names it. Errors are ConfigError naming the dotted key and the line (or
// the variable of `env`). The placement (names, ports, GPUs of `hosts`) is checked
// as the file writes it, then again for address clashes after `env`'s hosts.
ClusterConfig parse_cluster_config(const std::string& yaml_text, const std::string& path = "",
                                   const ClusterEnvironment& env = {});
// A file, with this process's cluster_environment(); ConfigError if unreadable.
// Errors are prefixed with the path.
ClusterConfig load_cluster_config(const std::string& path);
// Whether a YAML text is a cluster config (a map with a top-level `nodes` or
// `cluster` key) rather than one node's runtime config; false for malformed YAML
// (the runtime config's parser then reports it).
bool is_cluster_config(const std::string& yaml_text);

// The runtime config a member runs with (ConfigError as member() when there is no
// such node). Every role: node_name = the node's name, data_dir =
// member_data_dir(name), host = its bind address.
//  - worker: the embedded default, overlaid with `defaults`, overlaid with the node's
//    own runtime keys (model, device, tiers, blend, limits, server); port = its
//    http_port; tiers.remote's nodes = every storage node (name, host, data_port;
//    host and port = the first's), its replication = cluster.replication, its
//    secret = the cluster secret (where there are storage nodes), and with TLS on
//    its member_tls files (each node's certificate must carry its name); api_keys
//    also hold worker_api_key(secret) (actors/config/cluster_secret.h), the key its
//    frontend presents.
//  - frontend: the embedded default overlaid with `defaults` and the node's `server`
//    keys (api_keys, max_body, threads, model_name); port = its http_port. Its
//    workers are ClusterConfig::workers(), the timeouts the cluster's.
//  - storage: the embedded default overlaid with the node's tiers.ssd (path under its
//    data_dir, budget, ...): resolve_ssd_path() is its store; it serves on host and
//    data_port with the cluster secret (and TLS: member_tls, the workers' names as
//    the peers allowed), limits from data_plane. `port` is not used.
//  - worker, with TLS: server_tls = its member_tls, server_tls_peers = the frontend.
RuntimeConfig member_runtime_config(const ClusterConfig& cluster, const std::string& node_name);

}  // namespace bs
