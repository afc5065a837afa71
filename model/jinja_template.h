// A chat template written in Jinja (a model's tokenizer.chat_template, a checkpoint's
// chat_template / chat_template.jinja, or a file given with --chat-template), parsed
// once and rendered with the variables transformers' apply_chat_template passes.
//
// The engine is llama.cpp's (common/jinja; model/CMakeLists.txt says where it comes
// from and why): Debian packages no C++ Jinja, and writing one that renders the 71
// templates of llama.cpp's models/templates the way Python's jinja2 does is what that
// engine already is. tests/test_jinja_template.cpp renders each of those templates
// here and with Python's jinja2 (Debian python3-jinja2) and requires the same bytes.
// This header hides the engine: nothing else includes it.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

namespace bs {

// What JinjaTemplate::render throws where the template calls raise_exception: the
// template's own message, word for word (it refuses the conversation, e.g. "System role
// not supported"), apart from the engine's failures.
struct TemplateRaised : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class JinjaTemplate {
 public:
  // Parses `source`. std::invalid_argument with the engine's message for a template it
  // cannot parse (a feature it does not implement, a syntax error).
  explicit JinjaTemplate(const std::string& source);
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

  // The text for `context_json`, a JSON object of the template's variables (messages,
  // add_generation_prompt, bos_token, eos_token, tools, ...). std::invalid_argument with
  // the engine's error; TemplateRaised where the template calls raise_exception (a
  // system message it forbids, roles that do not alternate).
  std::string render(const std::string& context_json) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
