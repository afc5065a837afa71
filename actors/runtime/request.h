// A request as the runtime's callers see it: what they submit, what they get
// back, the errors a request can be refused with, the callbacks. The runtime's
// own views of a request: actors/runtime/plan.h (the back end's values) and
// actors/runtime/request_record.h (the front end's record). Plain C++ (no CAF).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blend/blend_engine.h"
#include "model/generate.h"

namespace bs {

// What a caller submits.
struct RuntimeRequest {
  std::vector<ChatMessage> messages;   // the conversation; the last message is the user's question
                                       // (or a tool's result)
  std::vector<std::string> documents;  // retrieved documents, one cached chunk each
  // The tools offered to the model: OpenAI's JSON array, the chat template's `tools`
  // (model/chat_template.h); empty: none.
  std::string tools;
  SamplingParams sampling;             // max_tokens, temperature, top_p, top_k, seed, stop
  std::optional<BlendMode> mode;       // default: the config's
  std::optional<float> ratio;          // default: the controller's choice (>= the config's floor)
  // Completion without the chat template: `raw_prompt` is tokenized as is and
  // `messages`/`documents` must be empty.
  bool raw = false;
  std::string raw_prompt;
  // Pre-tokenized prompt (tools and benchmarks that need exact chunk sizes):
  // used as is; `messages`/`documents` must be empty. Template stop strings apply.
  std::optional<RagPrompt> prompt;
};

// What a caller gets back at the end.
struct RequestResult {
  uint64_t id = 0;
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;           // stop | length | cancelled | error
  std::string error;                   // set when finish_reason == "error"
  bool deadline_exceeded = false;      // the error is limits.max_request_seconds (HTTP 504)
  int64_t prompt_tokens = 0, cached_tokens = 0, recomputed_tokens = 0;
  int64_t prefix_cached_tokens = 0;    // of cached_tokens, from stored prefix blocks (automatic prefix caching)
  int64_t pasted_tokens = 0;           // of cached_tokens, passages found pasted in the message (learnt or stored)
  int chunks = 0, chunks_missed = 0;
  std::map<std::string, int> chunks_by_tier;  // chunks whose KV came from each stored tier ("ram", "ssd")
  float ratio = 0;                     // the ratio the prefill ran at
  double ttft_seconds = 0;             // submit -> first token sampled
  double total_seconds = 0;
  double decode_seconds = 0;
  int chunks_from(const std::string& tier) const {
    auto it = chunks_by_tier.find(tier);
    return it == chunks_by_tier.end() ? 0 : it->second;
  }
};

// Errors a request can fail with before it runs (intake), with the HTTP-ish class.
// unavailable: a role of the runtime failed for good (limits.max_restarts); the
// message names it.
enum class RequestErrc : uint8_t {
  invalid = 1,
  too_long = 2,
  overloaded = 3,
  shutting_down = 4,
  internal = 5,
  unavailable = 6
};
struct RequestError : std::runtime_error {
  RequestError(RequestErrc c, const std::string& m) : std::runtime_error(m), code(c) {}
  RequestErrc code;
};
const char* errc_name(RequestErrc c);

struct RequestCallbacks {
  std::function<bool(std::string_view)> on_text;     // newly final text; false cancels
  std::function<void(const RequestResult&)> on_done; // exactly once, at the end
};

}  // namespace bs
