// The runtime's YAML configuration: the embedded default, every key read, sizes, paths
// and files. Refused configurations: test_runtime_config_errors.cpp.
#include "actors/config/runtime_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>


namespace bs {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

const std::string kSourceConfig = std::string(BLENDSERVE_FIXTURES) + "/../../configs/default.yaml";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}


std::string size_error_of(const std::string& text) {
  try {
    const int64_t v = parse_byte_size(text);
    ADD_FAILURE() << "'" << text << "' parsed as " << v;
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_same(const RuntimeConfig& a, const RuntimeConfig& b) {
  EXPECT_EQ(a.model_path, b.model_path);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.decode_activations, b.decode_activations);
  EXPECT_EQ(a.batch_invariant, b.batch_invariant);
  EXPECT_EQ(a.chat_template, b.chat_template);
  EXPECT_EQ(a.device_kind, b.device_kind);
  EXPECT_EQ(a.gpus, b.gpus);
  EXPECT_EQ(a.device_wait_timeout, b.device_wait_timeout);
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.communicator, b.communicator);
  EXPECT_EQ(a.kv_cache_bytes, b.kv_cache_bytes);
  EXPECT_EQ(a.kv_dtype, b.kv_dtype);
  EXPECT_EQ(a.data_dir, b.data_dir);
  EXPECT_EQ(a.ram, b.ram);
  EXPECT_EQ(a.ssd, b.ssd);
  EXPECT_EQ(a.remote, b.remote);
  EXPECT_EQ(a.blend.mode, b.blend.mode);
  EXPECT_EQ(a.blend.ratio, b.blend.ratio);
  EXPECT_EQ(a.blend.check_layers, b.blend.check_layers);
  EXPECT_EQ(a.blend.schedule, b.blend.schedule);
  EXPECT_EQ(a.blend.min_tokens, b.blend.min_tokens);
  EXPECT_EQ(a.blend.deviation, b.blend.deviation);
  EXPECT_EQ(a.blend.quota, b.blend.quota);
  EXPECT_EQ(a.blend.filtering, b.blend.filtering);
  EXPECT_EQ(a.blend.selection, b.blend.selection);
  EXPECT_EQ(a.blend.sink_tokens, b.blend.sink_tokens);
  EXPECT_EQ(a.blend.query_first_from_layer, b.blend.query_first_from_layer);
  EXPECT_EQ(a.chunk_prelude, b.chunk_prelude);
  EXPECT_EQ(a.adaptive_ratio, b.adaptive_ratio);
  EXPECT_EQ(a.write_back, b.write_back);
  EXPECT_EQ(a.find_pasted, b.find_pasted);
  EXPECT_EQ(a.prefix_block_tokens, b.prefix_block_tokens);
  EXPECT_EQ(a.learn_passage_tokens, b.learn_passage_tokens);
  EXPECT_EQ(a.max_requests, b.max_requests);
  EXPECT_EQ(a.max_queue, b.max_queue);
  EXPECT_EQ(a.max_decode_batch, b.max_decode_batch);
  EXPECT_EQ(a.decode_interleave, b.decode_interleave);
  EXPECT_EQ(a.max_prompt_tokens, b.max_prompt_tokens);
  EXPECT_EQ(a.trace_history, b.trace_history);
  EXPECT_EQ(a.load_timeout, b.load_timeout);
  EXPECT_EQ(a.max_request_seconds, b.max_request_seconds);
  EXPECT_EQ(a.max_restarts, b.max_restarts);
  EXPECT_EQ(a.restart_window, b.restart_window);
  EXPECT_EQ(a.restart_backoff, b.restart_backoff);
  EXPECT_EQ(a.restart_backoff_max, b.restart_backoff_max);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.port, b.port);
  EXPECT_EQ(a.api_keys, b.api_keys);
  EXPECT_EQ(a.max_body_bytes, b.max_body_bytes);
  EXPECT_EQ(a.server_threads, b.server_threads);
  EXPECT_EQ(a.model_name, b.model_name);
}

