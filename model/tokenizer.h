// The tokenizer built from GGUF metadata (tokenizer.ggml.*): byte-level BPE ("gpt2")
// with the model's pre-tokenizer (tokenizer.ggml.pre), SentencePiece BPE ("llama":
// Llama 2, Mistral, Gemma; "gemma4": Gemma 4's, by its merge list; model/spm_merge.h)
// or SentencePiece Unigram ("t5": model/unigram.h), with special (control) tokens and
// streaming UTF-8-safe decoding.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

namespace gguf { class GgufFile; }

struct TokenizerSpec {
  std::string model = "gpt2";          // tokenizer.ggml.model: "gpt2", "llama" (SentencePiece BPE), "gemma4", "t5"
  std::string pre = "default";         // tokenizer.ggml.pre (byte-level BPE only)
  std::vector<std::string> tokens;     // tokenizer.ggml.tokens (byte-level unicode form; SPM: U+2581 for spaces)
  // tokenizer.ggml.scores (SPM: merge priority; Unigram: log probabilities, summed in
  // doubles as Hugging Face and llama.cpp sum them; required for both).
  std::vector<double> scores;
  bool add_space_prefix = true;        // tokenizer.ggml.add_space_prefix (SPM: " " before text that
                                       // starts the input or follows a special token)
  // How a tokenizer.json's Metaspace pre-tokenizer puts that space (Hugging Face's
  // tokenizers), where it differs from llama.cpp's rule above:
  bool space_prefix_first_only = false;   // prepend_scheme "first": only where the input starts
  bool space_prefix_unless_space = false; // not before a text that starts with a space
  // SPM merged by the merge list (`merges`, a tokenizer.json's BPE with byte_fallback),
  // not by score (a GGUF's SentencePiece vocabulary, as llama.cpp merges it).
  bool spm_merge_by_rank = false;
  // Unigram ("t5"): Hugging Face's rules (a tokenizer.json's Unigram, with the space
  // prefix above as its Metaspace puts it) or llama.cpp's (a GGUF's: its UGM
  // normalizer, remove_extra_whitespaces below); model/unigram.h says how they differ.
  bool unigram_hf = false;
  bool byte_fallback = false;             // Hugging Face: an unknown run as its <0xAB> pieces
  bool metaspace_split = false;           // Hugging Face's Metaspace split: each word (from a U+2581) alone
  bool remove_extra_whitespaces = false;  // tokenizer.ggml.remove_extra_whitespaces (llama.cpp)
  // tokenizer.ggml.precompiled_charsmap is there: SentencePiece's Precompiled
  // normalizer, which we do not implement (refused).
  bool precompiled_charsmap = false;
  std::vector<int64_t> token_types;    // tokenizer.ggml.token_type (1 normal, 3 control, 4 user-defined, ...)
  std::vector<std::string> merges;     // tokenizer.ggml.merges ("a b")
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  // Tokens besides eos_id that end a generation: tokenizer.ggml.eot_token_id and
  // eom_token_id, and blendserve.eos_token_ids (a checkpoint's generation_config.json
  // eos_token_id list: Llama 3.1's <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  std::vector<int32_t> end_ids;
  bool add_bos = false;                // tokenizer.ggml.add_bos_token (Tokenizer::add_bos)
};

// GPT-2's byte-level alphabet: byte b's token text (its printable stand-in, UTF-8),
// as the byte-level vocabularies spell their 256 byte tokens.
std::vector<std::string> byte_level_alphabet();

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerSpec spec);
  static Tokenizer from_gguf(const gguf::GgufFile& file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // parse_special: control tokens written in the text (e.g. "<|im_start|>") become
  // their ids; otherwise they are tokenized as plain text.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // The tokens of `text` where it continues a longer text after other text (a RAG
  // prompt's documents and question, blend/rag_prompt.h): as encode(), except that a
  // SentencePiece vocabulary's space prefix (add_space_prefix) is not put at its start;
  // it still follows every special token inside it, as encode() of the whole text puts
  // it. Byte-level BPE: the same as encode().
  std::vector<int32_t> encode_continuation(std::string_view text, bool parse_special) const;
  // Raw bytes of one token (control tokens render as their text).
  std::string_view token_bytes(int32_t id) const;
  // The most bytes of text one token stands for (the longest token_bytes): a text of B
  // bytes takes at least ceil(B / max_token_bytes()) tokens, a bound a caller can check
  // before it pays for encode() (a prompt far over the context is refused at once).
  size_t max_token_bytes() const;
  std::string decode(std::span<const int32_t> ids) const;
  // How many pieces the tokenizer keeps with their tokens from earlier texts (a BPE
  // pre-token, a SentencePiece word: model/word_cache.h), which it looks up, not merges.
  size_t cached_words() const;
  int32_t vocab_size() const;
  bool is_control(int32_t id) const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // Whether generating `id` ends the answer: the EOS, every end token the model declares
  // (TokenizerSpec::end_ids), and any control token (a turn's markup, which no answer
  // contains as text).
  bool ends_generation(int32_t id) const;
  // Whether the model's prompts begin with BOS (tokenizer.ggml.add_bos_token; absent:
  // llama.cpp's default, true for SentencePiece and the Llama 3 pre-tokenizers). Gemma,
  // Llama 2 and 3 and Mistral are trained so; SmolLM2 and Qwen are not.
  bool add_bos() const;
  // {bos_id()} where add_bos() and the vocabulary has a BOS, else empty: what every
  // prompt of the model starts with (blend/rag_prompt.h puts it there).
  std::vector<int32_t> bos_prefix() const;
  // Id of a token given by its exact text, -1 when absent (e.g. "<|im_end|>").
  int32_t token_id(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Accumulates token bytes and releases only complete UTF-8 sequences, so a
// multi-byte character split across tokens is never emitted half-way.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);  // the complete text that became available
  std::string flush();           // whatever is left (invalid tails become U+FFFD)
 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace bs
