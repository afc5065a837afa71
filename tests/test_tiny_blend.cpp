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
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/store_backed_blend.h"
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

  RagPrompt prompt() const { return testing::tiny_rag_prompt(model->tokenizer()); }
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
    BlendEngine engine(*t.tf,
                       with_prelude ? t.model->tokenizer().encode("<|im_start|>system\n", true) : std::vector<int32_t>{});
    StoreBackedBlend from_store(engine, store);
    RagPrompt warm = prompt;
    warm.chunks = {prompt.chunks[0], prompt.chunks[1], prompt.chunks[3]};
    from_store.warm(warm);
    BlendOptions o;
    o.mode = BlendMode::Full;
    const auto full = from_store.prefill(prompt, o, 4);
    o.mode = BlendMode::Reuse;
    const auto reuse = from_store.prefill(prompt, o, 4);
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

    // The invariants every option set keeps (ratio 0 is reuse, 1 is full, the budget,
    // the narrowing, the sinks, the per-chunk counts).
    auto check = [&](const BlendOptions& b) {
      const auto& layers = b.check_layers;
      const Filtering filtering = b.filtering;
      const Quota quota = b.quota;
      const int sinks = b.sink_tokens;
      const float ratio = b.ratio;
      const auto r = from_store.prefill(prompt, b, 4);
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
      // The trace's per-request facts: the rule that chose, and the count per chunk.
      ASSERT_EQ(r.stats.recomputed_per_chunk.size(), prompt.chunks.size());
      int64_t per_chunk_sum = 0;
      for (size_t i = 0; i < prompt.chunks.size(); ++i) {
        int64_t inside = 0;
        const int64_t off = prompt.chunk_offset(i), m = static_cast<int64_t>(prompt.chunks[i].size());
        for (int32_t p : pos) inside += p >= off && p < off + m;
        EXPECT_EQ(r.stats.recomputed_per_chunk[i], inside) << "chunk " << i;
        per_chunk_sum += r.stats.recomputed_per_chunk[i];
      }
      EXPECT_EQ(per_chunk_sum, r.stats.recomputed_tokens);
      EXPECT_EQ(r.stats.selection, ratio > 0.0f && ratio < 1.0f ? selection_name(b.selection) : "none");
      if (ratio == 0.0f) {
        EXPECT_TRUE(pos.empty());
        EXPECT_EQ(max_abs_diff(r.logits, reuse.logits), 0.0);
        return;
      }
      if (ratio == 1.0f) {
        EXPECT_EQ(static_cast<int64_t>(pos.size()), H);
        EXPECT_LT(max_abs_diff(r.logits, full.logits), 1e-3);
        return;
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
      // query-first selects once, after its question pass over every layer.
      ASSERT_EQ(r.stats.candidates_per_check.size(), b.selection == Selection::QueryFirst ? 1 : layers.size());
      for (size_t i = 1; i < r.stats.candidates_per_check.size(); ++i)
        EXPECT_LE(r.stats.candidates_per_check[i], r.stats.candidates_per_check[i - 1]);
      EXPECT_EQ(r.stats.candidates_per_check.back(), static_cast<int64_t>(pos.size()));
      for (size_t i = 0; i < prompt.chunks.size(); ++i) {
        if (!stored[i]) continue;
        for (int j = 0; j < sinks; ++j) {
          EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(),
                                         static_cast<int32_t>(prompt.chunk_offset(i) + j)));
        }
      }
      if (b.selection == Selection::QueryFirst && layers != std::vector<int>{1}) {
        BlendOptions one = b;
        one.check_layers = {1};
        EXPECT_EQ(from_store.prefill(prompt, one, 4).recomputed_positions, pos);
      }
      if (layers.size() == 1 && filtering == Filtering::SinglePass && b.selection == Selection::Deviation) {
        BlendOptions two = b;
        two.filtering = Filtering::TwoPass;
        two.selection = Selection::Deviation;
        EXPECT_EQ(from_store.prefill(prompt, two, 4).recomputed_positions, pos);
      }
    };
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
                b.selection = Selection::Deviation;  // the check layers' rule (the others below)
                b.filtering = filtering;
                b.check_layers = layers;
                b.quota = quota;
                b.deviation = deviation;
                b.sink_tokens = sinks;
                b.ratio = ratio;
                check(b);
              }
    // The query-aware rules (single pass only: two-pass is refused, BadOptionsAreRefused;
    // query-first ignores the check layers: each set must give the same choice).
    for (Selection selection : {Selection::Attention, Selection::Impact, Selection::QueryFirst})
      for (const auto& layers : checks)
        for (Quota quota : {Quota::Global, Quota::PerChunk})
          for (int sinks : {0, 2})
            for (float ratio : {0.0f, 0.01f, 0.15f, 0.5f, 0.99f, 1.0f}) {
              SCOPED_TRACE(std::string(selection_name(selection)) + " checks " + std::to_string(layers.size()) +
                           " first " + std::to_string(layers.front()) + " " + quota_name(quota) + " sinks " +
                           std::to_string(sinks) + " ratio " + std::to_string(ratio) + (with_prelude ? " prelude" : ""));
              BlendOptions b;
              b.selection = selection;
              b.check_layers = layers;
              b.quota = quota;
              b.sink_tokens = sinks;
              b.ratio = ratio;
              check(b);
            }
  }
}