// Sets or unsets environment variables for one test and restores them after.
class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::string> names) {
    for (auto& n : names) {
      const char* v = std::getenv(n.c_str());
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
    }
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved_) {
      if (v) setenv(n.c_str(), v->c_str(), 1);
      else unsetenv(n.c_str());
    }
  }
  void set(const std::string& n, const std::string& v) { setenv(n.c_str(), v.c_str(), 1); }
  void unset(const std::string& n) { unsetenv(n.c_str()); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// ---- the embedded default -----------------------------------------------------

TEST(RuntimeConfigDefault, EmbeddedTextIsTheSourceFile) {
  const std::string file = read_text(kSourceConfig);
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(default_config_text(), file);
  EXPECT_THAT(default_config_text(), HasSubstr("check_layers: [1, 2, 3, 4, 5, 6]"));
}

TEST(RuntimeConfigDefault, ValuesAreTheDocumentedOnes) {
  const RuntimeConfig c = default_runtime_config();
  EXPECT_EQ(c.model_path, "");
  EXPECT_EQ(c.precision, "auto");
  EXPECT_EQ(c.device_kind, "cpu");
  EXPECT_EQ(c.threads, 0);
  EXPECT_EQ(c.data_dir, "");
  EXPECT_TRUE(c.ram.enabled);
  EXPECT_EQ(c.ram.budget_bytes, 2147483648LL);
  EXPECT_TRUE(c.ssd.enabled);
  EXPECT_EQ(c.ssd.path, "kv");
  EXPECT_EQ(c.ssd.budget_bytes, 8LL << 30);
  EXPECT_TRUE(c.ssd.direct_io);
  EXPECT_EQ(c.ssd.throttle_bytes_per_s, 0.0);
  EXPECT_EQ(c.ssd.write_queue_bytes, 256LL << 20);
  EXPECT_EQ(c.blend.mode, BlendMode::Blend);
  EXPECT_FLOAT_EQ(c.blend.ratio, 0.16f);
  EXPECT_EQ(c.blend.selection, Selection::QueryFirst);
  EXPECT_TRUE(c.adaptive_ratio);
  EXPECT_EQ(c.blend.check_layers, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(c.blend.schedule.empty());
  EXPECT_EQ(c.blend.min_tokens, 1);
  EXPECT_EQ(c.blend.deviation, Deviation::KV);
  EXPECT_TRUE(c.write_back);
  EXPECT_EQ(c.max_requests, 8);
  EXPECT_EQ(c.max_queue, 64);
  EXPECT_EQ(c.max_decode_batch, 16);
  EXPECT_DOUBLE_EQ(c.decode_interleave, 0.05);
  EXPECT_EQ(c.max_prompt_tokens, 0);
  EXPECT_EQ(c.trace_history, 64);
  EXPECT_DOUBLE_EQ(c.load_timeout, 60.0);
  EXPECT_DOUBLE_EQ(c.max_request_seconds, 600.0);
  EXPECT_EQ(c.max_restarts, 5);
  EXPECT_DOUBLE_EQ(c.restart_window, 60.0);
  EXPECT_DOUBLE_EQ(c.restart_backoff, 0.1);
  EXPECT_DOUBLE_EQ(c.restart_backoff_max, 10.0);
  EXPECT_DOUBLE_EQ(c.device_wait_timeout, 60.0);
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 8000);
}

TEST(RuntimeConfigDefault, EqualsTheSourceFileAndTheStructDefaults) {
  const RuntimeConfig embedded = default_runtime_config();
  expect_same(embedded, parse_runtime_config(read_text(kSourceConfig)));
  expect_same(embedded, load_runtime_config(kSourceConfig));
  // So a --config file only needs the keys it changes.
  expect_same(embedded, RuntimeConfig{});
}

TEST(RuntimeConfigDefault, EmptyDocumentsGiveTheDefaults) {
  for (const char* text : {"", "{}", "---\n", "~\n", "# only a comment\n", "server:\n", "tiers: {ram: {}}\n"}) {
    SCOPED_TRACE(text);
    const RuntimeConfig c = parse_runtime_config(text);
    expect_same(c, RuntimeConfig{});
    EXPECT_EQ(c.port, 8000);
    EXPECT_EQ(c.ram.budget_bytes, 2LL << 30);
  }
}

// ---- every key read -----------------------------------------------------------

TEST(RuntimeConfigParse, EveryKeyIsRead) {
  const RuntimeConfig c = parse_runtime_config(R"(
model:
  path: /models/m.gguf
  precision: bf16
  decode_activations: int8
  batch_invariant: true
  chat_template: /models/chat.jinja
device:
  kind: cpu
  threads: 3
  tp: 3
  communicator: inprocess
  kv_cache_bytes: 1.5GiB
  kv_dtype: bf16
  wait_timeout: 2.5
data_dir: /var/cache/bs
tiers:
  ram: {enabled: false, budget: 512MiB}
  ssd:
    enabled: true
    path: /fast/kv
    budget: 1.5GiB
    direct_io: false
    throttle: 100MB
    write_queue: 64MiB
blend:
  mode: reuse
  ratio: 0.2
  adaptive_ratio: false
  check_layers: [1, 4, 8]
  schedule: [0.6, 0.3]
  min_tokens: 0
  deviation: k
  quota: per-chunk
  filtering: two-pass
  selection: deviation
  sink_tokens: 2
  query_first_from_layer: 3
  chunk_prelude: "<|im_start|>system\n"
  write_back: no
  prefix_block_tokens: 32
  learn_passage_tokens: 0
limits: {max_requests: 2, max_queue: 0, max_decode_batch: 4, decode_interleave: 0.2, max_prompt_tokens: 4096,
         trace_history: 0, load_timeout: 5.5, max_request_seconds: 0, max_restarts: 2, restart_window: 1m,
         restart_backoff: 250ms, restart_backoff_max: 3s}
server: {host: 0.0.0.0, port: 9001, api_keys: [sk-test-0001, sk-test-0002], max_body: 64KiB, threads: 5,
         model_name: my-model}
)");
  EXPECT_EQ(c.model_path, "/models/m.gguf");
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.decode_activations, "int8");
  EXPECT_TRUE(c.batch_invariant);
  EXPECT_EQ(c.chat_template, "/models/chat.jinja");
  EXPECT_EQ(c.device_kind, "cpu");
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.tp, 3);
  EXPECT_EQ(c.communicator, "inprocess");
  EXPECT_EQ(c.kv_cache_bytes, int64_t{3} << 29);
  EXPECT_EQ(c.kv_dtype, "bf16");
  EXPECT_DOUBLE_EQ(c.device_wait_timeout, 2.5);
  EXPECT_EQ(c.data_dir, "/var/cache/bs");
  EXPECT_FALSE(c.ram.enabled);
  EXPECT_EQ(c.ram.budget_bytes, 512LL << 20);
  EXPECT_TRUE(c.ssd.enabled);
  EXPECT_EQ(c.ssd.path, "/fast/kv");
  EXPECT_EQ(c.ssd.budget_bytes, 1610612736LL);
  EXPECT_FALSE(c.ssd.direct_io);
  EXPECT_EQ(c.ssd.throttle_bytes_per_s, 1e8);
  EXPECT_EQ(c.ssd.write_queue_bytes, 64LL << 20);
  EXPECT_EQ(c.blend.mode, BlendMode::Reuse);
  EXPECT_FLOAT_EQ(c.blend.ratio, 0.2f);
  EXPECT_FALSE(c.adaptive_ratio);
  EXPECT_EQ(c.blend.check_layers, (std::vector<int>{1, 4, 8}));
  EXPECT_EQ(c.blend.schedule, (std::vector<float>{0.6f, 0.3f}));
  EXPECT_EQ(c.blend.min_tokens, 0);
  EXPECT_EQ(c.blend.deviation, Deviation::K);
  EXPECT_EQ(c.blend.quota, Quota::PerChunk);
  EXPECT_EQ(c.blend.filtering, Filtering::TwoPass);
  EXPECT_EQ(c.blend.sink_tokens, 2);
  EXPECT_EQ(c.blend.query_first_from_layer, 3);
  EXPECT_EQ(c.chunk_prelude, "<|im_start|>system\n");
  EXPECT_FALSE(c.write_back);
  EXPECT_EQ(c.prefix_block_tokens, 32);
  EXPECT_EQ(c.learn_passage_tokens, 0);
  EXPECT_EQ(c.max_requests, 2);
  EXPECT_EQ(c.max_queue, 0);
  EXPECT_EQ(c.max_decode_batch, 4);
  EXPECT_DOUBLE_EQ(c.decode_interleave, 0.2);
  EXPECT_EQ(c.max_prompt_tokens, 4096);
  EXPECT_EQ(c.trace_history, 0);
  EXPECT_DOUBLE_EQ(c.load_timeout, 5.5);
  EXPECT_DOUBLE_EQ(c.max_request_seconds, 0.0);
  EXPECT_EQ(c.max_restarts, 2);
  EXPECT_DOUBLE_EQ(c.restart_window, 60.0);
  EXPECT_DOUBLE_EQ(c.restart_backoff, 0.25);
  EXPECT_DOUBLE_EQ(c.restart_backoff_max, 3.0);
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.port, 9001);
  EXPECT_EQ(c.api_keys, (std::vector<std::string>{"sk-test-0001", "sk-test-0002"}));
  EXPECT_EQ(c.max_body_bytes, 64 << 10);
  EXPECT_EQ(c.server_threads, 5);
  EXPECT_EQ(c.model_name, "my-model");
}

