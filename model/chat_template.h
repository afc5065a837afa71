// A model's chat template: how a conversation becomes the prompt text the model was
// trained on. It is the model's own Jinja template (GGUF tokenizer.chat_template, which a
// Hugging Face checkpoint's tokenizer_config.json chat_template or chat_template.jinja
// becomes in model/hf_checkpoint.cpp), or one given by the operator (model.chat_template,
// --chat-template FILE, as vLLM's --chat-template and llama-server's --chat-template-file),
// rendered by model/jinja_template.h with the variables transformers' apply_chat_template
// passes. A file without a template gets ChatML, as llama.cpp does.
//
// A template is checked when it loads: it is parsed, and it must render a plain
// conversation and write the user's message verbatim (the RAG prompt is cut there,
// blend/rag_prompt.h). A template the engine cannot run (a tag, filter or method it does
// not implement, which the error names) is refused then, never at the first request.
// A template that refuses a conversation (raise_exception: a system message it does not
// take, roles that do not alternate) refuses it per request with its own message.
//
// Tools: the request's tools are the template's `tools`, an assistant's earlier calls
// its message's `tool_calls` (arguments as objects, as transformers' templates read
// them), a tool's result a message of role "tool" with its `tool_call_id`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/jinja_template.h"  // TemplateRaised: a template's refusal of a conversation
#include "model/tool_calls.h"

namespace bs {

namespace gguf { class GgufFile; }
class Tokenizer;

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, std::string calls = {}, std::string call_id = {})
      : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)), tool_call_id(std::move(call_id)) {}

  std::string role;     // system, user, assistant or tool
  std::string content;
  // An assistant's calls of the request's tools, OpenAI's JSON array
  // ([{"id", "type": "function", "function": {"name", "arguments"}}]); empty: none.
  std::string tool_calls;
  std::string tool_call_id;  // a tool message's: the call it answers
};

class ChatTemplate {
 public:
  // The built-in ChatML (`<|im_start|>ROLE\n...<|im_end|>\n`), no default system prompt.
  ChatTemplate();
  // `source` (Jinja) for a model whose BOS and EOS tokens are spelt `bos_token` and
  // `eos_token` (the template's variables of those names). `origin` names where the
  // template came from, in every error. std::invalid_argument when the check above fails.
  ChatTemplate(const std::string& source, std::string origin, std::string bos_token, std::string eos_token);
  // The model's own: `file`'s tokenizer.chat_template, else the built-in ChatML; `tok`
  // spells its BOS and EOS.
  static ChatTemplate from_gguf(const gguf::GgufFile& file, const Tokenizer& tok);
  // A template given by the operator: `spec` is a file's path, or the template itself
  // when it holds Jinja markup ("{{" or "{%"), as vLLM's --chat-template takes either.
  static ChatTemplate from_operator(const std::string& spec, const Tokenizer& tok);

  // Where the template came from: "the model's tokenizer.chat_template",
  // "--chat-template PATH", "built-in ChatML (the model has no template)".
  const std::string& origin() const { return origin_; }
  bool builtin() const { return builtin_; }

  // The prompt text of `messages`; with add_generation_prompt, followed by the opening of
  // the assistant's turn. `tools`: the request's tools (OpenAI's JSON array of
  // {"type": "function", "function": {...}}), the template's `tools`; empty: none.
  // std::invalid_argument with the template's own message where it refuses the
  // conversation, and where a message is not valid UTF-8.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                    const std::string& tools = {}) const;

  // apply(messages, true) cut where the last message's content is written:
  // before + content + after == apply(messages, true). The content itself is not rendered
  // (a placeholder stands for it), so a caller can put documents in front of a question
  // and tokenize each part apart (blend/rag_prompt.h). std::invalid_argument where the
  // template refuses the conversation.
  struct Cut {
    std::string before;
    std::string after;
  };
  Cut cut_at_last_message(const std::vector<ChatMessage>& messages, const std::string& tools = {}) const;

  // Whether the template writes the request's tools into the prompt (checked at load: a
  // question renders differently with a tool than without), and the format its model
  // writes calls in (model/tool_calls.h). A request with tools is refused where either
  // is missing (http/server.cpp).
  bool takes_tools() const { return takes_tools_; }
  ToolCallFormat tool_call_format() const { return tool_format_; }

  // Strings that end the assistant's turn where the template writes them as text the
  // model could spell out (ChatML's "<|im_end|>"); generation also stops at the model's
  // end tokens (model/generate.h).
  const std::vector<std::string>& stop_strings() const { return stops_; }

 private:
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& tools) const;
  void check() const;
  bool probe_tools() const;

  std::shared_ptr<const JinjaTemplate> jinja_;  // parsed once, shared by copies (rendering is const)
  std::string origin_;
  bool builtin_ = false;
  std::string bos_, eos_;  // the texts of the model's BOS and EOS tokens
  std::vector<std::string> stops_;
  bool takes_tools_ = false;
  ToolCallFormat tool_format_ = ToolCallFormat::none;
};

}  // namespace bs
