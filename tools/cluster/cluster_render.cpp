// blendctl cluster render (tools/cluster/cluster_render.h): Kubernetes manifests and a Slurm
// batch script from one cluster file.
#include "tools/cluster/cluster_render.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <openssl/evp.h>
#include <yaml-cpp/yaml.h>

#include "actors/config/runtime_config.h"
#include "tools/cli/child_process.h"

namespace bs::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigDir = "/etc/blendserve/config";  // the ConfigMap: cluster.yaml
constexpr const char* kTlsDir = "/etc/blendserve/tls";      // the Secret: ca.pem, <node>.pem, <node>.key
constexpr const char* kDataDir = "/var/lib/blendserve";     // the member's volume
constexpr const char* kSecretKey = "cluster-secret";         // the Secret's key for cluster.secret
constexpr int kImageUid = 10001;                             // the image's user (configs/deploy/Dockerfile)

// A DNS-1123 label: what a Kubernetes object's name (and a pod's host name) may be.
bool dns_label(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

std::string object_name(const ClusterConfig& c, const ClusterNode& n) { return c.name + "-" + n.name; }
std::string role_service(const ClusterConfig& c, NodeRole r) { return c.name + "-" + role_name(r); }
// The stable DNS name of a member's pod (ordinal 0 of its StatefulSet).
std::string member_dns(const ClusterConfig& c, const ClusterNode& n, const RenderOptions& opt) {
  return object_name(c, n) + "-0." + role_service(c, n.role) + "." + opt.namespace_name + ".svc." + opt.cluster_domain;
}

void check_renderable(const ClusterConfig& c, const RenderOptions& opt) {
  if (!dns_label(opt.namespace_name)) throw ConfigError("--namespace " + opt.namespace_name + ": not a DNS label");
  if (!dns_label(c.name))
    throw ConfigError("cluster.name: '" + c.name + "' cannot name Kubernetes objects (lowercase letters, digits, '-')");
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const ClusterNode& n = c.nodes[i];
    const std::string at = "nodes[" + std::to_string(i) + "]";
    // <cluster>-<node>: the StatefulSet; its pods' revision label adds 11 characters.
    if (!dns_label(n.name) || object_name(c, n).size() > 52)
      throw ConfigError(at + ".name: '" + n.name + "' (line " + std::to_string(n.line) +
                        ") cannot name a Kubernetes StatefulSet: '" + object_name(c, n) +
                        "' must be lowercase letters, digits and '-', at most 52 characters");
    if (n.role == NodeRole::Worker && c.tls && n.probe_port == 0)
      throw ConfigError(at + ".probe_port: missing (line " + std::to_string(n.line) + "): worker '" + n.name +
                        "' serves HTTPS that answers only the frontend's certificate, and the kubelet's probes carry "
                        "none; give it a probe_port (plain /health, /ready and /live)");
  }
}

json labels(const ClusterConfig& c, const ClusterNode* n, std::optional<NodeRole> role = std::nullopt) {
  json l{{"app.kubernetes.io/name", "blendserve"}, {"app.kubernetes.io/instance", c.name}};
  if (n) role = n->role;
  if (role) l["app.kubernetes.io/component"] = role_name(*role);
  if (n) l["blendserve.io/node"] = n->name;
  return l;
}

json metadata(const std::string& name, const RenderOptions& opt, json l) {
  return {{"name", name}, {"namespace", opt.namespace_name}, {"labels", std::move(l)}};
}

// Kubernetes quantities: bytes as Mi, rounded up.
std::string mebibytes(int64_t bytes) {
  return std::to_string(std::max<int64_t>(1, (bytes + (int64_t{1} << 20) - 1) >> 20)) + "Mi";
}

json http_probe(const std::string& path, const std::string& port, int period, int failures) {
  return {{"httpGet", {{"path", path}, {"port", port}, {"scheme", "HTTP"}}},
          {"periodSeconds", period},
          {"timeoutSeconds", 5},
          {"failureThreshold", failures}};
}
json tcp_probe(const std::string& port, int period, int failures) {
  return {{"tcpSocket", {{"port", port}}}, {"periodSeconds", period}, {"timeoutSeconds", 5}, {"failureThreshold", failures}};
}

