// The synthetic RAG QA set written by tools/eval/make_rag_qa.py: tests/data/rag_qa.jsonl
// (and its first-12-cases subset rag_qa_small.jsonl).
#include "tools/eval/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace {

const std::string kDataDir = std::string(BLENDSERVE_FIXTURES) + "/../data/";

// Document length bounds of the generator (MIN_CHARS/MAX_CHARS), chosen for 300-500
// SmolLM2 tokens; the committed file measures 313-450 tokens (3.9-4.9 characters/token).
constexpr size_t kMinChars = 1400, kMaxChars = 1900;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool is_ascii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

TEST(RagDataset, ShapeAndGuarantees) {
  const auto lines = read_lines(kDataDir + "rag_qa.jsonl");
  ASSERT_GE(lines.size(), 200u);
  std::set<std::string> ids;
  size_t two_hop = 0;
  std::array<size_t, 6> answer_slot{};
  for (const auto& line : lines) {
    const auto c = nlohmann::json::parse(line);
    const std::string id = c.at("id");
    SCOPED_TRACE(id);
    EXPECT_TRUE(ids.insert(id).second) << "duplicate id";

    const auto docs = c.at("documents").get<std::vector<std::string>>();
    ASSERT_EQ(docs.size(), 6u);
    for (const auto& d : docs) {
      EXPECT_GE(d.size(), kMinChars);
      EXPECT_LE(d.size(), kMaxChars);
      EXPECT_TRUE(is_ascii(d));
    }

    const std::string question = c.at("question");
    ASSERT_FALSE(question.empty());
    EXPECT_EQ(question.back(), '?');

    const int hops = c.at("hops");
    ASSERT_TRUE(hops == 1 || hops == 2);
    if (hops == 2) ++two_hop;
    const auto gold = c.at("gold_doc").get<std::vector<int>>();
    ASSERT_EQ(gold.size(), static_cast<size_t>(hops));
    for (int g : gold) ASSERT_TRUE(g >= 0 && g < 6);
    if (hops == 2) {
      EXPECT_NE(gold[0], gold[1]);
    }
    const int answer_doc = gold.back();
    ++answer_slot[static_cast<size_t>(answer_doc)];

    const auto answers = c.at("answers").get<std::vector<std::string>>();
    ASSERT_FALSE(answers.empty());
    for (const auto& a : answers) {
      ASSERT_FALSE(a.empty());
      // The answer lies in the answer document and in no other document (in a 2-hop case
      // not in the first-hop document either: it needs the bridge).
      for (int j = 0; j < 6; ++j) {
        const bool found = docs[static_cast<size_t>(j)].find(a) != std::string::npos;
        EXPECT_EQ(found, j == answer_doc) << "answer '" << a << "' in document " << j;
      }
      // A gold answer scores 1 against itself through the eval's parsing; in particular
      // it does not start with "No"/"Yes", which parse_generation would rewrite.
      EXPECT_EQ(bs::blend::parse_generation(a), a);
      EXPECT_DOUBLE_EQ(bs::blend::max_f1(a, answers), 1.0);
    }
  }
  EXPECT_GE(two_hop * 5, lines.size()) << "at least 20% two-hop cases";
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_GE(answer_slot[s] * 10, lines.size()) << "answer document rarely in slot " << s;
  }
}

TEST(RagDataset, SmallIsPrefix) {
  const auto all = read_lines(kDataDir + "rag_qa.jsonl");
  const auto small = read_lines(kDataDir + "rag_qa_small.jsonl");
  ASSERT_EQ(small.size(), 12u);
  ASSERT_GE(all.size(), small.size());
  for (size_t i = 0; i < small.size(); ++i) EXPECT_EQ(small[i], all[i]) << "line " << i;
}

}  // namespace
