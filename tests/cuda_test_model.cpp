// The model, the blend, the runtime and the server on the CUDA backend, against the CPU
// backend on the same machine (the real model file does not travel to the GPU machine:
// generated models do). Stated bounds, because the GPU's products are bf16 x bf16 ->
// fp32 and the CPU reference's fp32:
//  - logits of a prefill within 3e-2 of the largest |logit| (tiny model) and 5e-2
//    (random weights in SmolLM2-135M's shape, 30 layers);
//  - greedy decoding teacher-forced along the CPU's tokens: the GPU's argmax is the
//    CPU's at every step whose top-two margin on the CPU exceeds 4x that bound;
//  - the blend's recomputed positions overlap the CPU's by >= 80% (Jaccard) at ratio
//    0.3: a token near the selection's edge may swap with its neighbour in score;
//  - a request through the HTTP server on device.kind: cuda answers 200 with text.
// Label "cuda": exit 77 (skipped) without a GPU.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/runtime/runtime.h"
#include "actors/config/runtime_config.h"
#include "actors/runtime/runtime_context.h"
#include "blend/blend_engine.h"
#include "blend/store_backed_blend.h"
#include "http/server.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#include "model/generate.h"
#include "model/llama_model.h"
#include "model/transformer.h"
#include "storage/memory_store.h"
#include "tests/temp_dir.h"
#include "tests/tiny_model.h"

