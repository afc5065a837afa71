// The tokenizer built from GGUF metadata (tokenizer.ggml.*): byte-level BPE ("gpt2")
// with the model's pre-tokenizer (tokenizer.ggml.pre), or SentencePiece BPE ("llama":
// Llama 2, Mistral, Gemma; model/spm_merge.h), with special (control) tokens and
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
  std::string model = "gpt2";          // tokenizer.ggml.model: "gpt2" or "llama" (SentencePiece BPE)
  std::string pre = "default";         // tokenizer.ggml.pre (byte-level BPE only)
  std::vector<std::string> tokens;     // tokenizer.ggml.tokens (byte-level unicode form; SPM: U+2581 for spaces)
  std::vector<float> scores;           // tokenizer.ggml.scores (SPM: merge priority, required)
  bool add_space_prefix = true;        // tokenizer.ggml.add_space_prefix (SPM: " " before text that
                                       // starts the input or follows a special token)
  std::vector<int64_t> token_types;    // tokenizer.ggml.token_type (1 normal, 3 control, 4 user-defined, ...)
  std::vector<std::string> merges;     // tokenizer.ggml.merges ("a b")
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
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
  // Raw bytes of one token (control tokens render as their text).
  const std::string& token_bytes(int32_t id) const;
  // The most bytes of text one token stands for (the longest token_bytes): a text of B
  // bytes takes at least ceil(B / max_token_bytes()) tokens, a bound a caller can check
  // before it pays for encode() (a prompt far over the context is refused at once).
  size_t max_token_bytes() const;
  std::string decode(std::span<const int32_t> ids) const;
  int32_t vocab_size() const;
  bool is_control(int32_t id) const;
  int32_t bos_id() const;
  int32_t eos_id() const;
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

struct ChatMessage {
  std::string role;
  std::string content;
};

// Chat template from the GGUF's tokenizer.chat_template. We do not run Jinja:
// the known template families (ChatML, as used by SmolLM2 and Qwen2) are
// recognised and rendered by a built-in equivalent, including a default system
// prompt the template injects. A file without a template gets ChatML (as
// llama.cpp does). A template of another family loads (raw completion still
// works) but every rendering call throws std::invalid_argument naming it, so a
// chat is never rendered in a format the model was not trained on.
class ChatTemplate {
 public:
  static ChatTemplate from_gguf(const gguf::GgufFile& file);
  static ChatTemplate chatml(std::string default_system = "");
  // A template of a family this code does not render (`source`: its text).
  static ChatTemplate unsupported(std::string source);

  bool supported() const { return supported_; }
  std::string family() const { return supported_ ? "chatml" : "unsupported"; }
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The pieces of one turn, for callers that tokenize a turn's content apart from
  // its markup (RAG prompt assembly): apply({{role, c}}, false) without the
  // default system turn == turn_open(role) + c + turn_close().
  std::string turn_open(const std::string& role) const;
  std::string turn_close() const;
  std::string generation_prompt() const;  // what add_generation_prompt appends
  // Strings that end an assistant turn (e.g. "<|im_end|>").
  const std::vector<std::string>& stop_strings() const { return stops_; }
  const std::string& default_system() const { return default_system_; }

 private:
  void require_supported() const;
  bool supported_ = true;
  std::string source_;  // unsupported: the template's text (start of it in errors)
  std::string default_system_;
  std::vector<std::string> stops_{"<|im_end|>"};
};

}  // namespace bs
