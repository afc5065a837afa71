// blendctl bench tp: prefill throughput of one model at several tensor parallel
// degrees on CPU ranks (model/tp_group.h: one thread and OpenMP team per rank, the
// cores split between them, an in-process all-reduce after every output and down
// projection), in one run on one machine, with the time ranks spend in collectives
// per layer. The model is a GGUF file or random weights in a known shape
// (model/random_model.h: Llama-3.2-1B's 32 query / 8 KV heads for the issue's
// target). One JSON object per line on stdout, progress on stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "model/random_model.h"
#include "model/tp_group.h"
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"

namespace bs::tools {

int bench_tp(const TpBenchOptions& opt) {
  using clock_type = std::chrono::steady_clock;
  std::string path = opt.model_path;
  std::filesystem::path random_file;
  if (!opt.random_shape.empty()) {
    const RandomLlamaShape shape = random_llama_shape(opt.random_shape);
    random_file = std::filesystem::temp_directory_path() /
                  ("blendctl_random_" + shape.name + "_" + std::to_string(::getpid()) + ".gguf");
    std::fprintf(stderr, "writing random-weight %s (Q4_0) to %s\n", shape.name.c_str(), random_file.c_str());
    write_random_llama(shape, random_file.string());
    path = random_file.string();
  }
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      if (!p.empty()) std::filesystem::remove(p, ec);
    }
  } remove_random{random_file};

  const auto kv_dtype = kv_dtype_option(opt.kv_dtype);
  std::vector<double> best_tps(opt.degrees.size(), 0);
  Progress progress("bench tp", static_cast<int>(opt.degrees.size()) * opt.repeats);
  for (size_t d = 0; d < opt.degrees.size(); ++d) {
    const int tp = opt.degrees[d];
    auto probe = kernels::make_cpu_backend();
    const auto precision = kernels::choose_precision(opt.precision, *probe);
    TpGroup group(path, tp, [] { return kernels::make_cpu_backend(); }, precision, kv_dtype);
    const auto& c = group.model(0).full_config();
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> pick(0, c.vocab - 2);
    std::vector<int32_t> tokens(static_cast<size_t>(opt.tokens));
    for (auto& t : tokens) t = pick(rng);
    // One untimed prefill: GEMM primitives for these row counts are created once.
    auto prefill = [&] {
      group.run([&](int r) {
        auto cache = group.transformer(r).make_cache(opt.tokens);
        group.transformer(r).forward(tokens, cache);
      });
    };
    prefill();
    for (int rep = 0; rep < opt.repeats; ++rep) {
      std::vector<Transformer::CollectiveStats> before(static_cast<size_t>(tp));
      for (int r = 0; r < tp; ++r) before[r] = group.transformer(r).collective_stats();
      const auto t0 = clock_type::now();
      prefill();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      // Rank 0's time in collectives (the others' is alike: each waits for the slowest).
      const auto after = group.transformer(0).collective_stats();
      const double comm_s = after.seconds - before[0].seconds;
      const double tps = static_cast<double>(opt.tokens) / s;
      best_tps[d] = std::max(best_tps[d], tps);
      nlohmann::json j = {{"bench", "tp_prefill"},
                          {"model", opt.random_shape.empty() ? path : "random:" + opt.random_shape},
                          {"kernels", group.backend(0).kernel_id()},
                          {"precision", kernels::precision_name(precision)},
                          {"kv_dtype", opt.kv_dtype},
                          {"tp", tp},
                          {"threads_per_rank", group.threads_per_rank()},
                          {"tokens", opt.tokens},
                          {"repeat", rep},
                          {"seconds", s},
                          {"tokens_per_s", tps},
                          {"collectives", after.calls - before[0].calls},
                          {"collective_seconds", comm_s},
                          {"collective_ms_per_layer", 1e3 * comm_s / c.n_layers},
                          {"collective_share", comm_s / s}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
      progress.tick();
    }
  }
  nlohmann::json summary = {{"bench", "tp_summary"}, {"tokens", opt.tokens}};
  for (size_t d = 0; d < opt.degrees.size(); ++d) {
    summary["best_tokens_per_s_tp" + std::to_string(opt.degrees[d])] = best_tps[d];
    if (d > 0 && best_tps[0] > 0)
      summary["ratio_tp" + std::to_string(opt.degrees[d]) + "_vs_tp" + std::to_string(opt.degrees[0])] =
          best_tps[d] / best_tps[0];
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace bs::tools
