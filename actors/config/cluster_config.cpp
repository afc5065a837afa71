// The cluster config: read with the runtime config's helpers (same messages, same
// positions), the runtime keys of `defaults` and of each node applied in turn over
// the embedded default by the runtime config's own parser, then the checks that
// span nodes (names, addresses, roles, the remote tier's storage node).
#include "actors/config/cluster_config.h"

#include "actors/config/cluster_secret.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "actors/config/runtime_config_yaml.h"

namespace bs {

namespace {

namespace fs = std::filesystem;
using namespace config_yaml;

// Letters, digits, '.', '_', '-', not starting with '.' or '-': it names files and directories.
bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
  });
}

std::string get_name(const YAML::Node& v, const std::string& key) {
  const std::string s = get_string(v, key);
  if (!valid_name(s))
    fail(key, v, "'" + s + "' is not a valid name (letters, digits, '.', '_', '-'; at most 64; it names files)");
  return s;
}

int line_of(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() || m.line < 0 ? 0 : m.line + 1;
}

// Keys the cluster sets itself, refused in `defaults` and in a node's runtime keys
// (`where`: "defaults" or "nodes[i]"): a member's data dir, a worker's HTTP address,
// the storage node's address and the secret.
void refuse_cluster_owned(const YAML::Node& runtime_keys, const std::string& where) {
  if (const YAML::Node d = find_node(runtime_keys, {"data_dir"}); d.IsDefined())
    fail(where + ".data_dir", d,
         "a member's data dir is <cluster.data_dir>/<cluster name>/<node name>; set cluster.data_dir instead");
  for (const char* k : {"host", "port"})
    if (const YAML::Node n = find_node(runtime_keys, {"server", k}); n.IsDefined())
      fail(where + ".server." + k, n, "a member listens on its node's host and http_port; set those instead");
  for (const char* k : {"host", "port", "secret"})
    if (const YAML::Node n = find_node(runtime_keys, {"tiers", "remote", k}); n.IsDefined())
      fail(where + ".tiers.remote." + k, n,
           "in a cluster the remote tier reaches the storage node (its host and data_port) with cluster.secret; "
           "only enabled and the tuning keys belong here");
}

// apply_runtime_config with every message prefixed by `where` ("defaults",
// "nodes[1]"): its keys are dotted paths from the runtime config's top level.
void apply_at(const YAML::Node& runtime_keys, const std::string& where, RuntimeConfig& c) {
  try {
    apply_runtime_config(runtime_keys, c);
  } catch (const ConfigError& e) {
    throw ConfigError(where + "." + e.what());
  }
}

struct Parsed {
  ClusterConfig cluster;
  YAML::Node root, cluster_section, defaults, nodes, hosts;
  std::vector<YAML::Node> entries;  // each node's map
};

