#include "actors/runtime/inspection.h"

#include <algorithm>
#include <chrono>

#include "actors/runtime/runtime_context.h"

namespace bs {

namespace {

// The fields of a trace that say what a request is and how far it got.
void copy_request_fields(const nlohmann::json& from, nlohmann::json& to) {
  for (const char* key : {"mode", "prompt_tokens", "chunks", "chunk_tiers", "ratio", "first_token_s", "tokens_out",
                          "recomputed_tokens", "selection", "recomputed_per_chunk", "computed_tokens", "fallback", "finish_reason", "total_s", "error",
                          "load_bytes", "load_hidden_fraction", "reused"})
    if (from.contains(key)) to[key] = from.at(key);
  if (from.contains("controller")) to["ratio_reason"] = from.at("controller").value("reason", "");
}

}  // namespace

nlohmann::json requests_in_flight(const RuntimeContext& ctx) {
  const auto now = std::chrono::steady_clock::now();
  auto records = ctx.requests.all();
  std::sort(records.begin(), records.end(), [](const RecordPtr& a, const RecordPtr& b) { return a->id < b->id; });
  const int layers = ctx.model->config().n_layers;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : records) {
    if (r->finished.load()) continue;
    const nlohmann::json f = r->trace->fields();
    nlohmann::json row = {{"id", r->id}, {"age_s", std::chrono::duration<double>(now - r->submitted).count()}};
    copy_request_fields(f, row);
    std::string phase;
    if (r->cancelled.load()) phase = "cancelling";
    else if (!r->admitted.load()) phase = "queued";
    else if (!f.contains("controller")) phase = "planning";
    else if (!f.contains("first_token_s")) phase = "prefill";
    else phase = "decode";
    row["phase"] = phase;
    if (phase == "prefill") {
      row["layer"] = f.value("prefill_layer", 0);
      row["layers"] = layers;
    }
    out.push_back(std::move(row));
  }
  return out;
}

nlohmann::json finished_request_summary(const nlohmann::json& trace) {
  nlohmann::json row = {{"id", trace.value("id", uint64_t{0})}};
  copy_request_fields(trace, row);
  row["phase"] = "finished";
  return row;
}

}  // namespace bs
