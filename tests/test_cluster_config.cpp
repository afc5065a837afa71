// The cluster config (actors/config/cluster_config.h): the shipped example, what each
// member runs with, and for every mistake an error naming the dotted key and its
// line. Also the runtime config's tiers.remote section, durations and secrets.
// Placement (hosts, GPUs, probe ports), the environment over the file and the storage
// nodes: test_cluster_config_placement.cpp.
#include "cluster_config_test_helpers.h"

namespace bs {
namespace {

using namespace cluster_config_test;  // NOLINT: the suites' shared helpers
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// ---- the example and member configs --------------------------------------------

TEST(ClusterConfig, TheExampleFileParses) {
  EnvGuard env({"BLENDSERVE_CLUSTER_SECRET", "BLENDSERVE_DATA_DIR"});
  env.set("BLENDSERVE_CLUSTER_SECRET", kSecret);
  env.set("BLENDSERVE_DATA_DIR", "/tmp/bs-data");
  const ClusterConfig c = load_cluster_config(kExample);
  EXPECT_EQ(c.path, kExample);
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.secret, kSecret);
  EXPECT_DOUBLE_EQ(c.heartbeat_interval_s, 1.0);
  EXPECT_DOUBLE_EQ(c.connection_timeout_s, 5.0);
  EXPECT_DOUBLE_EQ(c.startup_timeout_s, 120.0);
  EXPECT_EQ(c.data_dir, "/tmp/bs-data/demo");
  ASSERT_EQ(c.nodes.size(), 4u);
  EXPECT_EQ(c.frontend().name, "frontend");
  EXPECT_EQ(c.frontend().http_port, 8000);
  ASSERT_NE(c.storage(), nullptr);
  EXPECT_EQ(c.storage()->name, "storage");
  EXPECT_EQ(c.storage()->data_port, 7202);
  ASSERT_EQ(c.workers().size(), 2u);
  EXPECT_EQ(c.workers()[0]->name, "worker-1");

  const RuntimeConfig w1 = member_runtime_config(c, "worker-1");
  EXPECT_EQ(w1.node_name, "worker-1");
  EXPECT_EQ(w1.host, "127.0.0.2");
  EXPECT_EQ(w1.port, 8101);
  EXPECT_EQ(w1.threads, 1);
  EXPECT_EQ(w1.tp, 1);
  EXPECT_EQ(w1.ram.budget_bytes, 1LL << 30);
  EXPECT_EQ(w1.ssd.budget_bytes, 4LL << 30);
  EXPECT_EQ(w1.max_requests, 4);  // from defaults
  EXPECT_TRUE(w1.remote.enabled);
  EXPECT_TRUE(w1.remote.write_back);
  EXPECT_EQ(w1.remote.host, "127.0.0.3");
  EXPECT_EQ(w1.remote.port, 7202);
  EXPECT_EQ(w1.remote.secret, kSecret);
  EXPECT_EQ(w1.data_dir, "/tmp/bs-data/demo/worker-1");
  EXPECT_EQ(resolve_ssd_path(w1), "/tmp/bs-data/demo/worker-1/kv");

  const RuntimeConfig w2 = member_runtime_config(c, "worker-2");
  EXPECT_FLOAT_EQ(w2.blend.ratio, 0.15f);
  EXPECT_EQ(w2.ram.budget_bytes, 1LL << 30);  // defaults, not overridden
  EXPECT_EQ(w2.port, 8102);

