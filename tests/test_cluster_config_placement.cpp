// The cluster config's placement (hosts, GPUs, probe ports, the drain), the environment
// over the file, several storage nodes and the replication, and the keys the cluster
// sets for its members; every mistake an error naming the key (or variable) and line.
#include "cluster_config_test_helpers.h"

namespace bs {
namespace {

using namespace cluster_config_test;  // NOLINT: the suites' shared helpers
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// ---- placement: hosts, GPUs, probe ports, the drain -------------------------------

TEST(ClusterConfig, ProbePortAndDrainTimeout) {
  const ClusterConfig c = parse_cluster_config(
      with_line("name: w2,", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102, probe_port: 8202}"));
  EXPECT_EQ(c.member("w2").probe_port, 8202);
  EXPECT_EQ(c.member("w1").probe_port, 0);
  EXPECT_DOUBLE_EQ(c.drain_timeout_s, 30.0);
  std::string text = kCluster;
  text.replace(text.find("  data_dir"), 0, "  drain_timeout: 45s\n");
  EXPECT_DOUBLE_EQ(parse_cluster_config(text).drain_timeout_s, 45.0);
  // A probe port is a worker's, and it clashes as any port does.
  EXPECT_THAT(error_of(with_line("name: front,", "  - {name: front, role: frontend, host: 127.0.0.1, port: 7100, "
                                                 "http_port: 8000, probe_port: 8200}")),
              HasSubstr("nodes[0].probe_port: only a worker has a probe_port"));
  EXPECT_THAT(error_of(with_line("name: w2,", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, "
                                              "http_port: 8102, probe_port: 8101}")),
              HasSubstr("nodes[2].probe_port: 127.0.0.1:8101 is also nodes[1].http_port"));
}

// Whether this build has the CUDA backend: a config naming device.kind cuda parses
// only then (tests of GPU placement skip elsewhere: the sanitizer builds, a machine
// without nvcc).
bool cuda_built() {
  const auto kinds = kernels::device_kinds_built();
  return std::find(kinds.begin(), kinds.end(), "cuda") != kinds.end();
}

// A cluster of CUDA workers on listed hosts.
std::string gpu_cluster(const std::string& w1_device, const std::string& w2_device, const std::string& gpus) {
  return std::string(R"(cluster: {name: g, secret: 0123456789abcdef0123, data_dir: /srv/bs}
hosts:
  - {host: 10.0.0.2, gpus: )") + gpus + R"(}
nodes:
  - {name: front, role: frontend, host: 10.0.0.1, port: 7100, http_port: 8000}
  - {name: w1, role: worker, host: 10.0.0.2, port: 7101, http_port: 8101, device: )" + w1_device + R"(}
  - {name: w2, role: worker, host: 10.0.0.2, port: 7102, http_port: 8102, device: )" + w2_device + R"(}
)";
}

TEST(ClusterConfig, GpuWorkersPlacedOnTheirHost) {
  // tp without a list: the first tp indices; a CPU worker uses none.
  RuntimeConfig r;
  r.device_kind = "cuda";
  r.tp = 3;
  EXPECT_EQ(worker_gpus(r), (std::vector<int>{0, 1, 2}));
  r.gpus = {4, 5, 6, 7};
  EXPECT_EQ(worker_gpus(r), (std::vector<int>{4, 5, 6}));
  r.device_kind = "cpu";
  EXPECT_TRUE(worker_gpus(r).empty());
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build: a cuda worker does not parse";
  const ClusterConfig c =
      parse_cluster_config(gpu_cluster("{kind: cuda, tp: 2, gpus: [0, 1]}", "{kind: cuda, gpus: [2]}", "4"));
  ASSERT_EQ(c.hosts.size(), 1u);
  EXPECT_EQ(c.hosts[0].host, "10.0.0.2");
  EXPECT_EQ(c.hosts[0].gpus, 4);
  EXPECT_EQ(worker_gpus(c.member("w1").runtime), (std::vector<int>{0, 1}));
  EXPECT_EQ(worker_gpus(c.member("w2").runtime), (std::vector<int>{2}));
}

TEST(ClusterConfigErrors, AWorkerThatCannotBePlaced) {
  // A host listed twice, and a bad count (checked before the nodes).
  EXPECT_THAT(error_of(R"(cluster: {name: g, secret: 0123456789abcdef0123}
hosts: [{host: a, gpus: 1}, {host: a, gpus: 2}]
nodes: []
)"),
              HasSubstr("hosts[1].host: 'a' is also hosts[0]"));
  EXPECT_THAT(error_of(gpu_cluster("{kind: cuda}", "{kind: cpu}", "-1")), HasSubstr("hosts[0].gpus: must be in 0..1024"));
  EXPECT_THAT(error_of(R"(cluster: {name: g, secret: 0123456789abcdef0123}
hosts: [{gpus: 2}]
nodes: []
)"),
              HasSubstr("hosts[0].host: missing"));
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build: a cuda worker does not parse";
  // More GPUs than the host lists: the key and its line.
  std::string text = gpu_cluster("{kind: cuda, tp: 2, gpus: [0, 1]}", "{kind: cuda, gpus: [2]}", "2");
  EXPECT_THAT(error_of(text),
              AllOf(HasSubstr("nodes[2].device.gpus: worker 'w2' needs GPU 2 of 10.0.0.2, but hosts lists 2 GPUs there "
                              "(line 3): it cannot be placed"),
                    HasSubstr(at_line(text, "name: w2"))));
  // Two workers of one host on one GPU (both default to GPU 0).
  text = gpu_cluster("{kind: cuda}", "{kind: cuda, tp: 1}", "8");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[2].device.tp: worker 'w2' needs GPU 0 of 10.0.0.2, which nodes[1] 'w1'"));
}

TEST(ClusterConfig, TheEnvironmentOverTheFile) {
  ClusterEnvironment env;
  env.hosts = "front=fe.example,w1=10.1.0.1";
  env.bind = "0.0.0.0";
  env.data_dir = "/var/lib/blendserve";
  env.tls_dir = "/etc/blendserve/tls";
  const ClusterConfig c = parse_cluster_config(kCluster, "", env);
  EXPECT_EQ(c.member("front").host, "fe.example");
  EXPECT_EQ(c.member("w1").host, "10.1.0.1");
  EXPECT_EQ(c.member("w2").host, "127.0.0.1");  // not named: the file's
  for (const ClusterNode& n : c.nodes) EXPECT_EQ(n.bind, "0.0.0.0") << n.name;
  EXPECT_EQ(member_runtime_config(c, "w1").host, "0.0.0.0");  // where its HTTP listens
  EXPECT_EQ(c.data_dir, "/var/lib/blendserve/test");           // over cluster.data_dir (/srv/bs)
  EXPECT_EQ(c.tls_dir, "/etc/blendserve/tls");
  EXPECT_EQ(member_runtime_config(c, "w1").remote.host, "127.0.0.3");
  // A storage node moved by the environment moves in every worker's remote tier.
  env = {};
  env.hosts = "store=storage.example";
  EXPECT_EQ(member_runtime_config(parse_cluster_config(kCluster, "", env), "w1").remote.host, "storage.example");
  // Without the variables, host is where a member listens too.
  EXPECT_EQ(parse_cluster_config(kCluster).member("w1").bind, "127.0.0.1");

  // GPUs: the pod's own numbering, over device.gpus, for CUDA workers only.
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build: a cuda worker does not parse";
  env = {};
  env.gpus = "0,1";
  const ClusterConfig g =
      parse_cluster_config(gpu_cluster("{kind: cuda, tp: 2, gpus: [2, 3]}", "{kind: cpu}", "4"), "", env);
  EXPECT_EQ(worker_gpus(g.member("w1").runtime), (std::vector<int>{0, 1}));
  EXPECT_TRUE(worker_gpus(g.member("w2").runtime).empty());
}

TEST(ClusterConfigErrors, TheEnvironmentsMistakesNameTheVariable) {
  auto hosts_env = [](const char* h) {
    ClusterEnvironment e;
    e.hosts = h;
    return e;
  };
  auto gpus_env = [](const char* g) {
    ClusterEnvironment e;
    e.gpus = g;
    return e;
  };
  auto error_with = [](ClusterEnvironment env) {
    try {
      parse_cluster_config(kCluster, "", env);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  EXPECT_THAT(error_with(hosts_env("nobody=10.0.0.1")),
              HasSubstr("BLENDSERVE_HOSTS: no node 'nobody' in the cluster (nodes: front, w1, w2, store)"));
  EXPECT_THAT(error_with(hosts_env("w1")), HasSubstr("BLENDSERVE_HOSTS: 'w1' is not name=address"));
  // A member moved onto another's address and port: refused as in the file.
  const std::string text = with_node("  - {name: w3, role: worker, host: 127.0.0.9, port: 7101, http_port: 8101}");
  EXPECT_NO_THROW(parse_cluster_config(text));
  try {
    parse_cluster_config(text, "", hosts_env("w3=127.0.0.1"));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("BLENDSERVE_HOSTS: 127.0.0.1:7101 is both w1's and w3's"),
                                HasSubstr("every port of every node must differ")));
  }
  EXPECT_THAT(error_with(gpus_env("0,x")), HasSubstr("BLENDSERVE_GPUS: '0,x' is not a list of CUDA indices"));
}

TEST(ClusterConfig, LoadReadsTheEnvironment) {
  EnvGuard env({"BLENDSERVE_CLUSTER_SECRET", "BLENDSERVE_HOSTS", "BLENDSERVE_BIND", "BLENDSERVE_CLUSTER_DATA_DIR",
                "BLENDSERVE_TLS_DIR", "BLENDSERVE_GPUS"});
  env.set("BLENDSERVE_CLUSTER_SECRET", kSecret);
  env.set("BLENDSERVE_HOSTS", "worker-1=w1.example");
  env.set("BLENDSERVE_BIND", "0.0.0.0");
  env.set("BLENDSERVE_CLUSTER_DATA_DIR", "/data");
  env.unset("BLENDSERVE_TLS_DIR");
  env.unset("BLENDSERVE_GPUS");
  const ClusterConfig c = load_cluster_config(kExample);
  EXPECT_EQ(c.member("worker-1").host, "w1.example");
  EXPECT_EQ(c.member("worker-1").bind, "0.0.0.0");
  EXPECT_EQ(c.member("worker-1").probe_port, 8201);
  EXPECT_EQ(c.data_dir, "/data/demo");
  EXPECT_EQ(c.tls_dir, "/data/demo/tls");
}

TEST(ClusterConfigErrors, FrontendsWorkersAndStorageNodes) {
  std::string text = with_line("role: frontend", "");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes: no frontend"), HasSubstr(at_line(text, "name: w1"))));
  text = with_node("  - {name: f2, role: frontend, host: 127.0.0.1, port: 7104, http_port: 8104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].role: a second frontend (nodes[0] 'front' (line 9"),
                                    HasSubstr(at_line(text, "name: f2"))));
  text = with_line("name: w1", "");
  text = text.replace(text.find("  - {name: w2"), text.find('\n', text.find("  - {name: w2")) + 1 - text.find("  - {name: w2"), "");
  EXPECT_THAT(error_of(text), HasSubstr("nodes: no worker: a cluster needs at least one"));
}

// Several storage nodes: every worker's remote tier knows them all (names, hosts,
// data ports, each its TLS name) and keeps cluster.replication copies (default 2,
// capped at the storage nodes there are).
TEST(ClusterConfig, SeveralStorageNodesAndTheReplication) {
  const std::string two = with_node("  - {name: s2, role: storage, host: 127.0.0.4, port: 7104, data_port: 7204}");
  const ClusterConfig c = parse_cluster_config(two);
  ASSERT_EQ(c.storage_nodes().size(), 2u);
  EXPECT_EQ(c.replication, 2);
  const RemoteTierConfig r = member_runtime_config(c, "w1").remote;
  ASSERT_EQ(r.nodes.size(), 2u);
  EXPECT_EQ(r.nodes[0], (RemoteNodeAddress{"store", "127.0.0.3", 7203}));
  EXPECT_EQ(r.nodes[1], (RemoteNodeAddress{"s2", "127.0.0.4", 7204}));
  EXPECT_EQ(r.replication, 2);
  // One storage node: one copy, whatever the cluster asks.
  EXPECT_EQ(member_runtime_config(parse_cluster_config(kCluster), "w1").remote.replication, 1);
  const ClusterConfig three = parse_cluster_config(with_line("data_dir:", "  data_dir: /srv/bs\n  replication: 3") +
                                                   "  - {name: s2, role: storage, host: 127.0.0.4, port: 7104, "
                                                   "data_port: 7204}\n");
  EXPECT_EQ(three.replication, 3);
  EXPECT_EQ(member_runtime_config(three, "w1").remote.replication, 2);
  const std::string zero = with_line("data_dir:", "  data_dir: /srv/bs\n  replication: 0");
  EXPECT_THAT(error_of(zero), AllOf(HasSubstr("cluster.replication: must be in 1..16"),
                                    HasSubstr(at_line(zero, "replication:"))));
}

TEST(ClusterConfigErrors, TheRemoteTierNeedsAStorageNode) {
  std::string text = with_line("role: storage", "");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[1].tiers.remote.enabled: worker 'w1' enables the remote tier, "
                                              "but no node has role: storage"),
                                    HasSubstr(at_line(text, "remote: {enabled"))));
  // Turned on in defaults.
  text = with_line("role: storage", "");
  text = text.replace(text.find(", tiers: {remote: {enabled: true}}"), 34, "");
  text = text.replace(text.find("tiers: {ram: {budget: 1GiB}}"), 28,
                      "tiers: {ram: {budget: 1GiB},\n         remote: {enabled: true}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("defaults.tiers.remote.enabled: worker 'w1' enables the remote tier"),
                                    HasSubstr(at_line(text, "remote: {enabled"))));
  // Neither on: fine.
  text = with_line("role: storage", "");
  text = text.replace(text.find(", tiers: {remote: {enabled: true}}"), 34, "");
  EXPECT_NO_THROW(parse_cluster_config(text));
}

