// Every architecture we compute against Hugging Face transformers' own logits: tiny
// random models of Llama (3.1 RoPE scaling, from the llama3 keys and from rope_freqs),
// Mistral, Qwen2 (biases, tied head) and Qwen3 (per-head q/k norms, head_dim apart
// from the width) and Gemma 3 (5 sliding-window layers with a window of 8, shorter than
// the prompts, and a global one with linear RoPE scaling; GeGLU, pre and post norms,
// scaled embeddings), each as GGUF in F32/F16 (Gemma 3: K-quants only) and in a
// K-quant mix (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q8_0), Llama (F16), Qwen3 and Gemma 3
// (BF16) also as Hugging Face checkpoint
// directories (model/hf_checkpoint.h: safetensors, config.json, tokenizer.json), made with transformers' logits for the exact weights each file
// holds by tools/fixtures/make_arch_reference.py (tests/fixtures/arch/). Every position of
// every prompt must match within a relative bound, with the same top-1 wherever the
// reference leads by more than 0.1, in prefill, decode steps and at tensor parallel
// degree 2; the blend at ratio 1 must equal full prefill.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/rag_prompt.h"
#include "blend/store_backed_blend.h"
#include "model/llama_model.h"
#include "model/tp_group.h"
#include "model/transformer.h"
#include "storage/memory_store.h"
#include "tests/model_fixture.h"
#include "tests/tp_fixture.h"

namespace {

const std::string kDir = std::string(BLENDSERVE_FIXTURES) + "/arch/";

struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> logits;  // per prompt: [positions, vocab]
  int vocab = 0;
};

Reference read_reference(const std::string& stem) {
  Reference r;
  std::ifstream meta(kDir + stem + ".json");
  EXPECT_TRUE(meta) << "missing " << kDir << stem << ".json (tools/fixtures/make_arch_reference.py)";
  if (!meta) return r;
  const auto j = nlohmann::json::parse(meta);
  r.vocab = j.at("vocab");
  std::ifstream blob(kDir + stem + ".logits.f32", std::ios::binary);
  for (const auto& ids : j.at("prompts")) {
    r.prompts.push_back(ids.get<std::vector<int32_t>>());
    std::vector<float> l(r.prompts.back().size() * static_cast<size_t>(r.vocab));
    blob.read(reinterpret_cast<char*>(l.data()), static_cast<std::streamsize>(l.size() * sizeof(float)));
    EXPECT_TRUE(blob) << stem << ".logits.f32 is short";
    r.logits.push_back(std::move(l));
  }
  return r;
}

struct Case {
  const char* stem;  // tests/fixtures/arch/<stem>.gguf
  const char* arch;  // general.architecture
};
const Case kCases[] = {{"llama.f32", "llama"}, {"llama.kq", "llama"},  {"mistral.kq", "llama"},
                       {"qwen2.f16", "qwen2"}, {"qwen2.kq", "qwen2"},  {"qwen3.f16", "qwen3"},
                       {"qwen3.kq", "qwen3"},  {"llama.hf", "llama"},  {"qwen3.hf", "qwen3"},
                       {"gemma3.kq", "gemma3"}, {"gemma3.hf", "gemma3"}};

// The model path of a case: <stem>.gguf, or the checkpoint directory <stem> (".hf").
std::string model_of(const Case& c) {
  const std::string stem = c.stem;
  return kDir + stem + (stem.ends_with(".hf") ? "" : ".gguf");
}

