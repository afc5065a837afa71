#include "model/tool_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace bs {

namespace {

using json = nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// {"name": N, <args_key>: {...}} with N one of the request's tools -> the call; else false.
bool read_call(const json& j, const char* args_key, const std::vector<std::string>& names, ToolCall& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const std::string name = j["name"].get<std::string>();
  if (std::find(names.begin(), names.end(), name) == names.end()) return false;
  json args = json::object();
  if (j.contains(args_key)) {
    args = j[args_key];
    // Some models write the arguments as a JSON string, as OpenAI returns them.
    if (args.is_string()) {
      args = json::parse(args.get<std::string>(), nullptr, false);
      if (args.is_discarded()) return false;
    }
    if (!args.is_object()) return false;
  }
  out.name = name;
  out.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

json parse_json(std::string_view s) { return json::parse(s.begin(), s.end(), nullptr, false); }

ParsedAnswer parse_hermes(std::string_view text, const std::vector<std::string>& names) {
  ParsedAnswer text_only{std::string(text), {}};
  const size_t first = text.find(kHermesOpen);
  if (first == std::string_view::npos) return text_only;
  ParsedAnswer out;
  out.content = std::string(trim(text.substr(0, first)));
  size_t at = first;
  while (at < text.size()) {
    const std::string_view rest = trim(text.substr(at));
    if (rest.empty()) break;
    if (!rest.starts_with(kHermesOpen)) return text_only;  // text after a call
    const std::string_view body_and_more = rest.substr(kHermesOpen.size());
    const size_t close = body_and_more.find(kHermesClose);
    // The last block may lack its close: the model ended its turn there.
    const std::string_view body = close == std::string_view::npos ? body_and_more : body_and_more.substr(0, close);
    ToolCall call;
    if (!read_call(parse_json(trim(body)), "arguments", names, call)) return text_only;
    out.calls.push_back(std::move(call));
    if (close == std::string_view::npos) break;
    at = static_cast<size_t>(body_and_more.data() - text.data()) + close + kHermesClose.size();
  }
  return out;
}

ParsedAnswer parse_llama3(std::string_view text, const std::vector<std::string>& names) {
  ParsedAnswer text_only{std::string(text), {}};
  std::string_view s = trim(text);
  if (s.starts_with(kPythonTag)) s = trim(s.substr(kPythonTag.size()));
  if (!s.starts_with("{")) return text_only;
  ParsedAnswer out;
  // One call, or several separated by ";" (Llama 3.1's parallel calls).
  json one = parse_json(s);
  std::vector<json> objects;
  if (!one.is_discarded()) {
    objects.push_back(std::move(one));
  } else {
    size_t from = 0;
    while (from <= s.size()) {
      size_t semi = s.find(';', from);
      // Split only where the text before the ";" is a whole object.
      while (semi != std::string_view::npos && parse_json(trim(s.substr(from, semi - from))).is_discarded())
        semi = s.find(';', semi + 1);
      const std::string_view part = trim(s.substr(from, semi == std::string_view::npos ? s.npos : semi - from));
      json j = parse_json(part);
      if (j.is_discarded()) return text_only;
      objects.push_back(std::move(j));
      if (semi == std::string_view::npos) break;
      from = semi + 1;
      if (trim(s.substr(from)).empty()) break;
    }
  }
  for (const json& j : objects) {
    ToolCall call;
    const char* key = j.is_object() && j.contains("arguments") && !j.contains("parameters") ? "arguments" : "parameters";
    if (!read_call(j, key, names, call)) return text_only;
    out.calls.push_back(std::move(call));
  }
  return out;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::none: break;
  }
  return "none";
}

ToolCallFormat tool_call_format_of(std::string_view src) {
  // Each format by the instructions its templates give the model (llama.cpp's
  // templates: Qwen 2.5 / 3, QwQ, Hermes 2 Pro / 3, Granite 4, MiMo-VL, Reka; Llama
  // 3.1 / 3.2 / 3.3). <tool_call> alone is not enough: GLM and Qwen3-Coder write
  // other markup inside it.
  if (contains(src, kHermesOpen) &&
      (contains(src, "<function-name>") || contains(src, "json object with function name")))
    return ToolCallFormat::hermes;
  if (contains(src, "{\"name\": function name, \"parameters\": dictionary of argument name"))
    return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

ParsedAnswer parse_tool_calls(std::string_view text, ToolCallFormat f, const std::vector<std::string>& tool_names) {
  switch (f) {
    case ToolCallFormat::hermes: return parse_hermes(text, tool_names);
    case ToolCallFormat::llama3_json: return parse_llama3(text, tool_names);
    case ToolCallFormat::none: break;
  }
  return ParsedAnswer{std::string(text), {}};
}

size_t tool_call_free_prefix(std::string_view text, ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: {
      if (const size_t at = text.find(kHermesOpen); at != std::string_view::npos) return at;
      // A partial "<tool_call>" at the end is held until the next text decides.
      for (size_t n = std::min(text.size(), kHermesOpen.size() - 1); n > 0; --n)
        if (text.substr(text.size() - n) == kHermesOpen.substr(0, n)) return text.size() - n;
      return text.size();
    }
    case ToolCallFormat::llama3_json: {
      const std::string_view s = trim(text);
      if (s.empty()) return 0;  // only whitespace so far: undecided
      if (s.front() == '{') return 0;
      if (kPythonTag.starts_with(s.substr(0, std::min(s.size(), kPythonTag.size())))) return 0;  // <|python_tag|>
      return text.size();  // an answer in words: no call follows
    }
    case ToolCallFormat::none: break;
  }
  return text.size();
}

}  // namespace bs
