// The live view of a runtime that the inspection endpoints, the console and
// `blendctl top` show: requests in flight read from their records and traces
// (thread-safe, no actor asked), and the short form of a finished request's
// trace. Plain C++ (no CAF): the Runtime adds the actor table and the traces the
// inspector actor keeps.
#pragma once

#include <nlohmann/json.hpp>

namespace bs {

struct RuntimeContext;

// One object per request submitted and not finished, oldest first: id, phase
// ("queued": waiting for a slot or pages; "planning": admitted, the controller
// deciding; "prefill": its layers computing, "layer" of "layers"; "decode":
// "tokens_out" so far; "cancelling"), age_s, prompt_tokens, mode, chunk_tiers,
// ratio and the controller's reason, first_token_s once it has one.
nlohmann::json requests_in_flight(const RuntimeContext& ctx);

// A finished request's trace (actors/runtime/trace.h) in a line of the console's list:
// its fields without the events.
nlohmann::json finished_request_summary(const nlohmann::json& trace);

}  // namespace bs
