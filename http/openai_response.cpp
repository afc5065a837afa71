#include "http/openai_response.h"

#include <nlohmann/json.hpp>

namespace bs::http {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage(const RequestResult& r) {
  const int64_t completion = static_cast<int64_t>(r.tokens.size());
  json blend = {{"chunks", r.chunks},
                {"chunks_missed", r.chunks_missed},
                {"prefix_cached_tokens", r.prefix_cached_tokens},
                {"pasted_passage_tokens", r.pasted_tokens},
                {"ratio", r.ratio},
                {"ttft_seconds", r.ttft_seconds},
                {"total_seconds", r.total_seconds}};
  // chunks_ram, chunks_ssd, ...: one per stored tier a chunk came from.
  for (const auto& [tier, n] : r.chunks_by_tier) blend["chunks_" + tier] = n;
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}, {"recomputed_tokens", r.recomputed_tokens}}},
          {"blendserve", std::move(blend)}};
}

json head(const CompletionMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model},
          {"system_fingerprint", m.system_fingerprint}};
}

json tool_calls_json(const CompletionMeta& m, const std::vector<ToolCall>& calls, bool with_index) {
  const size_t dash = m.id.find('-');
  const std::string base = "call_" + (dash == std::string::npos ? m.id : m.id.substr(dash + 1)) + "_";
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", base + std::to_string(i)},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

ParsedAnswer read_answer(const CompletionMeta& m, std::string_view text) {
  ParsedAnswer a = parse_tool_calls(text, m.tools.format, m.tools.names);
  if (!m.tools.parallel && a.calls.size() > 1) a.calls.resize(1);
  return a;
}

std::string client_finish_reason(const std::string& runtime_reason) {
  return runtime_reason == "length" ? "length" : "stop";
}

std::string usage_json(const RequestResult& r) { return dump(usage(r)); }

std::string completion_json(const CompletionMeta& m, const RequestResult& r) {
  if (m.text) {
    json j = head(m, "text_completion");
    j["choices"] = json::array({{{"index", 0}, {"text", r.text}, {"logprobs", nullptr},
                                 {"finish_reason", client_finish_reason(r.finish_reason)}}});
    j["usage"] = usage(r);
    return dump(j);
  }
  json j = head(m, "chat.completion");
  json message = {{"role", "assistant"}, {"content", r.text}, {"refusal", nullptr}};
  std::string finish = client_finish_reason(r.finish_reason);
  if (m.tools.format != ToolCallFormat::none) {
    const ParsedAnswer a = read_answer(m, r.text);
    if (!a.calls.empty()) {
      message["content"] = a.content.empty() ? json(nullptr) : json(a.content);
      message["tool_calls"] = tool_calls_json(m, a.calls, false);
      finish = "tool_calls";
    }
  }
  j["choices"] = json::array({{{"index", 0}, {"message", std::move(message)}, {"logprobs", nullptr},
                               {"finish_reason", finish}}});
  j["usage"] = usage(r);
  return dump(j);
}

std::string chunk_json(const CompletionMeta& m, std::string_view delta_content, bool with_role,
                       const std::string& finish_reason, bool usage_null) {
  if (m.text) {
    json j = head(m, "text_completion");
    json choice = {{"index", 0}, {"text", std::string(delta_content)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
    j["choices"] = json::array({choice});
    if (usage_null) j["usage"] = nullptr;
    return dump(j);
  }
  json j = head(m, "chat.completion.chunk");
  json delta = json::object();
  if (with_role) delta["role"] = "assistant";
  if (with_role || !delta_content.empty()) delta["content"] = std::string(delta_content);
  json choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  j["choices"] = json::array({choice});
  if (usage_null) j["usage"] = nullptr;
  return dump(j);
}

std::string tool_calls_chunk_json(const CompletionMeta& m, const std::vector<ToolCall>& calls, bool usage_null) {
  json j = head(m, "chat.completion.chunk");
  j["choices"] = json::array({{{"index", 0},
                               {"delta", {{"tool_calls", tool_calls_json(m, calls, true)}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (usage_null) j["usage"] = nullptr;
  return dump(j);
}

std::string usage_chunk_json(const CompletionMeta& m, const RequestResult& r) {
  json j = head(m, m.text ? "text_completion" : "chat.completion.chunk");
  j["choices"] = json::array();
  j["usage"] = usage(r);
  return dump(j);
}

std::string model_json(const std::string& model, int64_t created) {
  return dump({{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "blendserve"}});
}

std::string models_json(const std::string& model, int64_t created) {
  json j = {{"object", "list"},
            {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "blendserve"}}})}};
  return dump(j);
}

}  // namespace bs::http
