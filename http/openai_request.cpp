#include "http/openai_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "blend/rag_prompt.h"
#include "http/api_error.h"

namespace bs::http {
namespace {

using json = nlohmann::json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const json& v, const char* expected) {
  throw bad_request("'" + param + "' must be " + expected + ", got " + type_name(v), param, "invalid_type");
}

double get_number(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, v, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw bad_request("'" + param + "' must be finite", param);
  return d;
}

// An integer in [lo, hi]; 3.0 counts as an integer (JSON has one number type).
int64_t get_integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (v.is_number_integer()) {
    const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
    if (!neg && v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      throw bad_request("'" + param + "' must be at most " + std::to_string(hi), param, "out_of_range");
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi)
      throw bad_request("'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                            std::to_string(i),
                        param, "out_of_range");
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<int64_t>(d);
    throw bad_request("'" + param + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                      param, "out_of_range");
  }
  wrong_type(param, v, "an integer");
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, v, "a boolean");
  return v.get<bool>();
}

const std::string& get_string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, v, "a string");
  return v.get_ref<const std::string&>();
}

// A message's content: a string, or an array of {"type":"text","text":...} parts.
std::vector<std::string> content_parts(const json& content, const std::string& param) {
  if (content.is_string()) return {content.get<std::string>()};
  if (!content.is_array()) wrong_type(param, content, "a string or an array of text parts");
  if (content.empty()) throw bad_request("'" + param + "' must not be an empty array", param);
  std::vector<std::string> parts;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& part = content[i];
    if (!part.is_object()) wrong_type(p, part, "an object");
    const auto type = part.find("type");
    if (type == part.end()) throw bad_request("'" + p + ".type' is required", p + ".type");
    const std::string& t = get_string(*type, p + ".type");
    if (t != "text")
      throw bad_request("content parts of type '" + t + "' are not supported (only 'text')", p + ".type",
                        "unsupported_content_type");
    const auto text = part.find("text");
    if (text == part.end()) throw bad_request("'" + p + ".text' is required", p + ".text");
    parts.push_back(get_string(*text, p + ".text"));
    for (const auto& [k, v] : part.items())
      if (k != "type" && k != "text") throw bad_request("unknown field '" + p + "." + k + "'", p + "." + k);
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += p;
  return out;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}] -> the array as JSON text.
std::string parse_message_tool_calls(const json& v, const std::string& param) {
  if (!v.is_array()) wrong_type(param, v, "an array");
  if (v.empty()) throw bad_request("'" + param + "' must not be empty", param);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& c = v[i];
    if (!c.is_object()) wrong_type(p, c, "an object");
    for (const auto& [k, f] : c.items())
      if (k != "id" && k != "type" && k != "function" && k != "index")
        throw bad_request("'" + p + "." + k + "' is not supported", p + "." + k, "unsupported_parameter");
    if (!c.contains("id")) throw bad_request("'" + p + ".id' is required", p + ".id");
    get_string(c["id"], p + ".id");
    if (c.contains("type") && (!c["type"].is_string() || c["type"] != "function"))
      throw bad_request("'" + p + ".type' must be \"function\"", p + ".type");
    if (!c.contains("function") || !c["function"].is_object())
      throw bad_request("'" + p + ".function' must be an object", p + ".function");
    const json& f = c["function"];
    if (!f.contains("name")) throw bad_request("'" + p + ".function.name' is required", p + ".function.name");
    get_string(f["name"], p + ".function.name");
    if (!f.contains("arguments")) throw bad_request("'" + p + ".function.arguments' is required", p + ".function.arguments");
    get_string(f["arguments"], p + ".function.arguments");
  }
  return v.dump(-1, ' ', false, json::error_handler_t::strict);
}

struct Messages {
  std::vector<ChatMessage> messages;
  std::vector<std::string> documents;  // from the last user message's text parts
};