void parse_cluster_section(Parsed& p) {
  ClusterConfig& c = p.cluster;
  std::optional<YAML::Node> heartbeat, timeout;
  for_each_key(p.cluster_section, "cluster",
               {"name", "secret", "heartbeat_interval", "connection_timeout", "startup_timeout", "drain_timeout",
                "data_dir", "routing", "tls", "replication"},
               [&](std::string_view k, const YAML::Node& v) {
                 const std::string key = "cluster." + std::string(k);
                 if (k == "name") {
                   c.name = get_name(v, key);
                 } else if (k == "secret") {
                   try {
                     c.secret = resolve_secret(get_string(v, key));
                   } catch (const ConfigError& e) {
                     fail(key, v, e.what());
                   }
                 } else if (k == "heartbeat_interval") {
                   c.heartbeat_interval_s = get_duration(v, key);
                   heartbeat = v;
                 } else if (k == "connection_timeout") {
                   c.connection_timeout_s = get_duration(v, key);
                   timeout = v;
                 } else if (k == "startup_timeout") {
                   c.startup_timeout_s = get_duration(v, key);
                 } else if (k == "drain_timeout") {
                   c.drain_timeout_s = get_duration(v, key);
                   if (c.drain_timeout_s > 3600) fail(key, v, "must be at most 1h");
                 } else if (k == "data_dir") {
                   c.configured_data_dir = get_string(v, key);
                 } else if (k == "routing") {
                   c.routing = get_string(v, key);
                   if (c.routing != "kv_aware" && c.routing != "round_robin")
                     fail(key, v, "unknown policy '" + c.routing + "' (kv_aware | round_robin)");
                 } else if (k == "replication") {
                   c.replication = get_int(v, key);
                   if (c.replication < 1 || c.replication > 16)
                     fail(key, v, "must be in 1..16 (copies of each chunk across the storage nodes), got " + v.Scalar());
                 } else if (k == "tls") {
                   for_each_key(v, key, {"mode", "dir"}, [&](std::string_view tk, const YAML::Node& tv) {
                     const std::string tkey = key + "." + std::string(tk);
                     if (tk == "mode") {
                       const std::string mode = get_string(tv, tkey);
                       if (mode != "mutual" && mode != "plaintext")
                         fail(tkey, tv,
                              "unknown mode '" + mode +
                                  "' (mutual: TLS 1.3 with the cluster's certificates; plaintext: unencrypted, "
                                  "say so only on a trusted network)");
                       c.tls = mode == "mutual";
                     } else {
                       c.tls_dir = get_string(tv, tkey);
                     }
                   });
                 }
               });
  if (c.name.empty())
    fail("cluster.name", p.cluster_section, "missing: the cluster's name (it names its directory under the data dir)");
  if (c.secret.empty())
    fail("cluster.secret", p.cluster_section,
         "missing: the secret every member proves it knows (\"env:NAME\" reads it from a variable)");
  if (c.connection_timeout_s < c.heartbeat_interval_s)
    fail(timeout ? "cluster.connection_timeout" : "cluster.heartbeat_interval",
         timeout ? *timeout : heartbeat.value_or(YAML::Node()),
         "the connection timeout (" + std::to_string(c.connection_timeout_s) +
             " s) is shorter than the heartbeat interval (" + std::to_string(c.heartbeat_interval_s) +
             " s): every member would count as gone between two heartbeats");
}

std::string resolve_cluster_dir(const ClusterConfig& c) {
  fs::path base;
  if (!c.configured_data_dir.empty()) {
    RuntimeConfig rc;  // the runtime's "~/" expansion and normalisation
    fs::path p = c.configured_data_dir;
    if (p.is_relative() && c.configured_data_dir.rfind('~', 0) != 0 && !c.path.empty())
      p = fs::absolute(fs::path(c.path)).parent_path() / p;
    rc.data_dir = p.string();
    try {
      base = resolve_data_dir(rc);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("cluster.") + e.what());  // "data_dir: '~/x' needs $HOME"
    }
  } else {
    base = resolve_data_dir(RuntimeConfig{});
  }
  return (base / c.name).string();
}

