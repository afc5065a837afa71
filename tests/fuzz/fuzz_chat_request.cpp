// libFuzzer target for the chat- and text-completion body parsers (http/openai_request.cpp), the
// document body's and /tokenize's and /detokenize's (http/tokenize_routes.cpp):
// any bytes must either parse into a request whose fields hold the documented
// ranges or be refused with an ApiError of status 400 — never crash, hang or throw
// anything else. The error body must always dump as JSON. The same bytes are read as a
// model's answer for tool calls (model/tool_calls.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "http/api_error.h"
#include "http/openai_request.h"
#include "http/tokenize_routes.h"
#include "model/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const auto r = bs::http::parse_chat_completion(body, 512);
    const auto& s = r.request.sampling;
    const std::string& last = r.request.messages.empty() ? std::string() : r.request.messages.back().role;
    if (last != "user" && last != "tool") std::abort();
    // Offered tools: a JSON array the template can read, one name each.
    if (!r.request.tools.empty()) {
      const auto tools = nlohmann::json::parse(r.request.tools, nullptr, false);
      if (!tools.is_array() || tools.size() != r.tool_names.size()) std::abort();
    }
    if (s.max_tokens < 1 || !(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p > 0 && s.top_p <= 1) ||
        s.top_k < 0 || s.stop.size() > 4)
      std::abort();
    if (r.request.ratio && !(*r.request.ratio >= 0 && *r.request.ratio <= 1)) std::abort();
    // Documents from the `documents` array are never empty (text parts may be:
    // split_text_parts drops the empty ones).
    for (const auto& d : r.request.documents)
      if (d.empty()) std::abort();
    if (r.include_usage && !r.stream) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
    if (bs::http::error_body(e).empty()) std::abort();
  }
  try {
    (void)bs::http::parse_document_body(body);
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    const auto t = bs::http::parse_text_completion(body, 512);
    if (!t.request.raw || t.request.sampling.max_tokens < 1) std::abort();
    if (t.prompt_is_ids ? t.prompt_ids.empty() : (t.prompt_text.empty() && t.request.documents.empty())) std::abort();
    for (int32_t id : t.prompt_ids)
      if (id < 0) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    (void)bs::http::parse_tokenize_request(std::string(body));
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    for (int32_t id : bs::http::parse_detokenize_request(std::string(body), 49152))
      if (id < 0 || id >= 49152) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  // The body as a model's answer: read for calls in each format, never a call of a tool
  // not offered, arguments always a JSON object, and no call where the answer stays text.
  static const std::vector<std::string> names = {"get_weather", "f"};
  for (auto f : {bs::ToolCallFormat::hermes, bs::ToolCallFormat::llama3_json}) {
    const auto a = bs::parse_tool_calls(body, f, names);
    for (const auto& c : a.calls) {
      if (std::find(names.begin(), names.end(), c.name) == names.end()) std::abort();
      if (!nlohmann::json::parse(c.arguments, nullptr, false).is_object()) std::abort();
    }
    if (a.calls.empty() && a.content != body) std::abort();
    if (bs::tool_call_free_prefix(body, f) > body.size()) std::abort();
  }
  return 0;
}
