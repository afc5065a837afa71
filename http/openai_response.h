// The JSON the OpenAI API answers with, built from a runtime result: the
// non-streaming `chat.completion` (`text_completion` for /v1/completions), the
// streaming `chat.completion.chunk` (`text_completion`) events,
// `usage` (with the prompt tokens served from stored KV and those recomputed),
// and the model list. Plain C++ over nlohmann::json; every dump replaces invalid
// UTF-8 instead of throwing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "actors/runtime/request.h"
#include "model/tool_calls.h"

namespace bs::http {

// The tools a chat request offered, and how its model writes calls (model/tool_calls.h);
// format none: the answer is text.
struct ToolsOffered {
  ToolCallFormat format = ToolCallFormat::none;
  std::vector<std::string> names;
  bool parallel = true;  // parallel_tool_calls false: only the first call is kept
};

// What every response of one request shares.
struct CompletionMeta {
  std::string id;       // "chatcmpl-<hex>" ("cmpl-<hex>": text), the same on every chunk
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;  // the kernels + precision that computed it
  // /v1/completions: "text_completion" objects whose choices carry `text`, no
  // message, no delta and no role chunk; else /v1/chat/completions' shapes.
  bool text = false;
  ToolsOffered tools;
};

// The answer read for the offered tools' calls (all text when none were offered).
ParsedAnswer read_answer(const CompletionMeta& m, std::string_view text);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
//  {"cached_tokens", "recomputed_tokens"}, "blendserve": {chunks per tier, ratio, ttft}}
std::string usage_json(const RequestResult& r);

// The whole answer of a non-streaming request; with tool calls in it, the message's
// tool_calls (ids "call_<the response id's hex>_<i>"), its content the text before them
// (null if none), finish_reason "tool_calls".
std::string completion_json(const CompletionMeta& m, const RequestResult& r);

// One `data:` payload of a stream. delta_content empty + role: the first chunk;
// finish_reason set: the last choice chunk (empty delta).
std::string chunk_json(const CompletionMeta& m, std::string_view delta_content, bool with_role,
                       const std::string& finish_reason, bool usage_null);
// A stream's tool calls, all in one chunk (delta.tool_calls with each call's index, id,
// name and whole arguments), sent when the answer ends.
std::string tool_calls_chunk_json(const CompletionMeta& m, const std::vector<ToolCall>& calls, bool usage_null);
// The usage chunk (empty choices) sent before [DONE] with include_usage.
std::string usage_chunk_json(const CompletionMeta& m, const RequestResult& r);

// "stop" or "length" for the client; the runtime's other reasons never reach it.
std::string client_finish_reason(const std::string& runtime_reason);

std::string models_json(const std::string& model, int64_t created);
std::string model_json(const std::string& model, int64_t created);

}  // namespace bs::http
