#include "model/chat_template.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/jinja_template.h"
#include "model/tokenizer.h"

namespace bs {

namespace {

using json = nlohmann::json;

// ChatML as SmolLM2's and Qwen's templates write it, without their default system
// prompt: the template llama.cpp falls back to for a file that has none.
constexpr const char* kChatMl =
    R"({% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }})"
    R"({% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

// What stands for the last message's content in cut_at_last_message: plain ASCII that no
// filter a template applies to a message (trim, strip, escaping) changes, and that no
// other part of the conversation holds (a number is added until none does: a user may
// paste it, and the fuzzer did).
constexpr std::string_view kMarker = "@@blendserve:message:7f3a9c@@";

std::string marker_for(const std::vector<ChatMessage>& messages, const std::string& tools) {
  auto held = [&](const std::string& m) {
    if (tools.find(m) != std::string::npos) return true;
    for (const auto& msg : messages)
      if (msg.content.find(m) != std::string::npos || msg.tool_calls.find(m) != std::string::npos ||
          msg.tool_call_id.find(m) != std::string::npos || msg.role.find(m) != std::string::npos)
        return true;
    return false;
  };
  std::string m(kMarker);
  for (int n = 0; held(m); ++n) m = std::string(kMarker) + std::to_string(n) + "@@";
  return m;
}

// End-of-turn markers a model could also spell out in ordinary tokens: where the template
// writes one, the text stops generation too.
constexpr const char* kTurnEnds[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};

std::string token_text(const Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.vocab_size() ? std::string(tok.token_bytes(id)) : std::string();
}

// The engine's message without its own "chat template: " (the origin replaces it).
std::string engine_message(const std::exception& e) {
  std::string what = e.what();
  constexpr std::string_view kOwn = "chat template: ";
  if (what.starts_with(kOwn)) what.erase(0, kOwn.size());
  return what;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--chat-template: cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ChatTemplate::ChatTemplate()
    : jinja_(std::make_shared<const JinjaTemplate>(kChatMl)),
      origin_("built-in ChatML (the model has no template)"),
      builtin_(true),
      stops_{"<|im_end|>"} {}

ChatTemplate::ChatTemplate(const std::string& source, std::string origin, std::string bos_token, std::string eos_token)
    : origin_(std::move(origin)), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {
  try {
    jinja_ = std::make_shared<const JinjaTemplate>(source);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(origin_ + ": " + engine_message(e) +
                                "; give the model another with --chat-template FILE");
  }
  for (const char* end : kTurnEnds)
    if (source.find(end) != std::string::npos) stops_.emplace_back(end);
  check();
  takes_tools_ = probe_tools();
  tool_format_ = takes_tools_ ? tool_call_format_of(source) : ToolCallFormat::none;
}

bool ChatTemplate::probe_tools() const {
  static const std::string kTool =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",)"
      R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const std::vector<ChatMessage> question = {{"user", "What is the weather in Paris?"}};
  try {
    return render(question, true, kTool) != render(question, true, {});
  } catch (const std::invalid_argument&) {
    return false;  // the template cannot render tools: it takes none
  }
}

ChatTemplate ChatTemplate::from_gguf(const gguf::GgufFile& file, const Tokenizer& tok) {
  const auto source = file.get_string("tokenizer.chat_template");
  if (!source || source->empty()) return ChatTemplate();
  return ChatTemplate(*source, "the model's chat template (tokenizer.chat_template)", token_text(tok, tok.bos_id()),
                      token_text(tok, tok.eos_id()));
}

ChatTemplate ChatTemplate::from_operator(const std::string& spec, const Tokenizer& tok) {
  if (spec.find("{{") != std::string::npos || spec.find("{%") != std::string::npos)
    return ChatTemplate(spec, "the chat template given inline (model.chat_template)", token_text(tok, tok.bos_id()),
                        token_text(tok, tok.eos_id()));
  return ChatTemplate(read_file(spec), "the chat template '" + spec + "' (--chat-template)",
                      token_text(tok, tok.bos_id()), token_text(tok, tok.eos_id()));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& tools) const {
  json ms = json::array();
  for (const auto& m : messages) {
    json msg = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      json calls = json::parse(m.tool_calls, nullptr, false);
      if (!calls.is_array()) throw std::invalid_argument("a message's tool_calls is not a JSON array");
      // Arguments as an object (transformers' templates write them with tojson), as
      // vLLM passes them; OpenAI's clients send them as a JSON string.
      for (auto& c : calls)
        if (c.is_object() && c.contains("function") && c["function"].is_object() &&
            c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
          json args = json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) c["function"]["arguments"] = std::move(args);
        }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
    ms.push_back(std::move(msg));
  }
  json context = {{"messages", std::move(ms)},
                  {"add_generation_prompt", add_generation_prompt},
                  {"bos_token", bos_},
                  {"eos_token", eos_}};
  if (!tools.empty()) {
    json t = json::parse(tools, nullptr, false);
    if (!t.is_array()) throw std::invalid_argument("the request's tools are not a JSON array");
    context["tools"] = std::move(t);
  }
  std::string variables;
  try {
    variables = context.dump();
  } catch (const json::type_error&) {
    // Text the template's JSON cannot hold (only the CLI can send it: HTTP bodies are
    // checked as JSON): refused, not rendered with stand-ins the model never sees.
    throw std::invalid_argument("a message is not valid UTF-8 text");
  }
  try {
    return jinja_->render(variables);
  } catch (const TemplateRaised&) {
    throw;  // the template's own refusal of this conversation, as it words it
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(origin_ + ": " + engine_message(e));
  }
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                const std::string& tools) const {
  return render(messages, add_generation_prompt, tools);
}

ChatTemplate::Cut ChatTemplate::cut_at_last_message(const std::vector<ChatMessage>& messages,
                                                    const std::string& tools) const {
  if (messages.empty()) throw std::invalid_argument("a conversation needs at least one message");
  const std::string marker = marker_for(messages, tools);
  std::vector<ChatMessage> marked = messages;
  marked.back().content = marker;
  const std::string text = render(marked, true, tools);
  const size_t at = text.find(marker);
  if (at == std::string::npos || text.find(marker, at + marker.size()) != std::string::npos)
    throw std::invalid_argument(origin_ + " does not write the last message's text once and verbatim (it " +
                                (at == std::string::npos ? "leaves it out or changes it" : "writes it twice") +
                                "), so a prompt cannot be assembled around it");
  return Cut{text.substr(0, at), text.substr(at + marker.size())};
}

void ChatTemplate::check() const {
  // Conversations every chat model takes: a question; a system prompt and turns. A
  // template may refuse the second (no system role), never the first; and it must not
  // fail inside the engine on either.
  const std::vector<std::vector<ChatMessage>> samples = {
      {{"user", "Hi"}},
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Who are you?"}},
      {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Who are you?"}}};
  for (size_t i = 0; i < samples.size(); ++i) {
    try {
      cut_at_last_message(samples[i]);
    } catch (const TemplateRaised& e) {
      if (i == 0)
        throw std::invalid_argument(origin_ + " refuses a conversation of one user message (" + e.what() +
                                    "); give the model another with --chat-template FILE");
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(e.what()) + "; give the model another with --chat-template FILE");
    }
  }
}

}  // namespace bs
