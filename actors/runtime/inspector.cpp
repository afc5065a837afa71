// inspector: every actor registers its counters (messages, busy time, mailbox
// depth); the decoder sends each finished request's trace. Answers the actor table
// (each actor's kind, node, rank, state, counters, its busy share of the last
// interval and its last error) and the last traces as JSON, and keeps the last `history` traces as files in
// <data_dir>/traces/ (<id>.json, and the newest also as last.json) so `blendctl
// trace` can print or export them after the process is gone.
#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {


namespace {

// The share of the interval a busy share is measured over: the newest sample at
// least this old (a console polling every second sees the last second).
constexpr int64_t kShareIntervalNs = 1'000'000'000;
// Samples older than this are dropped (one older one is kept as the reference).
constexpr int64_t kSampleKeepNs = 10'000'000'000;

void sample_busy(InspectorState& st, const ActorCounters& a, int64_t now) {
  auto& q = st.busy_samples[a.name];
  q.emplace_back(now, a.busy_ns_at(now));
  while (q.size() > 2 && now - q[1].first > kSampleKeepNs) q.pop_front();
}

// Busy time over wall time since the newest sample at least kShareIntervalNs old
// (else the oldest one); the window it covers.
std::pair<double, double> busy_share(const std::deque<std::pair<int64_t, int64_t>>& q) {
  if (q.size() < 2) return {0.0, 0.0};
  const auto& now = q.back();
  size_t ref = 0;
  for (size_t i = 0; i + 1 < q.size(); ++i)
    if (now.first - q[i].first >= kShareIntervalNs) ref = i;
  const double window = static_cast<double>(now.first - q[ref].first);
  if (window <= 0) return {0.0, 0.0};
  return {std::clamp(static_cast<double>(now.second - q[ref].second) / window, 0.0, 1.0), window * 1e-9};
}

}  // namespace

inspector_actor::behavior_type inspector(inspector_actor::stateful_pointer<InspectorState> self, int history,
                                         std::string trace_dir, std::string node, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  self->state.actors.push_back(c);
  sample_busy(self->state, *c, steady_now_ns());
  // Request ids start at 1 in every process: the numbered files of an earlier
  // process would be mistaken for this one's (last.json stays: it is the newest).
  if (!trace_dir.empty()) {
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(trace_dir, ec)) {
      const std::string stem = f.path().stem().string();
      if (f.path().extension() == ".json" && !stem.empty() &&
          stem.find_first_not_of("0123456789") == std::string::npos)
        std::filesystem::remove(f.path(), ec);
    }
  }
  return {
      [=](register_atom, CountersPtr counters) {
        BusyScope busy(*c, self->mailbox().size());
        sample_busy(self->state, *counters, steady_now_ns());
        self->state.actors.push_back(std::move(counters));
      },
      [=](trace_atom, const std::string& trace) {
        InspectionCostScope cost;  // keeping and writing every finished request's trace
        BusyScope busy(*c, self->mailbox().size());
        auto& q = self->state.traces;
        q.push_back(trace);
        while (static_cast<int>(q.size()) > std::max(history, 1)) {
          q.pop_front();
          ++self->state.traces_dropped;
        }
        if (!trace_dir.empty()) {
          // A trace that cannot be written is not worth failing anything for.
          std::error_code ec;
          std::filesystem::create_directories(trace_dir, ec);
          const auto tmp = trace_dir + "/last.json.tmp";
          {
            std::ofstream out(tmp, std::ios::trunc);
            out << trace << "\n";
            if (!out) return;
          }
          uint64_t id = 0;
          try {
            id = nlohmann::json::parse(trace).value("id", uint64_t{0});
          } catch (const nlohmann::json::exception&) {
          }
          if (id != 0) {
            auto& files = self->state.trace_files;
            const auto numbered = trace_dir + "/" + std::to_string(id) + ".json";
            std::filesystem::copy_file(tmp, numbered, std::filesystem::copy_options::overwrite_existing, ec);
            if (!ec) files.push_back(id);
            while (static_cast<int>(files.size()) > std::max(history, 1)) {
              std::filesystem::remove(trace_dir + "/" + std::to_string(files.front()) + ".json", ec);
              files.pop_front();
            }
          }
          std::filesystem::rename(tmp, trace_dir + "/last.json", ec);
        }
      },
      [=](get_trace_atom, int32_t n) -> std::string {
        BusyScope busy(*c, self->mailbox().size());
        nlohmann::json out = nlohmann::json::array();
        const auto& q = self->state.traces;
        const int64_t count = std::min<int64_t>(std::max<int32_t>(n, 0), static_cast<int64_t>(q.size()));
        for (int64_t i = static_cast<int64_t>(q.size()) - count; i < static_cast<int64_t>(q.size()); ++i)
          out.push_back(nlohmann::json::parse(q[static_cast<size_t>(i)]));
        return out.dump();
      },
      [=](actors_atom) -> std::string {
        BusyScope busy(*c, self->mailbox().size());
        auto& st = self->state;
        const int64_t now = steady_now_ns();
        nlohmann::json rows = nlohmann::json::array();
        for (const auto& a : st.actors) {
          sample_busy(st, *a, now);
          const auto [share, window] = busy_share(st.busy_samples[a->name]);
          nlohmann::json row = {{"actor", a->name},
                                {"kind", a->kind},
                                {"node", node},
                                {"rank", a->rank},
                                {"state", a->busy() ? "busy" : "idle"},
                                {"mailbox", a->mailbox.load()},
                                {"messages", a->messages.load()},
                                {"busy_s", a->busy_ns_at(now) * 1e-9},
                                {"busy_share", share},
                                {"share_window_s", window},
                                {"restarts", a->restarts.load()}};
          const auto [error, at] = a->last_error();
          if (!error.empty()) {
            row["last_error"] = error;
            row["last_error_age_s"] = (now - at) * 1e-9;
          }
          rows.push_back(std::move(row));
        }
        nlohmann::json out = {{"actors", std::move(rows)},
                              {"traces",
                               {{"kept", st.traces.size()}, {"dropped", st.traces_dropped}, {"history", history}}}};
        return out.dump();
      },
  };
}

}  // namespace bs