// One node's entry: its own keys, its runtime config over `base` (the embedded
// default with `defaults` for workers and the frontend, without for storage).
ClusterNode parse_node(const YAML::Node& entry, size_t i, const RuntimeConfig& with_defaults) {
  const std::string at = "nodes[" + std::to_string(i) + "]";
  if (!entry.IsMap()) fail(at, entry, "expected a map with keys (name, role, host, port, ...), got " +
                                          std::string(entry.IsScalar() ? "'" + entry.Scalar() + "'" : "a list"));
  ClusterNode n;
  n.line = line_of(entry);
  // The role first: it decides which keys the entry may have.
  const YAML::Node role = entry["role"];
  if (!role.IsDefined()) fail(at + ".role", entry, "missing (frontend, worker or storage)");
  const std::string r = get_string(role, at + ".role");
  if (r == "frontend") n.role = NodeRole::Frontend;
  else if (r == "worker") n.role = NodeRole::Worker;
  else if (r == "storage") n.role = NodeRole::Storage;
  else fail(at + ".role", role, "unknown role '" + r + "' (frontend, worker, storage)");

  YAML::Node runtime_keys(YAML::NodeType::Map);  // the entry's runtime sections
  const Keys keys{"name", "role", "host", "port", "data_port", "http_port", "probe_port", "data_plane", "forward",
                  "model", "device", "tiers", "blend", "limits", "server"};
  for_each_key(entry, at, keys, [&](std::string_view k, const YAML::Node& v) {
    const std::string key = at + "." + std::string(k);
    if (k == "name") n.name = get_name(v, key);
    else if (k == "role") return;
    else if (k == "host") {
      n.host = get_string(v, key);
      if (n.host.empty()) fail(key, v, "must not be empty (e.g. 127.0.0.1)");
    } else if (k == "port") n.port = get_port(v, key);
    else if (k == "data_port") {
      if (n.role != NodeRole::Storage)
        fail(key, v, "only a storage node has a data_port (where it serves KV bytes); this node is a " + r);
      n.data_port = get_port(v, key);
    } else if (k == "data_plane") {
      if (n.role != NodeRole::Storage)
        fail(key, v, "only a storage node has a data_plane (how it serves its data_port); this node is a " + r);
      DataPlaneLimits& d = n.data_plane;
      for_each_key(v, key,
                   {"threads", "disk_threads", "max_connections", "max_connections_per_peer", "io_timeout",
                    "idle_timeout"},
                   [&](std::string_view dk, const YAML::Node& dv) {
                     const std::string dkey = key + "." + std::string(dk);
                     auto count = [&](int lo, int hi) {
                       const int x = get_int(dv, dkey);
                       if (x < lo || x > hi)
                         fail(dkey, dv, "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                                            dv.Scalar());
                       return x;
                     };
                     if (dk == "threads") d.threads = count(1, 256);
                     else if (dk == "disk_threads") d.disk_threads = count(1, 256);
                     else if (dk == "max_connections") d.max_connections = count(1, 100000);
                     else if (dk == "max_connections_per_peer") d.max_connections_per_peer = count(1, 100000);
                     else if (dk == "io_timeout") d.io_timeout_s = get_duration(dv, dkey);
                     else d.idle_timeout_s = get_duration(dv, dkey);
                   });
    } else if (k == "forward") {
      if (n.role != NodeRole::Frontend)
        fail(key, v, "only the frontend forwards requests (forward: its timeouts); this node is a " + r);
      for_each_key(v, key, {"connect_timeout", "first_token_timeout", "idle_timeout"},
                   [&](std::string_view fk, const YAML::Node& fv) {
                     const std::string fkey = key + "." + std::string(fk);
                     const double x = get_duration(fv, fkey);
                     if (fk == "connect_timeout") n.forward.connect_timeout_s = x;
                     else if (fk == "first_token_timeout") n.forward.first_token_timeout_s = x;
                     else n.forward.idle_timeout_s = x;
                   });
    } else if (k == "probe_port") {
      if (n.role != NodeRole::Worker)
        fail(key, v, "only a worker has a probe_port (the frontend's http_port is plain HTTP; a storage node's "
                     "ports take TCP probes); this node is a " + r);
      n.probe_port = get_port(v, key);
    } else if (k == "http_port") {
      if (n.role == NodeRole::Storage)
        fail(key, v, "a storage node serves no HTTP (it has a port and a data_port)");
      n.http_port = get_port(v, key);
    } else {
      if (n.role == NodeRole::Frontend && k != "server")
        fail(key, v, "a frontend runs no model: of the runtime keys it takes only server (api_keys, max_body, "
                     "threads, model_name); " + std::string(k) + " belongs to workers");
      if (n.role == NodeRole::Storage && k != "tiers")
        fail(key, v, "a storage node only keeps chunk KV: of the runtime keys it takes only tiers.ssd");
      if (n.role == NodeRole::Storage && v.IsMap())
        for (const auto& t : v)
          if (t.first.IsScalar() && t.first.Scalar() != "ssd")
            fail(key + "." + t.first.Scalar(), t.first, "a storage node serves its ssd tier only");
      runtime_keys.force_insert(std::string(k), v);
    }
  });
  if (n.name.empty()) fail(at + ".name", entry, "missing: every node has a unique name");
  if (n.host.empty()) fail(at + ".host", entry, "missing: the address the node listens on (e.g. 127.0.0.1)");
  if (n.port == 0) fail(at + ".port", entry, "missing: the node's control port");
  if (n.role == NodeRole::Storage && n.data_port == 0)
    fail(at + ".data_port", entry, "missing: a storage node serves KV bytes on its data_port");
  if (n.role != NodeRole::Storage && n.http_port == 0)
    fail(at + ".http_port", entry,
         std::string("missing: a ") + r +
             (n.role == NodeRole::Frontend ? " serves the users' OpenAI endpoint on its http_port"
                                           : " serves its OpenAI endpoint (which the frontend forwards to) on its "
                                             "http_port"));
  refuse_cluster_owned(runtime_keys, at);

  n.runtime = n.role == NodeRole::Storage ? RuntimeConfig{} : with_defaults;
  apply_at(runtime_keys, at, n.runtime);
  if (n.role == NodeRole::Storage && !n.runtime.ssd.enabled)
    fail(at + ".tiers.ssd.enabled", find_node(entry, {"tiers", "ssd", "enabled"}),
         "a storage node serves its ssd tier: it cannot be turned off");
  // Only workers read chunks from the storage node (a storage node is no client of
  // itself; a frontend keeps no KV).
  if (n.role != NodeRole::Worker) n.runtime.remote = RemoteTierConfig{};
  n.runtime.node_name = n.name;
  n.bind = n.host;
  n.runtime.host = n.host;
  if (n.http_port != 0) n.runtime.port = n.http_port;
  return n;
}

std::string node_ref(const Parsed& p, size_t i) {
  return "nodes[" + std::to_string(i) + "] '" + p.cluster.nodes[i].name + "'" + position(p.entries[i]);
}

// The file's `hosts`: [{host, gpus}], each host once.
void parse_hosts(Parsed& p) {
  if (!p.hosts.IsDefined() || p.hosts.IsNull()) return;
  if (!p.hosts.IsSequence()) fail("hosts", p.hosts, "expected a list of machines ({host: ADDRESS, gpus: N})");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < p.hosts.size(); ++i) {
    const std::string at = "hosts[" + std::to_string(i) + "]";
    const YAML::Node& hosts = p.hosts;
    const YAML::Node e = hosts[i];
    if (!e.IsMap()) fail(at, e, "expected a map {host: ADDRESS, gpus: N}");
    ClusterHost h;
    h.line = line_of(e);
    for_each_key(e, at, {"host", "gpus"}, [&](std::string_view k, const YAML::Node& v) {
      const std::string key = at + "." + std::string(k);
      if (k == "host") {
        h.host = get_string(v, key);
      } else {
        h.gpus = get_int(v, key);
        if (h.gpus < 0 || h.gpus > 1024) fail(key, v, "must be in 0..1024, got " + v.Scalar());
      }
    });
    if (h.host.empty()) fail(at + ".host", e, "missing: the machine's address, as the nodes' host keys write it");
    if (auto [it, fresh] = seen.emplace(h.host, i); !fresh)
      fail(at + ".host", e["host"], "'" + h.host + "' is also hosts[" + std::to_string(it->second) + "]");
    p.cluster.hosts.push_back(h);
  }
}

