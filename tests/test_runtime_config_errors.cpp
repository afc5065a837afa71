// The runtime's YAML configuration refused: an error naming the key (and its line) for
// each kind of mistake, and check_runtime_config's rules for a file and for a config
// built in code. What is accepted: test_runtime_config.cpp.
#include "actors/config/runtime_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"

namespace bs {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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

}  // namespace
}  // namespace bs