TEST(ClusterConfigErrors, KeysTheClusterSets) {
  std::string text = with_line("device: {threads", "  data_dir: /x");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("defaults.data_dir: a member's data dir is"),
                                    HasSubstr(at_line(text, "data_dir: /x"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102,\n"
                               "     server: {port: 9000}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].server.port: a member listens on its node's host and http_port"),
                                    HasSubstr(at_line(text, "port: 9000"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102,\n"
                               "     tiers: {remote: {enabled: true, host: 10.0.0.1}}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].tiers.remote.host: in a cluster the remote tier reaches"),
                                    HasSubstr(at_line(text, "10.0.0.1"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102, data_dir: /x}");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[2].data_dir: unknown key"));
}

TEST(ClusterConfigErrors, RuntimeValuesKeepTheirMessagesUnderTheNodesPath) {
  std::string text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102,\n"
                                           "     tiers: {ram: {budget: lots}}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].tiers.ram.budget: invalid byte size 'lots'"),
                                    HasSubstr(at_line(text, "budget: lots"))));
  text = with_line("device: {threads", "  blend: {ratio: 1.5}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("defaults.blend.ratio: must be in [0, 1], got 1.5"),
                                    HasSubstr(at_line(text, "ratio: 1.5"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102,\n"
                               "     device: {kind: tpu}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].device.kind: unknown device kind 'tpu'"),
                                    HasSubstr(at_line(text, "kind: tpu"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102,\n"
                               "     device: {gpus: [-2]}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].device.gpus: device indices are >= 0, got -2"),
                                    HasSubstr(at_line(text, "gpus: [-2]"))));
}

