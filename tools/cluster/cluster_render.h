// blendctl cluster render --target kubernetes|slurm F: the same cluster file onto the
// engines people run clusters with. The runtime adapts to the engine, not the
// reverse: what differs per environment (where a member is reached, where it listens,
// its directories, its GPUs) reaches the members as BLENDSERVE_* variables
// (actors/config/cluster_config.h: ClusterEnvironment) over the unchanged file.
//
// Kubernetes: one StatefulSet per member (replicas 1: each member has its own keys,
// GPUs and volume, and a StatefulSet's pods share one template), named
// <cluster>-<node>, its pod <cluster>-<node>-0 reached at
// <cluster>-<node>-0.<cluster>-<role>.<namespace>.svc.<domain> through a headless
// Service per role (publishNotReadyAddresses: members find each other before they
// are ready); the file in a ConfigMap; the cluster secret and TLS files in a Secret
// (each pod mounts the CA and its own certificate and key only); workers' GPUs as
// nvidia.com/gpu limits; the SSD tiers of workers and storage nodes on
// PersistentVolumeClaims; probes on /ready (readiness) and /live (liveness);
// terminationGracePeriodSeconds from cluster.drain_timeout. Restarts are Kubernetes'
// job: a member that comes back answers its control port again and the frontend
// marks it up.
//
// Slurm: a batch script; one srun whose task of rank r is the r-th member of the
// file; the file's distinct hosts are groups placed on the job's machines
// (SLURM_JOB_NODELIST, group g on machine g mod N) through an arbitrary
// distribution; members listen on 0.0.0.0 and reach each other by machine name;
// scancel's SIGTERM drains every member.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/cluster_config.h"
#include "tools/cluster/cluster_ctl.h"

namespace bs::tools {

struct RenderOptions {
  std::string target;   // "kubernetes" | "slurm"
  std::string out_dir;  // where the files are written (made if missing)
  // kubernetes
  std::string image = "blendserve:latest";
  std::string namespace_name = "default";
  std::string cluster_domain = "cluster.local";
  std::string storage_class;  // the volume claims' storageClassName; empty: the cluster's default
  // slurm
  int nodes = 0;           // machines to ask for; 0: one per distinct host of the file
  std::string partition;   // #SBATCH --partition (empty: the default)
  std::string time_limit;  // #SBATCH --time (empty: the partition's)
  std::string bin_dir;     // where blendserve and blendctl are on the machines (default: blendctl's own)
  bool submit = false;     // slurm: sbatch the script and wait until the frontend answers
};

// The Kubernetes objects, in the order to apply them: the Secret first (the others
// are in the next function's list), as JSON values. `file_text`: the cluster file
// as written (the ConfigMap holds it). `secret_files`: file name -> bytes for the
// Secret (ca.pem and each member's <node>.pem and <node>.key; not ca.key).
// `secret_env`: the variable cluster.secret names ("env:NAME"), or "" when the file
// holds the secret itself. Throws ConfigError for a cluster that cannot be rendered
// (a name that is no DNS label, a TLS worker without probe_port).
std::vector<nlohmann::json> kubernetes_secret(const ClusterConfig& cluster,
                                              const std::vector<std::pair<std::string, std::string>>& secret_files,
                                              const RenderOptions& opt);
std::vector<nlohmann::json> kubernetes_manifests(const ClusterConfig& cluster, const std::string& file_text,
                                                 const std::string& secret_env, const RenderOptions& opt);

// YAML documents ("---" between them), block style, every string double-quoted
// (so "8000", "true" or "0,1" stay strings).
std::string to_yaml(const std::vector<nlohmann::json>& docs);

// The batch script. `config_path`: the cluster file's absolute path, as the
// machines of the job see it.
std::string slurm_script(const ClusterConfig& cluster, const std::string& config_path, const RenderOptions& opt);

// The command: writes <out>/kubernetes.yaml and <out>/secret.yaml (0600; after
// making the TLS files that are missing, as `cluster init`), or <out>/blendserve.sbatch;
// one JSON line per file on stdout. With submit (slurm): sbatch, then waits for the
// frontend's /health within cluster.startup_timeout (progress on stderr). Exit 0; 1
// when submitting or waiting fails; 2 for a config error.
int cluster_render(const ClusterCtlOptions& ctl, const RenderOptions& opt);

}  // namespace bs::tools