  const RuntimeConfig s = member_runtime_config(c, "storage");
  EXPECT_EQ(s.ssd.budget_bytes, 20LL << 30);
  EXPECT_FALSE(s.remote.enabled);
  EXPECT_EQ(resolve_ssd_path(s), "/tmp/bs-data/demo/storage/kv");
  EXPECT_EQ(c.log_path("storage"), "/tmp/bs-data/demo/logs/storage.log");
  EXPECT_EQ(c.pid_path("storage"), "/tmp/bs-data/demo/pids/storage.pid");
  EXPECT_TRUE(is_cluster_config(kCluster));
}

TEST(ClusterConfig, MemberConfigsOverlayDefaultsThenTheNode) {
  const ClusterConfig c = parse_cluster_config(kCluster);
  EXPECT_EQ(c.data_dir, "/srv/bs/test");
  const RuntimeConfig w1 = member_runtime_config(c, "w1");
  const RuntimeConfig w2 = member_runtime_config(c, "w2");
  EXPECT_EQ(w1.threads, 1);
  EXPECT_EQ(w2.threads, 1);
  EXPECT_EQ(w1.ram.budget_bytes, 1LL << 30);
  EXPECT_EQ(w1.ssd.budget_bytes, RuntimeConfig{}.ssd.budget_bytes);  // the embedded default
  EXPECT_FLOAT_EQ(w1.blend.ratio, RuntimeConfig{}.blend.ratio);
  EXPECT_FLOAT_EQ(w2.blend.ratio, 0.3f);
  EXPECT_TRUE(w1.remote.enabled);
  EXPECT_FALSE(w2.remote.enabled);
  // The storage node's address reaches every worker (w2 can enable the tier alone).
  EXPECT_EQ(w2.remote.host, "127.0.0.3");
  EXPECT_EQ(w2.remote.port, 7203);
  EXPECT_EQ(w1.data_dir, "/srv/bs/test/w1");
  EXPECT_EQ(w2.data_dir, "/srv/bs/test/w2");
  const RuntimeConfig f = member_runtime_config(c, "front");
  EXPECT_EQ(f.node_name, "front");
  EXPECT_EQ(f.port, 8000);
  EXPECT_EQ(f.threads, 1);  // defaults reach the frontend too (its server keys matter)
  EXPECT_FALSE(f.remote.enabled);
  const RuntimeConfig s = member_runtime_config(c, "store");
  EXPECT_EQ(s.ram.budget_bytes, RuntimeConfig{}.ram.budget_bytes);  // defaults are the workers'
  EXPECT_EQ(s.ssd.budget_bytes, 20LL << 30);
  EXPECT_EQ(s.host, "127.0.0.3");
  EXPECT_EQ(c.nodes[1].line, 10);
}

TEST(ClusterConfig, ADefaultOverriddenByANodeKeepsItsOtherKeys) {
  const ClusterConfig c = parse_cluster_config(with_line(
      "name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102, "
                  "tiers: {ram: {loaders: 3}}, server: {api_keys: [key-abcdefgh]}}"));
  const RuntimeConfig w2 = member_runtime_config(c, "w2");
  EXPECT_EQ(w2.ram.loaders, 3);
  EXPECT_EQ(w2.ram.budget_bytes, 1LL << 30);
  // Every worker also takes the key its frontend presents (derived from the secret).
  EXPECT_EQ(w2.api_keys, (std::vector<std::string>{"key-abcdefgh", worker_api_key(c.secret)}));
  EXPECT_EQ(member_runtime_config(c, "w1").api_keys, std::vector<std::string>{worker_api_key(c.secret)});
  EXPECT_EQ(worker_api_key(c.secret).size(), 64u);
  EXPECT_NE(worker_api_key(c.secret), worker_api_key(c.secret + "x"));
}

TEST(ClusterConfig, NoStorageNodeLeavesTheRemoteTierOff) {
  const ClusterConfig d = parse_cluster_config(R"(cluster: {name: x, secret: 0123456789abcdef0123}
nodes:
  - {name: f, role: frontend, host: 127.0.0.1, port: 7100, http_port: 8000}
  - {name: w, role: worker, host: 127.0.0.1, port: 7101, http_port: 8101}
)");
  EXPECT_EQ(d.storage(), nullptr);
  const RuntimeConfig w = member_runtime_config(d, "w");
  EXPECT_FALSE(w.remote.enabled);
  EXPECT_EQ(w.remote.host, "");
}

TEST(ClusterConfig, ARelativeDataDirIsUnderTheFilesDirectory) {
  const fs::path dir = fs::path(::testing::TempDir()) / "bs_cluster_cfg";
  fs::create_directories(dir);
  const fs::path file = dir / "c.yaml";
  {
    std::ofstream out(file);
    out << with_line("data_dir:", "  data_dir: state");
  }
  const ClusterConfig c = load_cluster_config(file.string());
  EXPECT_EQ(c.configured_data_dir, "state");
  EXPECT_EQ(c.data_dir, (fs::absolute(dir) / "state" / "test").lexically_normal().string());
  fs::remove_all(dir);
}

TEST(ClusterConfig, TheDataDirDefaultsToTheRuntimeRule) {
  EnvGuard env({"BLENDSERVE_DATA_DIR"});
  env.set("BLENDSERVE_DATA_DIR", "/env/dir");
  const ClusterConfig c = parse_cluster_config(with_line("data_dir:", ""));
  EXPECT_EQ(c.configured_data_dir, "");
  EXPECT_EQ(c.data_dir, "/env/dir/test");
  EXPECT_EQ(member_runtime_config(c, "w1").data_dir, "/env/dir/test/w1");
}

TEST(ClusterConfig, MemberNamesTheNodesWhenAbsent) {
  const ClusterConfig c = parse_cluster_config(kCluster, "/etc/c.yaml");
  try {
    c.member("nope");
    ADD_FAILURE() << "found";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--node nope: no such node in /etc/c.yaml (nodes: front, w1, w2, store)");
  }
  EXPECT_THROW(member_runtime_config(c, "nope"), ConfigError);
}

TEST(ClusterConfig, DurationsAndTheSecretFromTheEnvironment) {
  EnvGuard env({"BS_TEST_SECRET"});
  env.set("BS_TEST_SECRET", kSecret);
  const ClusterConfig c = parse_cluster_config(with_line(
      "secret:", "  secret: env:BS_TEST_SECRET\n  heartbeat_interval: 500ms\n  connection_timeout: 2\n"
                 "  startup_timeout: 1.5m"));
  EXPECT_EQ(c.secret, kSecret);
  EXPECT_DOUBLE_EQ(c.heartbeat_interval_s, 0.5);
  EXPECT_DOUBLE_EQ(c.connection_timeout_s, 2.0);
  EXPECT_DOUBLE_EQ(c.startup_timeout_s, 90.0);
  EXPECT_EQ(member_runtime_config(c, "w1").remote.secret, kSecret);
}

TEST(ClusterConfig, RoutingPolicyDefaultsToKvAwareAndTakesRoundRobin) {
  EXPECT_EQ(parse_cluster_config(kCluster).routing, "kv_aware");
  EXPECT_EQ(parse_cluster_config(with_line("data_dir:", "  routing: round_robin")).routing, "round_robin");
  EXPECT_THAT(error_of(with_line("data_dir:", "  routing: fastest")),
              AllOf(HasSubstr("cluster.routing: unknown policy 'fastest' (kv_aware | round_robin)"),
                    HasSubstr("(line 4, column")));
}

// TLS on the storage data path is the default: each member's files under
// <cluster dir>/tls, the worker's remote tier presents its own and expects the
// storage node's name; plaintext only when said; a relative dir is under the file's.
TEST(ClusterConfig, TlsIsOnByDefaultAndPlaintextOnlyWhenSaid) {
  const ClusterConfig c = parse_cluster_config(kCluster, "/etc/bs/c.yaml");
  EXPECT_TRUE(c.tls);
  EXPECT_EQ(c.tls_dir, "/srv/bs/test/tls");
  EXPECT_EQ(c.ca_cert_path(), "/srv/bs/test/tls/ca.pem");
  EXPECT_EQ(c.ca_key_path(), "/srv/bs/test/tls/ca.key");
  const tls::Files w1 = c.member_tls("w1");
  EXPECT_EQ(w1.ca, "/srv/bs/test/tls/ca.pem");
  EXPECT_EQ(w1.cert, "/srv/bs/test/tls/w1.pem");
  EXPECT_EQ(w1.key, "/srv/bs/test/tls/w1.key");
  const RuntimeConfig r = member_runtime_config(c, "w1");
  EXPECT_EQ(r.remote.tls, w1);
  EXPECT_EQ(r.remote.tls_peer_name, "store");
  EXPECT_EQ(parse_cluster_config(with_line("data_dir:", "  data_dir: /srv/bs\n  tls: {dir: certs}"), "/etc/bs/c.yaml")
                .tls_dir,
            "/etc/bs/certs");
  EXPECT_EQ(parse_cluster_config(with_line("data_dir:", "  data_dir: /srv/bs\n  tls: {mode: mutual, dir: /x/t}")).tls_dir,
            "/x/t");

  const ClusterConfig plain = parse_cluster_config(with_line("data_dir:", "  data_dir: /srv/bs\n  tls: {mode: plaintext}"));
  EXPECT_FALSE(plain.tls);
  EXPECT_FALSE(plain.member_tls("w1").enabled());
  EXPECT_FALSE(member_runtime_config(plain, "w1").remote.tls.enabled());
  EXPECT_EQ(member_runtime_config(plain, "w1").remote.tls_peer_name, "");

  const std::string bad = with_line("data_dir:", "  data_dir: /srv/bs\n  tls: {mode: off}");
  EXPECT_THAT(error_of(bad), AllOf(HasSubstr("cluster.tls.mode: unknown mode 'off' (mutual: "),
                                   HasSubstr(at_line(bad, "tls:"))));
  EXPECT_THAT(error_of(with_line("data_dir:", "  data_dir: /srv/bs\n  tls: {modes: mutual}")),
              HasSubstr("cluster.tls.modes"));
}

// A storage node's data_plane: its server's threads and limits; the defaults when absent.
TEST(ClusterConfig, AStorageNodesDataPlaneLimits) {
  const ClusterConfig c = parse_cluster_config(kCluster);
  EXPECT_EQ(c.member("store").data_plane, DataPlaneLimits{});
  const ClusterConfig d = parse_cluster_config(with_line(
      "name: store", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203, data_plane: "
                     "{threads: 4, disk_threads: 8, max_connections: 500, max_connections_per_peer: 48, io_timeout: 3s, "
                     "idle_timeout: 1m}}"));
  const DataPlaneLimits& l = d.member("store").data_plane;
  EXPECT_EQ(l.threads, 4);
  EXPECT_EQ(l.disk_threads, 8);
  EXPECT_EQ(l.max_connections, 500);
  EXPECT_EQ(l.max_connections_per_peer, 48);
  EXPECT_DOUBLE_EQ(l.io_timeout_s, 3);
  EXPECT_DOUBLE_EQ(l.idle_timeout_s, 60);
  const std::string worker = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: "
                                                   "8102, data_plane: {threads: 2}}");
  EXPECT_THAT(error_of(worker), AllOf(HasSubstr("nodes[2].data_plane: only a storage node has a data_plane"),
                                      HasSubstr(at_line(worker, "name: w2"))));
  EXPECT_THAT(error_of(with_line("name: store", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, "
                                                "data_port: 7203, data_plane: {disk_threads: 0}}")),
              HasSubstr("nodes[3].data_plane.disk_threads: must be in 1..256, got 0"));
  EXPECT_THAT(error_of(with_line("name: store", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, "
                                                "data_port: 7203, data_plane: {fast: true}}")),
              HasSubstr("nodes[3].data_plane.fast"));
}