// Relative max error over a prompt's logits (max |ours - ref| / max |ref|) and the
// count of decisive positions (ref's top-1 leads by > 0.1) whose top-1 differs.
struct Agreement {
  double rel_max = 0;
  int decisive = 0, decisive_flips = 0;
};
Agreement compare(const std::vector<float>& ours, const std::vector<float>& ref, int vocab) {
  Agreement a;
  double err = 0, mag = 1e-12;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(ours[i] - ref[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(ref[i])));
  }
  a.rel_max = err / mag;
  for (size_t p = 0; p < ref.size() / vocab; ++p) {
    const float* r = ref.data() + p * vocab;
    const float* o = ours.data() + p * vocab;
    int best = 0, second = -1;
    for (int v = 1; v < vocab; ++v)
      if (r[v] > r[best]) second = best, best = v;
      else if (second < 0 || r[v] > r[second]) second = v;
    if (r[best] - r[second] <= 0.1f) continue;
    ++a.decisive;
    int ob = 0;
    for (int v = 1; v < vocab; ++v)
      if (o[v] > o[ob]) ob = v;
    if (ob != best) ++a.decisive_flips;
  }
  return a;
}

class ModelArch : public ::testing::TestWithParam<Case> {};

// fp32 arithmetic in another order than PyTorch's: the bound (1e-4 of the largest
// logit) is two orders above what reordering gives here and three below a wrong
// feature (a norm left out, RoPE in the other convention, unscaled frequencies).
TEST_P(ModelArch, LogitsMatchTransformers) {
  const Case c = GetParam();
  const Reference ref = read_reference(c.stem);
  ASSERT_FALSE(ref.prompts.empty());
  bs::LlamaModel model(model_of(c), bs::testing::shared_backend(), bs::kernels::Precision::F32);
  EXPECT_EQ(model.config().architecture, c.arch);
  ASSERT_EQ(model.config().vocab, ref.vocab);
  bs::Transformer tf(model);
  int decisive = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    auto cache = tf.make_cache(static_cast<int64_t>(ref.prompts[i].size()));
    const auto ours = tf.forward(ref.prompts[i], cache, /*all_logits=*/true);
    const Agreement a = compare(ours, ref.logits[i], ref.vocab);
    EXPECT_LT(a.rel_max, 1e-4) << c.stem << " prompt " << i;
    EXPECT_EQ(a.decisive_flips, 0) << c.stem << " prompt " << i << ": " << a.decisive << " decisive positions";
    decisive += a.decisive;
  }
  EXPECT_GT(decisive, 20) << "the references should mostly be decisive";
}

// Decode steps (one token at a time over the cache) give the same logits as the
// reference's positions too, batched rows included (the decode products' path).
TEST_P(ModelArch, DecodeStepsMatchTransformers) {
  const Case c = GetParam();
  const Reference ref = read_reference(c.stem);
  ASSERT_FALSE(ref.prompts.empty());
  bs::LlamaModel model(model_of(c), bs::testing::shared_backend(), bs::kernels::Precision::F32);
  bs::Transformer tf(model);
  const auto& ids = ref.prompts[0];
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()));
  std::vector<float> ours;
  for (int32_t id : ids) {
    bs::KvCache* one[] = {&cache};
    const auto l = tf.decode_step(std::vector<int32_t>{id}, one);
    ours.insert(ours.end(), l.begin(), l.end());
  }
  const Agreement a = compare(ours, ref.logits[0], ref.vocab);
  EXPECT_LT(a.rel_max, 1e-4) << c.stem;
  EXPECT_EQ(a.decisive_flips, 0) << c.stem;
}

// A compute thread that frees its scratch when it goes idle (Backend::release_scratch:
// the workspace, the GEMMs' chunk buffers, the ops' staging vectors) computes the same
// logits afterwards, bit for bit, in prefill and in a decode step.
TEST_P(ModelArch, FreeingTheThreadsScratchChangesNoLogit) {
  const Case c = GetParam();
  const Reference ref = read_reference(c.stem);
  ASSERT_FALSE(ref.prompts.empty());
  auto& backend = bs::testing::shared_backend();
  bs::LlamaModel model(model_of(c), backend, bs::kernels::Precision::F32);
  bs::Transformer tf(model);
  const auto& ids = ref.prompts[0];
  const std::vector<int32_t> prompt(ids.begin(), ids.end() - 1);
  auto run = [&] {
    auto cache = tf.make_cache(static_cast<int64_t>(ids.size()));
    auto logits = tf.forward(prompt, cache, /*all_logits=*/true);
    bs::KvCache* one[] = {&cache};
    const auto step = tf.decode_step(std::vector<int32_t>{ids.back()}, one);
    logits.insert(logits.end(), step.begin(), step.end());
    return logits;
  };
  const auto before = run();
  backend.release_scratch();
  const auto after = run();
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * sizeof(float))) << c.stem;
  backend.release_scratch();  // twice in a row, and with nothing grown: harmless
  backend.release_scratch();
  EXPECT_EQ(0, std::memcmp(before.data(), run().data(), before.size() * sizeof(float))) << c.stem;
}

