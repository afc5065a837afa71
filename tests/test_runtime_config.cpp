// The runtime's YAML configuration: the embedded default, every key, and an error
// naming the key for each kind of mistake.
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

#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"

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

// The message of the ConfigError the text raises; a test failure if it parses.
std::string error_of(const std::string& yaml) {
  try {
    parse_runtime_config(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without an error:\n" << yaml;
  return "";
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

TEST(RuntimeConfigErrors, UnknownTopLevelKeyListsTheSections) {
  const std::string e = error_of("servr:\n  port: 80\n");
  EXPECT_THAT(e, HasSubstr("servr: unknown key"));
  EXPECT_THAT(e, HasSubstr("model, device, data_dir, tiers, blend, limits, server"));
  EXPECT_THAT(e, HasSubstr("did you mean 'server'?"));
  EXPECT_THAT(e, HasSubstr("line 1, column 1"));
}

TEST(RuntimeConfigErrors, UnknownNestedKeyNamesItsFullPath) {
  std::string e = error_of("tiers:\n  ram:\n    budgte: 1GiB\n");
  EXPECT_THAT(e, HasSubstr("tiers.ram.budgte: unknown key"));
  EXPECT_THAT(e, HasSubstr("valid keys in tiers.ram: enabled, budget, loaders"));
  EXPECT_THAT(e, HasSubstr("did you mean 'tiers.ram.budget'?"));
  EXPECT_THAT(e, HasSubstr("line 3, column 5"));
  // ssd keys are not ram keys.
  e = error_of("tiers: {ram: {path: /x}}");
  EXPECT_THAT(e, HasSubstr("tiers.ram.path: unknown key"));
  EXPECT_THAT(e, HasSubstr("enabled, budget, loaders)"));
  e = error_of("tiers: {nvme: {}}");
  EXPECT_THAT(e, AllOf(HasSubstr("tiers.nvme: unknown key"), HasSubstr("ram, ssd")));
  e = error_of("blend: {zzzzzzzz: 1}");
  EXPECT_THAT(e, AllOf(HasSubstr("blend.zzzzzzzz: unknown key"),
                       HasSubstr("mode, ratio, adaptive_ratio, check_layers, schedule, min_tokens, deviation, quota, "
                                 "filtering, selection, sink_tokens, query_first_from_layer, chunk_prelude, write_back, "
                                 "find_pasted, prefix_block_tokens, learn_passage_tokens"),
                       Not(HasSubstr("did you mean"))));
  EXPECT_THAT(error_of("limits: {max_request: 4}"), HasSubstr("limits.max_request: unknown key"));
  EXPECT_THAT(error_of("blend: {prefix_block_tokens: 8}"),
              HasSubstr("blend.prefix_block_tokens: must be 0 (off) or 16..4096 tokens, got 8"));
  EXPECT_THAT(error_of("blend: {learn_passage_tokens: -1}"),
              HasSubstr("blend.learn_passage_tokens: must be >= 0, got -1"));
  EXPECT_THAT(error_of("device: {gpu: 1}"), AllOf(HasSubstr("device.gpu: unknown key"), HasSubstr("kind, gpus, threads")));
  EXPECT_THAT(error_of("model: {name: x}"), AllOf(HasSubstr("model.name"), HasSubstr("path, precision, decode_activations, batch_invariant, chat_template")));
  EXPECT_THAT(error_of("server: {addr: x}"), AllOf(HasSubstr("server.addr"), HasSubstr("host, port")));
}

TEST(RuntimeConfigErrors, RepeatedKey) {
  EXPECT_THAT(error_of("server:\n  port: 80\n  port: 81\n"), HasSubstr("server.port: key given twice"));
}

// ---- wrong types --------------------------------------------------------------

TEST(RuntimeConfigErrors, WrongTypesNameTheKeyAndTheExpectedType) {
  EXPECT_THAT(error_of("server: {port: abc}"), HasSubstr("server.port: expected an integer, got 'abc'"));
  EXPECT_THAT(error_of("device: {threads: 1.5}"), HasSubstr("device.threads: expected an integer, got '1.5'"));
  EXPECT_THAT(error_of("device: {kv_cache_bytes: lots}"), HasSubstr("device.kv_cache_bytes"));
  EXPECT_THAT(error_of("device: {kv_cache_bytes: -1}"), HasSubstr("device.kv_cache_bytes"));
  EXPECT_THAT(error_of("device: {kv_cache_bytes: [1]}"), HasSubstr("device.kv_cache_bytes: expected a byte size"));
  EXPECT_THAT(error_of("device: {kv_dtype: f8}"), HasSubstr("device.kv_dtype: unknown KV dtype 'f8' (f32, f16, bf16)"));
  EXPECT_THAT(error_of("device: {kv_dtype: [f16]}"), HasSubstr("device.kv_dtype"));
  EXPECT_THAT(error_of("device: {communicator: mpi}"),
              HasSubstr("device.communicator: unknown communicator 'mpi' (auto, inprocess"));
  EXPECT_THAT(error_of("device: {communicator: [nccl]}"), HasSubstr("device.communicator"));
  EXPECT_THAT(error_of("server: {port: 99999999999}"), HasSubstr("server.port: integer '99999999999' is out of range"));
  EXPECT_THAT(error_of("blend: {check_layers: 3}"), HasSubstr("blend.check_layers: expected a list of layers"));
  EXPECT_THAT(error_of("blend: {check_layers: [1, x]}"), HasSubstr("blend.check_layers[1]: expected an integer, got 'x'"));
  EXPECT_THAT(error_of("blend: {schedule: {a: 1}}"), HasSubstr("blend.schedule: expected a list of fractions"));
  EXPECT_THAT(error_of("blend: {ratio: high}"), HasSubstr("blend.ratio: expected a number, got 'high'"));
  EXPECT_THAT(error_of("blend: {ratio: [0.1]}"), HasSubstr("blend.ratio: expected a number, got a list"));
  EXPECT_THAT(error_of("server: {host: {a: 1}}"), HasSubstr("server.host: expected a string, got a map"));
  EXPECT_THAT(error_of("server: {api_keys: sk-1234567}"), HasSubstr("server.api_keys: expected a list of keys"));
  EXPECT_THAT(error_of("server: {api_keys: [short]}"), HasSubstr("server.api_keys[0]: an API key needs at least 8"));
  EXPECT_THAT(error_of("server: {max_body: 100}"), HasSubstr("server.max_body: must be at least 1KiB"));
  EXPECT_THAT(error_of("server: {threads: -1}"), HasSubstr("server.threads: must be >= 0"));
  EXPECT_THAT(error_of("device: {tp: 0}"), HasSubstr("device.tp: must be >= 1"));
  EXPECT_THAT(error_of("model: {path: [a, b]}"), HasSubstr("model.path: expected a string, got a list"));
  EXPECT_THAT(error_of("tiers: {ram: {enabled: maybe}}"), HasSubstr("tiers.ram.enabled: expected true or false, got 'maybe'"));
  EXPECT_THAT(error_of("tiers: {ram: {budget: [1]}}"), HasSubstr("tiers.ram.budget: expected a byte size"));
  EXPECT_THAT(error_of("tiers: {ssd: {throttle: {a: 1}}}"), HasSubstr("tiers.ssd.throttle: expected a bandwidth"));
  EXPECT_THAT(error_of("tiers: {ssd: {write_queue: 0}}"), HasSubstr("tiers.ssd.write_queue: a write queue of 0 bytes"));
  EXPECT_THAT(error_of("tiers: {ram: {write_queue: 1MiB}}"), HasSubstr("tiers.ram.write_queue"));
  EXPECT_THAT(error_of("tiers: {ssd: {loaders: 0}}"), HasSubstr("tiers.ssd.loaders: must be >= 1"));
  EXPECT_THAT(error_of("tiers: {ram: {loaders: many}}"), HasSubstr("tiers.ram.loaders: expected an integer"));
  EXPECT_THAT(error_of("device: {wait_timeout: 0}"),
              HasSubstr("device.wait_timeout: must be a number of seconds in (0, 86400], got 0"));
  EXPECT_THAT(error_of("device: {wait_timeout: 1e6}"), HasSubstr("device.wait_timeout: must be a number of seconds"));
  EXPECT_THAT(error_of("limits: {load_timeout: 0}"), HasSubstr("limits.load_timeout: must be a number of seconds > 0"));
  EXPECT_THAT(error_of("limits: {max_request_seconds: -1}"),
              HasSubstr("limits.max_request_seconds: must be a number of seconds >= 0 (0 = no limit), got -1"));
  EXPECT_THAT(error_of("limits: {max_restarts: -1}"), HasSubstr("limits.max_restarts: must be >= 0"));
  EXPECT_THAT(error_of("limits: {restart_window: 0}"), HasSubstr("limits.restart_window: must be a duration > 0"));
  EXPECT_THAT(error_of("limits: {restart_backoff: soon}"), HasSubstr("limits.restart_backoff:"));
  EXPECT_THAT(error_of("limits: {max_requests: }"), HasSubstr("limits.max_requests: expected an integer, got nothing"));
  // A section that is not a map.
  EXPECT_THAT(error_of("model: 3"), HasSubstr("model: expected a map with keys (path, precision, decode_activations, batch_invariant, chat_template), got '3'"));
  EXPECT_THAT(error_of("tiers: [ram, ssd]"), HasSubstr("tiers: expected a map with keys (ram, ssd, remote), got a list"));
  EXPECT_THAT(error_of("tiers: {ssd: on}"), HasSubstr("tiers.ssd: expected a map"));
}

TEST(RuntimeConfigErrors, TopLevelMustBeAMap) {
  EXPECT_THAT(error_of("- model\n- device\n"), HasSubstr("config: expected a map of sections (model, device"));
  EXPECT_THAT(error_of("just a string"), AllOf(HasSubstr("expected a map of sections"), HasSubstr("'just a string'")));
}

// ---- impossible values --------------------------------------------------------

TEST(RuntimeConfigErrors, RatioOutsideZeroOne) {
  EXPECT_THAT(error_of("blend: {ratio: 1.5}"), HasSubstr("blend.ratio: must be in [0, 1], got 1.5"));
  EXPECT_THAT(error_of("blend: {ratio: -0.1}"), HasSubstr("blend.ratio: must be in [0, 1], got -0.1"));
  EXPECT_THAT(error_of("blend: {ratio: nan}"), HasSubstr("blend.ratio: must be in [0, 1]"));
}

TEST(RuntimeConfigErrors, Schedule) {
  // Length: one per check layer but the last.
  std::string e = error_of("blend: {check_layers: [1, 2, 3], schedule: [0.5]}");
  EXPECT_THAT(e, HasSubstr("blend.schedule: needs one fraction per check layer but the last (2 for 3 check layers), got 1"));
  e = error_of("blend: {schedule: [0.5]}");  // the default check_layers: [1, ..., 6]
  EXPECT_THAT(e, HasSubstr("blend.schedule: needs one fraction per check layer but the last (5 for 6 check layers), got 1"));
  e = error_of("blend: {check_layers: [2], schedule: [0.5]}");
  EXPECT_THAT(e, HasSubstr("blend.schedule: needs one fraction per check layer but the last (0 for 1 check layer), got 1"));
  // Outside [ratio, 1], whatever the order of the keys.
  e = error_of("blend: {schedule: [0.1], check_layers: [1, 2], ratio: 0.2}");
  EXPECT_THAT(e, HasSubstr("blend.schedule[0]: must be in [ratio, 1] = [0.2, 1], got 0.1"));
  e = error_of("blend: {check_layers: [1, 2], schedule: [1.2]}");
  EXPECT_THAT(e, HasSubstr("blend.schedule[0]: must be in [ratio, 1]"));
  // Increasing.
  e = error_of("blend: {check_layers: [1, 2, 3], schedule: [0.4, 0.6]}");
  EXPECT_THAT(e, HasSubstr("blend.schedule[1]: the schedule must not increase (0.4 then 0.6)"));
  EXPECT_THAT(error_of("blend: {check_layers: [1, 2], schedule: [x]}"),
              HasSubstr("blend.schedule[0]: expected a number, got 'x'"));
}

TEST(RuntimeConfigErrors, CheckLayers) {
  EXPECT_THAT(error_of("blend: {check_layers: [0]}"), HasSubstr("blend.check_layers[0]: check layers must be >= 1"));
  EXPECT_THAT(error_of("blend: {check_layers: [2, -1]}"), HasSubstr("blend.check_layers[1]: check layers must be >= 1"));
  EXPECT_THAT(error_of("blend: {check_layers: [4, 2]}"), HasSubstr("blend.check_layers[1]: check layers must increase (4 then 2)"));
  EXPECT_THAT(error_of("blend: {check_layers: [2, 2]}"), HasSubstr("blend.check_layers[1]: check layers must increase"));
  EXPECT_THAT(error_of("blend: {check_layers: []}"), HasSubstr("blend.check_layers: needs at least one layer"));
}

TEST(RuntimeConfigErrors, NegativeCounts) {
  EXPECT_THAT(error_of("blend: {min_tokens: -1}"), HasSubstr("blend.min_tokens: must be >= 0, got -1"));
  EXPECT_THAT(error_of("device: {threads: -2}"), HasSubstr("device.threads: must be >= 0 (0 = all cores), got -2"));
  EXPECT_THAT(error_of("limits: {max_requests: 0}"), HasSubstr("limits.max_requests: must be >= 1, got 0"));
  EXPECT_THAT(error_of("limits: {max_prompt_tokens: -5}"), HasSubstr("limits.max_prompt_tokens: must be >= 0"));
  EXPECT_THAT(error_of("limits: {trace_history: -1}"), HasSubstr("limits.trace_history: must be >= 0"));
  EXPECT_THAT(error_of("limits: {max_queue: -1}"), HasSubstr("limits.max_queue: must be >= 0 (0 = no queue), got -1"));
  EXPECT_THAT(error_of("limits: {max_decode_batch: 0}"), HasSubstr("limits.max_decode_batch: must be >= 1, got 0"));
  EXPECT_THAT(error_of("limits: {decode_interleave: -0.5}"),
              HasSubstr("limits.decode_interleave: must be a number of seconds >= 0, got -0.5"));
  EXPECT_THAT(error_of("limits: {decode_interleave: .nan}"), HasSubstr("limits.decode_interleave"));
  EXPECT_THAT(error_of("limits: {max_decode_batch: many}"), HasSubstr("limits.max_decode_batch: expected an integer"));
}

TEST(RuntimeConfigErrors, Budgets) {
  EXPECT_THAT(error_of("tiers: {ram: {budget: -1}}"),
              AllOf(HasSubstr("tiers.ram.budget: invalid byte size '-1': negative")));
  EXPECT_THAT(error_of("tiers: {ssd: {budget: lots}}"), HasSubstr("tiers.ssd.budget: invalid byte size 'lots'"));
  EXPECT_THAT(error_of("tiers: {ssd: {budget: 10XB}}"), HasSubstr("tiers.ssd.budget: invalid byte size '10XB': unknown unit 'XB'"));
  EXPECT_THAT(error_of("tiers: {ram: {budget: 0}}"), AllOf(HasSubstr("tiers.ram.budget: a budget of 0 stores nothing"),
                                                        HasSubstr("tiers.ram.enabled: false")));
  EXPECT_THAT(error_of("tiers: {ssd: {throttle: -5MB}}"), HasSubstr("tiers.ssd.throttle: invalid byte size '-5MB': negative"));
  EXPECT_THAT(error_of("tiers: {ssd: {path: ''}}"), HasSubstr("tiers.ssd.path: the SSD tier needs a directory"));
}

TEST(RuntimeConfigErrors, UnknownNames) {
  EXPECT_THAT(error_of("model: {precision: fp16}"), HasSubstr("model.precision: unknown precision 'fp16' (auto, bf16, f32)"));
  EXPECT_THAT(error_of("model: {chat_template: ''}"), HasSubstr("model.chat_template: give a Jinja file's path"));
  EXPECT_THAT(error_of("model: {decode_activations: int4}"),
              HasSubstr("model.decode_activations: unknown decode activations 'int4' (auto, exact, int8)"));
  EXPECT_THAT(error_of("blend: {mode: cacheblend}"),
              HasSubstr("blend.mode: unknown mode 'cacheblend' (full, prefix, reuse, blend)"));
  EXPECT_THAT(error_of("blend: {deviation: q}"), HasSubstr("blend.deviation: unknown deviation 'q' (k, v, kv)"));
  EXPECT_THAT(error_of("blend: {quota: local}"), HasSubstr("blend.quota: unknown quota 'local' (global, per-chunk)"));
  EXPECT_THAT(error_of("blend: {filtering: gradual}"),
              HasSubstr("blend.filtering: unknown filtering 'gradual' (single-pass, two-pass)"));
  EXPECT_THAT(error_of("blend: {sink_tokens: -1}"), HasSubstr("blend.sink_tokens"));
  EXPECT_THAT(error_of("blend: {query_first_from_layer: -1}"), HasSubstr("blend.query_first_from_layer"));
  EXPECT_THAT(error_of("blend: {selection: relevance}"),
              HasSubstr("blend.selection: unknown selection 'relevance' (deviation, attention, impact, query-first)"));
  EXPECT_THAT(error_of("blend: {filtering: two-pass, selection: attention}"),
              AllOf(HasSubstr("blend.selection"), HasSubstr("only single-pass filtering")));
  EXPECT_THAT(error_of("blend: {filtering: two-pass, selection: query-first}"),
              AllOf(HasSubstr("blend.selection"), HasSubstr("own two passes")));
  // two-pass alone: the default selection (query-first) does not take it, and the
  // error says what does.
  EXPECT_THAT(error_of("blend: {filtering: two-pass}"),
              AllOf(HasSubstr("blend.filtering"), HasSubstr("needs blend.selection: deviation")));
  // cuda is a kind in a build configured with nvcc (CI's), an error naming why elsewhere.
  const bool cuda_built = kernels::device_kinds_built().size() == 2;
  EXPECT_THAT(error_of("device: {kind: tpu}"),
              HasSubstr(cuda_built ? "device.kind: unknown device kind 'tpu' (cpu, cuda)"
                                   : "device.kind: unknown device kind 'tpu' (cpu)"));
  if (cuda_built) {
    RuntimeConfig c = parse_runtime_config("device: {kind: cuda, gpus: [1]}");
    EXPECT_EQ(c.device_kind, "cuda");
    EXPECT_EQ(c.gpus, std::vector<int>{1});
  } else {
    EXPECT_THAT(error_of("device: {kind: cuda}"), HasSubstr("device.kind: the CUDA backend is not in this build"));
  }
  EXPECT_THAT(error_of("device: {gpus: []}"), HasSubstr("device.gpus: must name at least one device"));
  EXPECT_THAT(error_of("device: {gpus: [-1]}"), HasSubstr("device.gpus: device indices are >= 0, got -1"));
  EXPECT_THAT(error_of("device: {gpus: 0}"), HasSubstr("device.gpus"));
}

TEST(RuntimeConfigErrors, Server) {
  EXPECT_THAT(error_of("server: {port: 0}"), HasSubstr("server.port: must be in 1..65535, got 0"));
  EXPECT_THAT(error_of("server: {port: 65536}"), HasSubstr("server.port: must be in 1..65535, got 65536"));
  EXPECT_THAT(error_of("server: {host: ''}"), HasSubstr("server.host: must not be empty"));
  EXPECT_THAT(error_of("server: {host: }"), HasSubstr("server.host: must not be empty"));
}

TEST(RuntimeConfigErrors, ValueErrorsGiveTheLine) {
  const std::string e = error_of("# comment\nserver:\n  host: localhost\n  port: 70000\n");
  EXPECT_THAT(e, HasSubstr("server.port: must be in 1..65535, got 70000 (line 4, column 9)"));
}

// ---- malformed YAML -----------------------------------------------------------

TEST(RuntimeConfigErrors, MalformedYamlGivesTheLineAndColumn) {
  std::string e = error_of("server:\n  port: 80\n  host: [a\n");
  EXPECT_THAT(e, HasSubstr("invalid YAML at line"));
  EXPECT_THAT(e, HasSubstr("column"));
  e = error_of("model:\n  path: x\n bad indent: 1\n");
  EXPECT_THAT(e, AllOf(HasSubstr("invalid YAML at line 3, column"), Not(HasSubstr("yaml-cpp:"))));
  e = error_of("server: {port: 80");
  EXPECT_THAT(e, HasSubstr("invalid YAML at line 1"));
}

// yaml-cpp 0.7's LoadAll loops for ever on a stray top-level ',' and its Load reads
// ",a: 1" as an empty (default) config; both are errors naming the place (found by
// tests/fuzz/fuzz_config.cpp; the fuzzer's reproducer was ",imits: {...}").
TEST(RuntimeConfigErrors, AStrayCommaIsAnErrorNotAHangOrAnEmptyConfig) {
  for (const char* text : {",", ",a: 1", ",imits: {max_reqblenduestS: 2, restart_window: 5s}\n",
                           "limits: {max_requests: 2}\n---\n,"}) {
    const std::string e = error_of(text);
    EXPECT_THAT(e, HasSubstr("invalid YAML at line")) << text;
  }
  EXPECT_THAT(error_of(",a: 1"), HasSubstr("invalid YAML at line 1, column 1: unexpected ','"));
  // A document that is only a null, alone or after another, is still a document.
  EXPECT_NO_THROW(parse_runtime_config("~"));
  EXPECT_NO_THROW(parse_runtime_config("---\n"));
  EXPECT_THAT(error_of("limits: {max_requests: 2}\n---\n~\n"), HasSubstr("expected one YAML document, got 2"));
}

TEST(RuntimeConfigErrors, SeveralDocuments) {
  EXPECT_THAT(error_of("server: {port: 80}\n---\nserver: {port: 81}\n"),
              HasSubstr("config: expected one YAML document, got 2"));
}

// ---- sizes --------------------------------------------------------------------

// One check for a config however it was made: a file's rules across keys are refused
// as it is parsed, and a config built in code (CLI flags, tests) meets every value's
// rule in check_runtime_config, which the Runtime runs first.
TEST(RuntimeConfigCheck, EveryRuleHoldsForAFileAndForAConfigBuiltInCode) {
  const auto comms = kernels::communicator_kinds_built();
  if (std::find(comms.begin(), comms.end(), "nccl") != comms.end()) {
    EXPECT_THAT(error_of("device:\n  communicator: nccl\n"), HasSubstr("nccl joins GPU ranks, and device.kind is cpu"));
    const auto kinds = kernels::device_kinds_built();
    if (std::find(kinds.begin(), kinds.end(), "cuda") != kinds.end()) {
      EXPECT_THAT(error_of("device:\n  kind: cuda\n  tp: 2\n  gpus: [0]\n"),
                  HasSubstr("device.gpus: tp 2 on cuda puts each rank on a GPU of its own"));
      EXPECT_THAT(error_of("device:\n  kind: cuda\n  tp: 2\n  gpus: [1, 1]\n"),
                  HasSubstr("GPU 1 is listed for ranks 0 and 1"));
      EXPECT_THAT(error_of("device:\n  kind: cuda\n  tp: 2\n  gpus: [0, 1]\n  communicator: inprocess\n"),
                  HasSubstr("GPU ranks need nccl"));
    }
  }
  EXPECT_NO_THROW(check_runtime_config(default_runtime_config()));
  auto refused = [](auto edit) {
    RuntimeConfig c = default_runtime_config();
    edit(c);
    try {
      check_runtime_config(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.decode_activations = "int4"; }),
              HasSubstr("model.decode_activations: unknown value 'int4'"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.precision = "fp8"; }), HasSubstr("model.precision"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.device_kind = "tpu"; }), HasSubstr("device.kind: unknown device kind"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.gpus.clear(); }), HasSubstr("device.gpus: must name at least one"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.gpus = {-1}; }), HasSubstr("device.gpus: device indices are >= 0"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.tp = 0; }), HasSubstr("device.tp: must be >= 1"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.threads = -2; }), HasSubstr("device.threads"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.communicator = "mpi"; }), HasSubstr("device.communicator: unknown"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.kv_dtype = "f8"; }), HasSubstr("device.kv_dtype: unknown KV dtype"));
  EXPECT_THAT(refused([](RuntimeConfig& c) { c.communicator = "nccl"; }),
              HasSubstr("device.communicator: nccl joins GPU ranks, and device.kind is cpu"));
}

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
