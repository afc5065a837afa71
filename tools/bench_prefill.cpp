// blendctl bench prefill: full-prefill and decode throughput of the CPU backend,
// with the bf16 GEMM throughput of the model's own shapes measured in the same
// run, so the distance to the device's limit is visible. One JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/profiling_backend.h"
#include "model/generate.h"
#include "model/llama_model.h"
#include "model/transformer.h"
#include "tools/bench.h"

namespace bs::tools {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

nlohmann::json breakdown(const kernels::ProfilingBackend& prof, double total) {
  nlohmann::json b = nlohmann::json::object();
  double sum = 0;
  for (const auto& [op, s] : prof.stats()) {
    b[op] = {{"seconds", s.seconds}, {"share", s.seconds / total}};
    sum += s.seconds;
  }
  b["other"] = {{"seconds", total - sum}, {"share", (total - sum) / total}};
  return b;
}

// GEMM FLOPs of one token through all layers (QKV, O, gate/up, down).
double gemm_flops_per_token(const LlamaConfig& c) {
  const double per_layer = 2.0 * c.dim * (c.q_dim() + 2.0 * c.kv_dim()) + 2.0 * c.q_dim() * c.dim +
                           2.0 * c.dim * 2.0 * c.ff + 2.0 * c.ff * c.dim;
  return per_layer * c.n_layers;
}

}  // namespace

int bench_prefill(const BenchOptions& opt) {
  auto cpu = kernels::make_cpu_backend();
  kernels::ProfilingBackend prof(*cpu);
  const auto precision = kernels::choose_precision(opt.precision, *cpu);
  LlamaModel model(opt.model_path, prof, precision, kv_dtype_option(opt.kv_dtype));
  Transformer tf(model);
  const auto& c = model.config();
  const char* prec = kernels::precision_name(precision);
  const std::string isa = cpu->kernel_id();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(100, c.vocab - 1);

  // 1. GEMM throughput on the model's shapes at 3072 rows.
  {
    const int64_t n = 3072;
    std::vector<float> x(static_cast<size_t>(n * std::max(c.dim, c.ff)), 0.5f);
    std::vector<float> y(static_cast<size_t>(n * std::max(2 * c.ff, c.dim)));
    struct Shape { const char* name; const kernels::PreparedWeights* w; };
    const auto& L = model.layer(0);
    double flops = 0, secs = 0;
    for (Shape s : {Shape{"qkv", L.wqkv.get()}, Shape{"o", L.wo.get()}, Shape{"gate_up", L.w_gate_up.get()},
                    Shape{"down", L.w_down.get()}}) {
      cpu->linear(*s.w, x.data(), y.data(), n, nullptr);  // warm-up: primitive creation
      const int reps = 5;
      const auto t0 = clock_type::now();
      for (int i = 0; i < reps; ++i) cpu->linear(*s.w, x.data(), y.data(), n, nullptr);
      const double t = seconds_since(t0) / reps;
      const double f = 2.0 * n * s.w->view.in_features * s.w->view.out_features;
      flops += f;
      secs += t;
      std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"isa", isa}, {"precision", prec}, {"shape", s.name},
                                         {"m", n}, {"k", s.w->view.in_features}, {"n", s.w->view.out_features},
                                         {"gflops", f / t / 1e9}}.dump().c_str());
    }
    std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"isa", isa}, {"precision", prec}, {"shape", "layer_mix"},
                                       {"m", n}, {"gflops", flops / secs / 1e9}}.dump().c_str());
    std::fflush(stdout);
  }

  // 2. Full prefill at each length (warm-up run first: oneDNN primitives per size).
  for (int64_t n : opt.prefill_lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& t : ids) t = pick(rng);
    std::vector<double> times;
    for (int rep = 0; rep < opt.repeats + 1; ++rep) {
      auto cache = tf.make_cache(n);
      prof.reset();
      const auto t0 = clock_type::now();
      tf.forward(ids, cache);
      if (rep > 0) times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    std::printf("%s\n", nlohmann::json{{"bench", "prefill"}, {"isa", isa}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype}, {"tokens", n},
                                       {"seconds", t}, {"tokens_per_s", n / t},
                                       {"gemm_gflops_effective", gemm_flops_per_token(c) * n / t / 1e9},
                                       {"threads", kernels::cpu_compute_threads()},
                                       {"breakdown_last_run", breakdown(prof, times.back())}}.dump().c_str());
    std::fflush(stdout);
  }

  // 3. Decode: greedy steps after a prompt of opt.decode_context tokens.
  {
    std::vector<int32_t> ids(static_cast<size_t>(opt.decode_context));
    for (auto& t : ids) t = pick(rng);
    auto cache = tf.make_cache(opt.decode_context + opt.decode_tokens + 1);
    auto logits = tf.forward(ids, cache);
    prof.reset();
    const auto t0 = clock_type::now();
    for (int i = 0; i < opt.decode_tokens; ++i) {
      const int32_t next = argmax(logits.data(), c.vocab);
      logits = tf.forward(std::span<const int32_t>(&next, 1), cache);
    }
    const double t = seconds_since(t0);
    std::printf("%s\n", nlohmann::json{{"bench", "decode"}, {"isa", isa}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype}, {"context", opt.decode_context},
                                       {"tokens", opt.decode_tokens}, {"seconds", t},
                                       {"tokens_per_s", opt.decode_tokens / t},
                                       {"breakdown", breakdown(prof, t)}}.dump().c_str());
    std::fflush(stdout);
  }

  // 4. Batched decode: B sequences (each after its own opt.decode_context-token
  // prompt) stepped together by decode_step, as continuous batching does; where a
  // batched step's time goes, against one sequence's.
  for (int64_t batch : opt.decode_batches) {
    std::vector<KvCache> caches;
    std::vector<int32_t> next(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<int32_t> ids(static_cast<size_t>(opt.decode_context));
      for (auto& t : ids) t = pick(rng);
      caches.push_back(tf.make_cache(opt.decode_context + opt.decode_tokens + 1));
      const auto logits = tf.forward(ids, caches.back());
      next[static_cast<size_t>(b)] = argmax(logits.data(), c.vocab);
    }
    std::vector<KvCache*> ptrs;
    for (auto& cache : caches) ptrs.push_back(&cache);
    prof.reset();
    const auto t0 = clock_type::now();
    for (int i = 0; i < opt.decode_tokens; ++i) {
      const auto logits = tf.decode_step(next, ptrs);
      for (int64_t b = 0; b < batch; ++b)
        next[static_cast<size_t>(b)] = argmax(logits.data() + b * c.vocab, c.vocab);
    }
    const double t = seconds_since(t0);
    std::printf("%s\n", nlohmann::json{{"bench", "decode_batch"}, {"isa", isa}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype},
                                       {"batch", batch}, {"context", opt.decode_context},
                                       {"steps", opt.decode_tokens}, {"seconds", t},
                                       {"step_ms", 1e3 * t / opt.decode_tokens},
                                       {"tokens_per_s", static_cast<double>(batch) * opt.decode_tokens / t},
                                       {"threads", kernels::cpu_compute_threads()},
                                       {"breakdown", breakdown(prof, t)}}.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace bs::tools
