// The blend engine on a tiny synthetic Llama (tests/tiny_model.h: 6 layers of random
// weights, milliseconds per prefill), so every selection path runs in the unit set
// and under ASan+UBSan: both filterings, one and several check layers, global and
// per-chunk quotas, K/V/KV deviation, sink tokens, a chunk prelude, misses. For
// every combination the invariants that hold whatever the weights:
//  - recomputed positions are sorted, unique, inside cached chunks, within budget;
//  - ratio 0 is reuse exactly, ratio 1 is full (fp32 rounding), logits are finite;
//  - single-pass and two-pass pick the same tokens with one check layer.
// What the choices mean on a real model is tested on the real model
// (test_blend_selection.cpp, test_blend_prelude.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/rag_prompt.h"
#include "model/llama_model.h"
#include "storage/memory_store.h"
#include "tests/model_fixture.h"
#include "tests/temp_dir.h"
#include "tests/tiny_model.h"

namespace bs {
namespace {

constexpr int kTinyLayers = 6;

struct Tiny {
  Tiny() {
    testing::tiny_llama_writer("llama", kTinyLayers).write(path);
    model = std::make_unique<LlamaModel>(path, testing::shared_backend(), kernels::Precision::F32);
    tf = std::make_unique<Transformer>(*model);
  }
  testing::TempDir dir{"bs_tiny_blend"};
  std::string path = (dir.path() / "tiny.gguf").string();
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Transformer> tf;

  RagPrompt prompt() const {
    const auto& tok = model->tokenizer();
    RagPrompt p;
    p.prefix = tok.encode("<|im_start|>system\nyou read<|im_end|>\n<|im_start|>user\n", true);
    for (const char* doc : {"hello world and the world is on it\n\n", "the hill and the inn at the end of it\n\n",
                            "you and i in the hello world of worlds\n\n", "on and on at the hotel in the north\n\n"})
      p.chunks.push_back(tok.encode(doc, false));
    p.suffix = tok.encode("what is it<|im_end|>\n<|im_start|>assistant\n", true);
    return p;
  }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

TEST(TinyBlend, EverySelectionPathKeepsTheInvariants) {
  Tiny& t = tiny();
  const RagPrompt prompt = t.prompt();
  const std::vector<char> stored = {1, 1, 0, 1};  // chunk 2 misses
  int64_t H = 0;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) H += stored[i] ? static_cast<int64_t>(prompt.chunks[i].size()) : 0;