// ---- errors: each names the dotted key and its line -----------------------------

// Workers of one cluster run one model: the frontend routes by its tokens.
TEST(ClusterConfigErrors, WorkersOfDifferentModels) {
  const std::string text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: "
                                                 "8102, model: {path: /models/other.gguf}}");
  EXPECT_THAT(error_of(text),
              AllOf(HasSubstr("nodes[2].model.path: worker 'w2' runs '/models/other.gguf', worker 'w1' the default "
                              "model: a cluster's workers run one model"),
                    HasSubstr(at_line(text, "name: w2"))));
  // The same model for all (here by defaults) is fine, whatever else differs.
  EXPECT_NO_THROW(parse_cluster_config(with_line("device: {threads: 1}", "  device: {threads: 1}\n  model: {path: /m.gguf}")));
}

TEST(ClusterConfigErrors, SecretUnsetEmptyOrShort) {
  EnvGuard env({"BS_TEST_SECRET"});
  env.unset("BS_TEST_SECRET");
  std::string text = with_line("secret:", "  secret: env:BS_TEST_SECRET");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.secret: the environment variable BS_TEST_SECRET"),
                                    HasSubstr("is not set"), HasSubstr(at_line(text, "secret:"))));
  env.set("BS_TEST_SECRET", "");
  EXPECT_THAT(error_of(text), HasSubstr("BS_TEST_SECRET (from 'env:BS_TEST_SECRET') is empty"));
  env.set("BS_TEST_SECRET", "short");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.secret: $BS_TEST_SECRET holds 5 characters; a secret needs "
                                              "at least 16"),
                                    HasSubstr(at_line(text, "secret:"))));
  text = with_line("secret:", "  secret: tooshort");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.secret: the secret has 8 characters"),
                                    HasSubstr(at_line(text, "secret:"))));
  text = with_line("secret:", "");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.secret: missing"), HasSubstr("(line 2, column")));
}

