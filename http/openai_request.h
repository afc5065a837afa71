// POST /v1/chat/completions and /v1/completions bodies -> a runtime request. Every field is checked
// for type and range here, before anything is queued, and every refusal is an
// ApiError naming the field, as the OpenAI API does. Plain C++ over
// nlohmann::json: no server, no model — tested and fuzzed alone.
//
// What is accepted (OpenAI's chat completions, plus blendserve's RAG fields):
//   model (required), messages (required, non-empty; roles system, developer
//   (= system), user, assistant, tool; content a string or an array of text parts),
//   stream, stream_options.include_usage, max_tokens / max_completion_tokens
//   (the latter wins), temperature [0, 2], top_p (0, 1], seed, stop (a string or
//   up to 4), n (1 only), presence/frequency_penalty (0 only), logprobs (false
//   only), response_format {"type":"text"} only, user/metadata/store/
//   service_tier (ignored). Extensions: documents (array of non-empty strings:
//   each one a cached chunk), top_k (>= 0), mode (full|prefix|reuse|blend),
//   ratio [0, 1]. Tools: tools (functions: name, description, parameters as a JSON
//   Schema, strict), tool_choice "auto" or "none" (forcing a call is refused),
//   parallel_tool_calls; messages of role tool (content, tool_call_id) and assistants'
//   tool_calls (content then may be null); the last message is the user's or a tool's.
// Documents given as several text parts of the last user message: all parts but
// the last are documents (blend/README.md, "How a RAG prompt is assembled"); not together
// with a `documents` array. An unknown field is an error (a misspelt parameter
// must not be silently ignored).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/request.h"

namespace bs::http {

// What both completion routes carry besides their runtime request.
struct CompletionCommon {
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool max_tokens_given = false;
};

struct ChatCompletionRequest : CompletionCommon {
  RuntimeRequest request;     // messages, documents, sampling, mode, ratio, tools
  std::vector<std::string> tool_names;  // the tools offered (request.tools), in order
  bool parallel_tool_calls = true;      // false: at most one call in the answer
};

// POST /v1/completions (OpenAI's legacy completions, as vLLM serves them): `prompt` a
// string or token ids (or a one-element batch of either: one prompt per request), the
// shared fields above (documents included: each one cached chunk before the prompt),
// logprobs 0 only, echo false only, suffix empty only, best_of 1 only. The request is
// raw (no chat template); the server assembles its prompt with the model's tokenizer.
struct TextCompletionRequest : CompletionCommon {
  RuntimeRequest request;  // raw; documents, sampling, mode, ratio
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;  // when prompt_is_ids (each >= 0; the vocabulary is the runtime's check)
  bool prompt_is_ids = false;
};
TextCompletionRequest parse_text_completion(std::string_view body, int default_max_tokens);

// Parses and validates a body. Throws ApiError (400) with the field in `param`.
// max_tokens, when absent, is `default_max_tokens` (the runtime clamps it to the
// context left after the prompt, finishing with "length").
ChatCompletionRequest parse_chat_completion(std::string_view body, int default_max_tokens);

// POST /v1/documents: {"text": "..."} -> the text. Throws ApiError (400).
std::string parse_document_body(std::string_view body);

// POST /v1/documents at a cluster's frontend: {"text": "...", "warm": bool}; warm
// (default false) asks for the document on every worker, not only the one that
// stores it. Throws ApiError (400).
struct ClusterDocumentRequest {
  std::string text;
  bool warm = false;
};
ClusterDocumentRequest parse_cluster_document_body(std::string_view body);

}  // namespace bs::http
