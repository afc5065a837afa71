// blendctl trace: one request's trace (actors/runtime/trace.cpp writes it; the inspector keeps
// the last ones as <data_dir>/traces/<id>.json and last.json, and a server answers
// them at /v1/inspect/traces) as a per-layer timeline (when each loader delivered the
// layer, how long the worker waited for it, when the worker computed it), as the JSON
// itself, or as Chrome trace-event JSON (tools/cli/trace_chrome.h).
#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "actors/config/runtime_config.h"
#include "tools/bench/bench.h"
#include "tools/cli/trace_chrome.h"

namespace bs::tools {

namespace {

using json = nlohmann::json;

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (static_cast<size_t>(n) < sizeof buf) {
    out.append(buf, static_cast<size_t>(n));
    return;
  }
  std::string big(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  out.append(big.data(), static_cast<size_t>(n));
}

// "1 2 5" or "none": the ids of the traces there are, for an error message.
std::string id_list(std::vector<uint64_t> ids) {
  if (ids.empty()) return "none";
  std::sort(ids.begin(), ids.end());
  std::string s;
  for (auto id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

uint64_t parse_id(const std::string& id) {
  if (id.empty() || id.size() > 19 || id.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("trace: ID must be a request id (a number), not '" + id + "'");
  return std::stoull(id);
}

json read_trace_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("no trace at " + path + " (run a request first)");
  json t;
  try {
    in >> t;
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not a trace: " + e.what());
  }
  try {
    check_request_trace(t);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return t;
}

json local_trace(const TraceOptions& opt) {
  if (!opt.file.empty()) return read_trace_file(opt.file);
  RuntimeConfig cfg = default_runtime_config();
  cfg.data_dir = opt.data_dir;
  const std::string dir = resolve_data_dir(cfg) + "/traces";
  if (opt.last) return read_trace_file(dir + "/last.json");
  const uint64_t id = parse_id(opt.id);
  const std::string path = dir + "/" + std::to_string(id) + ".json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    std::vector<uint64_t> ids;
    for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
      const std::string stem = f.path().stem().string();
      if (f.path().extension() == ".json" && !stem.empty() && stem.size() <= 19 &&
          stem.find_first_not_of("0123456789") == std::string::npos)
        ids.push_back(std::stoull(stem));
    }
    throw std::runtime_error("no trace of request " + std::to_string(id) + " in " + dir +
                             " (the runtime keeps the last trace_history requests' traces, of its last process; "
                             "ids there: " + id_list(ids) + ")");
  }
  return read_trace_file(path);
}

std::string error_message(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  if (body.empty()) return "(no body: is it blendserve?)";
  return body.substr(0, 300);
}

std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (nothing listening?)";
    case httplib::Error::ConnectionTimeout: return "connection timed out (--timeout)";
    case httplib::Error::Read: return "read failed or timed out (--timeout)";
    default: return httplib::to_string(e);
  }
}

json server_trace(const TraceOptions& opt) {
  std::string url = opt.url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  httplib::Client c(url);
  if (!c.is_valid()) throw std::invalid_argument("trace: invalid --url " + opt.url + " (expected http://HOST:PORT)");
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(opt.timeout_s));
  c.set_connection_timeout(timeout);
  c.set_read_timeout(timeout);
  c.set_write_timeout(timeout);
  if (!opt.api_key.empty()) c.set_bearer_token_auth(opt.api_key);
  const std::string path = "/v1/inspect/traces?n=1000";  // the most the server answers
  const uint64_t id = opt.last ? 0 : parse_id(opt.id);
  auto r = c.Get(path);
  if (!r) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", opt.timeout_s);
    throw std::runtime_error("cannot reach blendserve at " + url + " (GET " + path + ", timeout " + secs +
                             " s): " + describe(r.error()));
  }
  if (r->status == 401)
    throw std::runtime_error(url + " refused the request (401): " + error_message(r->body) +
                             " Pass --api-key KEY (or set BLENDSERVE_API_KEY).");
  if (r->status != 200)
    throw std::runtime_error(url + " answered " + std::to_string(r->status) + " to GET " + path + ": " +
                             error_message(r->body));
  const json traces = json::parse(r->body, nullptr, false);
  if (traces.is_discarded() || !traces.is_array())
    throw std::runtime_error(url + path + " did not answer a JSON array of traces");
  if (opt.last) {
    if (traces.empty()) throw std::runtime_error("no traces on " + url + " yet (run a request first)");
    check_request_trace(traces.back());
    return traces.back();
  }
  std::vector<uint64_t> ids;
  for (auto it = traces.rbegin(); it != traces.rend(); ++it) {
    if (!it->is_object() || !it->contains("id") || !it->at("id").is_number_unsigned()) continue;
    const auto tid = it->at("id").get<uint64_t>();
    if (tid == id) {
      check_request_trace(*it);
      return *it;
    }
    ids.push_back(tid);
  }
  throw std::runtime_error("no trace of request " + std::to_string(id) + " on " + url +
                           " (it keeps the last trace_history requests' traces; ids there: " + id_list(ids) + ")");
}

