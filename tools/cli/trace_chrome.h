// A request's trace (actors/runtime/trace.cpp writes it: top-level fields and "events", times
// in seconds since the request was submitted) as Chrome trace-event JSON, which
// Perfetto (ui.perfetto.dev) and chrome://tracing load. `blendctl trace --format
// chrome` prints it. Pure functions, no I/O.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace bs::tools {

// Throws std::invalid_argument saying what is wrong when `trace` is not a request
// trace: an object whose "events" is an array of objects, each with string "actor"
// and "what", numeric "begin_s" and "end_s", optional integer "layer" and "bytes".
void check_request_trace(const nlohmann::json& trace);

// The kind an actor name belongs to: "intake", "controller", "loader" (loader-*),
// "layer-worker" ("worker", "layer-worker"), "rank" (rank-N), "decoder", else "other".
std::string trace_actor_kind(const std::string& actor);

// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {the trace's top-level
// fields but "events", "source"}}:
// - one process per node (the trace's "node" field, or an event's own "node"; else
//   "local"), named by process_name metadata;
// - one thread per actor (tensor-parallel ranks are actors "rank-N"), named by
//   thread_name and ordered by thread_sort_index: intake, controller, loaders, the
//   layer worker, rank-N (by N), decoder, others. Tids are 1, 2, ... in that order;
//   the same actors give the same tids. An event that overlaps another of its actor
//   without nesting in it (which the viewers cannot draw) goes on an extra thread
//   "<actor> (overlap N)" after the actor's own;
// - every event a complete event (ph "X"): name = what (+ " L<layer>"), cat = the
//   actor's kind, ts and dur in microseconds since submit (ns-rounded; dur >= 0, an
//   end before the begin becomes dur 0 with args.end_before_begin_us), args.layer and
//   args.bytes where the event has them;
// - "first token" (first_token_s) as a process-scoped instant event (ph "i", s "p")
//   on the decoder's thread;
// - the metadata events first (ts 0), then the rest by ts (ties: the longer first, so
//   parents come before the events nested in them). Times before the submit (none
//   expected) shift everything so the earliest is 0; otherData.ts_origin_s says by
//   how much.
// Throws std::invalid_argument (check_request_trace) for anything but a trace.
nlohmann::json trace_to_chrome(const nlohmann::json& trace);

}  // namespace bs::tools