// Check layers outside the model, a bad schedule, negative sinks and a query-aware
// rule with two-pass filtering are refused before any work.
TEST(TinyBlend, BadOptionsAreRefused) {
  Tiny& t = tiny();
  MemoryKvStore store(int64_t{1} << 28);
  BlendEngine engine(*t.tf);
  StoreBackedBlend from_store(engine, store);
  const RagPrompt prompt = t.prompt();
  from_store.warm(prompt);
  BlendOptions o;
  o.check_layers = {kTinyLayers};
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {0};
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {1, 2};
  o.schedule = {0.05f};  // below the ratio
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.schedule = {};
  o.sink_tokens = -1;
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.sink_tokens = 0;
  // The query-aware rules read the question's rows, which two-pass's selection pass
  // does not compute.
  o.filtering = Filtering::TwoPass;
  o.selection = Selection::Deviation;
  for (Selection rule : {Selection::Attention, Selection::Impact, Selection::QueryFirst}) {
    o.selection = rule;
    EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument) << selection_name(rule);
  }
  o.selection = Selection::Deviation;
  EXPECT_NO_THROW(from_store.prefill(prompt, o));
}

}  // namespace
// K and V of the cached rows 0..length-1 are bit for bit the same.
bool same_prompt_kv(const KvCache& a, const KvCache& b) {
  if (a.length != b.length || a.n_layers != b.n_layers || a.kv_heads != b.kv_heads || a.head_dim != b.head_dim)
    return false;
  const size_t row_bytes = static_cast<size_t>(a.head_dim) * sizeof(float);
  for (int l = 0; l < a.n_layers; ++l)
    for (int h = 0; h < a.kv_heads; ++h)
      for (int64_t p = 0; p < a.length; ++p)
        if (std::memcmp(a.k_at(l, h, p), b.k_at(l, h, p), row_bytes) != 0 ||
            std::memcmp(a.v_at(l, h, p), b.v_at(l, h, p), row_bytes) != 0)
          return false;
  return true;
}

// The engine steps (begin / step / finish): the runtime interleaves the layers of
// several prefills on one thread, so one prefill's steps must not disturb
// another's. Two prefills stepped alternately give, bit for bit, what each gives
// alone, in single and two-pass filtering; a layer is delivered (and its chunks
// repaired) once — the final pass of two-pass re-reads the selection pass's layers.
TEST(TinyBlend, InterleavedStepsOfTwoPrefillsEqualEachAlone) {
  Tiny& t = tiny();
  MemoryKvStore store(int64_t{1} << 28);
  BlendEngine engine(*t.tf);
  StoreBackedBlend from_store(engine, store);
  const RagPrompt first = t.prompt();
  RagPrompt second = first;
  std::swap(second.chunks[0], second.chunks[3]);  // the same chunks at other offsets
  second.chunks.pop_back();
  from_store.warm(first);
  for (Filtering filtering : {Filtering::SinglePass, Filtering::TwoPass}) {
    SCOPED_TRACE(filtering_name(filtering));
    BlendOptions o;
    o.selection = Selection::Deviation;
    o.filtering = filtering;
    o.check_layers = {1, 2, 3};
    o.ratio = 0.3f;
    const auto alone_first = from_store.prefill(first, o, 2);
    const auto alone_second = from_store.prefill(second, o, 2);

    KvCache cache_first = t.tf->make_cache(first.size() + 2), cache_second = t.tf->make_cache(second.size() + 2);
    PrefillRun a = engine.begin(first, from_store.read_stored(first, o, cache_first), cache_first, o);
    PrefillRun b = engine.begin(second, from_store.read_stored(second, o, cache_second), cache_second, o);
    const int steps_a = a.steps_left();
    EXPECT_EQ(steps_a, filtering == Filtering::TwoPass ? 4 + kTinyLayers : kTinyLayers);
    int steps = 0, deliveries = 0;
    while (!a.done() || !b.done()) {
      for (PrefillRun* run : {&a, &b}) {
        if (run->done()) continue;
        const int left = run->steps_left();
        if (run == &a) {
          ++steps;
          if (a.needs_delivery()) ++deliveries;
        }
        engine.step(*run);
        EXPECT_LT(run->steps_left(), left);
      }
    }
    EXPECT_THROW(engine.step(a), std::logic_error);
    EXPECT_EQ(steps, steps_a);
    EXPECT_EQ(deliveries, kTinyLayers);
    const auto stepped_first = engine.finish(std::move(a));
    const auto stepped_second = engine.finish(std::move(b));
    EXPECT_EQ(stepped_first.logits, alone_first.logits);
    EXPECT_EQ(stepped_second.logits, alone_second.logits);
    EXPECT_EQ(stepped_first.recomputed_positions, alone_first.recomputed_positions);
    EXPECT_EQ(stepped_second.recomputed_positions, alone_second.recomputed_positions);
    // Rows past the prompt are not initialised (the cache is sized for decode too).
    EXPECT_TRUE(same_prompt_kv(stepped_first.cache, alone_first.cache));
    EXPECT_TRUE(same_prompt_kv(stepped_second.cache, alone_second.cache));
    EXPECT_EQ(stepped_first.stats.row_layers, alone_first.stats.row_layers);
    EXPECT_FALSE(stepped_first.recomputed_positions.empty());
  }
}

}  // namespace bs