  for (bool with_prelude : {false, true}) {
    MemoryKvStore store(int64_t{1} << 28);
    BlendEngine engine(*t.tf, store,
                       with_prelude ? t.model->tokenizer().encode("<|im_start|>system\n", true) : std::vector<int32_t>{});
    RagPrompt warm = prompt;
    warm.chunks = {prompt.chunks[0], prompt.chunks[1], prompt.chunks[3]};
    engine.warm(warm);
    BlendOptions o;
    o.mode = BlendMode::Full;
    const auto full = engine.prefill(prompt, o, 4);
    o.mode = BlendMode::Reuse;
    const auto reuse = engine.prefill(prompt, o, 4);
    ASSERT_EQ(reuse.stats.chunks_hit, 3);
    ASSERT_EQ(reuse.stats.cached_tokens, H);
    // The rows the controller plans for (planned_rows_per_layer) are the rows the engine
    // computes (BlendStats::row_layers): full computes every row in every layer, reuse
    // the rows without stored KV (the prefix is stored: only the missed chunk and the suffix).
    const int64_t N = prompt.size(), P = static_cast<int64_t>(prompt.prefix.size());
    auto planned = [&](const BlendOptions& b, int64_t other, int64_t cached) {
      double sum = 0;
      for (double x : planned_rows_per_layer(b, kTinyLayers, other, cached)) sum += x;
      return sum;
    };
    EXPECT_EQ(full.stats.row_layers, N * kTinyLayers);
    EXPECT_EQ(planned(o, N - H - P, H), static_cast<double>(reuse.stats.row_layers));
    o.mode = BlendMode::Full;
    EXPECT_EQ(planned(o, N, 0), static_cast<double>(full.stats.row_layers));

    const std::vector<std::vector<int>> checks = {{1}, {2}, {1, 2, 3}, {1, 2, 3, 4, 5}};
    for (Filtering filtering : {Filtering::SinglePass, Filtering::TwoPass})
      for (const auto& layers : checks)
        for (Quota quota : {Quota::Global, Quota::PerChunk})
          for (Deviation deviation : {Deviation::K, Deviation::V, Deviation::KV})
            for (int sinks : {0, 2})
              for (float ratio : {0.0f, 0.01f, 0.15f, 0.5f, 0.99f, 1.0f}) {
                SCOPED_TRACE(std::string(filtering_name(filtering)) + " checks " + std::to_string(layers.size()) +
                             " first " + std::to_string(layers.front()) + " " + quota_name(quota) + " " +
                             deviation_name(deviation) + " sinks " + std::to_string(sinks) + " ratio " +
                             std::to_string(ratio) + (with_prelude ? " prelude" : ""));
                BlendOptions b;
                b.filtering = filtering;
                b.check_layers = layers;
                b.quota = quota;
                b.deviation = deviation;
                b.sink_tokens = sinks;
                b.ratio = ratio;
                const auto r = engine.prefill(prompt, b, 4);
                ASSERT_TRUE(all_finite(r.logits));
                if (quota == Quota::Global && sinks == 0) {
                  // Each check rounds its kept count and keeps at least min_tokens: at
                  // most a row or two per layer apart from the plan.
                  EXPECT_NEAR(static_cast<double>(r.stats.row_layers), planned(b, N - H - P, H), 2.0 * kTinyLayers);
                }
                const auto& pos = r.recomputed_positions;
                ASSERT_EQ(static_cast<int64_t>(pos.size()), r.stats.recomputed_tokens);
                ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
                ASSERT_EQ(std::adjacent_find(pos.begin(), pos.end()), pos.end());
                for (int32_t p : pos) {
                  bool inside = false;
                  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
                    const int64_t off = prompt.chunk_offset(i);
                    inside |= stored[i] && p >= off && p < off + static_cast<int64_t>(prompt.chunks[i].size());
                  }
                  ASSERT_TRUE(inside) << "position " << p;
                }
                if (ratio == 0.0f) {
                  EXPECT_TRUE(pos.empty());
                  EXPECT_EQ(max_abs_diff(r.logits, reuse.logits), 0.0);
                  continue;
                }
                if (ratio == 1.0f) {
                  EXPECT_EQ(static_cast<int64_t>(pos.size()), H);
                  EXPECT_LT(max_abs_diff(r.logits, full.logits), 1e-3);
                  continue;
                }
                // Budget: round(ratio * H), at least min_tokens; the sinks (2 per cached
                // chunk) are recomputed whatever the budget.
                const int64_t budget = std::max<int64_t>(std::llround(static_cast<double>(ratio) * H), b.min_tokens);
                const int64_t forced = sinks > 0 ? 3 * sinks : 0;
                if (quota == Quota::Global) {
                  EXPECT_EQ(static_cast<int64_t>(pos.size()), std::max(budget, forced));
                } else {
                  // Each chunk takes max(its share, its sinks); the shares add up to the budget.
                  EXPECT_LE(static_cast<int64_t>(pos.size()), budget + forced);
                  EXPECT_GE(static_cast<int64_t>(pos.size()), std::min(budget, H));
                }
                ASSERT_EQ(r.stats.candidates_per_check.size(), layers.size());
                for (size_t i = 1; i < layers.size(); ++i)
                  EXPECT_LE(r.stats.candidates_per_check[i], r.stats.candidates_per_check[i - 1]);
                EXPECT_EQ(r.stats.candidates_per_check.back(), static_cast<int64_t>(pos.size()));
                for (size_t i = 0; i < prompt.chunks.size(); ++i) {
                  if (!stored[i]) continue;
                  for (int j = 0; j < sinks; ++j) {
                    EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(),
                                                   static_cast<int32_t>(prompt.chunk_offset(i) + j)));
                  }
                }
                if (layers.size() == 1 && filtering == Filtering::SinglePass) {
                  BlendOptions two = b;
                  two.filtering = Filtering::TwoPass;
                  EXPECT_EQ(engine.prefill(prompt, two, 4).recomputed_positions, pos);
                }
              }
  }
}

// Check layers outside the model, a bad schedule and negative sinks are refused
// before any work.
TEST(TinyBlend, BadOptionsAreRefused) {
  Tiny& t = tiny();
  MemoryKvStore store(int64_t{1} << 28);
  BlendEngine engine(*t.tf, store);
  const RagPrompt prompt = t.prompt();
  engine.warm(prompt);
  BlendOptions o;
  o.check_layers = {kTinyLayers};
  EXPECT_THROW(engine.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {0};
  EXPECT_THROW(engine.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {1, 2};
  o.schedule = {0.05f};  // below the ratio
  EXPECT_THROW(engine.prefill(prompt, o), std::invalid_argument);
  o.schedule = {};
  o.sink_tokens = -1;
  EXPECT_THROW(engine.prefill(prompt, o), std::invalid_argument);
}

}  // namespace
}  // namespace bs