// Whether every CUDA worker fits its machine: its GPU indices exist there (when
// `hosts` lists it) and no two workers of one machine share a GPU.
void check_gpus(const Parsed& p) {
  std::map<std::pair<std::string, int>, size_t> taken;  // (host, GPU index) -> the node using it
  for (size_t i = 0; i < p.cluster.nodes.size(); ++i) {
    const ClusterNode& n = p.cluster.nodes[i];
    if (n.role != NodeRole::Worker) continue;
    const std::string at = "nodes[" + std::to_string(i) + "]";
    YAML::Node where = find_node(p.entries[i], {"device", "gpus"});
    std::string key = at + ".device.gpus";
    if (!where.IsDefined()) {
      where = find_node(p.entries[i], {"device", "tp"});
      key = at + ".device.tp";
    }
    if (!where.IsDefined()) {
      where = p.entries[i];
      key = at;
    }
    const auto host = std::find_if(p.cluster.hosts.begin(), p.cluster.hosts.end(),
                                   [&](const ClusterHost& h) { return h.host == n.host; });
    for (int g : worker_gpus(n.runtime)) {
      if (host != p.cluster.hosts.end() && g >= host->gpus)
        fail(key, where,
             "worker '" + n.name + "' needs GPU " + std::to_string(g) + " of " + n.host + ", but hosts lists " +
                 std::to_string(host->gpus) + " GPU" + (host->gpus == 1 ? "" : "s") + " there (line " +
                 std::to_string(host->line) + "): it cannot be placed");
      if (auto [it, fresh] = taken.emplace(std::pair(n.host, g), i); !fresh)
        fail(key, where,
             "worker '" + n.name + "' needs GPU " + std::to_string(g) + " of " + n.host + ", which " +
                 node_ref(p, it->second) + " uses: give each worker of a machine its own device.gpus");
    }
  }
}

