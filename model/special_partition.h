// The cut of a text at its special tokens' texts, as llama.cpp's
// tokenizer_st_partition makes it (src/llama-vocab.cpp): one special at a time, in
// priority order (the longest text first), each splits every raw fragment left so far
// at its occurrences, left to right, none overlapping. A later special never cuts inside
// an earlier one's match, so priority, not position, decides between overlapping texts.
//
// Why not a scan per special: vocabularies have many (Gemma 3: 165 user-defined
// tokens, split out even from user text; Llama 3: 256 reserved), and a search of the
// whole text for each took half of Gemma 3's encoding time. One pass over the text
// with a trie of the special texts finds which occur (usually none or the template's
// few); the exact priority-ordered cut then runs over those alone.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bs {

class SpecialPartition {
 public:
  struct Special {
    std::string text;  // non-empty
    int32_t id;        // its token id
    bool always;       // cut even when the caller does not parse specials (user-defined tokens)
  };
  SpecialPartition() = default;
  // specials: in priority order (llama.cpp: longest text first, ties by id).
  explicit SpecialPartition(std::vector<Special> specials);

  // frags: (end offset in text, token id) per fragment in order, id -1 for raw text;
  // fragments are contiguous from offset 0 and none is empty (an empty text has none). parse_special: every special cuts, else
  // only the `always` ones.
  void split(std::string_view text, bool parse_special, std::vector<std::pair<size_t, int32_t>>& frags) const;

 private:
  // Indices into specials_ of those whose text occurs in `text` (any position), ascending.
  void occurring(std::string_view text, bool parse_special, std::vector<uint32_t>& found) const;

  std::vector<Special> specials_;
  // The trie of the texts: the root's children by byte in root_, deeper nodes' edges
  // (byte, child) sorted within each node's [edge_begin, edge_end).
  struct Node {
    uint32_t edge_begin = 0, edge_end = 0;
    uint32_t ends_begin = 0, ends_end = 0;  // [ ) of ends_: the specials whose text ends here
  };
  std::array<int32_t, 256> root_{};  // -1: no special starts with that byte
  std::vector<Node> nodes_;
  std::vector<std::pair<uint8_t, uint32_t>> edges_;
  std::vector<uint32_t> ends_;
};

}  // namespace bs
