// Chat template: built-in ChatML rendering equivalent to the Jinja templates of
// ChatML models (SmolLM2, Qwen2), including the default system prompt such a
// template injects when the conversation does not start with a system message.
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace bs {

namespace {

constexpr std::string_view kStart = "<|im_start|>";
constexpr std::string_view kEnd = "<|im_end|>";

// Undoes Jinja string-literal escapes; returns false when the literal's quote
// character q appears unescaped (the text is not a single literal).
bool unescape_literal(std::string_view raw, char q, std::string* out) {
  out->clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == q) return false;
    if (c != '\\' || i + 1 == raw.size()) {
      out->push_back(c);
      continue;
    }
    const char e = raw[++i];
    switch (e) {
      case 'n': out->push_back('\n'); break;
      case 't': out->push_back('\t'); break;
      case 'r': out->push_back('\r'); break;
      case '\\': out->push_back('\\'); break;
      case '\'': out->push_back('\''); break;
      case '"': out->push_back('"'); break;
      default:
        out->push_back('\\');
        out->push_back(e);
    }
  }
  return true;
}

// The first system turn written in the template as one string literal, e.g.
// '<|im_start|>system\nYou are ...<|im_end|>\n'. Turns assembled from expressions
// ('<|im_start|>system\n' + messages[0]['content'] + ...) are skipped.
std::string extract_default_system(const std::string& tpl) {
  const std::string open = std::string(kStart) + "system";
  for (size_t at = tpl.find(open); at != std::string::npos; at = tpl.find(open, at + 1)) {
    if (at == 0) continue;
    const char q = tpl[at - 1];
    if (q != '\'' && q != '"') continue;
    size_t body = at + open.size();
    if (tpl.compare(body, 1, "\n") == 0) {
      body += 1;
    } else if (tpl.compare(body, 2, "\\n") == 0) {
      body += 2;
    } else {
      continue;
    }
    const size_t end = tpl.find(kEnd, body);
    if (end == std::string::npos) break;
    const std::string_view raw(tpl.data() + body, end - body);
    if (raw.find("{{") != std::string_view::npos || raw.find("{%") != std::string_view::npos) continue;
    std::string text;
    if (unescape_literal(raw, q, &text)) return text;
  }
  return "";
}

}  // namespace

ChatTemplate ChatTemplate::chatml(std::string default_system) {
  ChatTemplate t;
  t.default_system_ = std::move(default_system);
  return t;
}

ChatTemplate ChatTemplate::unsupported(std::string source) {
  ChatTemplate t;
  t.supported_ = false;
  t.source_ = std::move(source);
  return t;
}

ChatTemplate ChatTemplate::from_gguf(const gguf::GgufFile& file) {
  const auto tpl = file.get_string("tokenizer.chat_template");
  if (!tpl || tpl->empty()) return chatml();  // no template: ChatML, as llama.cpp does
  // ChatML: turns open with <|im_start|>ROLE and close with <|im_end|>.
  if (tpl->find(kStart) == std::string::npos || tpl->find(kEnd) == std::string::npos) return unsupported(*tpl);
  return chatml(extract_default_system(*tpl));
}

void ChatTemplate::require_supported() const {
  if (supported_) return;
  std::string head = source_.substr(0, 80);
  for (char& c : head)
    if (c == '\n') c = ' ';
  throw std::invalid_argument("the model's chat template is not supported (known: ChatML); it begins \"" + head +
                              (source_.size() > 80 ? "...\"" : "\"") +
                              "; use a raw prompt, or a model with a ChatML template");
}

std::string ChatTemplate::turn_open(const std::string& role) const {
  require_supported();
  return std::string(kStart) + role + "\n";
}

std::string ChatTemplate::turn_close() const {
  require_supported();
  return std::string(kEnd) + "\n";
}

std::string ChatTemplate::generation_prompt() const {
  require_supported();
  return std::string(kStart) + "assistant\n";
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  require_supported();
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && !default_system_.empty() && m.role != "system") {
      out.append(kStart).append("system\n").append(default_system_).append(kEnd).append("\n");
    }
    out.append(kStart).append(m.role).append("\n").append(m.content).append(kEnd).append("\n");
  }
  if (add_generation_prompt) out.append(kStart).append("assistant\n");
  return out;
}

}  // namespace bs
