// Tensor parallelism on CPU ranks (model/tensor_parallel.h, model/tp_group.h) with the
// tiny synthetic Llama (tests/tiny_model.h, heads configurable), real threads and the
// in-process communicator: tp 2 and 4 compute what tp 1 does (logits within fp32
// rounding of the reordered sums, the same greedy tokens), every rank returns
// bit-identical logits, a degree that does not divide the model is refused naming
// the counts, and a rank that fails aborts the others at once, after which the group
// is rebuilt and the next step succeeds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/rag_prompt.h"
#include "blend/store_backed_blend.h"
#include "storage/memory_store.h"
#include "kernels/dequant.h"
#include "model/generate.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/random_model.h"
#include "model/tensor_parallel.h"
#include "model/tp_group.h"
#include "tests/temp_dir.h"
#include "tests/tp_fixture.h"
#include "tests/tiny_model.h"

namespace bs {
namespace {

using ::testing::HasSubstr;
using testing::BlendRun;
using testing::Generated;
using testing::blend_on;
using testing::generate_on;
using testing::max_abs_diff;
using namespace std::chrono_literals;

constexpr int kLayers = 3;

std::unique_ptr<kernels::Backend> cpu() { return kernels::make_cpu_backend(); }

// A tiny model file of the given shape in a directory of its own.
struct TinyFile {
  explicit TinyFile(testing::TinyShape shape) { testing::tiny_llama_writer("llama", kLayers, shape).write(path); }
  testing::TempDir dir{"bs_tp"};
  std::string path = (dir.path() / "tiny.gguf").string();
};

std::vector<int32_t> prompt_of(const LlamaModel& m) {
  return m.tokenizer().encode("hello world and the world is on it, you and i", false);
}

TEST(TensorParallel, DegreesThatDoNotDivideTheModelAreRefusedNamingTheCounts) {
  LlamaConfig smollm2;
  smollm2.n_heads = 9;
  smollm2.n_kv_heads = 3;
  smollm2.ff = 1536;
  EXPECT_NO_THROW(check_tensor_parallel(smollm2, 1));
  EXPECT_NO_THROW(check_tensor_parallel(smollm2, 3));
  try {
    check_tensor_parallel(smollm2, 2);
    FAIL() << "tp 2 of 9 query heads accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("9 query heads"));
    EXPECT_THAT(e.what(), HasSubstr("3 KV heads"));
    EXPECT_THAT(e.what(), HasSubstr("degrees that fit: 1, 3"));
  }
  EXPECT_THROW(check_tensor_parallel(smollm2, 0), std::invalid_argument);
  EXPECT_THROW(shard_config(smollm2, TpShard{3, 3}), std::invalid_argument);
  const LlamaConfig shard = shard_config(smollm2, TpShard{2, 3});
  EXPECT_EQ(shard.n_heads, 3);
  EXPECT_EQ(shard.n_kv_heads, 1);
  EXPECT_EQ(shard.ff, 512);

  TinyFile file({64, 4, 2, 0});  // 2 KV heads: tp 4 cannot split them
  try {
    TpGroup group(file.path, 4, cpu, kernels::Precision::F32, kernels::TensorType::F32);
    FAIL() << "tp 4 of 2 KV heads loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 KV heads"));
  }
}

