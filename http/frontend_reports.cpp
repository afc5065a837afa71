#include "http/frontend_reports.h"

#include <chrono>

#include "http/cluster_tls.h"

namespace bs::http {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

json cluster_members_json(const ClusterView& v, const RequestRouter& router) {
  json out = json::array();
  const double now = std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
  for (const auto& m : v.members) {
    json j = {{"name", m.member.name},
              {"role", m.member.role},
              {"host", m.member.host},
              {"control_port", m.member.port},
              {"up", m.up},
              {"downs", m.downs},
              {"last_error", m.last_error},
              {"report_age_s", m.last_report_s > 0 ? now - m.last_report_s : -1.0}};
    if (m.member.role == "worker")
      j["report"] = {{"in_flight", m.report.in_flight},
                     {"queued", m.report.queued},
                     {"max_requests", m.report.max_requests},
                     {"chunks_held", m.report.chunks_held},
                     {"keys_known", m.held->size()},
                     {"holdings_version", m.held->version()},
                     {"uses_storage", m.report.uses_storage},
                     {"routed_in_flight", router.in_flight(m.member.name)}};
    else
      j["report"] = {{"bytes", m.report.store_bytes},
                     {"entries", m.report.store_entries},
                     {"budget", m.report.store_budget},
                     {"keys_known", m.held->size()},
                     {"holdings_version", m.held->version()}};
    out.push_back(std::move(j));
  }
  return out;
}

std::string FrontendMetrics::text(const ClusterView& view) const {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line("# HELP blendserve_cluster_member_up Whether a member answers its heartbeat (1) or not (0).");
  line("# TYPE blendserve_cluster_member_up gauge");
  for (const auto& m : view.members)
    line("blendserve_cluster_member_up{member=\"" + m.member.name + "\",role=\"" + m.member.role + "\"} " +
         (m.up ? "1" : "0"));
  line("# HELP blendserve_cluster_member_downs_total Times a member was marked down.");
  line("# TYPE blendserve_cluster_member_downs_total counter");
  for (const auto& m : view.members)
    line("blendserve_cluster_member_downs_total{member=\"" + m.member.name + "\"} " + std::to_string(m.downs));
  std::lock_guard<std::mutex> lock(mu);
  line("# HELP blendserve_frontend_routed_total Completions sent to each worker (retries included).");
  line("# TYPE blendserve_frontend_routed_total counter");
  for (const auto& [w, n] : routed) line("blendserve_frontend_routed_total{worker=\"" + w + "\"} " + std::to_string(n));
  line("# HELP blendserve_frontend_worker_failures_total Completions a worker failed.");
  line("# TYPE blendserve_frontend_worker_failures_total counter");
  for (const auto& [w, n] : failed)
    line("blendserve_frontend_worker_failures_total{worker=\"" + w + "\"} " + std::to_string(n));
  line("# TYPE blendserve_frontend_retries_total counter");
  line("blendserve_frontend_retries_total " + std::to_string(retries));
  line("# TYPE blendserve_frontend_no_worker_total counter");
  line("blendserve_frontend_no_worker_total " + std::to_string(refused_no_worker));
  line("# TYPE blendserve_frontend_mid_stream_failures_total counter");
  line("blendserve_frontend_mid_stream_failures_total " + std::to_string(mid_stream_failures));
  line("# HELP blendserve_frontend_heartbeat_failures_total Forwards ended because their worker missed its heartbeats.");
  line("# TYPE blendserve_frontend_heartbeat_failures_total counter");
  line("blendserve_frontend_heartbeat_failures_total " + std::to_string(heartbeat_failures));
  line("# HELP blendserve_frontend_forwards_refused_total Forwards refused: every forward thread was busy.");
  line("# TYPE blendserve_frontend_forwards_refused_total counter");
  line("blendserve_frontend_forwards_refused_total " + std::to_string(forwards_refused));
  line("# HELP blendserve_frontend_routed_held_tokens_total Document tokens the chosen worker held when routed.");
  line("# TYPE blendserve_frontend_routed_held_tokens_total counter");
  line("blendserve_frontend_routed_held_tokens_total " + std::to_string(held_tokens));
  line("# HELP blendserve_frontend_routed_storage_tokens_total Document tokens the chosen worker did not hold that a storage node did.");
  line("# TYPE blendserve_frontend_routed_storage_tokens_total counter");
  line("blendserve_frontend_routed_storage_tokens_total " + std::to_string(storage_tokens));
  line("# TYPE blendserve_frontend_routed_document_tokens_total counter");
  line("blendserve_frontend_routed_document_tokens_total " + std::to_string(request_tokens));
  return out;
}


std::string cluster_snapshot(const FrontendOptions& opt, const ClusterView& view, const RequestRouter& router,
                             const std::map<std::string, FrontendWorker>& workers) {
  json nodes = json::array();
  nodes.push_back({{"name", opt.node},
                   {"role", "frontend"},
                   {"members", cluster_members_json(view, router)},
                   {"actors", json::array()},
                   {"requests", json::array()}});
  for (const auto& m : view.members) {
    if (m.member.role == "storage") {
      nodes.push_back({{"name", m.member.name},
                       {"role", "storage"},
                       {"up", m.up},
                       {"tiers", {{"ssd", {{"bytes", m.report.store_bytes}, {"entries", m.report.store_entries},
                                           {"budget", m.report.store_budget}}}}},
                       {"actors", json::array()},
                       {"requests", json::array()}});
      continue;
    }
    json node = {{"name", m.member.name}, {"role", "worker"}, {"up", m.up}, {"actors", json::array()},
                 {"requests", json::array()}};
    const auto wit = workers.find(m.member.name);
    if (m.up && wit != workers.end()) {
      const auto cli = make_member_client(wit->second.host, wit->second.http_port, opt.tls, wit->second.name);
      cli->set_connection_timeout(2, 0);
      cli->set_read_timeout(2, 0);
      auto r = cli->Get("/v1/inspect/snapshot", {{"Authorization", "Bearer " + opt.worker_api_key}});
      const json j = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
      if (j.is_object() && j.contains("nodes") && j["nodes"].is_array() && !j["nodes"].empty()) {
        node = j["nodes"][0];
        node["role"] = "worker";
        node["up"] = true;
      } else {
        node["error"] = "no snapshot from the worker";
      }
    }
    nodes.push_back(std::move(node));
  }
  return json{{"nodes", std::move(nodes)}}.dump();
}

}  // namespace bs::http