// The per-layer table, the controller's decision and the load overlap.
std::string trace_text(const json& t) {
  std::string out;
  auto num = [&](const char* key) { return t.contains(key) ? t.at(key).get<double>() : -1.0; };
  std::string tiers;
  for (const auto& x : t.value("chunk_tiers", json::array())) tiers += " " + x.get<std::string>();
  appendf(out, "request %llu: %lld prompt tokens, %zu chunks (%s ), mode %s, ratio %.3f, finish %s\n",
          static_cast<unsigned long long>(t.value("id", 0ull)), static_cast<long long>(t.value("prompt_tokens", 0ll)),
          t.value("chunk_tiers", json::array()).size(), tiers.c_str(), t.value("mode", "?").c_str(),
          t.value("ratio", 0.0), t.value("finish_reason", "?").c_str());
  if (t.contains("controller")) {
    const auto& c = t.at("controller");
    appendf(out, "controller: ratio %.3f (floor %.3f, %s); estimated load %.3f s, compute %.3f s\n",
            c.value("ratio", 0.0), c.value("ratio_floor", 0.0), c.value("reason", "?").c_str(),
            c.value("est_load_s", 0.0), c.value("est_compute_s", 0.0));
  }
  appendf(out, "first token at %.3f s; recomputed %lld, computed %lld tokens%s\n", num("first_token_s"),
          static_cast<long long>(t.value("recomputed_tokens", 0ll)), static_cast<long long>(t.value("computed_tokens", 0ll)),
          t.value("fallback", false) ? "; a stored entry failed: fell back to computing it" : "");
  if (t.contains("load_span_s"))
    appendf(out, "load: %.3f s for %.1f MB; the worker waited %.3f s: %.0f%% of the load time hidden behind compute\n",
            num("load_span_s"), num("load_bytes") / 1e6, num("wait_s"), 100.0 * num("load_hidden_fraction"));
  // Per layer: columns per (actor, what), "begin-end" in ms since submit.
  std::map<int, std::map<std::string, std::string>> rows;
  std::vector<std::string> columns;
  for (const auto& e : t.at("events")) {
    const std::string col = e.at("actor").get<std::string>() + " " + e.at("what").get<std::string>();
    if (!e.contains("layer")) {
      appendf(out, "  %-28s %8.1f - %8.1f ms\n", col.c_str(), 1e3 * e.at("begin_s").get<double>(),
              1e3 * e.at("end_s").get<double>());
      continue;
    }
    if (std::find(columns.begin(), columns.end(), col) == columns.end()) columns.push_back(col);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f-%.1f", 1e3 * e.at("begin_s").get<double>(), 1e3 * e.at("end_s").get<double>());
    rows[e.at("layer").get<int>()][col] = buf;
  }
  if (rows.empty()) return out;
  appendf(out, "layer");
  for (const auto& c : columns) appendf(out, "  %-22s", c.c_str());
  appendf(out, "   (ms since submit)\n");
  for (const auto& [layer, cells] : rows) {
    appendf(out, "%5d", layer);
    for (const auto& c : columns) {
      auto it = cells.find(c);
      appendf(out, "  %-22s", it == cells.end() ? "" : it->second.c_str());
    }
    appendf(out, "\n");
  }
  return out;
}

}  // namespace

int print_trace(const TraceOptions& opt) {
  const int sources = (opt.id.empty() ? 0 : 1) + (opt.last ? 1 : 0) + (opt.file.empty() ? 0 : 1);
  if (sources != 1) throw std::invalid_argument("trace: give one of a request ID, --last or --file");
  if (!opt.url.empty() && !opt.file.empty()) throw std::invalid_argument("trace: --file and --url exclude each other");
  if (opt.format != "text" && opt.format != "json" && opt.format != "chrome")
    throw std::invalid_argument("trace: --format must be text, json or chrome");
  const json t = opt.url.empty() ? local_trace(opt) : server_trace(opt);
  const std::string text = opt.format == "chrome" ? trace_to_chrome(t).dump() + "\n"
                           : opt.format == "json" ? t.dump(2) + "\n"
                                                  : trace_text(t);
  if (opt.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream out(opt.out, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + opt.out);
  return 0;
}

}  // namespace bs::tools