// 8 query / 4 KV heads and a vocabulary of 304: tp 2 and 4 split the heads, the
// feed-forward rows and the LM head; tp 1's tokens and logits within fp32 rounding.
TEST(TensorParallel, TwoAndFourRanksGenerateWhatOneRankDoes) {
  TinyFile file({128, 8, 4, 3});
  TpGroup one(file.path, 1, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  const auto prompt = prompt_of(one.model(0));
  const Generated want = generate_on(one, prompt, 12);
  for (int tp : {2, 4}) {
    TpGroup group(file.path, tp, cpu, kernels::Precision::F32, kernels::TensorType::F32);
    EXPECT_EQ(group.model(0).output_rows(), 304 / tp) << "the LM head is split by vocabulary rows";
    EXPECT_EQ(group.model(tp - 1).config().n_kv_heads, 4 / tp);
    EXPECT_EQ(group.model(tp - 1).first_kv_head(), (tp - 1) * (4 / tp));
    EXPECT_EQ(group.model(0).fingerprint(), group.model(tp - 1).fingerprint()) << "one key for every rank";
    EXPECT_NE(group.model(0).fingerprint(), one.model(0).fingerprint()) << "KV at tp " << tp << " is keyed apart";
    const Generated got = generate_on(group, prompt, 12);
    EXPECT_EQ(got.tokens, want.tokens) << "tp " << tp;
    for (size_t s = 0; s < want.logits.size(); ++s)
      EXPECT_LT(max_abs_diff(got.logits[s], want.logits[s]), 1e-4) << "tp " << tp << " step " << s;
  }
}

// 4 query / 2 KV heads and 301 tokens: tp 2 keeps the whole LM head on every rank
// (301 is odd) and still equals tp 1.
TEST(TensorParallel, AVocabularyTheRanksDoNotDivideKeepsTheWholeHead) {
  TinyFile file({64, 4, 2, 0});
  TpGroup one(file.path, 1, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  TpGroup two(file.path, 2, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  EXPECT_EQ(two.model(1).output_rows(), two.model(1).config().vocab);
  const auto prompt = prompt_of(one.model(0));
  const Generated want = generate_on(one, prompt, 8);
  const Generated got = generate_on(two, prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  for (size_t s = 0; s < want.logits.size(); ++s) EXPECT_LT(max_abs_diff(got.logits[s], want.logits[s]), 1e-4);
}

// A batched decode step of three sequences at tp 2 equals each sequence's own forward
// at tp 2, bit for bit (the all-reduce is per element, so rows stay independent).
TEST(TensorParallel, ABatchedDecodeStepEqualsOneTokenForwardsOnEveryRank) {
  TinyFile file({128, 8, 4, 3});
  TpGroup group(file.path, 2, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  const auto& tok = group.model(0).tokenizer();
  const std::vector<std::vector<int32_t>> prompts = {tok.encode("hello world", false), tok.encode("the inn at", false),
                                                     tok.encode("you and i in the hello", false)};
  const std::vector<int32_t> next = {40, 41, 42};
  std::vector<std::vector<float>> batched(2), alone(2);
  group.run([&](int r) {
    const auto& tf = group.transformer(r);
    std::vector<KvCache> a, b;
    for (const auto& p : prompts) {
      a.push_back(tf.make_cache(32));
      b.push_back(tf.make_cache(32));
      tf.forward(p, a.back());
      tf.forward(p, b.back());
    }
    std::vector<KvCache*> ptrs = {&a[0], &a[1], &a[2]};
    batched[r] = tf.decode_step(next, ptrs);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto one = tf.forward(std::span<const int32_t>(&next[i], 1), b[i]);
      alone[r].insert(alone[r].end(), one.begin(), one.end());
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(batched[r].size(), alone[r].size());
    EXPECT_EQ(std::memcmp(batched[r].data(), alone[r].data(), alone[r].size() * sizeof(float)), 0) << "rank " << r;
  }
}

// Rank 1 throws between two layers of a forward while rank 0 waits in that layer's
// all-reduce with a long timeout: rank 0 is released at once by the abort, run()
// throws rank 1's own error, the group is rebuilt, and the next forward on fresh
// caches equals a run that never failed.
TEST(TensorParallel, ARankThatFailsAbortsTheOthersAtOnceAndTheGroupIsRebuilt) {
  TinyFile file({128, 8, 4, 3});
  TpGroup group(file.path, 2, cpu, kernels::Precision::F32, kernels::TensorType::F32, 0, 60s);
  const auto prompt = prompt_of(group.model(0));
  const Generated before = generate_on(group, prompt, 1);
  std::atomic<bool> rank0_comm_error{false};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    group.run([&](int r) {
      const auto& tf = group.transformer(r);
      auto cache = tf.make_cache(64);
      const auto& c = tf.model().config();
      kernels::DeviceBuffer pos = tf.model().backend().alloc(static_cast<int64_t>(prompt.size() * sizeof(int32_t)));
      std::vector<int32_t> host_pos(prompt.size());
      for (size_t i = 0; i < prompt.size(); ++i) host_pos[i] = static_cast<int32_t>(i);
      tf.model().backend().copy_to_backend(pos.as<int32_t>(), host_pos.data(), pos.bytes());
      kernels::DeviceBuffer hidden =
          tf.model().backend().alloc(static_cast<int64_t>(prompt.size()) * c.dim * static_cast<int64_t>(sizeof(float)));
      tf.embed(prompt, hidden.as<float>());
      const auto n = static_cast<int64_t>(prompt.size());
      try {
        for (int l = 0; l < c.n_layers; ++l) {
          if (r == 1 && l == 1) throw std::runtime_error("test: rank 1 lost its device");
          tf.run_layer(l, hidden.as<float>(), pos.as<int32_t>(), n, cache, n);
        }
      } catch (const kernels::CommError&) {
        rank0_comm_error = r == 0;
        throw;
      }
    });
    FAIL() << "a failed rank went unnoticed";
  } catch (const kernels::CommError& e) {
    FAIL() << "run() threw the others' CommError, not the failing rank's error: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 lost its device"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "rank 0 waited out its 60 s timeout";
  EXPECT_TRUE(rank0_comm_error.load()) << "rank 0 was released by the abort";
  EXPECT_EQ(group.rebuilds(), 1);
  const Generated after = generate_on(group, prompt, 1);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(std::memcmp(after.logits[0].data(), before.logits[0].data(), before.logits[0].size() * sizeof(float)), 0);
}

// The blend at tp 2 and 4 on 8 query / 4 KV heads (by deviation and by impact): every rank recomputes the same
// tokens at every check layer (their digests compared, not assumed), the ranks'
// logits are bit-identical, and the selection, logits and continuation are tp 1's;
// a chunk's stored KV assembled from the ranks' heads is tp 1's within fp32 rounding.
TEST(TensorParallel, TheBlendSelectsOneSetOnEveryRankAndAnswersAsOneRankDoes) {
  TinyFile file({128, 8, 4, 3});
  TpGroup one(file.path, 1, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  const RagPrompt prompt = testing::tiny_rag_prompt(one.model(0).tokenizer());
  // Single pass and two passes by deviation; single pass by impact (the question's
  // attention, each rank's heads, all-reduced like the deviation); query-first (the
  // same attention, over every layer of the question's own pass, one selection).
  for (auto [filtering, selection] : {std::pair{Filtering::SinglePass, Selection::Deviation},
                                      std::pair{Filtering::TwoPass, Selection::Deviation},
                                      std::pair{Filtering::SinglePass, Selection::Impact},
                                      std::pair{Filtering::SinglePass, Selection::QueryFirst}}) {
    BlendOptions opt;
    opt.ratio = 0.3f;
    opt.check_layers = {1, 2};
    opt.filtering = filtering;
    opt.selection = selection;
    const BlendRun want = blend_on(one, prompt, opt, 6);
    ASSERT_EQ(want.digests[0].size(), selection == Selection::QueryFirst ? 1u : 2u);
    ASSERT_FALSE(want.recomputed[0].empty());
    for (int tp : {2, 4}) {
      TpGroup group(file.path, tp, cpu, kernels::Precision::F32, kernels::TensorType::F32);
      const BlendRun got = blend_on(group, prompt, opt, 6);
      const std::string what =
          std::string("tp ") + std::to_string(tp) + ", " + filtering_name(filtering) + ", " + selection_name(selection);
      for (int r = 0; r < tp; ++r) {
        EXPECT_EQ(got.digests[r], got.digests[0]) << what << ": rank " << r << " selected other tokens";
        EXPECT_EQ(got.recomputed[r], got.recomputed[0]) << what << ", rank " << r;
        EXPECT_EQ(std::memcmp(got.logits[r].data(), got.logits[0].data(), got.logits[0].size() * sizeof(float)), 0)
            << what << ", rank " << r;
      }
      EXPECT_EQ(got.digests[0], want.digests[0]) << what;
      EXPECT_EQ(got.recomputed[0], want.recomputed[0]) << what;
      EXPECT_LT(max_abs_diff(got.logits[0], want.logits[0]), 1e-4) << what;
      EXPECT_EQ(got.tokens, want.tokens) << what;
      // A direct store-backed prefill would let each rank decide its own hits: refused.
      MemoryKvStore store(1 << 20);
      BlendEngine engine(group.transformer(0));
      EXPECT_THROW(StoreBackedBlend(engine, store), std::invalid_argument);
      for (size_t i = 0; i < want.chunks.size(); ++i) {
        const auto& a = *got.chunks[i];
        const auto& b = *want.chunks[i];
        ASSERT_EQ(a.k.size(), b.k.size());
        const auto* ka = reinterpret_cast<const float*>(a.k.data());
        const auto* kb = reinterpret_cast<const float*>(b.k.data());
        double worst = 0;
        for (size_t e = 0; e < a.k.size() / sizeof(float); ++e)
          worst = std::max(worst, static_cast<double>(std::fabs(ka[e] - kb[e])));
        EXPECT_LT(worst, 1e-4) << what << ", part " << i;
      }
    }
  }
}

// The benchmarks' random-weight models (model/random_model.h) load as real ones do,
// compute finite logits, and split across ranks like any model: SmolLM2's shape at
// tp 3 generates tp 1's tokens. An unknown shape names the known ones.
TEST(TensorParallel, RandomWeightModelsLoadAndSplit) {
  try {
    random_llama_shape("llama-9000");
    FAIL() << "an unknown shape was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("llama-3.2-1b"));
  }
  testing::TempDir dir("bs_random_model");
  const std::string path = (dir.path() / "random.gguf").string();
  write_random_llama(random_llama_shape("smollm2-135m"), path);
  TpGroup one(path, 1, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  TpGroup three(path, 3, cpu, kernels::Precision::F32, kernels::TensorType::F32);
  EXPECT_EQ(one.model(0).config().n_heads, 9);
  EXPECT_EQ(one.model(0).config().vocab, 49152);
  const std::vector<int32_t> prompt = {300, 4000, 17, 256, 9000, 12, 40000, 5};
  const Generated want = generate_on(one, prompt, 4);
  for (float x : want.logits[0]) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(generate_on(three, prompt, 4).tokens, want.tokens);
}

// `--model random:NAME` (the GPU benchmarks' models): BF16 weights built in memory once
// per process (a memfd, nothing on disk), the same path the second time, the shape's
// dimensions and finite logits; a written BF16 file is the same bytes; Llama-3.1-8B's
// shape is known (not built here: 16 GB).
TEST(TensorParallel, RandomModelsByNameAreBuiltInMemoryAsBf16) {
  const std::string path = materialize_model_path("random:smollm2-135m");
  EXPECT_EQ(path.rfind("/proc/self/fd/", 0), 0u) << path;
  EXPECT_EQ(materialize_model_path("random:smollm2-135m"), path) << "built once";
  EXPECT_EQ(materialize_model_path("/some/file.gguf"), "/some/file.gguf");
  EXPECT_THROW(materialize_model_path("random:llama-9000"), std::invalid_argument);
  const auto big = random_llama_shape("llama-3.1-8b");
  EXPECT_EQ(big.dim, 4096);
  EXPECT_EQ(big.ff, 14336);
  EXPECT_EQ(big.layers, 32);
  EXPECT_EQ(big.kv_heads, 8);

  const auto backend = cpu();
  LlamaModel model("random:smollm2-135m", *backend, kernels::Precision::F32, kernels::TensorType::F32);
  EXPECT_EQ(model.path(), "random:smollm2-135m");
  EXPECT_EQ(model.config().n_layers, 30);
  EXPECT_EQ(model.config().dim, 576);
  EXPECT_EQ(model.layer(0).wqkv->view.type, kernels::TensorType::BF16);
  Transformer tf(model);
  auto cache = tf.make_cache(16);
  const std::vector<int32_t> prompt = {300, 4000, 17, 256, 9000};
  const auto logits = tf.forward(prompt, cache);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));

  testing::TempDir dir("bs_random_bf16");
  const std::string file = (dir.path() / "random.gguf").string();
  write_random_llama(random_llama_shape("smollm2-135m"), file, 1, kernels::TensorType::BF16);
  // Compared byte for byte (loading it as a second model took most of this test's ~16 s
  // under the sanitizers: 135M weights widened to fp32).
  std::ifstream a(path, std::ios::binary), b(file, std::ios::binary);
  ASSERT_TRUE(a && b);
  std::vector<char> ba(size_t{1} << 20), bb(size_t{1} << 20);
  int64_t compared = 0;
  for (;;) {
    a.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    b.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    ASSERT_EQ(a.gcount(), b.gcount()) << "the file and the memfd differ in length after " << compared << " bytes";
    ASSERT_TRUE(std::equal(ba.begin(), ba.begin() + a.gcount(), bb.begin()))
        << "the file and the memfd differ within bytes " << compared << ".." << compared + a.gcount();
    compared += a.gcount();
    if (a.gcount() == 0) break;
  }
  EXPECT_GT(compared, int64_t{200} << 20);  // ~270 MB of BF16 weights
  EXPECT_THROW(write_random_llama(random_llama_shape("smollm2-135m"), file, 1, kernels::TensorType::F16),
               std::invalid_argument);
}

// The Q4_K_M mix of random models (`blendctl make-random-model --weights q4_k_m`, the
// 8B-shaped memory benchmark): Q4_K matrices with attn_v, ffn_down and an untied LM head
// in Q6_K, weights of mean ~0 and sd ~1/sqrt(in) (activations stay finite through the
// layers); a shape whose widths are not multiples of 256 is refused.
TEST(RandomModel, Q4KMixHasLlamaCppsTypesAndRuns) {
  testing::TempDir dir("bs_random_q4km");
  const std::string file = (dir.path() / "tiny.gguf").string();
  write_random_llama(random_llama_shape("tiny-256"), file, 1, kernels::TensorType::Q4_K);
  const auto g = gguf::GgufFile::open(file);
  EXPECT_EQ(g.tensor("blk.0.attn_q.weight").type, kernels::TensorType::Q4_K);
  EXPECT_EQ(g.tensor("blk.1.ffn_up.weight").type, kernels::TensorType::Q4_K);
  EXPECT_EQ(g.tensor("blk.0.attn_v.weight").type, kernels::TensorType::Q6_K);
  EXPECT_EQ(g.tensor("blk.1.ffn_down.weight").type, kernels::TensorType::Q6_K);
  EXPECT_EQ(g.tensor("output.weight").type, kernels::TensorType::Q6_K);
  std::vector<float> w(256);
  kernels::dequantize_row(kernels::TensorType::Q4_K, g.tensor("blk.0.attn_q.weight").data, w.data(), 256);
  double mean = 0, sq = 0;
  for (float x : w) mean += x / 256.0, sq += double{x} * x / 256.0;
  EXPECT_LT(std::abs(mean), 0.02);
  EXPECT_NEAR(std::sqrt(sq - mean * mean), 1.0 / 16.0, 0.02);  // 1/sqrt(256)

  const auto backend = cpu();
  LlamaModel model(file, *backend, kernels::Precision::F32, kernels::TensorType::F32);
  Transformer tf(model);
  auto cache = tf.make_cache(40);
  std::vector<int32_t> prompt(32);
  for (int i = 0; i < 32; ++i) prompt[i] = (i * 37) % 1024;
  const auto logits = tf.forward(prompt, cache);  // 32 rows: the prefill GEMM
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_THROW(write_random_llama(random_llama_shape("smollm2-135m"), file, 1, kernels::TensorType::Q4_K),
               std::invalid_argument);
}

}  // namespace
}  // namespace bs
