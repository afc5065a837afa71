#include "blend/rag_prompt.h"

#include <stdexcept>

namespace bs {

int64_t RagPrompt::size() const {
  int64_t n = static_cast<int64_t>(prefix.size() + suffix.size());
  for (const auto& c : chunks) n += static_cast<int64_t>(c.size());
  return n;
}

std::vector<int32_t> RagPrompt::concatenated() const {
  std::vector<int32_t> all(prefix);
  for (const auto& c : chunks) all.insert(all.end(), c.begin(), c.end());
  all.insert(all.end(), suffix.begin(), suffix.end());
  return all;
}

int64_t RagPrompt::chunk_offset(size_t i) const {
  int64_t off = static_cast<int64_t>(prefix.size());
  for (size_t j = 0; j < i; ++j) off += static_cast<int64_t>(chunks[j].size());
  return off;
}

RagPrompt assemble_rag_prompt(const Tokenizer& tok, const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                              const std::vector<std::string>& documents, const std::string& tools) {
  if (messages.empty() || (messages.back().role != "user" && messages.back().role != "tool"))
    throw std::invalid_argument("the last message must be the user's question or a tool's result");
  RagPrompt p;
  // The conversation rendered with its generation prompt, cut where the question is
  // written: the documents go in front of it, in the user's turn.
  const ChatTemplate::Cut cut = tmpl.cut_at_last_message(messages, tools);
  p.prefix = with_bos(tok, tok.encode(cut.before, true));
  for (const auto& d : documents) {
    auto ids = document_chunk_tokens(tok, d);
    if (!ids.empty()) p.chunks.push_back(std::move(ids));
  }
  // The question and the turn's close continue the text (no SentencePiece space prefix
  // at their start: Tokenizer::encode_continuation).
  p.suffix = tok.encode_continuation(messages.back().content, false);
  const auto close = tok.encode_continuation(cut.after, true);
  p.suffix.insert(p.suffix.end(), close.begin(), close.end());
  return p;
}

std::vector<int32_t> document_chunk_tokens(const Tokenizer& tok, const std::string& document) {
  return tok.encode_continuation(document + "\n\n", false);
}

std::vector<int32_t> with_bos(const Tokenizer& tok, std::vector<int32_t> ids) {
  const auto bos = tok.bos_prefix();
  if (bos.empty() || (!ids.empty() && ids.front() == bos.front())) return ids;
  ids.insert(ids.begin(), bos.front());
  return ids;
}

std::vector<int32_t> chunk_prelude_tokens(const Tokenizer& tok, const std::string& text) {
  return with_bos(tok, tok.encode(text, true));
}

SplitMessage split_text_parts(const std::vector<std::string>& parts) {
  SplitMessage m;
  if (parts.empty()) return m;
  m.documents.assign(parts.begin(), parts.end() - 1);
  m.question = parts.back();
  return m;
}

SplitMessage split_by_separator(const std::string& text, const std::string& separator) {
  if (separator.empty()) return SplitMessage{{}, text};
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(separator, start);
    std::string piece = text.substr(start, at == std::string::npos ? std::string::npos : at - start);
    if (!piece.empty()) pieces.push_back(std::move(piece));
    if (at == std::string::npos) break;
    start = at + separator.size();
  }
  return split_text_parts(pieces);
}

}  // namespace bs
