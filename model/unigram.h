// SentencePiece's unigram model, as Hugging Face's tokenizers (`Unigram`) and llama.cpp
// (its UGM tokenizer) apply it: a text's tokens are its segmentation into vocabulary
// pieces with the highest sum of their scores (log probabilities), found by Viterbi
// over a trie of the pieces, one character at a time. A character no one-character
// piece covers can also be the unknown piece, at the lowest score less 10; consecutive
// unknown characters are one unknown. Equal sums keep the segmentation found first
// (the one whose last piece starts earliest), as both do.
//
// The two differ in details, and each vocabulary follows the one it was made for
// (Rules): a tokenizer.json's Unigram Hugging Face's, a GGUF's ("t5") llama.cpp's.
//   Hugging Face: every piece but control tokens may match (byte pieces <0xAB> and the
//     unknown piece too, by their text); the lowest score is over all pieces; with
//     byte_fallback an unknown run is its bytes' <0xAB> pieces where all exist.
//     (Control tokens are matched in Hugging Face too, but its added-token split has
//     taken them out before; here a control token's text in plain text stays text.)
//   llama.cpp: normal, user-defined (at score 0) and unused pieces match; the lowest
//     score is over the normal ones; no byte fallback.
// The text comes normalized (spaces already U+2581: model/tokenizer.cpp).
//
// Why our own: the references are those two programs, and SentencePiece's library
// (which Debian packages) reads its .model files, not a tokenizer.json or a GGUF.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/token_index.h"

namespace bs {

class UnigramModel {
 public:
  enum class Rules { HuggingFace, LlamaCpp };
  struct Piece {
    std::string_view text;
    double score;
    uint8_t type;  // GGUF token type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  };

  // pieces[i] is token i. unk_id: the unknown piece (required: a character no piece
  // covers has no other token). byte_token: byte -> its <0xAB> piece, -1 none.
  UnigramModel(const std::vector<Piece>& pieces, int32_t unk_id, Rules rules, bool byte_fallback,
               const std::array<int32_t, 256>& byte_token, const TokenIndex& index, const TokenTexts& texts);

  // Appends the tokens of `text` (normalized, any bytes: a byte that starts no valid
  // UTF-8 character is a character of its own).
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  // A trie of the pieces that may match, children contiguous and sorted by byte.
  struct Node {
    int32_t token = -1;    // the piece ending here, -1 none
    uint32_t first = 0;    // its children: nodes_[first, first + count)
    uint16_t count = 0;
    uint8_t byte = 0;      // the byte that leads here from the parent
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_;
  std::vector<double> scores_;  // the score a match counts (llama.cpp: user-defined 0)
  double unk_score_ = 0;
  int32_t unk_id_ = -1;
  bool hf_ = true;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_token_{};
  const TokenIndex* index_;
  const TokenTexts* texts_;
};

// llama.cpp's UGM normalizer (llm_tokenizer_ugm_session::normalize) without a
// character map, into `out`: each space a U+2581; with prefix_space one more U+2581
// right before the first other character; with remove_extra_whitespaces no spaces kept
// but one U+2581 before every run of other characters (the first too, prefix or not).
void unigram_normalize_llamacpp(std::string_view text, bool prefix_space, bool remove_extra_whitespaces,
                                std::string& out);

}  // namespace bs