Messages parse_messages(const json& v) {
  if (!v.is_array()) wrong_type("messages", v, "an array");
  if (v.empty()) throw bad_request("'messages' must not be empty", "messages");
  Messages out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) wrong_type(p, m, "an object");
    const auto role_it = m.find("role");
    if (role_it == m.end()) throw bad_request("'" + p + ".role' is required", p + ".role");
    std::string role = get_string(*role_it, p + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      throw bad_request("unknown role '" + role + "' in '" + p + ".role' (system, developer, user, assistant, tool)",
                        p + ".role", "invalid_role");
    for (const auto& [k, f] : m.items())
      if (k != "role" && k != "content" && k != "name" && !(k == "tool_calls" && role == "assistant") &&
          !(k == "tool_call_id" && role == "tool"))
        throw bad_request("'" + p + "." + k + "' is not supported", p + "." + k, "unsupported_parameter");
    // An assistant's earlier tool calls; its content may then be null.
    std::string tool_calls;
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null())
      tool_calls = parse_message_tool_calls(*calls, p + ".tool_calls");
    std::string tool_call_id;
    if (role == "tool") {
      const auto id = m.find("tool_call_id");
      if (id == m.end()) throw bad_request("'" + p + ".tool_call_id' is required", p + ".tool_call_id");
      tool_call_id = get_string(*id, p + ".tool_call_id");
    }
    const auto content_it = m.find("content");
    if ((content_it == m.end() || content_it->is_null()) && tool_calls.empty())
      throw bad_request("'" + p + ".content' is required", p + ".content");
    if (auto name = m.find("name"); name != m.end()) get_string(*name, p + ".name");
    if (content_it == m.end() || content_it->is_null()) {
      out.messages.emplace_back(role, "", std::move(tool_calls));
      continue;
    }
    auto parts = content_parts(*content_it, p + ".content");
    const bool last = i + 1 == v.size();
    if (last && role == "user" && parts.size() > 1) {
      // Several text parts of the question: every part but the last is a document.
      for (size_t k = 0; k + 1 < parts.size(); ++k)
        if (parts[k].empty()) {
          const std::string t = p + ".content[" + std::to_string(k) + "].text";
          throw bad_request("'" + t + "' is a document and must not be empty", t);
        }
      SplitMessage split = split_text_parts(parts);
      out.documents = std::move(split.documents);
      out.messages.emplace_back(role, std::move(split.question));
    } else {
      out.messages.emplace_back(role, join(parts), std::move(tool_calls), std::move(tool_call_id));
    }
  }
  if (out.messages.back().role != "user" && out.messages.back().role != "tool")
    throw bad_request("the last message must be the user's or a tool's result (got '" + out.messages.back().role + "')",
                      "messages[" + std::to_string(v.size() - 1) + "].role");
  return out;
}

// A tool's or a call's function name: what OpenAI allows.
const std::string& get_function_name(const json& v, const std::string& param) {
  const std::string& name = get_string(v, param);
  const bool ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (!ok) throw bad_request("'" + param + "' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", param);
  return name;
}

