// Stored chunks found inside a plain prompt (issue 41): most RAG frameworks paste the
// retrieved passages into the user's message instead of sending a `documents` list.
// Such a request still blends when the passages' KV is stored: the message's tokens
// are searched for the stored chunks' tokens by a rolling hash (as LMCache's Blend
// matcher does) and each match is snapped to its chunk's boundaries in the text.
//
// Why snapping is done on the text. A chunk is stored as document_chunk_tokens(doc):
// the document and "\n\n" tokenized alone. Pasted into a longer text, the same
// passage tokenizes the same inside but may not at its edges (a byte-level BPE joins
// "\n\n" into one token at the end of a text, splits it before a word; a space
// before the passage joins its first word). So a token match only says where to look:
// the chunk's own text (its tokens decoded) must then appear byte for byte at the
// place the match implies. The message is cut there into text pieces and chunks,
// exactly as assemble_rag_prompt cuts a request with documents: the pieces between
// chunks are tokenized alone and become parts of their own (uncached: computed), the
// text after the last chunk is the suffix. The prompt is then what the same request
// sent with `documents` would give, which is what the blend was measured on.
//
// The index holds the token sequences of chunks known to be stored (write-back, the
// documents endpoint, the SSD tier's entries at start); it is a hint: a chunk found
// here whose KV is no longer in any tier is computed like any missed chunk. Bounded
// by the tokens it holds: past `max_tokens` the oldest chunks are forgotten.
// Thread-safe (one lock; a lookup costs well under a millisecond for a 6k-token
// prompt).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "blend/rag_prompt.h"
#include "model/tokenizer.h"

namespace bs {

class PastedChunkIndex {
 public:
  // window: tokens per hashed window (a chunk shorter than it is never found);
  // max_tokens: the chunks' tokens it holds at most (4 Mi tokens: 16 MiB of ids,
  // about 8k chunks of 512 tokens, plus a quarter-million window entries).
  explicit PastedChunkIndex(int window = 16, int64_t max_tokens = int64_t{4} << 20);

  // A chunk whose KV is stored (its tokens as the engine keys them). Adding the same
  // tokens again refreshes nothing and costs one lookup.
  void add(std::span<const int32_t> tokens);
  size_t size() const;          // chunks held
  int64_t tokens_held() const;  // their tokens
  int window() const { return window_; }

  // A stored chunk's tokens found in `text` (its tokens `ids`, tok.encode(text)):
  // the chunk's text starts at byte `begin` of the text.
  struct Found {
    size_t begin = 0, end = 0;    // bytes [begin, end) of the text
    std::vector<int32_t> tokens;  // the chunk's stored tokens
  };
  // Non-overlapping, in text order. Each window of `ids` is looked up; a hit whose
  // tokens agree is extended both ways and snapped on the text (header).
  std::vector<Found> find(const Tokenizer& tok, std::string_view text, std::span<const int32_t> ids) const;

 private:
  uint64_t window_hash(const int32_t* t) const;
  struct Place {
    uint32_t chunk;   // serial of the chunk (chunks_ index = serial - first_serial_)
    uint32_t offset;  // token offset of the window in the chunk
  };

  int window_;
  int64_t max_tokens_;
  int64_t held_ = 0;  // tokens of chunks_
  uint64_t power_ = 1;  // base^(window - 1), for rolling
  mutable std::mutex mu_;
  std::deque<std::vector<int32_t>> chunks_;  // oldest first
  uint32_t first_serial_ = 0;
  std::unordered_multimap<uint64_t, Place> windows_;
  std::unordered_map<uint64_t, uint32_t> whole_;  // hash of a chunk's tokens -> serial (no duplicates)
};

// Passages learnt on first sight (blend.learn_passage_tokens): the paragraphs of a
// pasted message, cut at blank lines ("\n\n", the way RAG frameworks join retrieved
// passages), each exactly as it stands between them; empty pieces dropped. Stored as
// document_chunk_tokens(paragraph) (the paragraph and "\n\n", as a document is), a
// paragraph pasted again between blank lines, in any order and with any other text
// around it, is found by PastedChunkIndex::find and blended.
std::vector<std::string> blank_line_paragraphs(std::string_view text);

// What assemble_pasted_prompt found.
struct PastedMatch {
  int chunks_found = 0;
  int64_t chunk_tokens = 0;   // tokens of the found chunks
  int64_t message_tokens = 0; // tokens of the user's message tokenized whole
};

// A plain chat request (no documents) as prefix + parts + suffix: the prefix as
// assemble_rag_prompt makes it; the user's message cut around the stored chunks the
// index finds in it (text before, between: parts of their own; after: the suffix,
// with the turn's close). With no chunk found it is assemble_rag_prompt(..., {}).
RagPrompt assemble_pasted_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, const PastedChunkIndex& index,
                                 PastedMatch* match = nullptr, const std::string& tools = {});

}  // namespace bs