TEST(RuntimeConfigParse, AbsentKeysKeepTheDefaults) {
  const RuntimeConfig c = parse_runtime_config("tiers:\n  ssd:\n    budget: 100MB\nserver:\n  port: 8080\n");
  EXPECT_EQ(c.ssd.budget_bytes, 100000000LL);
  EXPECT_EQ(c.ssd.path, "kv");
  EXPECT_TRUE(c.ssd.direct_io);
  EXPECT_EQ(c.ram.budget_bytes, 2LL << 30);
  EXPECT_EQ(c.port, 8080);
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_FLOAT_EQ(c.blend.ratio, 0.16f);  // query-first: KL under 0.05 on both sets
  EXPECT_EQ(c.blend.selection, Selection::QueryFirst);
}

TEST(RuntimeConfigParse, ModesDeviationsPrecisions) {
  EXPECT_EQ(parse_runtime_config("blend: {mode: full}").blend.mode, BlendMode::Full);
  EXPECT_EQ(parse_runtime_config("blend: {mode: prefix}").blend.mode, BlendMode::Prefix);
  EXPECT_EQ(parse_runtime_config("blend: {mode: blend}").blend.mode, BlendMode::Blend);
  EXPECT_EQ(parse_runtime_config("blend: {deviation: v}").blend.deviation, Deviation::V);
  EXPECT_EQ(parse_runtime_config("blend: {deviation: kv}").blend.deviation, Deviation::KV);
  EXPECT_EQ(parse_runtime_config("blend: {quota: global}").blend.quota, Quota::Global);
  EXPECT_EQ(parse_runtime_config("blend: {filtering: single-pass}").blend.filtering, Filtering::SinglePass);
  EXPECT_EQ(parse_runtime_config("blend: {selection: impact}").blend.selection, Selection::Impact);
  EXPECT_FALSE(parse_runtime_config("blend: {find_pasted: false}").find_pasted);
  EXPECT_TRUE(parse_runtime_config("").find_pasted);
  EXPECT_EQ(parse_runtime_config("blend: {selection: attention}").blend.selection, Selection::Attention);
  EXPECT_EQ(parse_runtime_config("blend: {selection: query-first}").blend.selection, Selection::QueryFirst);
  EXPECT_EQ(parse_runtime_config("blend: {selection: deviation, filtering: two-pass}").blend.selection,
            Selection::Deviation);
  EXPECT_EQ(parse_runtime_config("model: {precision: f32}").precision, "f32");
}