TEST(ClusterConfigErrors, UnknownKeys) {
  std::string text = with_line("data_dir:", "  heartbeat_intervl: 1s");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("cluster.heartbeat_intervl: unknown key"),
                                    HasSubstr("did you mean 'cluster.heartbeat_interval'"),
                                    HasSubstr(at_line(text, "heartbeat_intervl:"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 8104, gpus: 2}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].gpus: unknown key (valid keys in nodes[4]: name, role"),
                                    HasSubstr(at_line(text, "gpus"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 8104,\n"
                   "     device: {kind: cpu, tpp: 1}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].device.tpp: unknown key (valid keys in device: kind, gpus, threads"),
                                    HasSubstr("did you mean 'device.tp'"), HasSubstr(at_line(text, "tpp"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 8104,\n"
                   "     tiers: {nvme: {}}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].tiers.nvme: unknown key"), HasSubstr("ram, ssd, remote"),
                                    HasSubstr(at_line(text, "nvme"))));
  text = with_line("tiers: {ram:", "  tiers: {ram: {budget: 1GiB}, remote: {enable: true}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("defaults.tiers.remote.enable: unknown key"),
                                    HasSubstr(at_line(text, "enable:"))));
  text = "cluster: {name: x, secret: 0123456789abcdef0123}\nnode: []\n";
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("node: unknown key (valid keys at the top level: cluster, defaults, nodes, hosts)"),
                                    HasSubstr("did you mean 'nodes'"), HasSubstr("(line 2, column 1)")));
}