// model.batch_invariant: a prompt split anywhere into prefills (a prefix-cache hit's
// stored rows, then the rest) gives every position's logits, and the decode step after
// it, bit for bit as one prefill does; and still matches transformers.
TEST_P(ModelArch, ABatchInvariantBackendComputesThePromptTheSameWhereverItIsSplit) {
  const Case c = GetParam();
  const Reference ref = read_reference(c.stem);
  ASSERT_FALSE(ref.prompts.empty());
  auto backend = bs::kernels::make_cpu_backend(bs::kernels::DecodeActivations::Exact, /*batch_invariant=*/true);
  bs::LlamaModel model(model_of(c), *backend, bs::kernels::Precision::F32);
  bs::Transformer tf(model);
  const auto& ids = ref.prompts[0];
  const int64_t len = static_cast<int64_t>(ids.size());
  ASSERT_GT(len, 12);
  const std::vector<int32_t> prompt(ids.begin(), ids.end() - 1);
  auto run = [&](std::vector<int64_t> cuts) {  // prefills of [0, cuts[0]), [cuts[0], cuts[1]), ... the rest
    cuts.push_back(len - 1);
    auto cache = tf.make_cache(len);
    std::vector<float> logits;
    int64_t at = 0;
    for (int64_t cut : cuts) {
      const std::vector<int32_t> part(prompt.begin() + at, prompt.begin() + cut);
      const auto l = tf.forward(part, cache, /*all_logits=*/true);
      logits.insert(logits.end(), l.begin(), l.end());
      at = cut;
    }
    bs::KvCache* one[] = {&cache};
    const auto step = tf.decode_step(std::vector<int32_t>{ids.back()}, one);
    logits.insert(logits.end(), step.begin(), step.end());
    return logits;
  };
  const auto whole = run({});
  const Agreement a = compare(whole, ref.logits[0], ref.vocab);
  EXPECT_LT(a.rel_max, 1e-4) << c.stem;
  EXPECT_EQ(a.decisive_flips, 0) << c.stem;
  for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{
           {1}, {4}, {9}, {len - 2}, {3, 11}, {5, 6, 7}}) {
    const auto split = run(cuts);
    ASSERT_EQ(split.size(), whole.size());
    EXPECT_EQ(0, std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)))
        << c.stem << ": split at " << cuts[0] << (cuts.size() > 1 ? " and after" : "");
  }
}

