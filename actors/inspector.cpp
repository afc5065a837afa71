// inspector: every actor registers its counters (messages, busy time, mailbox
// depth); the decoder sends each finished request's trace. Answers the actor table
// and the last traces as JSON, and keeps the last `history` traces as files in
// <data_dir>/traces/ (<id>.json, and the newest also as last.json) so `blendctl
// trace` can print or export them after the process is gone.
#include <deque>
#include <filesystem>
#include <fstream>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {


inspector_actor::behavior_type inspector(inspector_actor::stateful_pointer<InspectorState> self, int history,
                                         std::string trace_dir, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  self->state.actors.push_back(c);
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
        self->state.actors.push_back(std::move(counters));
      },
      [=](trace_atom, const std::string& trace) {
        BusyScope busy(*c, self->mailbox().size());
        auto& q = self->state.traces;
        q.push_back(trace);
        while (static_cast<int>(q.size()) > std::max(history, 1)) q.pop_front();
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
        nlohmann::json out = nlohmann::json::array();
        for (const auto& a : self->state.actors)
          out.push_back({{"actor", a->name},
                         {"messages", a->messages.load()},
                         {"busy_s", a->busy_ns.load() * 1e-9},
                         {"mailbox", a->mailbox.load()},
                         {"restarts", a->restarts.load()}});
        return out.dump();
      },
  };
}

}  // namespace bs