void check_keys(const json& o, const std::string& param, std::initializer_list<const char*> allowed) {
  for (const auto& item : o.items()) {
    const std::string& k = item.key();
    if (std::none_of(allowed.begin(), allowed.end(), [&k](const char* a) { return k == a; }))
      throw bad_request("'" + param + "." + k + "' is not supported", param + "." + k, "unsupported_parameter");
  }
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}] -> the array as JSON text and the names.
void parse_tools(const json& v, ChatCompletionRequest& out) {
  if (!v.is_array()) wrong_type("tools", v, "an array");
  if (v.size() > 128) throw bad_request("'tools' holds at most 128 tools", "tools");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json& t = v[i];
    if (!t.is_object()) wrong_type(p, t, "an object");
    check_keys(t, p, {"type", "function"});
    if (!t.contains("type") || !t["type"].is_string() || t["type"] != "function")
      throw bad_request("'" + p + ".type' must be \"function\"", p + ".type");
    if (!t.contains("function")) throw bad_request("'" + p + ".function' is required", p + ".function");
    const json& f = t["function"];
    if (!f.is_object()) wrong_type(p + ".function", f, "an object");
    check_keys(f, p + ".function", {"name", "description", "parameters", "strict"});
    if (!f.contains("name")) throw bad_request("'" + p + ".function.name' is required", p + ".function.name");
    const std::string& name = get_function_name(f["name"], p + ".function.name");
    if (std::find(out.tool_names.begin(), out.tool_names.end(), name) != out.tool_names.end())
      throw bad_request("two tools are named '" + name + "'", p + ".function.name");
    if (f.contains("description")) get_string(f["description"], p + ".function.description");
    if (f.contains("parameters") && !f["parameters"].is_object())
      wrong_type(p + ".function.parameters", f["parameters"], "an object (a JSON Schema)");
    if (f.contains("strict")) get_bool(f["strict"], p + ".function.strict");
    out.tool_names.push_back(name);
  }
  if (!v.empty()) out.request.tools = v.dump(-1, ' ', false, json::error_handler_t::strict);
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> stop;
  if (v.is_string()) {
    stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > 4) throw bad_request("'stop' takes at most 4 sequences", "stop");
    for (size_t i = 0; i < v.size(); ++i) stop.push_back(get_string(v[i], "stop[" + std::to_string(i) + "]"));
  } else {
    wrong_type("stop", v, "a string or an array of strings");
  }
  for (const auto& s : stop)
    if (s.empty()) throw bad_request("'stop' sequences must not be empty", "stop");
  return stop;
}

json parse_body(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw bad_request("the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) throw bad_request("the request body must be a JSON object", "", "invalid_json");
  return j;
}

}  // namespace