// The blend at ratio 1 recomputes every token: it equals full prefill on every
// architecture (the per-head norms and biases included), and every selection rule runs.
// Gemma 3's local layers: a stored chunk's K/V there were computed with the chunk's own
// window, as on every layer with its own prefix; the blend treats them as any layer's
// (the same selection, positions repaired with the local layer's RoPE table) and its
// attention sees each query's window by absolute position, so at ratio 1 it is full
// prefill (the prompt, 27 tokens, is over three windows of 8).
TEST_P(ModelArch, BlendAtRatioOneEqualsFullAndEveryRuleRuns) {
  const Case c = GetParam();
  bs::LlamaModel model(model_of(c), bs::testing::shared_backend(), bs::kernels::Precision::F32);
  bs::Transformer tf(model);
  bs::BlendEngine engine(tf);
  bs::MemoryKvStore store(int64_t{1} << 26);
  bs::StoreBackedBlend from_store(engine, store);
  bs::RagPrompt prompt;
  prompt.prefix = {256, 10, 11, 12};
  prompt.chunks = {{40, 41, 42, 43, 44, 45, 46, 47, 48, 49}, {60, 61, 62, 63, 64, 65, 66, 67}};
  prompt.suffix = {100, 101, 102, 103, 104};
  from_store.warm(prompt);  // every chunk's KV stored, computed alone
  bs::BlendOptions full;
  full.mode = bs::BlendMode::Full;
  const auto want = from_store.prefill(prompt, full, 1).logits;
  for (auto sel : {bs::Selection::QueryFirst, bs::Selection::Deviation, bs::Selection::Attention,
                   bs::Selection::Impact}) {
    SCOPED_TRACE(bs::selection_name(sel));
    bs::BlendOptions o;
    o.selection = sel;
    o.check_layers = {1};  // the tiny models have 2 layers
    o.ratio = 1.0f;
    const auto got = from_store.prefill(prompt, o, 1);
    EXPECT_EQ(got.stats.chunks_hit, 2);
    ASSERT_EQ(got.logits.size(), want.size());
    double err = 0, mag = 1e-12;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(got.logits[i] - want[i])));
      mag = std::max(mag, static_cast<double>(std::fabs(want[i])));
    }
    // 1e-5 where every product multiplies fp32 activations; the K-quant files' 4/5-bit
    // tensors of 32-element blocks (Q5_0 here) round a decode-size product's activations
    // to int16 (2^-16 of a block's largest value), and the blend's few-row passes take
    // that product where full prefill's GEMM does not (measured 1.1e-5)
    EXPECT_LT(err / mag, std::string(c.stem).find("kq") != std::string::npos ? 1e-4 : 1e-5) << c.stem;
    o.ratio = 0.3f;  // a partial recompute runs on this architecture too
    const auto partial = from_store.prefill(prompt, o, 1);
    EXPECT_EQ(partial.logits.size(), want.size());
    EXPECT_GT(partial.stats.recomputed_tokens, 0);
    EXPECT_LT(partial.stats.recomputed_tokens, 18);
  }
}

// Tensor parallel degree 2 (CPU ranks, model/tp_group.h) on the per-head-norm and the
// biased architectures, in plain and K-quant files (whose split down projection falls
// inside a super-block: dequantized for the rank): the last position's logits are
// transformers' within the same bound, and 8 greedy tokens are tp 1's.
TEST_P(ModelArch, TensorParallelDegree2EqualsTp1AndTransformers) {
  const Case c = GetParam();
  const Reference ref = read_reference(c.stem);
  ASSERT_FALSE(ref.prompts.empty());
  auto cpu = [] { return bs::kernels::make_cpu_backend(); };
  bs::TpGroup one(model_of(c), 1, cpu, bs::kernels::Precision::F32, bs::kernels::TensorType::F32);
  bs::TpGroup two(model_of(c), 2, cpu, bs::kernels::Precision::F32, bs::kernels::TensorType::F32);
  EXPECT_EQ(two.model(1).config().n_kv_heads, 1);
  const auto& ids = ref.prompts[1];
  const auto got = bs::testing::generate_on(two, ids, 8);
  const auto want = bs::testing::generate_on(one, ids, 8);
  EXPECT_EQ(got.tokens, want.tokens) << c.stem;
  const std::vector<float> last(ref.logits[1].end() - ref.vocab, ref.logits[1].end());
  const Agreement a = compare(got.logits[0], last, ref.vocab);
  EXPECT_LT(a.rel_max, 1e-4) << c.stem;
  EXPECT_EQ(a.decisive_flips, 0) << c.stem;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelArch, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string s = info.param.stem;
  for (char& ch : s)
    if (ch == '.') ch = '_';
  return s;
});

}  // namespace