// `env` over the file: hosts, bind address, directories, GPUs; then the address
// clashes again (a host given twice by the environment).
void apply_environment(Parsed& p, const ClusterEnvironment& env) {
  auto& nodes = p.cluster.nodes;
  if (!env.hosts.empty()) {
    std::stringstream items(env.hosts);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
        throw ConfigError("BLENDSERVE_HOSTS: '" + item + "' is not name=address");
      const std::string name = item.substr(0, eq);
      auto it = std::find_if(nodes.begin(), nodes.end(), [&](const ClusterNode& n) { return n.name == name; });
      if (it == nodes.end()) {
        std::string names;
        for (const ClusterNode& n : nodes) names += (names.empty() ? "" : ", ") + n.name;
        throw ConfigError("BLENDSERVE_HOSTS: no node '" + name + "' in the cluster (nodes: " + names + ")");
      }
      it->host = item.substr(eq + 1);
      it->bind = it->host;
      it->runtime.host = it->host;
    }
    std::map<std::pair<std::string, int>, std::string> addresses;
    for (const ClusterNode& n : nodes)
      for (int port : {n.port, n.data_port, n.http_port, n.probe_port}) {
        if (port == 0) continue;
        if (auto [it, fresh] = addresses.emplace(std::pair(n.host, port), n.name); !fresh)
          throw ConfigError("BLENDSERVE_HOSTS: " + n.host + ":" + std::to_string(port) + " is both " + it->second +
                            "'s and " + n.name + "'s: every port of every node must differ");
      }
  }
  if (!env.bind.empty())
    for (ClusterNode& n : nodes) {
      n.bind = env.bind;
      n.runtime.host = env.bind;
    }
  if (!env.gpus.empty()) {
    std::vector<int> gpus;
    std::stringstream items(env.gpus);
    std::string item;
    while (std::getline(items, item, ',')) {
      char* end = nullptr;
      const long g = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || g < 0 || g > 1023)
        throw ConfigError("BLENDSERVE_GPUS: '" + env.gpus + "' is not a list of CUDA indices (\"0,1\")");
      gpus.push_back(static_cast<int>(g));
    }
    for (ClusterNode& n : nodes)
      if (n.role == NodeRole::Worker && n.runtime.device_kind == "cuda") n.runtime.gpus = gpus;
  }
}