TEST(ClusterConfigErrors, RolesAndRoleKeys) {
  std::string text = with_node("  - {name: w3, role: router, host: 127.0.0.1, port: 7104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].role: unknown role 'router' (frontend, worker, storage)"),
                                    HasSubstr(at_line(text, "router"))));
  text = with_node("  - {name: w3, host: 127.0.0.1, port: 7104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].role: missing"), HasSubstr(at_line(text, "name: w3"))));
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 8104, data_port: 9000}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].data_port: only a storage node has a data_port"),
                                    HasSubstr(at_line(text, "name: w3"))));
  text = with_line("role: storage", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203,\n"
                                    "     http_port: 8000}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[3].http_port: a storage node serves no HTTP"),
                                    HasSubstr(at_line(text, "     http_port: 8000}"))));
  text = with_line("role: frontend", "  - {name: front, role: frontend, host: 127.0.0.1, port: 7100, http_port: 8000,\n"
                                     "     model: {path: /m.gguf}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[0].model: a frontend runs no model"),
                                    HasSubstr(at_line(text, "path: /m.gguf"))));
  text = with_line("role: storage", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203,\n"
                                    "     tiers: {ram: {budget: 1GiB}}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[3].tiers.ram: a storage node serves its ssd tier only"),
                                    HasSubstr(at_line(text, "     tiers: {ram"))));
  text = with_line("role: storage", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203,\n"
                                    "     blend: {ratio: 0.5}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[3].blend: a storage node only keeps chunk KV"),
                                    HasSubstr(at_line(text, "     blend: {ratio"))));
  text = with_line("role: storage", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203,\n"
                                    "     tiers: {ssd: {enabled: false}}}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[3].tiers.ssd.enabled: a storage node serves its ssd tier"),
                                    HasSubstr(at_line(text, "enabled: false"))));
}