json member_statefulset(const ClusterConfig& c, const ClusterNode& n, const std::string& secret_env,
                        const RenderOptions& opt) {
  const std::string name = object_name(c, n);
  std::string hosts;
  for (const ClusterNode& m : c.nodes) {
    if (!hosts.empty()) hosts += ',';
    hosts.append(m.name).append("=").append(member_dns(c, m, opt));
  }
  json env = json::array({
      {{"name", "BLENDSERVE_NODE"}, {"value", n.name}},
      {{"name", "BLENDSERVE_CONFIG"}, {"value", std::string(kConfigDir) + "/cluster.yaml"}},
      {{"name", "BLENDSERVE_HOSTS"}, {"value", hosts}},
      {{"name", "BLENDSERVE_BIND"}, {"value", "0.0.0.0"}},
      {{"name", "BLENDSERVE_CLUSTER_DATA_DIR"}, {"value", kDataDir}},
  });
  if (c.tls) env.push_back({{"name", "BLENDSERVE_TLS_DIR"}, {"value", kTlsDir}});
  if (!secret_env.empty())
    env.push_back({{"name", secret_env},
                   {"valueFrom", {{"secretKeyRef", {{"name", c.name + "-secret"}, {"key", kSecretKey}}}}}});
  const std::vector<int> gpus = n.role == NodeRole::Worker ? worker_gpus(n.runtime) : std::vector<int>{};
  if (!gpus.empty()) {
    // The pod sees only its own GPUs, numbered from 0.
    std::string list;
    for (size_t g = 0; g < gpus.size(); ++g) {
      if (g) list += ',';
      list += std::to_string(g);
    }
    env.push_back({{"name", "BLENDSERVE_GPUS"}, {"value", list}});
  }

  json ports = json::array({{{"name", "control"}, {"containerPort", n.port}, {"protocol", "TCP"}}});
  if (n.http_port) ports.push_back({{"name", "http"}, {"containerPort", n.http_port}, {"protocol", "TCP"}});
  if (n.data_port) ports.push_back({{"name", "data"}, {"containerPort", n.data_port}, {"protocol", "TCP"}});
  if (n.probe_port) ports.push_back({{"name", "probe"}, {"containerPort", n.probe_port}, {"protocol", "TCP"}});

  // Readiness: /ready (the model loaded, not draining; a worker's storage node
  // answering; the frontend's workers up); liveness: /live. A worker loads its model
  // before it listens: the startup probe allows cluster.startup_timeout for that.
  const int startup_failures = std::max(1, static_cast<int>(std::ceil(c.startup_timeout_s / 5)));
  json container{{"name", "blendserve"},
                 {"image", opt.image},
                 {"imagePullPolicy", "IfNotPresent"},
                 {"env", env},
                 {"ports", ports}};
  if (n.role == NodeRole::Storage) {
    container["readinessProbe"] = tcp_probe("data", 5, 3);
    container["livenessProbe"] = tcp_probe("control", 10, 6);
    container["startupProbe"] = tcp_probe("data", 5, startup_failures);
  } else {
    const std::string port = n.role == NodeRole::Worker && n.probe_port ? "probe" : "http";
    container["readinessProbe"] = http_probe("/ready", port, 5, 3);
    container["livenessProbe"] = http_probe("/live", port, 10, 6);
    container["startupProbe"] = http_probe("/live", port, 5, startup_failures);
  }
  // Requests: a worker's compute threads and what its RAM tier and KV cache may
  // hold, plus a GiB for the model and the process; the others are light.
  json requests{{"cpu", "500m"}, {"memory", "512Mi"}};
  json limits = json::object();
  if (n.role == NodeRole::Worker) {
    const RuntimeConfig& r = n.runtime;
    requests["cpu"] = std::to_string(std::max(1, r.threads));
    const int64_t ram = (r.ram.enabled ? r.ram.budget_bytes : 0) + r.kv_cache_bytes + (int64_t{1} << 30);
    requests["memory"] = mebibytes(ram);
    if (!gpus.empty()) limits["nvidia.com/gpu"] = static_cast<int>(gpus.size());
  } else if (n.role == NodeRole::Storage) {
    requests["cpu"] = std::to_string(std::max(1, n.data_plane.threads));
  }
  json resources{{"requests", requests}};
  if (!limits.empty()) resources["limits"] = limits;
  container["resources"] = resources;

  json mounts = json::array({{{"name", "config"}, {"mountPath", kConfigDir}, {"readOnly", true}},
                             {{"name", "data"}, {"mountPath", kDataDir}}});
  json volumes = json::array({{{"name", "config"},
                               {"configMap", {{"name", c.name + "-config"},
                                              {"items", json::array({{{"key", "cluster.yaml"}, {"path", "cluster.yaml"}}})}}}}});
  if (c.tls) {
    mounts.push_back({{"name", "tls"}, {"mountPath", kTlsDir}, {"readOnly", true}});
    json items = json::array();
    for (const std::string& f : {std::string("ca.pem"), n.name + ".pem", n.name + ".key"})
      items.push_back({{"key", f}, {"path", f}});
    // 0440 with the pod's fsGroup: readable by the image's user (not root), no one else.
    volumes.push_back({{"name", "tls"}, {"secret", {{"secretName", c.name + "-secret"}, {"defaultMode", 0440}, {"items", items}}}});
  }
  container["volumeMounts"] = mounts;

  // The SSD tier (a worker's, a storage node's store) on a claim of its own, sized
  // from its budget with a tenth to spare; the frontend keeps only traces and logs.
  json claims = json::array();
  const bool ssd = n.role != NodeRole::Frontend && n.runtime.ssd.enabled;
  if (ssd) {
    const int64_t bytes = n.runtime.ssd.budget_bytes + n.runtime.ssd.budget_bytes / 10 + (int64_t{256} << 20);
    json spec{{"accessModes", json::array({"ReadWriteOnce"})}, {"resources", {{"requests", {{"storage", mebibytes(bytes)}}}}}};
    if (!opt.storage_class.empty()) spec["storageClassName"] = opt.storage_class;
    claims.push_back({{"metadata", {{"name", "data"}, {"labels", labels(c, &n)}}}, {"spec", spec}});
  } else {
    volumes.push_back({{"name", "data"}, {"emptyDir", json::object()}});
  }

  // The image's user (configs/deploy/Dockerfile: uid 10001); fsGroup makes the
  // volumes (the data claim, the Secret's files) its group's.
  json pod_spec{{"securityContext", {{"runAsUser", kImageUid}, {"runAsGroup", kImageUid}, {"fsGroup", kImageUid},
                                     {"runAsNonRoot", true}}},
                {"containers", json::array({container})},
                {"volumes", volumes},
                {"terminationGracePeriodSeconds", static_cast<int>(std::ceil(c.drain_timeout_s)) + 10},
                {"enableServiceLinks", false}};
  json spec{{"serviceName", role_service(c, n.role)},
            {"replicas", 1},
            {"podManagementPolicy", "Parallel"},
            {"selector", {{"matchLabels", labels(c, &n)}}},
            {"template", {{"metadata", {{"labels", labels(c, &n)}}}, {"spec", pod_spec}}}};
  if (!claims.empty()) spec["volumeClaimTemplates"] = claims;
  return {{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"}, {"metadata", metadata(name, opt, labels(c, &n))}, {"spec", spec}};
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

void emit(std::ostringstream& out, const json& v, int indent);

// A scalar as YAML: strings double-quoted (JSON escapes are YAML's), the rest plain.
std::string scalar(const json& v) { return v.dump(); }

// A map key: plain when it cannot be read as anything but that string (Kubernetes'
// keys: apiVersion, app.kubernetes.io/name, nvidia.com/gpu), else double-quoted.
std::string key_text(const std::string& k) {
  static const char* const special[] = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"};
  std::string lower = k;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const bool plain =
      !k.empty() && std::isalpha(static_cast<unsigned char>(k[0])) &&
      std::all_of(k.begin(), k.end(), [](unsigned char ch) { return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-' || ch == '/'; }) &&
      std::none_of(std::begin(special), std::end(special), [&](const char* s) { return lower == s; });
  return plain ? k : json(k).dump();
}

bool is_collection(const json& v) { return (v.is_object() || v.is_array()) && !v.empty(); }

// A multi-line string of printable text (a file: the ConfigMap's cluster.yaml) as a
// literal block, its lines as they are, at `indent`; false for anything else.
bool emit_literal(std::ostringstream& out, const json& v, int indent) {
  if (!v.is_string()) return false;
  const std::string& text = v.get_ref<const std::string&>();
  if (text.find('\n') == std::string::npos ||
      std::any_of(text.begin(), text.end(), [](unsigned char ch) { return ch < 0x20 && ch != '\n' && ch != '\t'; }))
    return false;
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '\n') --end;
  const size_t trailing = text.size() - end;
  // The explicit indentation indicator (2) lets the first line start with a space.
  out << " |" << (trailing == 0 ? "-" : trailing == 1 ? "" : "+") << "2\n";
  const std::string pad(static_cast<size_t>(indent), ' ');
  std::stringstream lines(text.substr(0, end));
  std::string line;
  while (std::getline(lines, line)) out << (line.empty() ? "" : pad) << line << "\n";
  for (size_t i = 1; i < trailing; ++i) out << "\n";
  return true;
}

void emit(std::ostringstream& out, const json& v, int indent) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      out << pad << key_text(k) << ":";
      if (is_collection(x)) {
        out << "\n";
        emit(out, x, indent + 2);
      } else if (!emit_literal(out, x, indent + 2)) {
        out << " " << (x.is_object() ? "{}" : x.is_array() ? "[]" : scalar(x)) << "\n";
      }
    }
  } else if (v.is_array()) {
    for (const json& x : v) {
      if (is_collection(x)) {
        // "- " then the first line of the item at this indent + 2.
        std::ostringstream item;
        emit(item, x, indent + 2);
        std::string text = item.str();
        out << pad << "- " << text.substr(static_cast<size_t>(indent) + 2);
      } else {
        out << pad << "- " << (x.is_object() ? "{}" : x.is_array() ? "[]" : scalar(x)) << "\n";
      }
    }
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// cluster.secret as written: "env:NAME" gives NAME, a literal secret "".
std::string secret_variable(const std::string& file_text) {
  const YAML::Node root = YAML::Load(file_text);
  const YAML::Node s = root["cluster"]["secret"];
  const std::string v = s.IsScalar() ? s.Scalar() : "";
  return v.rfind("env:", 0) == 0 ? v.substr(4) : "";
}

void write_file(const fs::path& path, const std::string& text, fs::perms perms) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + path.string());
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
  }
  fs::permissions(path, perms);
}

