// SentencePiece BPE merging as llama.cpp applies it to a "llama" (SPM) vocabulary
// (src/llama-vocab.cpp: llm_tokenizer_spm_session), the tokenizer of Llama 2, Mistral
// v0.1-v0.3 and Gemma: the text is split into UTF-8 characters; the adjacent pair whose
// concatenation is a vocabulary entry with the highest score merges first (leftmost on
// equal scores), again and again; each final piece is its token, or re-split along the
// merges that made it, or its bytes as byte tokens (<0xAB>) where nothing matches.
//
// Why our own: it is the reference's algorithm, not SentencePiece's library (which
// Debian packages, but whose results on a GGUF vocabulary are llama.cpp's only where
// the two agree); the test vectors are llama.cpp's and Hugging Face's.
#pragma once

#include "model/token_index.h"
#include "model/word_cache.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bs {

// A merge of the list: its rank (lower first) and the token it makes.
struct SpmMerge {
  int32_t rank, result;
};
// (left id, right id) -> its merge: spm_pair_key(left, right).
using SpmPairRanks = std::unordered_map<uint64_t, SpmMerge>;
inline uint64_t spm_pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct SpmVocab {
  const TokenIndex* text_to_id;                                // every token's text (any type) -> id
  const TokenTexts* tokens;                                    // [vocab]: the texts it indexes
  const std::vector<double>* scores;                           // [vocab]: merge priority, higher first
  const std::array<int32_t, 256>* byte_token;                  // byte -> its byte token, -1: none
  // A tokenizer.json's SentencePiece BPE (Hugging Face's BPE with byte_fallback) merges
  // by its merge list, not by score: only a pair of tokens the list names merges, the
  // lowest rank first (leftmost on equal ranks), as Hugging Face's BPE does. Null: by
  // score, as llama.cpp merges a GGUF's vocabulary.
  const SpmPairRanks* pair_ranks = nullptr;
  // The vocabulary's boundary tokens (spm_boundary_tokens): with them the text is merged
  // word by word, each distinct word once (the same tokens: see below); null: whole.
  const std::vector<std::string>* boundary_tokens = nullptr;
  // Words merged before, kept across calls (word by word only); null: none.
  WordCache* cache = nullptr;
};

// The tokens that hold a U+2581 after another character: a piece across a word boundary
// (a space after a non-space) is one of them, as every merged piece is a token. So the
// text can be cut before every such space where none of these stands across it, and
// each word merged alone, with the same result: merges in different words never
// compete for a symbol. Real vocabularies have few: none in Llama 2's or Phi-3's, one
// in Gemma 3's (">▁</").
std::vector<std::string> spm_boundary_tokens(const std::vector<std::string>& tokens);

// Appends the tokens of `text` (whitespace already escaped to U+2581 by the caller).
// A byte of a piece without a token and without a byte token is dropped, as llama.cpp's
// lookups would fail on it (such vocabularies have every byte).
void spm_tokenize(std::string_view text, const SpmVocab& vocab, std::vector<int32_t>& out);

}  // namespace bs
