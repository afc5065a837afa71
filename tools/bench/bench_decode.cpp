// blendctl bench decode: decode throughput of N concurrent streams through the
// runtime (continuous batching: the N streams share decode steps), against one
// stream. For each stream count, N greedy requests start at once; each prompt is
// a different counting sequence cut to --prompt-tokens tokens, so the model counts
// on and no stream stops before --tokens (a stream that does is reported).
//
// What is measured: the decode phase, from the moment every stream has its first
// token (all prefills done) to the last stream's end, and the tokens the decode
// steps produced in it (Runtime::decode_stats before and after) — so prefill time
// is excluded and the number is the steady-state rate of N streams decoding
// together. Prefills are not interleaved with decode here (decode_interleave is
// off unless --interleave is given): the N prefills run back to back first. Also
// reported: the span rate (every decode token over first first-token to last end,
// which includes the later prefills) and the mean batch. One JSON line per stream
// count, then a summary with the ratio of the last count to the first.
//
// --inspection-cost: the time spent collecting the inspection data (per-message actor
// counters, trace events and fields, the finished traces kept and written; summed over
// all threads) over the run's wall time, submit to last end — an upper bound on what
// the collection costs a run with nobody watching (it counts as if every nanosecond of
// it delayed the run; on 2 cores part of it overlaps). Issue 22 bounds it at 2%.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "actors/runtime/inspection_cost.h"
#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

// "k, k+1, k+2, ..." tokenized, cut to exactly n tokens.
std::vector<int32_t> counting_prompt(const Tokenizer& tok, int from, int n) {
  std::string text;
  std::vector<int32_t> ids;
  for (int i = from; static_cast<int>(ids.size()) < n; i += 50) {
    for (int j = i; j < i + 50; ++j) text += std::to_string(j) + ", ";
    ids = tok.encode(text, false);
  }
  ids.resize(static_cast<size_t>(n));
  return ids;
}

struct StreamRun {
  double decode_tok_s = 0, span_tok_s = 0, mean_batch = 0, window_s = 0, ttft_max_s = 0;
  double run_s = 0;                                 // first submit to last end
  int64_t inspection_ns = 0, inspection_calls = 0;  // with --inspection-cost
  int64_t window_tokens = 0, decode_tokens = 0, interleaved_steps = 0;
  int early_stops = 0;
};

StreamRun run_streams(Runtime& rt, int streams, int tokens, int prompt_tokens, int seed) {
  const auto& tok = rt.model().tokenizer();
  std::mutex mu;
  std::condition_variable cv;
  int started = 0, finished = 0;
  Runtime::DecodeStats at_start{}, at_end{};
  clock_type::time_point t_start, t_end, t_first{};
  std::vector<RequestResult> results;

  const auto before = rt.decode_stats();
  InspectionCost::reset();
  const auto t_submit = clock_type::now();
  for (int i = 0; i < streams; ++i) {
    RuntimeRequest r;
    r.prompt = RagPrompt{};
    r.prompt->suffix = counting_prompt(tok, 1 + 1000 * (seed + i), prompt_tokens);
    r.mode = BlendMode::Full;  // no chunks: the same thing, said plainly
    r.sampling.max_tokens = tokens;
    r.sampling.temperature = 0;
    RequestCallbacks cb;
    auto first = std::make_shared<bool>(true);
    cb.on_text = [&, first](std::string_view) {
      if (*first) {
        *first = false;
        std::lock_guard<std::mutex> lock(mu);
        if (started == 0) t_first = clock_type::now();
        if (++started == streams) {
          at_start = rt.decode_stats();
          t_start = clock_type::now();
        }
      }
      return true;
    };
    cb.on_done = [&](const RequestResult& res) {
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(res);
      if (++finished == streams) {
        at_end = rt.decode_stats();
        t_end = clock_type::now();
        cv.notify_all();
      }
    };
    rt.submit(std::move(r), std::move(cb));
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == streams; });

  StreamRun out;
  out.run_s = std::chrono::duration<double>(t_end - t_submit).count();
  out.inspection_ns = InspectionCost::ns.load();
  out.inspection_calls = InspectionCost::calls.load();
  for (const auto& res : results) {
    if (res.finish_reason == "error") throw std::runtime_error("a stream failed: " + res.error);
    if (static_cast<int>(res.tokens.size()) < tokens) ++out.early_stops;
    out.ttft_max_s = std::max(out.ttft_max_s, res.ttft_seconds);
  }
  if (started < streams) throw std::runtime_error("a stream produced no text");
  out.window_s = std::chrono::duration<double>(t_end - t_start).count();
  out.window_tokens = at_end.tokens - at_start.tokens;
  out.decode_tok_s = out.window_s > 0 ? static_cast<double>(out.window_tokens) / out.window_s : 0;
  out.decode_tokens = at_end.tokens - before.tokens;
  const double span = std::chrono::duration<double>(t_end - t_first).count();
  out.span_tok_s = span > 0 ? static_cast<double>(out.decode_tokens) / span : 0;
  const int64_t steps = at_end.steps - before.steps;
  out.mean_batch = steps > 0 ? static_cast<double>(out.decode_tokens) / static_cast<double>(steps) : 0;
  out.interleaved_steps = at_end.interleaved_steps - before.interleaved_steps;
  return out;
}

}  // namespace

