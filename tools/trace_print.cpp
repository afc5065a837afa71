// blendctl trace: prints one request's trace (actors/request.cpp writes it) as a
// per-layer timeline: when each loader delivered the layer, how long the worker
// waited for it, when the worker computed it.
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "actors/runtime_config.h"
#include "tools/bench.h"

namespace bs::tools {

int print_trace(const std::string& file, bool last, const std::string& data_dir, bool raw_json) {
  std::string path = file;
  if (path.empty()) {
    if (!last) throw std::invalid_argument("trace: give --last or --file");
    RuntimeConfig cfg = default_runtime_config();
    cfg.data_dir = data_dir;
    path = resolve_data_dir(cfg) + "/traces/last.json";
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error("no trace at " + path + " (run a request first)");
  nlohmann::json t;
  try {
    in >> t;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not a trace: " + e.what());
  }
  if (raw_json) {
    std::printf("%s\n", t.dump(2).c_str());
    return 0;
  }
  auto num = [&](const char* key) { return t.contains(key) ? t.at(key).get<double>() : -1.0; };
  std::string tiers;
  for (const auto& x : t.value("chunk_tiers", nlohmann::json::array())) tiers += " " + x.get<std::string>();
  std::printf("request %llu: %lld prompt tokens, %zu chunks (%s ), mode %s, ratio %.3f, finish %s\n",
              static_cast<unsigned long long>(t.value("id", 0ull)), static_cast<long long>(t.value("prompt_tokens", 0ll)),
              t.value("chunk_tiers", nlohmann::json::array()).size(), tiers.c_str(), t.value("mode", "?").c_str(),
              t.value("ratio", 0.0), t.value("finish_reason", "?").c_str());
  if (t.contains("controller")) {
    const auto& c = t.at("controller");
    std::printf("controller: ratio %.3f (floor %.3f, %s); estimated load %.3f s, compute %.3f s\n",
                c.value("ratio", 0.0), c.value("ratio_floor", 0.0), c.value("reason", "?").c_str(),
                c.value("est_load_s", 0.0), c.value("est_compute_s", 0.0));
  }
  std::printf("first token at %.3f s; recomputed %lld, computed %lld tokens%s\n", num("first_token_s"),
              static_cast<long long>(t.value("recomputed_tokens", 0ll)), static_cast<long long>(t.value("computed_tokens", 0ll)),
              t.value("fallback", false) ? "; a stored entry failed: fell back to computing it" : "");
  if (t.contains("load_span_s"))
    std::printf("load: %.3f s for %.1f MB; the worker waited %.3f s: %.0f%% of the load time hidden behind compute\n",
                num("load_span_s"), num("load_bytes") / 1e6, num("wait_s"), 100.0 * num("load_hidden_fraction"));
  // Per layer: columns per (actor, what), "begin-end" in ms since submit.
  std::map<int, std::map<std::string, std::string>> rows;
  std::vector<std::string> columns;
  for (const auto& e : t.at("events")) {
    const std::string col = e.at("actor").get<std::string>() + " " + e.at("what").get<std::string>();
    if (!e.contains("layer")) {
      std::printf("  %-28s %8.1f - %8.1f ms\n", col.c_str(), 1e3 * e.at("begin_s").get<double>(),
                  1e3 * e.at("end_s").get<double>());
      continue;
    }
    if (std::find(columns.begin(), columns.end(), col) == columns.end()) columns.push_back(col);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f-%.1f", 1e3 * e.at("begin_s").get<double>(), 1e3 * e.at("end_s").get<double>());
    rows[e.at("layer").get<int>()][col] = buf;
  }
  if (rows.empty()) return 0;
  std::printf("layer");
  for (const auto& c : columns) std::printf("  %-22s", c.c_str());
  std::printf("   (ms since submit)\n");
  for (const auto& [layer, cells] : rows) {
    std::printf("%5d", layer);
    for (const auto& c : columns) {
      auto it = cells.find(c);
      std::printf("  %-22s", it == cells.end() ? "" : it->second.c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace bs::tools