// Checks across nodes: names, addresses, roles, the remote tier's storage node.
void check_nodes(const Parsed& p) {
  const auto& nodes = p.cluster.nodes;
  std::map<std::string, size_t> names;
  std::map<std::pair<std::string, int>, std::string> addresses;  // host:port -> "nodes[i].key (line L)"
  std::optional<size_t> frontend, storage;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ClusterNode& n = nodes[i];
    const std::string at = "nodes[" + std::to_string(i) + "]";
    const YAML::Node& e = p.entries[i];
    if (auto [it, fresh] = names.emplace(n.name, i); !fresh)
      fail(at + ".name", e["name"], "'" + n.name + "' is also the name of " + node_ref(p, it->second));
    for (const auto& [key, port] : {std::pair<const char*, int>{"port", n.port}, {"data_port", n.data_port},
                                    {"http_port", n.http_port}, {"probe_port", n.probe_port}}) {
      if (port == 0) continue;
      const std::string here = at + "." + key;
      const std::string address = n.host + ":" + std::to_string(port);
      if (auto [it, fresh] = addresses.emplace(std::pair(n.host, port), here + position(e[key])); !fresh)
        fail(here, e[key], address + " is also " + it->second + ": every port of every node must differ");
    }
    if (n.role == NodeRole::Frontend) {
      if (frontend)
        fail(at + ".role", e["role"],
             "a second frontend (" + node_ref(p, *frontend) + " is one): a cluster has exactly one");
      frontend = i;
    }
    if (n.role == NodeRole::Storage && !storage) storage = i;
  }
  if (!frontend) fail("nodes", p.nodes, "no frontend: a cluster has exactly one node with role: frontend");
  // One model for every worker: the frontend tokenizes a request's documents once,
  // with the workers' tokenizer, to find the worker that holds their KV (each
  // worker's key fingerprint and prelude come with its reports; another model's
  // token ids would make keys that match nothing). Decided: refused here, naming
  // both, rather than a tokenizer per worker.
  std::optional<size_t> first_worker;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].role != NodeRole::Worker) continue;
    if (!first_worker) {
      first_worker = i;
      continue;
    }
    const std::string& mine = nodes[i].runtime.model_path;
    const std::string& theirs = nodes[*first_worker].runtime.model_path;
    if (mine == theirs) continue;
    const YAML::Node own = find_node(p.entries[i], {"model", "path"});
    auto shown = [](const std::string& m) { return m.empty() ? std::string("the default model") : "'" + m + "'"; };
    fail(own.IsDefined() ? "nodes[" + std::to_string(i) + "].model.path" : "nodes[" + std::to_string(i) + "]",
         own.IsDefined() ? own : p.entries[i],
         "worker '" + nodes[i].name + "' runs " + shown(mine) + ", worker '" + nodes[*first_worker].name + "' " +
             shown(theirs) + ": a cluster's workers run one model (the frontend routes by that model's tokens)");
  }
  if (std::none_of(nodes.begin(), nodes.end(), [](const ClusterNode& n) { return n.role == NodeRole::Worker; }))
    fail("nodes", p.nodes, "no worker: a cluster needs at least one node with role: worker");
  check_gpus(p);
  if (storage) return;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].role != NodeRole::Worker || !nodes[i].runtime.remote.enabled) continue;
    // Name the key that turned it on: the node's own, else the defaults'.
    const YAML::Node own = find_node(p.entries[i], {"tiers", "remote", "enabled"});
    const bool from_node = own.IsDefined();
    fail(from_node ? "nodes[" + std::to_string(i) + "].tiers.remote.enabled" : "defaults.tiers.remote.enabled",
         from_node ? own : find_node(p.defaults, {"tiers", "remote", "enabled"}),
         "worker '" + nodes[i].name + "' enables the remote tier, but no node has role: storage");
  }
}

}  // namespace

const char* role_name(NodeRole role) {
  switch (role) {
    case NodeRole::Frontend: return "frontend";
    case NodeRole::Worker: return "worker";
    case NodeRole::Storage: return "storage";
  }
  return "?";
}

const ClusterNode* ClusterConfig::find(const std::string& node_name) const {
  for (const ClusterNode& n : nodes)
    if (n.name == node_name) return &n;
  return nullptr;
}

