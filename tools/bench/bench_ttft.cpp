// blendctl bench ttft: the same RAG requests in all four modes, in one run.
// Chunks (and the system prefix) are stored in RAM before the cached modes run,
// as they would be in a warm server; `full` computes everything. Prints one JSON
// object per mode and a summary with the ratios to `full`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "blend/blend_engine.h"
#include "blend/store_backed_blend.h"
#include "kernels/kv_view.h"
#include "storage/memory_store.h"
#include "model/generate.h"
#include "tools/bench/bench.h"


namespace bs::tools {
namespace {

using json = nlohmann::json;

}  // namespace

kernels::TensorType kv_dtype_option(const std::string& name) {
  kernels::TensorType type;
  if (!kernels::kv_dtype_from_name(name, type))
    throw std::invalid_argument("--kv-dtype: unknown KV dtype '" + name + "' (f32, f16, bf16)");
  return type;
}

RuntimeConfig bench_runtime_config(const std::string& model_path, const kernels::BackendChoice& device,
                                   const std::string& precision, const std::string& kv_dtype,
                                   const std::string& data_dir) {
  RuntimeConfig cfg = default_runtime_config();
  cfg.model_path = model_path;
  cfg.device_kind = device.kind;
  cfg.gpus = {device.gpu};
  cfg.precision = precision;
  cfg.kv_dtype = kv_dtype;
  cfg.data_dir = data_dir;
  return cfg;
}

// Chunks of exactly `chunk_tokens` tokens cut from the dataset's documents
// (joined document text), so the sizes are exact and the text is realistic.
std::vector<std::vector<int32_t>> make_bench_chunks(const Tokenizer& tok, const std::string& dataset, int count,
                                              int chunk_tokens, int skip) {
  std::ifstream in(dataset);
  if (!in) throw std::runtime_error("cannot open dataset " + dataset);
  std::vector<int32_t> stream;
  std::string line;
  int seen = 0;
  std::vector<std::vector<int32_t>> chunks;
  while (static_cast<int>(chunks.size()) < count && std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = json::parse(line);
    for (const auto& d : j.at("documents")) {
      if (seen++ < skip) continue;
      auto ids = tok.encode(d.get<std::string>() + "\n\n", false);
      stream.insert(stream.end(), ids.begin(), ids.end());
      while (static_cast<int>(stream.size()) >= chunk_tokens && static_cast<int>(chunks.size()) < count) {
        chunks.emplace_back(stream.begin(), stream.begin() + chunk_tokens);
        stream.erase(stream.begin(), stream.begin() + chunk_tokens);
      }
    }
  }
  if (static_cast<int>(chunks.size()) < count) throw std::runtime_error("dataset too small for the requested chunks");
  return chunks;
}


BlendOptions blend_options(const TtftOptions& opt) {
  BlendOptions o;
  o.ratio = opt.ratio;
  o.check_layers = opt.check_layers;
  o.schedule = opt.schedule;
  o.filtering = parse_filtering(opt.filtering);
  o.selection = parse_selection(opt.selection);
  o.query_first_from_layer = opt.query_first_from_layer;
  return o;
}

int bench_ttft(const TtftOptions& opt) {
  auto backend = kernels::make_backend(opt.device);
  const auto precision = kernels::choose_precision(opt.precision, *backend);
  const std::string device = backend->device_name().empty() ? "cpu" : backend->device_name();
  LlamaModel model(opt.model_path, *backend, precision, kv_dtype_option(opt.kv_dtype));
  Transformer tf(model);
  MemoryKvStore store(int64_t{16} << 30);
  BlendEngine engine(tf);
  StoreBackedBlend from_store(engine, store);
  const auto& tok = model.tokenizer();
  const BlendMode modes[] = {BlendMode::Full, BlendMode::Prefix, BlendMode::Reuse, BlendMode::Blend};
  std::map<BlendMode, std::vector<double>> ttft;
  std::map<BlendMode, BlendStats> last_stats;
  int64_t prompt_tokens = 0;

  for (int req = 0; req < opt.requests; ++req) {
    RagPrompt prompt = assemble_rag_prompt(tok, model.chat_template(),
                                           {{"user", "Which of the facts above happened first? Answer briefly."}}, {});
    prompt.chunks = make_bench_chunks(tok, opt.dataset, opt.chunks, opt.chunk_tokens, req * opt.chunks * 3);
    prompt_tokens = prompt.size();
    from_store.warm(prompt);
    for (int rep = 0; rep < opt.repeats + (req == 0 ? 1 : 0); ++rep) {  // request 0 warms oneDNN up
      for (BlendMode mode : modes) {
        BlendOptions o = blend_options(opt);
        o.mode = mode;
        const auto t0 = std::chrono::steady_clock::now();
        auto r = from_store.prefill(prompt, o, 1);
        const int32_t first = argmax(r.logits.data(), model.config().vocab);  // the first token is out
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (void)first;
        if (req == 0 && rep == 0) continue;
        ttft[mode].push_back(t);
        last_stats[mode] = r.stats;
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double full = median(ttft[BlendMode::Full]);
  json summary = {{"bench", "ttft_summary"}, {"isa", backend->kernel_id()}, {"device", device},
                  {"model", opt.model_path},
                  {"precision", kernels::precision_name(precision)}, {"kv_dtype", opt.kv_dtype},
                  {"chunks", opt.chunks}, {"chunk_tokens", opt.chunk_tokens},
                  {"prompt_tokens", prompt_tokens}, {"ratio", opt.ratio}};
  for (BlendMode mode : modes) {
    const double t = median(ttft[mode]);
    const auto& s = last_stats[mode];
    json line = {{"bench", "ttft"},
                 {"isa", backend->kernel_id()},
                 {"device", device},
                 {"precision", kernels::precision_name(precision)},
                 {"kv_dtype", opt.kv_dtype},
                 {"mode", mode_name(mode)},
                 {"chunks", opt.chunks},
                 {"chunk_tokens", opt.chunk_tokens},
                 {"prompt_tokens", prompt_tokens},
                 {"samples", ttft[mode].size()},
                 {"ttft_s", t},
                 {"ratio_to_full", t / full},
                 {"computed_tokens", s.computed_tokens},
                 {"recomputed_tokens", s.recomputed_tokens},
                 {"load_s", s.load_seconds},
                 {"select_s", s.select_seconds},
                 {"compute_s", s.compute_seconds}};
    if (mode == BlendMode::Blend) {
      line["blend_ratio"] = opt.ratio;
      line["check_layers"] = opt.check_layers;
      line["filtering"] = opt.filtering;
      line["selection"] = opt.selection;
      if (opt.selection == "query-first") line["query_first_from_layer"] = opt.query_first_from_layer;
    }
    std::printf("%s\n", line.dump().c_str());
    summary[std::string(mode_name(mode)) + "_ttft_s"] = t;
    summary[std::string(mode_name(mode)) + "_vs_full"] = t / full;
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace bs::tools