int bench_decode(const DecodeBenchOptions& opt) {
  if (opt.streams.empty()) throw std::invalid_argument("--streams: at least one stream count");
  const int most = *std::max_element(opt.streams.begin(), opt.streams.end());
  const std::string data_dir = (fs::temp_directory_path() / ("blendctl_decode_" + std::to_string(::getpid()))).string();
  RuntimeConfig cfg = bench_runtime_config(opt.model_path, opt.device, opt.precision, opt.kv_dtype, data_dir);
  cfg.ssd.enabled = false;
  cfg.write_back = false;
  cfg.max_requests = std::max(cfg.max_requests, most);
  cfg.max_decode_batch = opt.max_batch > 0 ? opt.max_batch : std::max(cfg.max_decode_batch, most);
  cfg.decode_interleave = opt.interleave >= 0 ? opt.interleave : 1e9;
  Runtime rt(cfg);
  const auto& ctx = rt.context();
  InspectionCost::measuring = opt.inspection_cost;

  // Warm-up: primitives, caches, the first-touch page faults of a KV cache.
  run_streams(rt, 1, 8, opt.prompt_tokens, 99);

  Progress progress("bench decode", static_cast<int>(opt.streams.size()) * opt.repeats);
  std::vector<double> rate;  // best decode_tok_s per stream count
  for (int n : opt.streams) {
    StreamRun best;
    for (int rep = 0; rep < opt.repeats; ++rep) {
      const StreamRun r = run_streams(rt, n, opt.tokens, opt.prompt_tokens, rep * most);
      if (r.decode_tok_s > best.decode_tok_s) best = r;
      progress.tick();
    }
    rate.push_back(best.decode_tok_s);
    json j = {{"bench", "decode"},
              {"streams", n},
              {"tokens", opt.tokens},
              {"prompt_tokens", opt.prompt_tokens},
              {"decode_tok_s", best.decode_tok_s},
              {"per_stream_tok_s", best.decode_tok_s / n},
              {"window_s", best.window_s},
              {"window_tokens", best.window_tokens},
              {"span_tok_s", best.span_tok_s},
              {"mean_batch", best.mean_batch},
              {"interleaved_steps", best.interleaved_steps},
              {"ttft_max_s", best.ttft_max_s},
              {"early_stops", best.early_stops},
              {"max_decode_batch", cfg.max_decode_batch},
              {"repeats", opt.repeats},
              {"kernel", ctx.backend->kernel_id()},
              {"device", ctx.backend->device_name().empty() ? "cpu" : ctx.backend->device_name()},
              // Decode steps replayed from CUDA graphs so far in this process (0 on the CPU).
              {"graph_launches", ctx.backend->graph_launches()},
              {"model", opt.model_path},
              {"kv_dtype", cfg.kv_dtype},
              {"threads", kernels::cpu_compute_threads()}};
    if (opt.inspection_cost) {
      const double fraction = best.run_s > 0 ? static_cast<double>(best.inspection_ns) * 1e-9 / best.run_s : 0;
      j["run_s"] = best.run_s;
      j["inspection_s"] = static_cast<double>(best.inspection_ns) * 1e-9;
      j["inspection_calls"] = best.inspection_calls;
      j["inspection_ns_per_call"] =
          best.inspection_calls > 0 ? static_cast<double>(best.inspection_ns) / static_cast<double>(best.inspection_calls) : 0;
      j["inspection_overhead"] = fraction;
      j["inspection_bound"] = 0.02;
    }
    std::cout << j.dump() << std::endl;
  }
  json summary = {{"bench", "decode_summary"},
                  {"streams", opt.streams},
                  {"decode_tok_s", rate},
                  {"ratio_last_vs_first", rate.front() > 0 ? rate.back() / rate.front() : 0},
                  {"kernel", ctx.backend->kernel_id()},
                  {"device", ctx.backend->device_name().empty() ? "cpu" : ctx.backend->device_name()},
                  {"model", opt.model_path},
                  {"target", 3.0}};
  std::cout << summary.dump() << std::endl;
  rt.shutdown();
  std::error_code ec;
  fs::remove_all(data_dir, ec);
  return 0;
}

}  // namespace bs::tools
