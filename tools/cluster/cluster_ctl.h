// blendctl cluster init|up|status|down F: the cluster's certificates, and every
// member of a cluster config as its own process on this host, for development and
// tests (on several machines, start each member there with `blendserve --config F
// --node NAME`, its TLS files copied there from the host that ran `init`).
//
// Files, under the cluster's data dir (ClusterConfig::data_dir): logs/<node>.log (the
// member's stdout and stderr, rewritten at each start) and pids/<node>.pid (its
// process id, one line; written by `up`, removed by `down`). A pid file is trusted
// only while /proc/<pid>/cmdline is that member's (`--config <this file> --node
// <node>`): a pid the system gave to another process since is never signalled.
#pragma once

#include <string>

#include "actors/config/cluster_config.h"

namespace bs::tools {

struct ClusterCtlOptions {
  std::string config;    // the cluster config file
  // --data-dir D: $BLENDSERVE_DATA_DIR for blendctl and the members it starts (so the
  // cluster's files are under D/<cluster name>); refused when the file sets
  // cluster.data_dir. Empty: the environment's.
  std::string data_dir;
  // down (and up's clean-up after a failure): seconds the members of one stage get
  // to exit after SIGTERM before they are sent SIGKILL.
  double timeout_s = 20;
};

// The cluster's TLS files (cluster.tls.mode mutual; storage/tls.h): in cluster.tls.dir
// (0700), the CA (ca.pem, ca.key) made if missing, and each member's certificate and
// key (<node>.pem, <node>.key: signed by the CA, naming the node and its host) made if
// missing or when the CA was just made; files already there are checked against the
// CA. One JSON line per member on stdout ({name, cert, key, made}). Exit 0; 1 when a
// file there is wrong (which, and why: delete it to have it made again); 2 for a config
// error. Plaintext clusters: nothing to do, exit 0.
int cluster_init(const ClusterCtlOptions& opt);

// Starts every member (`<blendctl's directory>/blendserve --config F --node NAME`, in
// its own session so it outlives blendctl): the storage nodes, then the workers, then
// the frontend — after making the TLS files that are missing, as cluster_init —, each
// stage ready (storage: its data_port accepts a connection; worker,
// frontend: GET /health on its http_port answers 200; a TLS cluster's worker over HTTPS
// with the frontend's certificate) within cluster.startup_timeout
// before the next starts. Progress on stderr; one JSON line per member on stdout
// ({name, role, pid, ready, log}). Exit 0; 1 when a member exits or is not ready in
// time (which one and its log's last lines on stderr; every member started is
// stopped again) or when members of the cluster are already running; 2 for a config
// error.
int cluster_up(const ClusterCtlOptions& opt);

// One JSON line per member ({name, role, pid (null: no pid file), alive, ready, log}),
// probing as `up` does with a short timeout. Exit 0 when every member is alive and
// ready, 1 otherwise, 2 for a config error.
int cluster_status(const ClusterCtlOptions& opt);

// SIGTERM to every live member, frontend first, then the workers, the storage node
// last (each stage waits up to timeout_s, then SIGKILL); pid files removed, stale ones
// too. One JSON line per member with a pid file ({name, role, pid, stopped: "SIGTERM"
// | "SIGKILL" | "not running" | "not ours"}). Exit 0; 1 when a member outlived
// SIGKILL; 2 for a config error.
int cluster_down(const ClusterCtlOptions& opt);

// What the commands above share with `cluster render` (tools/cluster/cluster_render.h).
// The config, with --data-dir applied (ConfigError as the commands report it).
ClusterConfig load_cluster_for_ctl(const ClusterCtlOptions& opt);
// The TLS files made where missing and checked, as `init`; false (why on stderr)
// when a file there is wrong. True at once for a plaintext cluster.
bool ensure_cluster_certificates(const ClusterConfig& c);
// Whether a member is ready, as `up` waits for it (storage: its data_port accepts;
// the others: GET /health answers 200), probing for at most timeout_s.
bool member_ready(const ClusterConfig& c, const ClusterNode& n, double timeout_s);

}  // namespace bs::tools