const ClusterNode& ClusterConfig::member(const std::string& node_name) const {
  if (const ClusterNode* n = find(node_name)) return *n;
  std::string names;
  for (const ClusterNode& n : nodes) names += (names.empty() ? "" : ", ") + n.name;
  throw ConfigError("--node " + node_name + ": no such node in " + (path.empty() ? "the cluster config" : path) +
                    " (nodes: " + names + ")");
}

const ClusterNode& ClusterConfig::frontend() const {
  for (const ClusterNode& n : nodes)
    if (n.role == NodeRole::Frontend) return n;
  throw ConfigError("the cluster has no frontend");  // parse_cluster_config never lets this happen
}

const ClusterNode* ClusterConfig::storage() const {
  for (const ClusterNode& n : nodes)
    if (n.role == NodeRole::Storage) return &n;
  return nullptr;
}

std::vector<const ClusterNode*> ClusterConfig::storage_nodes() const {
  std::vector<const ClusterNode*> out;
  for (const ClusterNode& n : nodes)
    if (n.role == NodeRole::Storage) out.push_back(&n);
  return out;
}

std::vector<const ClusterNode*> ClusterConfig::workers() const {
  std::vector<const ClusterNode*> out;
  for (const ClusterNode& n : nodes)
    if (n.role == NodeRole::Worker) out.push_back(&n);
  return out;
}

std::string ClusterConfig::member_data_dir(const std::string& node_name) const {
  return (fs::path(data_dir) / node_name).string();
}
std::string ClusterConfig::log_path(const std::string& node_name) const {
  return (fs::path(data_dir) / "logs" / (node_name + ".log")).string();
}
std::string ClusterConfig::pid_path(const std::string& node_name) const {
  return (fs::path(data_dir) / "pids" / (node_name + ".pid")).string();
}

tls::Files ClusterConfig::member_tls(const std::string& node_name) const {
  if (!tls) return {};
  const fs::path d = tls_dir;
  return {ca_cert_path(), (d / (node_name + ".pem")).string(), (d / (node_name + ".key")).string()};
}

std::string ClusterConfig::ca_cert_path() const { return (fs::path(tls_dir) / "ca.pem").string(); }
std::string ClusterConfig::ca_key_path() const { return (fs::path(tls_dir) / "ca.key").string(); }

std::vector<int> worker_gpus(const RuntimeConfig& runtime) {
  if (runtime.device_kind != "cuda") return {};
  const int tp = std::max(runtime.tp, 1);
  std::vector<int> out;
  if (static_cast<int>(runtime.gpus.size()) < tp) {
    for (int r = 0; r < tp; ++r) out.push_back(r);
  } else {
    out.assign(runtime.gpus.begin(), runtime.gpus.begin() + tp);
  }
  return out;
}

ClusterEnvironment cluster_environment() {
  auto var = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  return {.hosts = var("BLENDSERVE_HOSTS"), .bind = var("BLENDSERVE_BIND"),
          .data_dir = var("BLENDSERVE_CLUSTER_DATA_DIR"), .tls_dir = var("BLENDSERVE_TLS_DIR"),
          .gpus = var("BLENDSERVE_GPUS")};
}