namespace bs {
namespace {

constexpr int kTinyLayers = 6;

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// The top-two margin of a row of logits.
double margin(const std::vector<float>& logits) {
  std::vector<float> v = logits;
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return static_cast<double>(v[0]) - v[1];
}

struct Pair {
  Pair(const std::string& path, kernels::Precision cpu_precision) {
    cpu_model = std::make_unique<LlamaModel>(path, *cpu, cpu_precision, kernels::TensorType::F32);
    gpu_model = std::make_unique<LlamaModel>(path, *gpu, kernels::Precision::BF16, kernels::TensorType::F32);
    cpu_tf = std::make_unique<Transformer>(*cpu_model);
    gpu_tf = std::make_unique<Transformer>(*gpu_model);
  }
  std::unique_ptr<kernels::Backend> cpu = kernels::make_cpu_backend();
  std::unique_ptr<kernels::Backend> gpu = kernels::make_cuda_backend(0);
  std::unique_ptr<LlamaModel> cpu_model, gpu_model;
  std::unique_ptr<Transformer> cpu_tf, gpu_tf;
};

// Prefill logits within `bound` of the largest logit, then greedy steps teacher-forced
// along the CPU's tokens. Returns the steps compared.
int compare_decoding(Pair& p, const std::vector<int32_t>& prompt, double bound, int steps) {
  auto cpu_cache = p.cpu_tf->make_cache(static_cast<int64_t>(prompt.size()) + steps + 1);
  auto gpu_cache = p.gpu_tf->make_cache(static_cast<int64_t>(prompt.size()) + steps + 1);
  auto a = p.cpu_tf->forward(prompt, cpu_cache);
  auto b = p.gpu_tf->forward(prompt, gpu_cache);
  const int64_t vocab = p.cpu_model->config().vocab;
  int decisive = 0;
  for (int s = 0; s <= steps; ++s) {
    const double scale = max_abs(a);
    EXPECT_LT(max_abs_diff(b, a), bound * scale) << "step " << s;
    const int32_t cpu_token = argmax(a.data(), vocab), gpu_token = argmax(b.data(), vocab);
    if (margin(a) > 4 * bound * scale) {
      EXPECT_EQ(gpu_token, cpu_token) << "step " << s << " (margin " << margin(a) / scale << " of the scale)";
      ++decisive;
    }
    if (s == steps) break;
    a = p.cpu_tf->forward(std::span<const int32_t>(&cpu_token, 1), cpu_cache);
    b = p.gpu_tf->forward(std::span<const int32_t>(&cpu_token, 1), gpu_cache);
  }
  return decisive;
}

TEST(CudaModel, TinyModelDecodesAsTheCpu) {
  testing::TempDir dir{"bs_cuda_model"};
  const std::string path = (dir.path() / "tiny.gguf").string();
  testing::tiny_llama_writer("llama", kTinyLayers).write(path);
  Pair p(path, kernels::Precision::F32);
  const auto prompt = p.cpu_model->tokenizer().encode("hello world and the world is on it, the hill and the inn", false);
  const int decisive = compare_decoding(p, prompt, 3e-2, 24);
  EXPECT_GE(decisive, 12) << "too few steps had a clear winner to compare";
}

TEST(CudaModel, RandomSmolLmShapeMatchesTheCpu) {
  Pair p("random:smollm2-135m", kernels::Precision::F32);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(100 + (i * 37) % 200);
  compare_decoding(p, prompt, 5e-2, 8);
}

// The blend on both backends over stores each filled by its own backend: the same
// tokens selected (within the stated overlap), logits within the bound.
TEST(CudaModel, BlendSelectsTheCpusTokens) {
  testing::TempDir dir{"bs_cuda_blend"};
  const std::string path = (dir.path() / "tiny.gguf").string();
  testing::tiny_llama_writer("llama", kTinyLayers).write(path);
  Pair p(path, kernels::Precision::F32);
  const RagPrompt prompt = testing::tiny_rag_prompt(p.cpu_model->tokenizer());
  MemoryKvStore cpu_store(int64_t{1} << 28), gpu_store(int64_t{1} << 28);
  BlendEngine cpu_engine(*p.cpu_tf), gpu_engine(*p.gpu_tf);
  StoreBackedBlend cpu_blend(cpu_engine, cpu_store), gpu_blend(gpu_engine, gpu_store);
  cpu_blend.warm(prompt);
  gpu_blend.warm(prompt);
  BlendOptions o;
  o.mode = BlendMode::Blend;
  o.ratio = 0.3f;
  o.check_layers = {1};
  const auto a = cpu_blend.prefill(prompt, o, 1);
  const auto b = gpu_blend.prefill(prompt, o, 1);
  ASSERT_FALSE(a.recomputed_positions.empty());
  const std::set<int32_t> sa(a.recomputed_positions.begin(), a.recomputed_positions.end());
  const std::set<int32_t> sb(b.recomputed_positions.begin(), b.recomputed_positions.end());
  std::vector<int32_t> both, either;
  std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(both));
  std::set_union(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(either));
  EXPECT_GE(static_cast<double>(both.size()) / static_cast<double>(either.size()), 0.8)
      << both.size() << " of " << either.size();
  EXPECT_LT(max_abs_diff(b.logits, a.logits), 3e-2 * max_abs(a.logits));
}

// The whole path: device.kind cuda in the runtime, a request over HTTP on loopback, a
// chunk stored by one request and loaded (through a loader's copy stream) by the next.
TEST(CudaModel, TheServerAnswersOnCuda) {
  testing::TempDir dir{"bs_cuda_server"};
  const std::string path = (dir.path() / "tiny.gguf").string();
  testing::tiny_llama_writer("llama", kTinyLayers).write(path);
  RuntimeConfig config = default_runtime_config();
  config.model_path = path;
  config.device_kind = "cuda";
  config.gpus = {0};
  config.ssd.enabled = false;
  config.data_dir = dir.path().string();
  config.kv_cache_bytes = int64_t{256} << 20;
  Runtime runtime(config);
  EXPECT_EQ(runtime.context().backend->name(), "cuda");
  http::Server server(runtime, config);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.serve(); });
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120, 0);
  const nlohmann::json body = {
      {"model", "tiny"},
      {"messages", {{{"role", "user"}, {"content", "what is it"}}}},
      {"documents", {"hello world and the world is on it", "the hill and the inn at the end of it"}},
      {"max_tokens", 8},
      {"temperature", 0}};
  for (int i = 0; i < 2; ++i) {  // the second request finds its chunks stored
    auto r = client.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r) << "no answer";
    ASSERT_EQ(r->status, 200) << r->body;
    const auto j = nlohmann::json::parse(r->body);
    const std::string text = j["choices"][0]["message"]["content"];
    EXPECT_FALSE(text.empty());
  }
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("blendserve_backend_info{backend=\"cuda\""), std::string::npos);
  server.stop();
  serving.join();
  runtime.shutdown();
}

}  // namespace
}  // namespace bs

int main(int argc, char** argv) {
  if (bs::kernels::cuda::device_count() == 0) {
    std::printf("cuda_test_model: no CUDA device (or no driver): skipped\n");
    return 77;
  }
  std::printf("cuda_test_model: %s\n", bs::kernels::cuda::device_description(0).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