namespace {

// JSON null means "not given" for every optional field, as in OpenAI's API.
const json* field_of(const json& j, const char* name) {
  const auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// Every key of `j` must be in `known`.
void check_known(const json& j, const std::set<std::string>& known) {
  for (const auto& [k, v] : j.items())
    if (!known.count(k))
      throw bad_request("unrecognized request argument supplied: " + k, k, "unsupported_parameter");
}

// The fields chat and text completions share: model, documents (the array), stream and
// its options, max_tokens, sampling, n, penalties, user and blendserve's mode / ratio.
// `logprobs` differs between the two APIs and is the caller's.
void parse_shared(const json& j, CompletionCommon& out, RuntimeRequest& req) {
  auto field = [&j](const char* name) { return field_of(j, name); };
  const json* model = field("model");
  if (!model) throw bad_request("you must provide a model parameter", "model", "missing_required_parameter");
  out.model = get_string(*model, "model");

  if (const json* d = field("documents")) {
    if (!d->is_array()) wrong_type("documents", *d, "an array of strings");
    for (size_t i = 0; i < d->size(); ++i) {
      const std::string p = "documents[" + std::to_string(i) + "]";
      const std::string& s = get_string((*d)[i], p);
      if (s.empty()) throw bad_request("'" + p + "' must not be empty", p);
      req.documents.push_back(s);
    }
  }

  if (const json* v = field("stream")) out.stream = get_bool(*v, "stream");
  if (const json* v = field("stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", *v, "an object");
    if (!out.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    for (const auto& [k, f] : v->items()) {
      if (k != "include_usage")
        throw bad_request("unknown field 'stream_options." + k + "'", "stream_options." + k, "unsupported_parameter");
      if (!f.is_null()) out.include_usage = get_bool(f, "stream_options.include_usage");
    }
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (const json* v = field("max_tokens")) {
    req.sampling.max_tokens = static_cast<int>(get_integer(*v, "max_tokens", 1, kMaxInt));
    out.max_tokens_given = true;
  }
  if (const json* v = field("max_completion_tokens")) {
    req.sampling.max_tokens = static_cast<int>(get_integer(*v, "max_completion_tokens", 1, kMaxInt));
    out.max_tokens_given = true;
  }
  if (const json* v = field("temperature")) {
    const double t = get_number(*v, "temperature");
    if (t < 0 || t > 2) throw bad_request("'temperature' must be in [0, 2]", "temperature", "out_of_range");
    req.sampling.temperature = static_cast<float>(t);
  }
  if (const json* v = field("top_p")) {
    const double p = get_number(*v, "top_p");
    if (!(p > 0 && p <= 1)) throw bad_request("'top_p' must be in (0, 1]", "top_p", "out_of_range");
    req.sampling.top_p = static_cast<float>(p);
  }
  if (const json* v = field("top_k"))
    req.sampling.top_k = static_cast<int>(get_integer(*v, "top_k", 0, kMaxInt));
  if (const json* v = field("seed"))
    req.sampling.seed = static_cast<uint64_t>(
        get_integer(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  if (const json* v = field("stop")) req.sampling.stop = parse_stop(*v);
  if (const json* v = field("n"))
    if (get_integer(*v, "n", 1, kMaxInt) != 1)
      throw bad_request("only n = 1 is supported", "n", "unsupported_parameter");
  for (const char* penalty : {"presence_penalty", "frequency_penalty"})
    if (const json* v = field(penalty))
      if (get_number(*v, penalty) != 0)
        throw bad_request(std::string("'") + penalty + "' is not supported (only 0)", penalty,
                          "unsupported_parameter");
  if (const json* v = field("user")) get_string(*v, "user");
  if (const json* v = field("mode")) {
    try {
      req.mode = parse_mode(get_string(*v, "mode"));
    } catch (const std::invalid_argument& e) {
      throw bad_request(e.what(), "mode");
    }
  }
  if (const json* v = field("ratio")) {
    const double r = get_number(*v, "ratio");
    if (r < 0 || r > 1) throw bad_request("'ratio' must be in [0, 1]", "ratio", "out_of_range");
    req.ratio = static_cast<float>(r);
  }
}

}  // namespace

ChatCompletionRequest parse_chat_completion(std::string_view body, int default_max_tokens) {
  const json j = parse_body(body);
  static const std::set<std::string> known = {
      "model",  "messages", "stream",    "stream_options", "max_tokens",        "max_completion_tokens",
      "temperature", "top_p", "seed",    "stop",           "n",                 "presence_penalty",
      "frequency_penalty", "logprobs", "response_format", "user", "metadata", "store", "service_tier",
      "documents", "top_k", "mode",      "ratio", "tools", "tool_choice", "parallel_tool_calls"};
  check_known(j, known);

  ChatCompletionRequest out;
  auto& req = out.request;
  req.sampling.max_tokens = default_max_tokens;
  auto field = [&j](const char* name) { return field_of(j, name); };
  parse_shared(j, out, req);

  const json* messages = field("messages");
  if (!messages) throw bad_request("'messages' is required", "messages", "missing_required_parameter");
  Messages parsed = parse_messages(*messages);
  req.messages = std::move(parsed.messages);
  if (!parsed.documents.empty()) {
    if (!req.documents.empty())
      throw bad_request("give documents either as 'documents' or as text parts of the last message, not both",
                        "documents");
    req.documents = std::move(parsed.documents);
  }

  if (const json* v = field("tools")) parse_tools(*v, out);
  if (const json* v = field("tool_choice")) {
    // none: the tools are not offered (the template renders without them); auto: the
    // model may call one. Forcing a call (required, a named function) needs constrained
    // decoding, which blendserve does not do.
    if (v->is_string() && (*v == "none" || *v == "auto")) {
      if (*v == "none") {
        out.request.tools.clear();
        out.tool_names.clear();
      }
    } else if (v->is_string() || v->is_object()) {
      throw bad_request("'tool_choice' " + v->dump().substr(0, 80) +
                            " is not supported: the model is not forced to call a tool (use \"auto\" or \"none\")",
                        "tool_choice", "unsupported_parameter");
    } else {
      wrong_type("tool_choice", *v, "\"none\" or \"auto\"");
    }
  }
  if (const json* v = field("parallel_tool_calls")) out.parallel_tool_calls = get_bool(*v, "parallel_tool_calls");
  if (const json* v = field("logprobs"))
    if (get_bool(*v, "logprobs"))
      throw bad_request("'logprobs' is not supported", "logprobs", "unsupported_parameter");
  if (const json* v = field("response_format")) {
    if (!v->is_object()) wrong_type("response_format", *v, "an object");
    const auto t = v->find("type");
    if (t == v->end() || !t->is_string() || t->get<std::string>() != "text")
      throw bad_request("only response_format {\"type\": \"text\"} is supported", "response_format",
                        "unsupported_parameter");
  }
  return out;
}

TextCompletionRequest parse_text_completion(std::string_view body, int default_max_tokens) {
  const json j = parse_body(body);
  static const std::set<std::string> known = {
      "model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n",
      "presence_penalty", "frequency_penalty", "logprobs", "echo", "suffix", "best_of", "user",
      "documents", "top_k", "mode", "ratio"};
  check_known(j, known);

  TextCompletionRequest out;
  auto& req = out.request;
  req.raw = true;
  req.sampling.max_tokens = default_max_tokens;
  auto field = [&j](const char* name) { return field_of(j, name); };
  parse_shared(j, out, req);

  // prompt: a string, or token ids; OpenAI's batch forms only with one prompt.
  const json* p = field("prompt");
  if (!p) throw bad_request("'prompt' is required", "prompt", "missing_required_parameter");
  const json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
    throw bad_request("only one prompt per request is supported", "prompt", "unsupported_parameter");
  if (one->is_string()) {
    out.prompt_text = one->get<std::string>();
    if (out.prompt_text.empty() && req.documents.empty())
      throw bad_request("'prompt' must not be empty", "prompt");
  } else if (one->is_array()) {
    if (one->empty()) throw bad_request("'prompt' must not be empty", "prompt");
    out.prompt_is_ids = true;
    for (size_t i = 0; i < one->size(); ++i) {
      const std::string param = "prompt[" + std::to_string(i) + "]";
      out.prompt_ids.push_back(
          static_cast<int32_t>(get_integer((*one)[i], param, 0, std::numeric_limits<int32_t>::max())));
    }
  } else {
    wrong_type("prompt", *p, "a string or an array of token ids");
  }

  if (const json* v = field("logprobs"))
    if (get_integer(*v, "logprobs", 0, 20) != 0)
      throw bad_request("'logprobs' is not supported", "logprobs", "unsupported_parameter");
  if (const json* v = field("echo"))
    if (get_bool(*v, "echo")) throw bad_request("'echo' is not supported", "echo", "unsupported_parameter");
  if (const json* v = field("suffix"))
    if (!get_string(*v, "suffix").empty())
      throw bad_request("'suffix' (insertion) is not supported", "suffix", "unsupported_parameter");
  if (const json* v = field("best_of"))
    if (get_integer(*v, "best_of", 1, std::numeric_limits<int>::max()) != 1)
      throw bad_request("only best_of = 1 is supported", "best_of", "unsupported_parameter");
  return out;
}

namespace {
// The document's text from a parsed body whose keys are `text` and `allowed`.
std::string document_text(const json& j, std::initializer_list<std::string_view> allowed) {
  for (const auto& [k, v] : j.items())
    if (k != "text" && std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      throw bad_request("unrecognized request argument supplied: " + k, k, "unsupported_parameter");
  const auto it = j.find("text");
  if (it == j.end()) throw bad_request("'text' is required", "text", "missing_required_parameter");
  const std::string& text = get_string(*it, "text");
  if (text.empty()) throw bad_request("'text' must not be empty", "text");
  return text;
}
}  // namespace

std::string parse_document_body(std::string_view body) { return document_text(parse_body(body), {}); }

ClusterDocumentRequest parse_cluster_document_body(std::string_view body) {
  const json j = parse_body(body);
  ClusterDocumentRequest out;
  out.text = document_text(j, {"warm"});
  if (const auto it = j.find("warm"); it != j.end()) {
    if (!it->is_boolean()) throw bad_request("'warm' must be a boolean", "warm");
    out.warm = it->get<bool>();
  }
  return out;
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  // Messages quote what the client sent, which need not be valid UTF-8.
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace bs::http
