// Stored chunks found in a plain prompt (blend/pasted_chunks.h), with SmolLM2's real
// tokenizer and chat template: passages pasted into the user's message are found by
// their tokens and cut out on their text, so the prompt is the one the same request
// with `documents` gives; what is not stored, altered, forgotten or too short is not
// found, and nothing of the text is lost or added.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "blend/pasted_chunks.h"
#include "blend/rag_prompt.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace bs {
namespace {

struct Shared {
  gguf::GgufFile file;
  Tokenizer tok;
  ChatTemplate tmpl;
};

Shared* shared() {
  static std::unique_ptr<Shared> s = []() -> std::unique_ptr<Shared> {
    const std::string path = BLENDSERVE_DEFAULT_MODEL;
    if (!std::filesystem::exists(path)) return nullptr;
    gguf::GgufFile f = gguf::GgufFile::open(path);
    Tokenizer t = Tokenizer::from_gguf(f);
    ChatTemplate c = ChatTemplate::from_gguf(f, t);
    return std::unique_ptr<Shared>(new Shared{std::move(f), std::move(t), std::move(c)});
  }();
  return s.get();
}

#define REQUIRE_MODEL() \
  if (!shared()) FAIL() << "model file not found (run tools/setup.sh): " << BLENDSERVE_DEFAULT_MODEL

// Real prose (MuSiQue-style passages, lower-cased as the paper's set is).
const std::vector<std::string> kDocs = {
    "hannibal and scipio is a caroline era stage play, a classical tragedy written by thomas nabbes. the play was "
    "first performed in 1635 by queen henrietta's men, and was first published in 1637.",
    "thomas nabbes ( 1605 - 1641 ) was an english dramatist. he was born in worcestershire and educated at exeter "
    "college, oxford, which he left without taking a degree, and came to london around 1630.",
    "the battle of the upper baetis was fought in 211 bc in spain, where the roman armies of publius and gnaeus "
    "scipio were defeated by the carthaginians under hasdrubal barca.",
};
const std::string kQuestion = "Where was the author of Hannibal and Scipio educated at?";

void store(PastedChunkIndex& index, const Tokenizer& tok, const std::vector<std::string>& docs) {
  for (const auto& d : docs) index.add(document_chunk_tokens(tok, d));
}

// The user's message as frameworks send it: an instruction, the passages joined by
// blank lines, the question.
std::string pasted(const std::string& before, const std::vector<std::string>& docs, const std::string& question) {
  std::string m = before;
  for (const auto& d : docs) m += d + "\n\n";
  return m + question;
}

TEST(PastedChunks, PassagesPastedIntoTheMessageAreFoundAsTheirStoredChunks) {
  REQUIRE_MODEL();
  const auto& tok = shared()->tok;
  const auto& tmpl = shared()->tmpl;
  PastedChunkIndex index;
  store(index, tok, kDocs);
  ASSERT_EQ(index.size(), 3u);
  for (const std::string& before : {std::string(""), std::string("Answer from these passages.\n\n"),
                                   std::string("Context: "), std::string("Passages:\n")}) {
    SCOPED_TRACE("before: '" + before + "'");
    const std::vector<ChatMessage> messages = {{"user", pasted(before, kDocs, kQuestion)}};
    PastedMatch match;
    const RagPrompt p = assemble_pasted_prompt(tok, tmpl, messages, index, &match);
    EXPECT_EQ(match.chunks_found, 3);
    // The found chunks are the stored tokens, in order; the text before them is a
    // part of its own; the question and the turn's close are the suffix.
    const size_t lead = before.empty() ? 0 : 1;
    ASSERT_EQ(p.chunks.size(), 3 + lead);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(p.chunks[lead + i], document_chunk_tokens(tok, kDocs[i])) << i;
    if (lead) {
      EXPECT_EQ(tok.decode(p.chunks[0]), before);
    }
    // The same request with documents: the same prefix, chunks and question.
    const RagPrompt with_docs = assemble_rag_prompt(tok, tmpl, {{"user", kQuestion}}, kDocs);
    EXPECT_EQ(p.prefix, with_docs.prefix);
    EXPECT_EQ(p.suffix, with_docs.suffix);
    // Not a byte of the conversation lost or added.
    EXPECT_EQ(tok.decode(p.concatenated()), tmpl.apply(messages, true));
    int64_t stored = 0;
    for (const auto& d : kDocs) stored += static_cast<int64_t>(document_chunk_tokens(tok, d).size());
    EXPECT_EQ(match.chunk_tokens, stored);
  }
}

TEST(PastedChunks, WhatIsNotStoredAlteredOrTooShortIsNotFound) {
  REQUIRE_MODEL();
  const auto& tok = shared()->tok;
  const auto& tmpl = shared()->tmpl;
  // Only the first two stored: the third stays text of the suffix.
  PastedChunkIndex index;
  store(index, tok, {kDocs[0], kDocs[1]});
  {
    const std::vector<ChatMessage> messages = {{"user", pasted("", kDocs, kQuestion)}};
    PastedMatch match;
    const RagPrompt p = assemble_pasted_prompt(tok, tmpl, messages, index, &match);
    EXPECT_EQ(match.chunks_found, 2);
    ASSERT_EQ(p.chunks.size(), 2u);
    EXPECT_EQ(tok.decode(p.concatenated()), tmpl.apply(messages, true));
    EXPECT_TRUE(tok.decode(p.suffix).starts_with(kDocs[2]));
  }
  {
    // One character changed inside the first passage: its windows still hit, but
    // its text is not the stored chunk's, so it is not taken for it.
    std::string changed = kDocs[0];
    changed[changed.find("1635")] = '7';
    const std::vector<ChatMessage> messages = {{"user", pasted("", {changed, kDocs[1]}, kQuestion)}};
    PastedMatch match;
    const RagPrompt p = assemble_pasted_prompt(tok, tmpl, messages, index, &match);
    EXPECT_EQ(match.chunks_found, 1);
    ASSERT_EQ(p.chunks.size(), 2u);  // the changed passage as text, then the second
    EXPECT_EQ(p.chunks[1], document_chunk_tokens(tok, kDocs[1]));
    EXPECT_EQ(tok.decode(p.concatenated()), tmpl.apply(messages, true));
  }
  {
    // Passages separated by one newline are not their stored chunk (which ends with
    // a blank line): the last one's text is there, but not as stored.
    const std::string m = kDocs[0] + "\n" + kDocs[1] + "\n" + kQuestion;
    PastedMatch match;
    const RagPrompt p = assemble_pasted_prompt(tok, tmpl, {{"user", m}}, index, &match);
    EXPECT_EQ(match.chunks_found, 0);
    EXPECT_EQ(p.concatenated(), assemble_rag_prompt(tok, tmpl, {{"user", m}}, {}).concatenated());
  }
  {
    // Nothing stored matches: exactly the plain prompt.
    PastedChunkIndex empty;
    const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", pasted("", kDocs, kQuestion)}};
    const RagPrompt p = assemble_pasted_prompt(tok, tmpl, messages, empty);
    const RagPrompt plain = assemble_rag_prompt(tok, tmpl, messages, {});
    EXPECT_TRUE(p.chunks.empty());
    EXPECT_EQ(p.prefix, plain.prefix);
    EXPECT_EQ(p.suffix, plain.suffix);
  }
  {
    // A chunk shorter than the window is never indexed.
    PastedChunkIndex small(16);
    small.add(document_chunk_tokens(tok, "short one."));
    EXPECT_EQ(small.size(), 0u);
  }
}

TEST(PastedChunks, TheIndexIsBoundedAndForgetsTheOldestOnce) {
  REQUIRE_MODEL();
  const auto& tok = shared()->tok;
  const auto& tmpl = shared()->tmpl;
  // Room for the last two documents' tokens, not for all three.
  const int64_t two = static_cast<int64_t>(document_chunk_tokens(tok, kDocs[1]).size() +
                                           document_chunk_tokens(tok, kDocs[2]).size());
  PastedChunkIndex index(16, two);
  for (const auto& d : kDocs) index.add(document_chunk_tokens(tok, d));
  index.add(document_chunk_tokens(tok, kDocs[2]));  // again: no second entry
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.tokens_held(), two);
  PastedMatch match;
  const RagPrompt p = assemble_pasted_prompt(tok, tmpl, {{"user", pasted("", kDocs, kQuestion)}}, index, &match);
  EXPECT_EQ(match.chunks_found, 2);  // the first was forgotten
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[1], document_chunk_tokens(tok, kDocs[1]));
  EXPECT_EQ(p.chunks[2], document_chunk_tokens(tok, kDocs[2]));
  EXPECT_THROW(PastedChunkIndex(0), std::invalid_argument);
  EXPECT_THROW(PastedChunkIndex(16, 15), std::invalid_argument);
}

// The same passage twice in a message, and a message that is only passages: each
// occurrence is found, none overlaps another, and the text is kept whole.
TEST(PastedChunks, RepeatedPassagesAndAMessageOfPassagesOnly) {
  REQUIRE_MODEL();
  const auto& tok = shared()->tok;
  const auto& tmpl = shared()->tmpl;
  PastedChunkIndex index;
  store(index, tok, kDocs);
  const std::vector<ChatMessage> messages = {{"user", pasted("", {kDocs[1], kDocs[1], kDocs[0]}, "")}};
  PastedMatch match;
  const RagPrompt p = assemble_pasted_prompt(tok, tmpl, messages, index, &match);
  EXPECT_EQ(match.chunks_found, 3);
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[0], p.chunks[1]);
  EXPECT_EQ(tok.decode(p.concatenated()), tmpl.apply(messages, true));
  EXPECT_FALSE(p.suffix.empty());  // the turn's close
}

}  // namespace
}  // namespace bs