// A shell word: single-quoted.
std::string sh(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Runs argv, its stdout returned; throws with its exit status.
std::string run_capture(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) {
    if (!cmd.empty()) cmd += ' ';
    cmd += sh(a);
  }
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + argv[0]);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  if (st != 0)
    throw std::runtime_error(argv[0] + " failed (exit " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + ")");
  return out;
}

int submit_and_wait(const ClusterConfig& c, const fs::path& script, const RenderOptions& opt) {
  // sbatch waits on slurmctld: bounded, so an unreachable controller is an error, not a hang.
  std::string id = run_capture({"timeout", "120", "sbatch", "--parsable", script.string()});
  id.erase(std::remove_if(id.begin(), id.end(), [](char ch) { return ch == '\n' || ch == '\r'; }), id.end());
  id = id.substr(0, id.find(';'));
  std::fprintf(stderr, "blendctl: submitted job %s\n", id.c_str());
  // The job writes where the frontend runs once its machines are known.
  const fs::path endpoint = fs::path(opt.out_dir) / ("endpoint." + id);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(c.startup_timeout_s + 60);
  int last_report = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    const int waited = static_cast<int>(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (fs::exists(endpoint)) {
      std::string host = read_text(endpoint.string());
      host.erase(std::remove_if(host.begin(), host.end(), [](char ch) { return ch == '\n'; }), host.end());
      ClusterConfig placed = c;
      for (ClusterNode& n : placed.nodes)
        if (n.role == NodeRole::Frontend) n.host = host;
      if (member_ready(placed, placed.frontend(), 2)) {
        std::cout << json{{"job", id}, {"frontend", "http://" + host + ":" + std::to_string(c.frontend().http_port)},
                          {"ready_s", waited}}
                         .dump()
                  << "\n";
        return 0;
      }
    }
    if (waited / 10 != last_report) {
      last_report = waited / 10;
      std::fprintf(stderr, "blendctl: job %s: waiting for the frontend (%d s)\n", id.c_str(), waited);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::fprintf(stderr, "blendctl: job %s: the frontend was not ready within %.0f s (logs: %s)\n", id.c_str(),
               c.startup_timeout_s + 60, opt.out_dir.c_str());
  return 1;
}

}  // namespace

std::vector<json> kubernetes_secret(const ClusterConfig& c,
                                    const std::vector<std::pair<std::string, std::string>>& secret_files,
                                    const RenderOptions& opt) {
  check_renderable(c, opt);
  json data = json::object();
  data[kSecretKey] = base64(c.secret);
  for (const auto& [name, bytes] : secret_files) data[name] = base64(bytes);
  return {{{"apiVersion", "v1"},
           {"kind", "Secret"},
           {"metadata", metadata(c.name + "-secret", opt, labels(c, nullptr))},
           {"type", "Opaque"},
           {"data", data}}};
}

std::vector<json> kubernetes_manifests(const ClusterConfig& c, const std::string& file_text,
                                       const std::string& secret_env, const RenderOptions& opt) {
  check_renderable(c, opt);
  std::vector<json> docs;
  docs.push_back({{"apiVersion", "v1"},
                  {"kind", "ConfigMap"},
                  {"metadata", metadata(c.name + "-config", opt, labels(c, nullptr))},
                  {"data", {{"cluster.yaml", file_text}}}});
  // A headless Service per role: the members' stable DNS names.
  for (NodeRole role : {NodeRole::Frontend, NodeRole::Worker, NodeRole::Storage}) {
    json ports = json::array();
    std::vector<int> seen;
    for (const ClusterNode& n : c.nodes) {
      if (n.role != role) continue;
      for (int p : {n.port, n.http_port, n.data_port})
        if (p && std::find(seen.begin(), seen.end(), p) == seen.end()) {
          seen.push_back(p);
          ports.push_back({{"name", std::string("p").append(std::to_string(p))}, {"port", p}, {"targetPort", p}, {"protocol", "TCP"}});
        }
    }
    if (seen.empty()) continue;
    docs.push_back({{"apiVersion", "v1"},
                    {"kind", "Service"},
                    {"metadata", metadata(role_service(c, role), opt, labels(c, nullptr, role))},
                    {"spec",
                     {{"clusterIP", "None"},
                      {"publishNotReadyAddresses", true},
                      {"selector", labels(c, nullptr, role)},
                      {"ports", ports}}}});
  }
  // The users' endpoint: the frontend, while it is ready.
  const ClusterNode& fe = c.frontend();
  docs.push_back({{"apiVersion", "v1"},
                  {"kind", "Service"},
                  {"metadata", metadata(c.name + "-api", opt, labels(c, nullptr, NodeRole::Frontend))},
                  {"spec",
                   {{"type", "ClusterIP"},
                    {"selector", labels(c, &fe)},
                    {"ports", json::array({{{"name", "http"}, {"port", fe.http_port}, {"targetPort", "http"},
                                            {"protocol", "TCP"}}})}}}});
  for (const ClusterNode& n : c.nodes) docs.push_back(member_statefulset(c, n, secret_env, opt));
  return docs;
}

std::string to_yaml(const std::vector<json>& docs) {
  std::ostringstream out;
  out << "# Rendered by `blendctl cluster render --target kubernetes`; render again rather than edit.\n";
  for (const json& d : docs) {
    out << "---\n";
    emit(out, d, 0);
  }
  return out.str();
}

std::string slurm_script(const ClusterConfig& c, const std::string& config_path, const RenderOptions& opt) {
  // Host groups: the file's distinct hosts in order of appearance.
  std::vector<std::string> groups;
  std::vector<size_t> group_of;
  for (const ClusterNode& n : c.nodes) {
    auto it = std::find(groups.begin(), groups.end(), n.host);
    if (it == groups.end()) it = groups.insert(groups.end(), n.host);
    group_of.push_back(static_cast<size_t>(it - groups.begin()));
  }
  const int machines = opt.nodes > 0 ? opt.nodes : static_cast<int>(groups.size());
  // GPUs per machine: the most any group needs (a worker's indices are on its machine).
  int gpus = 0, cpus = 1;
  std::map<size_t, int> group_gpus;
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const ClusterNode& n = c.nodes[i];
    if (n.role != NodeRole::Worker) continue;
    for (int g : worker_gpus(n.runtime)) group_gpus[group_of[i] % static_cast<size_t>(machines)] =
        std::max(group_gpus[group_of[i] % static_cast<size_t>(machines)], g + 1);
    cpus = std::max(cpus, n.runtime.threads);
  }
  for (const auto& [g, count] : group_gpus) gpus = std::max(gpus, count);
  const std::string bin = opt.bin_dir.empty() ? self_dir() : opt.bin_dir;

  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Cluster '" << c.name << "' under Slurm. Rendered by `blendctl cluster render --target slurm`\n"
    << "# from " << config_path << "; render again rather than edit. The environment of\n"
    << "# sbatch reaches every member (BLENDSERVE_* variables: README \"Running on many machines\").\n"
    << "#SBATCH --job-name=blendserve-" << c.name << "\n"
    << "#SBATCH --nodes=" << machines << "\n"
    << "#SBATCH --ntasks=" << c.nodes.size() << "\n"
    << "#SBATCH --cpus-per-task=" << cpus << "\n"
    << "#SBATCH --output=" << (fs::path(opt.out_dir) / "job-%j.out").string() << "\n";
  if (gpus > 0) s << "#SBATCH --gres=gpu:" << gpus << "\n";
  if (!opt.partition.empty()) s << "#SBATCH --partition=" << opt.partition << "\n";
  if (!opt.time_limit.empty()) s << "#SBATCH --time=" << opt.time_limit << "\n";
  s << "set -euo pipefail\n"
    << "CONFIG=" << sh(config_path) << "\n"
    << "BIN=${BLENDSERVE_BIN:-" << sh(bin) << "}\n"
    << "OUT=" << sh(fs::absolute(opt.out_dir).string()) << "\n"
    << "LOGS=\"$OUT/logs-$SLURM_JOB_ID\"\n"
    << "mkdir -p \"$LOGS\"\n"
    << "# Rank r runs MEMBERS[r]; its host group is GROUP_OF[r] (the file's distinct hosts).\n"
    << "MEMBERS=(";
  for (size_t i = 0; i < c.nodes.size(); ++i) s << (i ? " " : "") << sh(c.nodes[i].name);
  s << ")\nGROUP_OF=(";
  for (size_t i = 0; i < c.nodes.size(); ++i) s << (i ? " " : "") << group_of[i];
  s << ")\n"
    << "mapfile -t MACHINES < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")\n"
    << "HOSTS=\n"
    << ": > \"$LOGS/hostfile\"\n"
    << "for r in \"${!MEMBERS[@]}\"; do\n"
    << "  m=${MACHINES[$(( GROUP_OF[r] % ${#MACHINES[@]} ))]}\n"
    << "  HOSTS+=\"${HOSTS:+,}${MEMBERS[r]}=$m\"\n"
    << "  echo \"$m\" >> \"$LOGS/hostfile\"\n"
    << "  if [ \"${MEMBERS[r]}\" = " << sh(c.frontend().name) << " ]; then echo \"$m\" > \"$OUT/endpoint.$SLURM_JOB_ID\"; fi\n"
    << "done\n"
    << "export BLENDSERVE_HOSTS=\"$HOSTS\" BLENDSERVE_BIND=0.0.0.0\n"
    << "export BLENDSERVE_SLURM_MEMBERS=\"${MEMBERS[*]}\" BLENDSERVE_SLURM_LOGS=\"$LOGS\" CONFIG BIN\n";
  if (c.tls)
    s << "# The CA and the members' certificates, made where missing (the TLS dir must be one all\n"
      << "# machines of the job see: cluster.tls.dir or $BLENDSERVE_TLS_DIR).\n"
      << "\"$BIN/blendctl\" cluster init \"$CONFIG\" > \"$LOGS/init.json\"\n";
  s << "echo \"blendserve: job $SLURM_JOB_ID: $HOSTS; logs in $LOGS\" >&2\n"
    << "# One task per member; scancel's SIGTERM reaches each (a worker drains for up to\n"
    << "# cluster.drain_timeout = " << c.drain_timeout_s << " s: keep slurm.conf's KillWait above it). A member that\n"
    << "# fails ends the job.\n"
    << "SLURM_HOSTFILE=\"$LOGS/hostfile\" srun --distribution=arbitrary --ntasks=" << c.nodes.size()
    << " --kill-on-bad-exit=1 \\\n"
    << "  bash -c 'm=($BLENDSERVE_SLURM_MEMBERS); node=${m[$SLURM_PROCID]}; "
       "exec \"$BIN/blendserve\" --config \"$CONFIG\" --node \"$node\" > \"$BLENDSERVE_SLURM_LOGS/$node.log\" 2>&1'\n";
  return s.str();
}