TEST(RuntimeConfigParse, BoundaryValuesAreAccepted) {
  EXPECT_EQ(parse_runtime_config("server: {port: 1}").port, 1);
  EXPECT_EQ(parse_runtime_config("server: {port: 65535}").port, 65535);
  EXPECT_FLOAT_EQ(parse_runtime_config("blend: {ratio: 0}").blend.ratio, 0.0f);
  EXPECT_FLOAT_EQ(parse_runtime_config("blend: {ratio: 1}").blend.ratio, 1.0f);
  EXPECT_EQ(parse_runtime_config("limits: {max_requests: 1}").max_requests, 1);
  // Schedule values may equal the ratio and each other (not increasing is enough).
  const RuntimeConfig c = parse_runtime_config("blend: {ratio: 0.5, check_layers: [1, 2, 3], schedule: [0.5, 0.5]}");
  EXPECT_EQ(c.blend.schedule, (std::vector<float>{0.5f, 0.5f}));
  // A disabled tier may have a budget of 0.
  EXPECT_FALSE(parse_runtime_config("tiers: {ram: {enabled: false, budget: 0}}").ram.enabled);
  EXPECT_EQ(parse_runtime_config("tiers: {ssd: {throttle: 100MB/s}}").ssd.throttle_bytes_per_s, 1e8);
  EXPECT_EQ(parse_runtime_config("tiers: {ssd: {throttle: 4096}}").ssd.throttle_bytes_per_s, 4096.0);
}