TEST(ClusterConfigErrors, MissingKeysPerRole) {
  std::string text = with_line("role: storage", "  - {name: store, role: storage, host: 127.0.0.3, port: 7103}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[3].data_port: missing: a storage node serves KV bytes"),
                                    HasSubstr(at_line(text, "name: store"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, port: 7102}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].http_port: missing: a worker serves its OpenAI endpoint"),
                                    HasSubstr(at_line(text, "name: w2"))));
  text = with_line("role: frontend", "  - {name: front, role: frontend, host: 127.0.0.1, port: 7100}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[0].http_port: missing: a frontend serves the users'"),
                                    HasSubstr(at_line(text, "name: front"))));
  text = with_line("name: w2", "  - {role: worker, host: 127.0.0.1, port: 7102, http_port: 8102}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].name: missing"), HasSubstr(at_line(text, "port: 7102"))));
  text = with_line("name: w2", "  - {name: w2, role: worker, port: 7102, http_port: 8102}");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[2].host: missing"));
  text = with_line("name: w2", "  - {name: w2, role: worker, host: 127.0.0.1, http_port: 8102}");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[2].port: missing"));
  text = with_line("name: w2", "  - {name: 'w 2', role: worker, host: 127.0.0.1, port: 7102, http_port: 8102}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[2].name: 'w 2' is not a valid name"),
                                    HasSubstr(at_line(text, "'w 2'"))));
  text = "cluster: {name: x, secret: 0123456789abcdef0123}\nnodes: {a: 1}\n";
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes: expected a list of nodes"), HasSubstr(at_line(text, "a: 1"))));
  EXPECT_THAT(error_of("nodes: []\n"), HasSubstr("cluster: missing"));
  EXPECT_THAT(error_of("cluster: {name: x, secret: 0123456789abcdef0123}\n"), HasSubstr("nodes: missing"));
}

TEST(ClusterConfigErrors, DuplicateNamesAndAddresses) {
  std::string text = with_node("  - {name: w1, role: worker, host: 127.0.0.1, port: 7104, http_port: 8104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].name: 'w1' is also the name of nodes[1] 'w1' (line 10"),
                                    HasSubstr(at_line(text, "port: 7104"))));
  // Another node's http_port taken as a control port.
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 8101, http_port: 8104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].port: 127.0.0.1:8101 is also nodes[1].http_port (line 10"),
                                    HasSubstr(at_line(text, "port: 8101"))));
  // One node's own two ports.
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.1, port: 7104, http_port: 7104}");
  EXPECT_THAT(error_of(text), AllOf(HasSubstr("nodes[4].http_port: 127.0.0.1:7104 is also nodes[4].port"),
                                    HasSubstr(at_line(text, "port: 7104"))));
  // The storage node's data_port.
  text = with_node("  - {name: w3, role: worker, host: 127.0.0.3, port: 7104, http_port: 7203}");
  EXPECT_THAT(error_of(text), HasSubstr("nodes[4].http_port: 127.0.0.3:7203 is also nodes[3].data_port"));
  // The same port on another host is fine.
  EXPECT_NO_THROW(parse_cluster_config(
      with_node("  - {name: w3, role: worker, host: 127.0.0.9, port: 7101, http_port: 8101}")));
}

// ---- the runtime config's remote tier -----------------------------------------

TEST(RemoteTierConfig, OffByDefault) {
  const RuntimeConfig c = default_runtime_config();
  EXPECT_FALSE(c.remote.enabled);
  EXPECT_EQ(c.remote, RemoteTierConfig{});  // configs/default.yaml says what the struct does
  EXPECT_EQ(c.remote.loaders, 2);
  EXPECT_EQ(c.remote.layers_in_flight, 4);
  EXPECT_EQ(c.remote.max_connections, 16);
  EXPECT_DOUBLE_EQ(c.remote.connect_timeout_s, 2);
  EXPECT_DOUBLE_EQ(c.remote.io_timeout_s, 5);
  EXPECT_DOUBLE_EQ(c.remote.retry_after_s, 1);
}

TEST(RemoteTierConfig, EveryKeyOfASingleNode) {
  EnvGuard env({"BS_TEST_SECRET"});
  env.set("BS_TEST_SECRET", kSecret);
  const RuntimeConfig c = parse_runtime_config(R"(tiers:
  remote:
    enabled: true
    host: 10.0.0.5
    port: 7202
    secret: env:BS_TEST_SECRET
    loaders: 3
    layers_in_flight: 8
    max_connections: 2
    write_back: false
    connect_timeout: 500ms
    io_timeout: 2
    retry_after: 1m
)");
  EXPECT_TRUE(c.remote.enabled);
  EXPECT_EQ(c.remote.host, "10.0.0.5");
  EXPECT_EQ(c.remote.port, 7202);
  EXPECT_EQ(c.remote.secret, kSecret);
  EXPECT_EQ(c.remote.loaders, 3);
  EXPECT_EQ(c.remote.layers_in_flight, 8);
  EXPECT_EQ(c.remote.max_connections, 2);
  EXPECT_FALSE(c.remote.write_back);
  EXPECT_DOUBLE_EQ(c.remote.connect_timeout_s, 0.5);
  EXPECT_DOUBLE_EQ(c.remote.io_timeout_s, 2);
  EXPECT_DOUBLE_EQ(c.remote.retry_after_s, 60);
}

