// How a RAG chat request becomes prefix + chunks + suffix.
//
// For a conversation whose last message is the user's question and a list of
// retrieved documents, with the model's chat template (model/chat_template.h) rendering
// the conversation and its generation prompt, cut where the question is written
// (ChatTemplate::cut_at_last_message; ChatML for SmolLM2 shown):
//
//   prefix  = everything before the question: the system prompt (the template's default
//             one too), earlier turns, the user turn's opening ("...<|im_start|>user\n")
//   chunk_i = document_i + "\n\n"          (one per document, in request order)
//   suffix  = question + everything after it: the turn's close and the assistant's
//             opening ("<|im_end|>\n<|im_start|>assistant\n")
// The concatenation is the template's rendering of the conversation with the documents
// written in front of the question. A template that refuses the conversation (no system
// role, roles that do not alternate) throws std::invalid_argument with its message.
//
// Each part is tokenized on its own, so a chunk's tokens never depend on its
// neighbours and the same document is the same token sequence (and cache key) in
// every request. Documents are tokenized as plain text: a control token written
// inside a document is text, never markup. The `full` mode runs the very same
// concatenated token sequence, so modes are compared on identical inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace bs {

struct RagPrompt {
  std::vector<int32_t> prefix;
  std::vector<std::vector<int32_t>> chunks;
  std::vector<int32_t> suffix;

  int64_t size() const;
  std::vector<int32_t> concatenated() const;
  // Position of chunk i's first token in the concatenated prompt.
  int64_t chunk_offset(size_t i) const;
  int64_t suffix_offset() const { return size() - static_cast<int64_t>(suffix.size()); }
};

// messages: the conversation; its last message must be the user's question (or a tool's
// result, which the documents then precede). tools: the tools offered (the template's
// `tools`, ChatTemplate::apply); empty: none. The prefix starts with the model's BOS
// where it adds one (Tokenizer::bos_prefix) and the rendered conversation does not
// already begin with it.
RagPrompt assemble_rag_prompt(const Tokenizer& tok, const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                              const std::vector<std::string>& documents, const std::string& tools = {});

// The chunk tokens of one document, exactly as assemble_rag_prompt makes them
// (so a document stored ahead of time has the key a request will look up).
std::vector<int32_t> document_chunk_tokens(const Tokenizer& tok, const std::string& document);

// `ids` with the model's BOS in front where it adds one and `ids` does not start with
// it already: a prompt's first tokens (a raw prompt's, a chat prefix's).
std::vector<int32_t> with_bos(const Tokenizer& tok, std::vector<int32_t> ids);

// The tokens every chunk's KV is computed behind (BlendEngine's chunk_prelude): the
// model's BOS where it adds one, then `text` (blend.chunk_prelude; special tokens
// parsed). A model trained with BOS first never sees a text without it; a chunk
// computed alone would make its own first token the sink BOS is (Gemma 3's local
// layers, whose window loses the prompt's BOS, then read those sinks:
// tests/test_model_gemma3.cpp). Every chunk key includes it.
std::vector<int32_t> chunk_prelude_tokens(const Tokenizer& tok, const std::string& text);

// Documents given inside the user's message instead of a `documents` array:
//  - as several text parts (OpenAI content array): every part but the last is a
//    document, the last part is the question;
//  - LMCache compatibility: one text with documents separated by `separator`
//    (e.g. " # # "); the last piece is the question. Empty pieces are dropped.
struct SplitMessage {
  std::vector<std::string> documents;
  std::string question;
};
SplitMessage split_text_parts(const std::vector<std::string>& parts);
SplitMessage split_by_separator(const std::string& text, const std::string& separator);

}  // namespace bs
