// A byte-level BPE pre-tokenizer that is a sequence of regex splits, as Hugging Face's
// tokenizers apply a Sequence of Split(pattern, "Isolated") pre-tokenizers (its Digits
// and Punctuation are such splits too): each pattern runs over every piece the step
// before made, on that piece alone (its `$` and lookahead see the piece, not the text
// around it); its matches and the gaps between them are the next pieces. The vectors
// it is checked against are Hugging Face's (tests/test_tokenizer_vocabs.cpp).
//
// Why regexes here and hand-written state machines in model/tokenizer.cpp: the common
// pre-tokenizers (GPT-2, Llama 3, Qwen2) are hot paths, written out to be fast; the
// rarer ones (DeepSeek LLM and Coder, Falcon, Qwen 3.5) are sequences of several
// regexes with large character classes, which ICU's regex engine runs as written.
//
// Patterns are ICU's syntax with one change: \s and \S mean the Unicode White_Space
// property, as in Oniguruma (Hugging Face's engine) and model/tokenizer.cpp, not ICU's
// [\t\n\f\r\p{Z}]. A step after Hugging Face's ByteLevel pre-tokenizer sees the piece as
// ByteLevel left it, each byte one character of GPT-2's byte alphabet (RegexSplit::
// byte_level): Falcon's digit splits run there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

struct RegexSplit {
  std::string pattern;
  bool byte_level = false;  // matched against the bytes in GPT-2's alphabet (after ByteLevel)
};

// The splits of a tokenizer.ggml.pre name done by regex, or null when none is (the
// hand-written kinds, or a name we do not implement).
const std::vector<RegexSplit>* regex_pre_tokenizer_splits(std::string_view pre);

class RegexPreTokenizer {
 public:
  // Compiles each pattern once; throws std::invalid_argument naming a bad one, or a
  // text step after a byte-level one (ByteLevel's alphabet is all that follows it).
  explicit RegexPreTokenizer(const std::vector<RegexSplit>& splits);
  ~RegexPreTokenizer();
  RegexPreTokenizer(const RegexPreTokenizer&) = delete;
  RegexPreTokenizer& operator=(const RegexPreTokenizer&) = delete;

  // The pieces of `text` (any bytes; an invalid UTF-8 byte is one U+FFFD to the
  // patterns): `ends` gets the byte offset where each ends, in order, the last
  // text.size(); pieces are never empty. Thread-safe (matchers are per call).
  void split(std::string_view text, std::vector<uint32_t>& ends) const;

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace bs
