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

#include "actors/request.h"

namespace bs::http {

// What every response of one request shares.
struct CompletionMeta {
  std::string id;       // "chatcmpl-<hex>" ("cmpl-<hex>": text), the same on every chunk
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;  // the kernels + precision that computed it
  // /v1/completions: "text_completion" objects whose choices carry `text`, no
  // message, no delta and no role chunk; else /v1/chat/completions' shapes.
  bool text = false;
};

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
//  {"cached_tokens", "recomputed_tokens"}, "blendserve": {chunks per tier, ratio, ttft}}
std::string usage_json(const RequestResult& r);

// The whole answer of a non-streaming request.
std::string completion_json(const CompletionMeta& m, const RequestResult& r);

// One `data:` payload of a stream. delta_content empty + role: the first chunk;
// finish_reason set: the last choice chunk (empty delta).
std::string chunk_json(const CompletionMeta& m, std::string_view delta_content, bool with_role,
                       const std::string& finish_reason, bool usage_null);
// The usage chunk (empty choices) sent before [DONE] with include_usage.
std::string usage_chunk_json(const CompletionMeta& m, const RequestResult& r);

// "stop" or "length" for the client; the runtime's other reasons never reach it.
std::string client_finish_reason(const std::string& runtime_reason);

std::string models_json(const std::string& model, int64_t created);
std::string model_json(const std::string& model, int64_t created);

}  // namespace bs::http