TEST(RemoteTierConfig, EnabledAloneNamesWhatIsMissing) {
  std::string e = runtime_error_of("tiers:\n  remote:\n    enabled: true\n");
  EXPECT_THAT(e, AllOf(HasSubstr("tiers.remote.host: the remote tier is enabled but has no host"),
                       HasSubstr("(line 3, column 14)")));
  e = runtime_error_of("tiers: {remote: {enabled: true, host: h}}");
  EXPECT_THAT(e, HasSubstr("tiers.remote.port: the remote tier is enabled but has no port"));
  e = runtime_error_of("tiers: {remote: {enabled: true, host: h, port: 7202}}");
  EXPECT_THAT(e, HasSubstr("tiers.remote.secret: the remote tier is enabled but has no secret"));
  // Off, the endpoint may stay unset.
  EXPECT_NO_THROW(parse_runtime_config("tiers: {remote: {enabled: false, loaders: 1}}"));
}

TEST(RemoteTierConfig, BadValues) {
  EXPECT_THAT(runtime_error_of("tiers: {remote: {port: 70000}}"), HasSubstr("tiers.remote.port: must be in 1..65535"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {secret: abc}}"),
              HasSubstr("tiers.remote.secret: the secret has 3 characters"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {io_timeout: 0}}"), HasSubstr("tiers.remote.io_timeout: must be a duration > 0"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {retry_after: soon}}"),
              HasSubstr("tiers.remote.retry_after: invalid duration 'soon'"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {layers_in_flight: 0}}"),
              HasSubstr("tiers.remote.layers_in_flight: must be >= 1"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {budget: 1GiB}}"), HasSubstr("tiers.remote.budget: unknown key"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {enabled: yes please}}"),
              HasSubstr("tiers.remote.enabled: expected true or false"));
  // TLS keys: all three files or none.
  EXPECT_THAT(runtime_error_of("tiers: {remote: {tls: {ca: ca.pem, cert: w.pem}}}"),
              HasSubstr("tiers.remote.tls.key: TLS to the storage node needs ca, cert and key (key is not set)"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {tls: {cert: w.pem, key: w.key}}}"),
              HasSubstr("tiers.remote.tls.ca:"));
  EXPECT_THAT(runtime_error_of("tiers: {remote: {tls: {ca: a, cert: b, key: c, name: d}}}"),
              HasSubstr("tiers.remote.tls.name: unknown key"));
  const RuntimeConfig c =
      parse_runtime_config("tiers: {remote: {tls: {ca: /c/ca.pem, cert: /c/w.pem, key: /c/w.key, peer_name: node-a}}}");
  EXPECT_EQ(c.remote.tls, (tls::Files{"/c/ca.pem", "/c/w.pem", "/c/w.key"}));
  EXPECT_EQ(c.remote.tls_peer_name, "node-a");
  EXPECT_FALSE(parse_runtime_config("tiers: {remote: {enabled: false}}").remote.tls.enabled());
}

TEST(Durations, Units) {
  EXPECT_DOUBLE_EQ(parse_duration("5"), 5);
  EXPECT_DOUBLE_EQ(parse_duration("0.25"), 0.25);
  EXPECT_DOUBLE_EQ(parse_duration("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(parse_duration("2s"), 2);
  EXPECT_DOUBLE_EQ(parse_duration("1.5m"), 90);
  EXPECT_DOUBLE_EQ(parse_duration(" 3 s "), 3);
  EXPECT_DOUBLE_EQ(parse_duration("0"), 0);
  for (const char* bad : {"", "s", "-1s", "1h", "1..5s", "fast", ".s"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_duration(bad), ConfigError);
  }
}

TEST(ClusterConfig, IsClusterConfigTellsTheKindsApart) {
  EXPECT_TRUE(is_cluster_config("nodes: []\n"));
  EXPECT_TRUE(is_cluster_config("cluster: {name: x}\n"));
  EXPECT_FALSE(is_cluster_config("server: {port: 80}\n"));
  EXPECT_FALSE(is_cluster_config(""));
  EXPECT_FALSE(is_cluster_config("server: [\n"));
}

}  // namespace
}  // namespace bs