// ---- unknown keys -------------------------------------------------------------

TEST(RuntimeConfigSizes, Units) {
  EXPECT_EQ(parse_byte_size("2GiB"), 2147483648LL);
  EXPECT_EQ(parse_byte_size("512MiB"), 536870912LL);
  EXPECT_EQ(parse_byte_size("100MB"), 100000000LL);
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 1610612736LL);
  EXPECT_EQ(parse_byte_size("0"), 0);
  EXPECT_EQ(parse_byte_size("7B"), 7);
  EXPECT_EQ(parse_byte_size("3KB"), 3000);
  EXPECT_EQ(parse_byte_size("3KiB"), 3072);
  EXPECT_EQ(parse_byte_size("2GB"), 2000000000LL);
  EXPECT_EQ(parse_byte_size("1TB"), 1000000000000LL);
  EXPECT_EQ(parse_byte_size("1TiB"), 1LL << 40);
  EXPECT_EQ(parse_byte_size(" 2 GiB "), 2147483648LL);
  EXPECT_EQ(parse_byte_size("0.5KiB"), 512);
  EXPECT_EQ(parse_byte_size("1.0001KiB"), 1024);  // fractions of a byte are dropped
  EXPECT_EQ(parse_byte_size("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parse_byte_size("8388607TiB"), 8388607LL << 40);
}

TEST(RuntimeConfigSizes, Rejected) {
  EXPECT_THAT(size_error_of("-1"), HasSubstr("invalid byte size '-1': negative"));
  EXPECT_THAT(size_error_of("abc"), HasSubstr("invalid byte size 'abc': expected a number"));
  EXPECT_THAT(size_error_of("10XB"), HasSubstr("invalid byte size '10XB': unknown unit 'XB'"));
  EXPECT_THAT(size_error_of(""), HasSubstr("empty"));
  EXPECT_THAT(size_error_of("1.5"), HasSubstr("a fraction of a byte"));
  EXPECT_THAT(size_error_of("1."), HasSubstr("expected digits after '.'"));
  EXPECT_THAT(size_error_of("1e9"), HasSubstr("unknown unit 'e9'"));
  EXPECT_THAT(size_error_of("2gib"), HasSubstr("unknown unit 'gib'"));
  EXPECT_THAT(size_error_of("9223372036854775808"), HasSubstr("too large"));
  EXPECT_THAT(size_error_of("99999999999999999999999"), HasSubstr("too large"));
  EXPECT_THAT(size_error_of("8388608TiB"), HasSubstr("too large"));
  EXPECT_THAT(size_error_of("10000000EiB"), HasSubstr("unknown unit 'EiB'"));
}

// ---- paths --------------------------------------------------------------------

const std::vector<std::string> kDirEnv{"BLENDSERVE_DATA_DIR", "XDG_CACHE_HOME", "HOME"};

TEST(RuntimeConfigPaths, DataDirFromTheConfig) {
  EnvGuard env(kDirEnv);
  env.set("BLENDSERVE_DATA_DIR", "/env/dir");
  env.set("HOME", "/home/tester");
  RuntimeConfig c;
  c.data_dir = "/srv/bs/";
  EXPECT_EQ(resolve_data_dir(c), "/srv/bs");
  c.data_dir = "~/bsdata";
  EXPECT_EQ(resolve_data_dir(c), "/home/tester/bsdata");
  c.data_dir = "~";
  EXPECT_EQ(resolve_data_dir(c), "/home/tester");
  c.data_dir = "rel/dir";
  EXPECT_EQ(resolve_data_dir(c), (fs::current_path() / "rel/dir").string());
  env.unset("HOME");
  c.data_dir = "~/bsdata";
  try {
    resolve_data_dir(c);
    ADD_FAILURE() << "~/ without $HOME resolved";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("data_dir: '~/bsdata' needs $HOME"));
  }
}

