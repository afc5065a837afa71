// The runtime's inspection answers as JSON (the console, /v1/inspect/*, blendctl
// trace and top): traces, the actor table, requests in flight, the controller's
// profiles, the tiers' counters, and actors a tool adds to the table.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/runtime_actors.h"
#include "actors/runtime/inspection.h"

namespace bs {
using namespace runtime_detail;

std::string Runtime::traces_json(int n) {
  std::string out = "[]";
  CallerActor self{*actors_->system};
  self->request(actors_->h->inspector(), std::chrono::seconds(10), get_trace_atom::value, static_cast<int32_t>(n))
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::actors_json() {
  std::string out;
  CallerActor self{*actors_->system};
  self->request(actors_->h->inspector(), std::chrono::seconds(10), actors_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  if (out.empty()) return "[]";  // the inspector is being restarted
  auto j = nlohmann::json::parse(out).at("actors");
  // A follower rank's compute thread also says how many requests' caches it holds.
  for (auto& row : j)
    for (int r = 1; ctx_->tp && r < ctx_->tp->size(); ++r)
      if (row.value("actor", "") == "compute-thread-rank-" + std::to_string(r))
        row["requests"] = ctx_->tp->follower(r).requests();
  return j.dump();
}

std::string Runtime::requests_json() const { return requests_in_flight(*ctx_).dump(); }

std::string Runtime::request_trace_json(uint64_t id) {
  if (const RecordPtr r = ctx_->requests.find(id)) return r->trace->json();
  for (const auto& t : nlohmann::json::parse(traces_json(std::max(ctx_->config.trace_history, 1))))
    if (t.value("id", uint64_t{0}) == id) return t.dump();
  return "";
}

std::string Runtime::snapshot_json() {
  nlohmann::json node;
  node["name"] = ctx_->config.node_name;
  node["backend"] = ctx_->backend->kernel_id();
  node["tp"] = ctx_->tp ? ctx_->tp->size() : 1;
  node["model"] = ctx_->model->path();
  node["queue"] = {{"in_flight", in_flight()},
                   {"queued", queued()},
                   {"max_requests", ctx_->config.max_requests},
                   {"max_queue", ctx_->config.max_queue}};
  const auto kv = kv_pages();
  node["kv_pages"] = {{"total", kv.total}, {"used", kv.used}, {"reserved", kv.reserved}, {"page_bytes", kv.page_bytes}};
  const auto ds = decode_stats();
  node["decode"] = {{"steps", ds.steps}, {"tokens", ds.tokens}, {"interleaved_steps", ds.interleaved_steps}};
  node["tiers"] = nlohmann::json::parse(stores_json());
  const auto rs = reuse_stats();
  node["reuse"] = {{"chunks_computed", rs.chunks_computed},
                   {"computes_joined", rs.computes_joined},
                   {"provisional_entries", rs.provisional_entries},
                   {"computes_in_flight", rs.computes_in_flight},
                   {"write_backs_refused", rs.write_backs_refused}};
  node["actor_restarts"] = actor_restarts();
  std::string table;
  {
    CallerActor self{*actors_->system};
    self->request(actors_->h->inspector(), std::chrono::seconds(10), actors_atom::value)
        .receive([&](const std::string& s) { table = s; }, [&](caf::error&) {});
  }
  if (!table.empty()) {
    auto t = nlohmann::json::parse(table);
    node["actors"] = std::move(t.at("actors"));
    node["traces"] = std::move(t.at("traces"));
  } else {
    node["actors"] = nlohmann::json::array();
  }
  node["requests"] = requests_in_flight(*ctx_);
  nlohmann::json recent = nlohmann::json::array();
  for (const auto& t : nlohmann::json::parse(traces_json(20))) recent.push_back(finished_request_summary(t));
  node["recent"] = std::move(recent);
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - actors_->started).count();
  return nlohmann::json{{"time_s", uptime}, {"nodes", nlohmann::json::array({std::move(node)})}}.dump();
}

std::function<void()> Runtime::spawn_reporting_actor(const std::string& name, std::function<void()> work) {
  auto& a = *actors_;
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
  if (a.counters.count(name)) throw std::invalid_argument("an actor is already called " + name);
  CountersPtr c = a.counters[name] = make_counters(name);
  // Detached: its work may block, as any blocking actor of the runtime runs.
  caf::actor x = a.system->spawn<caf::detached>([c, work](caf::event_based_actor* self) -> caf::behavior {
    return {[=](int32_t) {
      BusyScope busy(*c, self->mailbox().size());
      // Unsupervised: a failing message is reported, never the end of the actor.
      try {
        work();
      } catch (const std::exception& e) {
        c->set_error(e.what());
      }
    }};
  });
  a.reporting.push_back(x);
  caf::anon_send(a.h->inspector(), register_atom::value, c);
  caf::actor_addr addr = x.address();
  return [addr] {
    if (auto target = caf::actor_cast<caf::actor>(addr)) caf::anon_send(target, int32_t{0});
  };
}

std::string Runtime::profile_json() {
  std::string out = "{}";
  CallerActor self{*actors_->system};
  self->request(actors_->h->controller(), std::chrono::seconds(10), get_profile_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::stores_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& tier : ctx_->tiers) {
    KvStore* s = tier.store;
    const auto st = s->stats();
    j[tier.name] = {{"hits", st.hits},       {"misses", st.misses},   {"puts", st.puts},
                                 {"evictions", st.evictions}, {"bytes", st.bytes}, {"entries", st.entries},
                                 {"corrupt", st.corrupt},  {"write_errors", st.write_errors}, {"budget", s->budget()},
                                 {"load_bytes", tier.load->bytes.load()}, {"load_s", tier.load->ns.load() * 1e-9},
                                 {"loads", tier.load->loads.load()}};
  }
  if (ctx_->ssd) {
    const auto& q = ctx_->ssd_write_queue;
    auto& ssd = j["ssd"];
    ssd["write_queue_bytes"] = q.bytes.load();
    ssd["write_queue_high_water"] = q.high_water.load();
    ssd["write_queue_limit"] = ctx_->config.ssd.write_queue_bytes;
    ssd["writes_dropped"] = q.dropped.load();
    ssd["writes"] = q.written.load();
  }
  if (ctx_->remote) {
    const auto& q = ctx_->remote_write_queue;
    auto& remote = j["remote"];
    remote["endpoint"] = ctx_->config.remote.host + ":" + std::to_string(ctx_->config.remote.port);
    remote["last_error"] = ctx_->remote->last_error();
    remote["write_back"] = ctx_->config.remote.write_back;
    remote["write_queue_bytes"] = q.bytes.load();
    remote["writes_dropped"] = q.dropped.load();
    remote["writes"] = q.written.load();
  }
  return j.dump();
}

}  // namespace bs