int cluster_render(const ClusterCtlOptions& ctl, const RenderOptions& opt) {
  ClusterConfig c;
  std::string text, secret_env;
  try {
    c = load_cluster_for_ctl(ctl);
    text = read_text(ctl.config);
    secret_env = secret_variable(text);
    if (opt.target == "kubernetes") check_renderable(c, opt);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  try {
    fs::create_directories(opt.out_dir);
    if (opt.target == "kubernetes") {
      if (secret_env.empty())
        std::fprintf(stderr, "blendctl: cluster.secret is written in %s: the ConfigMap carries it too (use "
                             "\"env:NAME\" to keep it in the Secret only)\n", ctl.config.c_str());
      if (!ensure_cluster_certificates(c)) return 1;
      std::vector<std::pair<std::string, std::string>> files;
      if (c.tls) {
        files.emplace_back("ca.pem", read_text(c.ca_cert_path()));
        for (const ClusterNode& n : c.nodes) {
          const tls::Files f = c.member_tls(n.name);
          files.emplace_back(n.name + ".pem", read_text(f.cert));
          files.emplace_back(n.name + ".key", read_text(f.key));
        }
      }
      const fs::path manifests = fs::path(opt.out_dir) / "kubernetes.yaml";
      const fs::path secret = fs::path(opt.out_dir) / "secret.yaml";
      write_file(secret, to_yaml(kubernetes_secret(c, files, opt)), fs::perms::owner_read | fs::perms::owner_write);
      write_file(manifests, to_yaml(kubernetes_manifests(c, text, secret_env, opt)),
                 fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
      std::cout << json{{"file", secret.string()}, {"kind", "Secret"}}.dump() << "\n"
                << json{{"file", manifests.string()}, {"members", c.nodes.size()}}.dump() << "\n";
      return 0;
    }
    const fs::path script = fs::path(opt.out_dir) / "blendserve.sbatch";
    write_file(script, slurm_script(c, fs::absolute(ctl.config).string(), opt),
               fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                   fs::perms::others_exec);
    std::cout << json{{"file", script.string()}, {"members", c.nodes.size()}}.dump() << "\n";
    return opt.submit ? submit_and_wait(c, script, opt) : 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace bs::tools
