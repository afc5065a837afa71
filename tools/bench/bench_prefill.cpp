// blendctl bench prefill: full-prefill and decode throughput of a backend (--device
// cpu | cuda), with the bf16 GEMM throughput of the model's own shapes measured in the
// same run, so the distance to the device's limit is visible (MFU: the prefill's GEMM
// FLOP rate over that). One JSON object per line. On the CPU every op is also timed
// (the breakdown); a device backend's ops return before the GPU ran them, so there
// only whole forwards and decode steps are timed (each ends in a copy of the logits,
// or of the picked ids, to the host).
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
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"

namespace bs::tools {
namespace {

using clock_type = std::chrono::steady_clock;

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

// Attention FLOPs of a causal prefill of n tokens (QK^T and PV over the lower triangle).
double attention_flops(const LlamaConfig& c, int64_t n) {
  return 2.0 * 2.0 * (static_cast<double>(n) * (n + 1) / 2.0) * c.q_dim() * c.n_layers;
}

// The backend's bf16 GEMM peak: a square 8192^3 product (BF16 weights prepared as the
// model's are), best of 5. Device backends only: it is a TFLOP of work.
double square_gemm_gflops(kernels::Backend& be, kernels::Precision precision) {
  constexpr int64_t n = 8192;
  std::vector<uint16_t> w(static_cast<size_t>(n * n), 0x3c00);  // bf16 ~0.0078
  kernels::WeightView view{kernels::TensorType::BF16, w.data(), n, n};
  auto prepared = be.prepare(view, precision);
  const std::vector<float> host_x(static_cast<size_t>(n * n), 0.5f);
  kernels::DeviceBuffer x = be.upload(host_x.data(), n * n * static_cast<int64_t>(sizeof(float)));
  kernels::DeviceBuffer y = be.alloc(n * n * static_cast<int64_t>(sizeof(float)));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    be.synchronize();
    const auto t0 = clock_type::now();
    be.linear(*prepared, x.as<float>(), y.as<float>(), n, nullptr);
    be.synchronize();
    if (rep > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace

int bench_prefill(const BenchOptions& opt) {
  auto device = kernels::make_backend(opt.device);
  // The profiler reads host memory: the CPU backends only.
  std::unique_ptr<kernels::ProfilingBackend> profiler;
  if (device->host_accessible()) profiler = std::make_unique<kernels::ProfilingBackend>(*device);
  kernels::Backend& be = profiler ? static_cast<kernels::Backend&>(*profiler) : *device;
  const auto precision = kernels::choose_precision(opt.precision, *device);
  LlamaModel model(opt.model_path, be, precision, kv_dtype_option(opt.kv_dtype));
  Transformer tf(model);
  const auto& c = model.config();
  const char* prec = kernels::precision_name(precision);
  const std::string isa = device->kernel_id();
  const std::string device_name = device->device_name().empty() ? "cpu" : device->device_name();
  auto reset_profile = [&] {
    if (profiler) profiler->reset();
  };
  auto profile = [&](double total) { return profiler ? breakdown(*profiler, total) : nlohmann::json(nullptr); };
  double peak_layer_gflops = 0, square_gflops = 0;
  if (!device->host_accessible()) {
    square_gflops = square_gemm_gflops(*device, precision);
    std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"isa", isa}, {"device", device_name}, {"precision", prec},
                                       {"shape", "square"}, {"m", 8192}, {"k", 8192}, {"n", 8192},
                                       {"gflops", square_gflops}}.dump().c_str());
    std::fflush(stdout);
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(100, c.vocab - 1);

  // 1. GEMM throughput on the model's shapes at 3072 rows.
  {
    const int64_t n = 3072;
    // Buffers of the backend's memory (host memory on the CPU).
    const std::vector<float> host_x(static_cast<size_t>(n * std::max(c.dim, c.ff)), 0.5f);
    kernels::DeviceBuffer x = device->upload(host_x.data(), static_cast<int64_t>(host_x.size() * sizeof(float)));
    kernels::DeviceBuffer y = device->alloc(n * std::max<int64_t>(2 * c.ff, c.dim) * static_cast<int64_t>(sizeof(float)));
    struct Shape { const char* name; const kernels::PreparedWeights* w; };
    const auto& L = model.layer(0);
    double flops = 0, secs = 0;
    for (Shape s : {Shape{"qkv", L.wqkv.get()}, Shape{"o", L.wo.get()}, Shape{"gate_up", L.w_gate_up.get()},
                    Shape{"down", L.w_down.get()}}) {
      device->linear(*s.w, x.as<float>(), y.as<float>(), n, nullptr);  // warm-up: primitive creation
      device->synchronize();
      const int reps = 5;
      const auto t0 = clock_type::now();
      for (int i = 0; i < reps; ++i) device->linear(*s.w, x.as<float>(), y.as<float>(), n, nullptr);
      device->synchronize();
      const double t = seconds_since(t0) / reps;
      const double f = 2.0 * n * s.w->view.in_features * s.w->view.out_features;
      flops += f;
      secs += t;
      std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"isa", isa}, {"device", device_name},
                                         {"precision", prec}, {"shape", s.name},
                                         {"m", n}, {"k", s.w->view.in_features}, {"n", s.w->view.out_features},
                                         {"gflops", f / t / 1e9}}.dump().c_str());
    }
    peak_layer_gflops = flops / secs / 1e9;
    std::printf("%s\n", nlohmann::json{{"bench", "gemm"}, {"isa", isa}, {"device", device_name}, {"precision", prec},
                                       {"shape", "layer_mix"}, {"m", n}, {"gflops", peak_layer_gflops}}.dump().c_str());
    std::fflush(stdout);
  }

  // 2. Full prefill at each length (warm-up run first: oneDNN primitives per size).
  for (int64_t n : opt.prefill_lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& t : ids) t = pick(rng);
    std::vector<double> times;
    for (int rep = 0; rep < opt.repeats + 1; ++rep) {
      auto cache = tf.make_cache(n);
      reset_profile();
      const auto t0 = clock_type::now();
      tf.forward(ids, cache);
      if (rep > 0) times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double gemm_gflops = gemm_flops_per_token(c) * n / t / 1e9;
    std::printf("%s\n", nlohmann::json{{"bench", "prefill"}, {"isa", isa}, {"device", device_name},
                                       {"model", opt.model_path}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype}, {"tokens", n},
                                       {"seconds", t}, {"tokens_per_s", n / t},
                                       {"gemm_gflops_effective", gemm_gflops},
                                       // The prefill's GEMM rate over the model's own GEMMs at 3072 rows.
                                       {"gemm_share_of_layer_mix", gemm_gflops / peak_layer_gflops},
                                       // Model FLOPs utilization against the square GEMM's rate (device backends).
                                       {"mfu", square_gflops > 0 ? nlohmann::json((gemm_flops_per_token(c) * n +
                                                                                   attention_flops(c, n)) /
                                                                                  t / 1e9 / square_gflops)
                                                                 : nlohmann::json(nullptr)},
                                       {"threads", kernels::cpu_compute_threads()},
                                       {"breakdown_last_run", profile(times.back())}}.dump().c_str());
    std::fflush(stdout);
  }

  // 3. Decode: greedy steps after a prompt of opt.decode_context tokens — as the
  // runtime steps a request: on a device backend a decode step that picks the token
  // where the logits are (decode_step_sampled: a CUDA graph on the CUDA backend), on
  // the CPU a one-token forward and the host's argmax.
  const bool on_device = !device->host_accessible();
  const kernels::SampleRow greedy{};  // temperature 0
  {
    std::vector<int32_t> ids(static_cast<size_t>(opt.decode_context));
    for (auto& t : ids) t = pick(rng);
    auto cache = tf.make_cache(opt.decode_context + opt.decode_tokens + 1);
    auto logits = tf.forward(ids, cache);
    int32_t next = argmax(logits.data(), c.vocab);
    KvCache* one = &cache;
    reset_profile();
    const auto t0 = clock_type::now();
    for (int i = 0; i < opt.decode_tokens; ++i) {
      if (on_device) {
        next = tf.decode_step_sampled(std::span<const int32_t>(&next, 1), std::span<KvCache* const>(&one, 1),
                                      std::span<const kernels::SampleRow>(&greedy, 1))[0];
      } else {
        logits = tf.forward(std::span<const int32_t>(&next, 1), cache);
        next = argmax(logits.data(), c.vocab);
      }
    }
    const double t = seconds_since(t0);
    std::printf("%s\n", nlohmann::json{{"bench", "decode"}, {"isa", isa}, {"device", device_name},
                                       {"model", opt.model_path}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype}, {"context", opt.decode_context},
                                       {"path", on_device ? "decode_step_sampled" : "forward"},
                                       {"tokens", opt.decode_tokens}, {"seconds", t},
                                       {"tokens_per_s", opt.decode_tokens / t},
                                       {"breakdown", profile(t)}}.dump().c_str());
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
    reset_profile();
    const auto t0 = clock_type::now();
    const std::vector<kernels::SampleRow> rows(static_cast<size_t>(batch), greedy);
    for (int i = 0; i < opt.decode_tokens; ++i) {
      if (on_device) {
        next = tf.decode_step_sampled(next, ptrs, rows);
        continue;
      }
      const auto logits = tf.decode_step(next, ptrs);
      for (int64_t b = 0; b < batch; ++b)
        next[static_cast<size_t>(b)] = argmax(logits.data() + b * c.vocab, c.vocab);
    }
    const double t = seconds_since(t0);
    std::printf("%s\n", nlohmann::json{{"bench", "decode_batch"}, {"isa", isa}, {"device", device_name},
                                       {"model", opt.model_path}, {"precision", prec},
                                       {"kv_dtype", opt.kv_dtype},
                                       {"batch", batch}, {"context", opt.decode_context},
                                       {"path", on_device ? "decode_step_sampled" : "decode_step"},
                                       {"graph_launches", device->graph_launches()},
                                       {"steps", opt.decode_tokens}, {"seconds", t},
                                       {"step_ms", 1e3 * t / opt.decode_tokens},
                                       {"tokens_per_s", static_cast<double>(batch) * opt.decode_tokens / t},
                                       {"threads", kernels::cpu_compute_threads()},
                                       {"breakdown", profile(t)}}.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace bs::tools
