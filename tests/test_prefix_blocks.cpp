// The pieces of automatic prefix caching and passage learning that need no model: the
// chained block keys (storage/chunk_kv.h), an entry's rows cut into a block of their
// own, and a pasted message cut into its blank-line paragraphs (blend/pasted_chunks.h).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "blend/pasted_chunks.h"
#include "storage/chunk_kv.h"

namespace bs {
namespace {

std::vector<ChunkKey> chain(uint64_t fp, const std::vector<int32_t>& tokens, size_t block) {
  std::vector<ChunkKey> keys;
  ChunkKey prev{};
  for (size_t j = 0; (j + 1) * block <= tokens.size(); ++j) {
    prev = make_prefix_block_key(fp, prev, std::span<const int32_t>(tokens).subspan(j * block, block));
    keys.push_back(prev);
  }
  return keys;
}

TEST(PrefixBlockKey, ABlockKeyNamesEveryTokenBeforeItAndTheModel) {
  std::vector<int32_t> a(64 * 4);
  std::iota(a.begin(), a.end(), 100);
  const auto ka = chain(7, a, 64);
  ASSERT_EQ(ka.size(), 4u);
  // The same first blocks give the same keys, whatever follows.
  auto b = a;
  b[3 * 64 + 5] = 1;
  const auto kb = chain(7, b, 64);
  EXPECT_EQ(kb[0], ka[0]);
  EXPECT_EQ(kb[2], ka[2]);
  EXPECT_NE(kb[3], ka[3]);
  // A token changed in block 0 changes every key after it, though the later blocks'
  // own tokens are the same.
  auto c = a;
  c[0] = 99;
  const auto kc = chain(7, c, 64);
  for (size_t j = 0; j < 4; ++j) EXPECT_NE(kc[j], ka[j]) << j;
  // Another model (fingerprint) never shares a key; nor does a chunk of the same tokens.
  EXPECT_NE(chain(8, a, 64)[0], ka[0]);
  EXPECT_NE(make_chunk_key(7, KvKind::Chunk, std::span<const int32_t>(a).subspan(0, 64)), ka[0]);
  EXPECT_NE(make_chunk_key(7, KvKind::Prefix, std::span<const int32_t>(a).subspan(0, 64)), ka[0]);
  // Block 1 alone (the same tokens at position 0) is not block 1 behind block 0.
  EXPECT_NE(chain(7, std::vector<int32_t>(a.begin() + 64, a.end()), 64)[0], ka[1]);
}

TEST(PrefixBlockKey, SliceRowsIsTheEntrysRowsOfEveryLayerAndHead) {
  ChunkKv kv;
  kv.n_layers = 3, kv.kv_heads = 2, kv.head_dim = 4;
  kv.tokens.resize(10);
  std::iota(kv.tokens.begin(), kv.tokens.end(), 0);
  kv.dtype = kernels::TensorType::F32;
  std::vector<float> k(3 * 2 * 10 * 4), v(k.size());
  std::iota(k.begin(), k.end(), 0.0f);
  std::iota(v.begin(), v.end(), 1000.0f);
  kv.set_fp32(k, v);
  const auto s = slice_rows(kv, 3, 4);
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{3, 4, 5, 6}));
  ASSERT_TRUE(s->consistent());
  const auto sk = s->k_fp32(), sv = s->v_fp32();
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < 4; ++r)
        for (int d = 0; d < 4; ++d) {
          const size_t src = ((static_cast<size_t>(l) * 2 + h) * 10 + 3 + r) * 4 + d;
          const size_t dst = ((static_cast<size_t>(l) * 2 + h) * 4 + r) * 4 + d;
          EXPECT_EQ(sk[dst], k[src]);
          EXPECT_EQ(sv[dst], v[src]);
        }
  EXPECT_THROW(slice_rows(kv, 8, 3), std::out_of_range);
}

TEST(LearntPassages, AMessageIsCutIntoItsBlankLineParagraphsAsTheyStand) {
  EXPECT_EQ(blank_line_paragraphs("Context:\n\nFirst passage.\nSecond line.\n\nSecond passage.\n\nQuestion?"),
            (std::vector<std::string>{"Context:", "First passage.\nSecond line.", "Second passage.", "Question?"}));
  // Empty pieces (three or four newlines, a leading or trailing blank line) are dropped;
  // a third newline stays with the paragraph it starts.
  EXPECT_EQ(blank_line_paragraphs("\n\nA\n\n\n\nB\n\n\nC\n\n"), (std::vector<std::string>{"A", "B", "\nC"}));
  EXPECT_TRUE(blank_line_paragraphs("").empty());
  EXPECT_EQ(blank_line_paragraphs("one"), (std::vector<std::string>{"one"}));
}

}  // namespace
}  // namespace bs