TEST(ClusterConfigErrors, PortsOutOfRange) {
  std::string text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 0, http_port: 8104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].port: must be in 1..65535, got 0"),
                                    HasSubstr(at_line(text, "port: 0"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 70000}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].http_port: must be in 1..65535, got 70000"),
                                    HasSubstr(at_line(text, "70000"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: x, http_port: 8104}");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[4].port: expected an integer, got 'x'"));
}

TEST(ClusterConfigErrors, Durations) {
  std::string text = with_line("data_dir:", "  heartbeat_interval: 1 sec");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.heartbeat_interval: invalid duration '1 sec': unknown unit 'sec'"),
                                    HasSubstr(at_line(text, "heartbeat_interval"))));
  text = with_line("data_dir:", "  startup_timeout: 0s");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.startup_timeout: must be a duration > 0, got 0s"),
                                    HasSubstr(at_line(text, "startup_timeout"))));
  text = with_line("data_dir:", "  connection_timeout: -1");
  EXPECT_THAT(error_of(text), HasSubstr("cluster.connection_timeout: invalid duration '-1': negative"));
  text = with_line("data_dir:", "  heartbeat_interval: 2s\n  connection_timeout: 1500ms");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.connection_timeout: the connection timeout"),
                                    HasSubstr("shorter than the heartbeat interval"),
                                    HasSubstr(at_line(text, "connection_timeout"))));
  // Only the heartbeat given, above the default timeout: named at the heartbeat.
  text = with_line("data_dir:", "  heartbeat_interval: 10s");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.heartbeat_interval: the connection timeout"),
                                    HasSubstr(at_line(text, "heartbeat_interval"))));
  // Equal is fine.
  EXPECT_NO_THROW(parse_cluster_config(with_line("data_dir:", "  heartbeat_interval: 2s\n  connection_timeout: 2s")));
}

TEST(ClusterConfigErrors, AFileNamesItsPath) {
  const fs::path file = fs::path(::testing::TempDir()) / "bs_cluster_bad.yaml";
  const std::string text = with_line("role: frontend", "");
  {
    std::ofstream out(file);
    out << text;
  }
  try {
    load_cluster_config(file.string());
    ADD_FAILURE() << "loaded";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(file.string() + ": nodes: no frontend"));
  }
  fs::remove(file);
  EXPECT_THROW(load_cluster_config(file.string()), ConfigError);
}

}  // namespace
}  // namespace bs