TEST(RuntimeConfigPaths, DataDirFallbacks) {
  EnvGuard env(kDirEnv);
  const RuntimeConfig c;  // data_dir empty
  env.set("BLENDSERVE_DATA_DIR", "/env/dir");
  env.set("XDG_CACHE_HOME", "/xdg");
  env.set("HOME", "/home/tester");
  EXPECT_EQ(resolve_data_dir(c), "/env/dir");
  env.unset("BLENDSERVE_DATA_DIR");
  EXPECT_EQ(resolve_data_dir(c), "/xdg/blendserve");
  env.set("BLENDSERVE_DATA_DIR", "");  // empty counts as unset
  EXPECT_EQ(resolve_data_dir(c), "/xdg/blendserve");
  env.set("XDG_CACHE_HOME", "relative/cache");  // invalid per the XDG spec: ignored
  EXPECT_EQ(resolve_data_dir(c), "/home/tester/.cache/blendserve");
  env.unset("XDG_CACHE_HOME");
  EXPECT_EQ(resolve_data_dir(c), "/home/tester/.cache/blendserve");
  env.unset("HOME");
  EXPECT_EQ(resolve_data_dir(c), "/tmp/blendserve");
}

TEST(RuntimeConfigPaths, SsdPath) {
  EnvGuard env(kDirEnv);
  env.unset("BLENDSERVE_DATA_DIR");
  env.set("HOME", "/home/tester");
  RuntimeConfig c;
  c.data_dir = "/data";
  EXPECT_EQ(resolve_ssd_path(c), "/data/kv");  // the default "kv"
  c.ssd.path = "/mnt/nvme/kv/";
  EXPECT_EQ(resolve_ssd_path(c), "/mnt/nvme/kv");
  c.ssd.path = "cache/../kv2";
  EXPECT_EQ(resolve_ssd_path(c), "/data/kv2");
  c.data_dir = "";
  env.set("XDG_CACHE_HOME", "/xdg");
  c.ssd.path = "kv";
  EXPECT_EQ(resolve_ssd_path(c), "/xdg/blendserve/kv");
  c.ssd.path = "~/kvs";
  EXPECT_EQ(resolve_ssd_path(c), "/home/tester/kvs");
}

// ---- files --------------------------------------------------------------------

TEST(RuntimeConfigFile, MissingFileNamesThePath) {
  const std::string path = (fs::path(testing::TempDir()) / "no_such_dir_bs" / "missing.yaml").string();
  try {
    load_runtime_config(path);
    ADD_FAILURE() << "a missing file loaded";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("cannot read config '" + path + "'"),
                                             HasSubstr("No such file or directory")));
  }
  try {
    load_runtime_config(testing::TempDir());
    ADD_FAILURE() << "a directory loaded";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("it is a directory"));
  }
}

TEST(RuntimeConfigFile, ErrorsInAFileArePrefixedWithItsPath) {
  const fs::path path = fs::path(testing::TempDir()) / "bs_runtime_config_test.yaml";
  {
    std::ofstream out(path);
    out << "server:\n  port: 8100\ntiers:\n  ram: {budget: 1GiB}\n";
  }
  const RuntimeConfig c = load_runtime_config(path.string());
  EXPECT_EQ(c.port, 8100);
  EXPECT_EQ(c.ram.budget_bytes, 1LL << 30);
  {
    std::ofstream out(path);
    out << "server:\n  port: 0\n";
  }
  try {
    load_runtime_config(path.string());
    ADD_FAILURE() << "port 0 loaded";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(path.string() + ": server.port: must be in 1..65535"));
  }
  fs::remove(path);
}

}  // namespace
}  // namespace bs