ClusterConfig parse_cluster_config(const std::string& yaml_text, const std::string& path,
                                   const ClusterEnvironment& env) {
  Parsed p;
  p.cluster.path = path;
  p.root = load_document(yaml_text);
  if (p.root.IsNull()) throw ConfigError("cluster config: empty (it needs cluster and nodes)");
  for_each_key(p.root, "", {"cluster", "defaults", "nodes", "hosts"}, [&](std::string_view k, const YAML::Node& v) {
    if (k == "cluster") p.cluster_section = v;
    else if (k == "defaults") p.defaults = v;
    else if (k == "hosts") p.hosts = v;
    else p.nodes = v;
  });
  const YAML::Node& root = p.root;  // const: a lookup must not add the key
  if (!root["cluster"].IsDefined()) fail("cluster", root, "missing: the cluster's name and secret");
  if (!root["nodes"].IsDefined()) fail("nodes", root, "missing: the list of the cluster's nodes");
  parse_cluster_section(p);
  parse_hosts(p);
  if (!env.data_dir.empty()) p.cluster.configured_data_dir = fs::absolute(env.data_dir).string();
  if (!env.tls_dir.empty()) p.cluster.tls_dir = fs::absolute(env.tls_dir).string();
  p.cluster.data_dir = resolve_cluster_dir(p.cluster);
  if (p.cluster.tls_dir.empty()) {
    p.cluster.tls_dir = (fs::path(p.cluster.data_dir) / "tls").string();
  } else if (fs::path(p.cluster.tls_dir).is_relative()) {
    const fs::path base = p.cluster.path.empty() ? fs::current_path() : fs::absolute(p.cluster.path).parent_path();
    p.cluster.tls_dir = (base / p.cluster.tls_dir).lexically_normal().string();
  }

  RuntimeConfig with_defaults;  // the embedded default (the struct's defaults equal it)
  if (root["defaults"].IsDefined() && !p.defaults.IsNull()) {
    if (!p.defaults.IsMap())
      fail("defaults", p.defaults, "expected a map of runtime sections (model, device, tiers, blend, limits, server)");
    refuse_cluster_owned(p.defaults, "defaults");
    apply_at(p.defaults, "defaults", with_defaults);
  }
  if (!p.nodes.IsSequence() || p.nodes.size() == 0)
    fail("nodes", p.nodes, "expected a list of nodes (a frontend, workers, a storage node)");
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const YAML::Node& nodes = p.nodes;
    p.entries.push_back(nodes[i]);
    p.cluster.nodes.push_back(parse_node(nodes[i], i, with_defaults));
  }
  check_nodes(p);
  apply_environment(p, env);

  const auto storage_nodes = p.cluster.storage_nodes();
  std::vector<RemoteNodeAddress> remote_nodes;
  for (const ClusterNode* s : storage_nodes) remote_nodes.push_back({s->name, s->host, s->data_port});
  for (ClusterNode& n : p.cluster.nodes) {
    n.runtime.data_dir = p.cluster.member_data_dir(n.name);
    if (!storage_nodes.empty() && n.role == NodeRole::Worker) {
      n.runtime.remote.host = storage_nodes.front()->host;
      n.runtime.remote.port = storage_nodes.front()->data_port;
      n.runtime.remote.nodes = remote_nodes;
      n.runtime.remote.replication = std::min<int>(p.cluster.replication, static_cast<int>(remote_nodes.size()));
      n.runtime.remote.secret = p.cluster.secret;
      n.runtime.remote.tls = p.cluster.member_tls(n.name);
      if (p.cluster.tls) n.runtime.remote.tls_peer_name = storage_nodes.front()->name;
    }
    // A worker answers its frontend, which presents the key derived from the secret.
    if (n.role == NodeRole::Worker) n.runtime.api_keys.push_back(worker_api_key(p.cluster.secret));
    // TLS: a worker's endpoint is HTTPS and answers only the frontend's certificate.
    if (n.role == NodeRole::Worker && p.cluster.tls) {
      n.runtime.server_tls = p.cluster.member_tls(n.name);
      n.runtime.server_tls_peers = {p.cluster.frontend().name};
    }
  }
  return std::move(p.cluster);
}

ClusterConfig load_cluster_config(const std::string& path) {
  return config_yaml::load_config_file(
      path, [&](const std::string& text) { return parse_cluster_config(text, path, cluster_environment()); });
}

bool is_cluster_config(const std::string& yaml_text) {
  try {
    const YAML::Node root = load_document(yaml_text);
    return root.IsMap() && (root["nodes"].IsDefined() || root["cluster"].IsDefined());
  } catch (const std::exception&) {
    return false;
  }
}

RuntimeConfig member_runtime_config(const ClusterConfig& cluster, const std::string& node_name) {
  return cluster.member(node_name).runtime;
}

}  // namespace bs
