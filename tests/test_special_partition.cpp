// model/special_partition.h: the one-pass cut equals llama.cpp's special-by-special cut
// (tokenizer_st_partition, restated below as the reference: a search of the whole text
// per special) on texts built to make specials overlap, nest and repeat.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/special_partition.h"

namespace {

using bs::SpecialPartition;
using Frags = std::vector<std::pair<size_t, int32_t>>;

// llama.cpp's loop: each special in priority order splits every raw fragment at its
// non-overlapping occurrences, left to right.
Frags reference(const std::vector<SpecialPartition::Special>& specials, std::string_view text, bool parse_special) {
  struct Frag {
    size_t off, len;
    int32_t id;
  };
  if (text.empty()) return {};
  std::vector<Frag> cur{{0, text.size(), -1}}, next;
  for (const auto& sp : specials) {
    if (!parse_special && !sp.always) continue;
    next.clear();
    for (const Frag& f : cur) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view window = text.substr(0, f.off + f.len);
      size_t pos = f.off;
      for (size_t m; (m = window.find(sp.text, pos)) != std::string_view::npos; pos = m + sp.text.size()) {
        if (m > pos) next.push_back({pos, m - pos, -1});
        next.push_back({m, sp.text.size(), sp.id});
      }
      if (pos < f.off + f.len) next.push_back({pos, f.off + f.len - pos, -1});
    }
    cur.swap(next);
  }
  Frags out;
  for (const Frag& f : cur) out.emplace_back(f.off + f.len, f.id);
  return out;
}

TEST(SpecialPartition, PriorityNotPositionDecidesBetweenOverlappingTexts) {
  // "bcd" (longer, first) takes its match although "ab" starts earlier.
  const SpecialPartition cut({{"bcd", 7, true}, {"ab", 9, true}});
  Frags got;
  cut.split("xabcd ab", true, got);
  EXPECT_EQ(got, (Frags{{2, -1}, {5, 7}, {6, -1}, {8, 9}}));
  EXPECT_EQ(got, reference({{"bcd", 7, true}, {"ab", 9, true}}, "xabcd ab", true));
}

TEST(SpecialPartition, OnlyTheAlwaysSpecialsCutWhenSpecialsAreNotParsed) {
  const std::vector<SpecialPartition::Special> specials = {{"<|im_start|>", 1, false}, {"\n\n", 5, true}, {"\n", 4, true}};
  const SpecialPartition cut(specials);
  Frags got;
  cut.split("<|im_start|>a\n\n\nb", false, got);
  EXPECT_EQ(got, (Frags{{13, -1}, {15, 5}, {16, 4}, {17, -1}}));
  cut.split("<|im_start|>a\n\n\nb", true, got);
  EXPECT_EQ(got, (Frags{{12, 1}, {13, -1}, {15, 5}, {16, 4}, {17, -1}}));
  cut.split("", true, got);
  EXPECT_TRUE(got.empty());
  const SpecialPartition none;
  none.split("abc", true, got);
  EXPECT_EQ(got, (Frags{{3, -1}}));
}

TEST(SpecialPartition, EqualsTheSearchPerSpecialOnRandomTexts) {
  std::mt19937 rng(58);
  const std::string alphabet = "ab<>|\n ";
  for (int round = 0; round < 300; ++round) {
    // Specials from the same small alphabet, so they overlap, nest and share prefixes;
    // longest first as the tokenizer orders them, a duplicate text now and then.
    std::vector<SpecialPartition::Special> specials;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      std::string t;
      for (int k = 0, len = 1 + static_cast<int>(rng() % 4); k < len; ++k) t += alphabet[rng() % alphabet.size()];
      specials.push_back({t, 100 + i, rng() % 2 == 0});
    }
    std::stable_sort(specials.begin(), specials.end(),
                     [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
    const SpecialPartition cut(specials);
    for (int k = 0; k < 20; ++k) {
      std::string text;
      for (int i = 0, len = static_cast<int>(rng() % 40); i < len; ++i) text += alphabet[rng() % alphabet.size()];
      for (const bool parse : {false, true}) {
        Frags got;
        cut.split(text, parse, got);
        ASSERT_EQ(got, reference(specials, text, parse)) << "text '" << text << "' parse " << parse;
      }
    }
  }
}

}  // namespace
