#include "tools/cli/top_view.h"

#include <algorithm>
#include <cstdio>

namespace bs::tools {

TopSort next_sort(TopSort s) {
  switch (s) {
    case TopSort::BusyShare: return TopSort::Mailbox;
    case TopSort::Mailbox: return TopSort::Messages;
    case TopSort::Messages: return TopSort::Name;
    case TopSort::Name: return TopSort::BusyShare;
  }
  return TopSort::BusyShare;
}

const char* sort_name(TopSort s) {
  switch (s) {
    case TopSort::BusyShare: return "busy";
    case TopSort::Mailbox: return "mailbox";
    case TopSort::Messages: return "messages";
    case TopSort::Name: return "name";
  }
  return "busy";
}

namespace {

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

std::string cut(std::string s, int width) {
  if (static_cast<int>(s.size()) > width) s.resize(static_cast<size_t>(std::max(width, 0)));
  return s;
}

}  // namespace

std::vector<std::string> top_lines(const nlohmann::json& snapshot, const TopViewOptions& opt) {
  std::vector<std::string> out;
  auto line = [&](const std::string& s) { out.push_back(cut(s, opt.width)); };
  const auto nodes = snapshot.value("nodes", nlohmann::json::array());
  std::vector<nlohmann::json> actors, requests;
  for (const auto& n : nodes) {
    const std::string name = n.value("name", "?"), role = n.value("role", "");
    const bool down = !n.value("up", true);
    if (role == "frontend") {  // a cluster's frontend: its members, each listed below as a node
      const auto members = n.value("members", nlohmann::json::array());
      int up = 0;
      for (const auto& m : members) up += m.value("up", false);
      line(fmt("node %s (frontend)  members up %d/%zu", name.c_str(), up, members.size()));
      continue;
    }
    if (down || !n.contains("queue")) {  // a storage node, or a member that is down
      line(fmt("node %s%s%s%s", name.c_str(), role.empty() ? "" : (" (" + role + ")").c_str(), down ? "  DOWN" : "",
               n.contains("error") ? ("  " + n.value("error", "")).c_str() : ""));
    } else {
      const auto q = n.value("queue", nlohmann::json::object());
      const auto kv = n.value("kv_pages", nlohmann::json::object());
      line(fmt("node %s %s tp %d  run %d/%d  queue %d/%d  KV pages %lld/%lld  restarts %lld", name.c_str(),
               n.value("backend", "?").c_str(), n.value("tp", 1), q.value("in_flight", 0), q.value("max_requests", 0),
               q.value("queued", 0), q.value("max_queue", 0), static_cast<long long>(kv.value("used", 0LL)),
               static_cast<long long>(kv.value("total", 0LL)), static_cast<long long>(n.value("actor_restarts", 0LL))));
    }
    const auto tiers = n.value("tiers", nlohmann::json::object());  // items() must not outlive it
    for (const auto& [tier, t] : tiers.items()) {
      const double hits = t.value("hits", 0.0), misses = t.value("misses", 0.0);
      line(fmt("  %-4s %6lld chunks %8.1f MB  hits %5.1f%%  loaded %8.1f MB in %6.2f s", tier.c_str(),
               static_cast<long long>(t.value("entries", 0LL)), t.value("bytes", 0.0) / 1e6,
               hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0, t.value("load_bytes", 0.0) / 1e6,
               t.value("load_s", 0.0)));
    }
    for (const auto& a : n.value("actors", nlohmann::json::array())) actors.push_back(a);
    for (auto r : n.value("requests", nlohmann::json::array())) {
      r["node"] = name;  // ids are each node's own
      requests.push_back(std::move(r));
    }
  }
  if (!opt.filter.empty())
    std::erase_if(actors, [&](const nlohmann::json& a) {
      return a.value("actor", "").find(opt.filter) == std::string::npos &&
             a.value("kind", "").find(opt.filter) == std::string::npos;
    });
  std::stable_sort(actors.begin(), actors.end(), [&](const nlohmann::json& a, const nlohmann::json& b) {
    switch (opt.sort) {
      case TopSort::BusyShare: return a.value("busy_share", 0.0) > b.value("busy_share", 0.0);
      case TopSort::Mailbox: return a.value("mailbox", 0LL) > b.value("mailbox", 0LL);
      case TopSort::Messages: return a.value("messages", 0LL) > b.value("messages", 0LL);
      case TopSort::Name: return a.value("actor", "") < b.value("actor", "");
    }
    return false;
  });
  line("");
  line(fmt("ACTORS (sort: %s%s%s)", sort_name(opt.sort), opt.filter.empty() ? "" : ", filter: ",
           opt.filter.c_str()));
  line(fmt("%-24s %-8s %4s %-5s %7s %9s %6s %8s", "actor", "node", "rank", "state", "mailbox", "messages", "busy%",
           "busy s"));
  for (const auto& a : actors) {
    std::string row = fmt("%-24s %-8s %4d %-5s %7lld %9lld %6.1f %8.2f", cut(a.value("actor", "?"), 24).c_str(),
                          cut(a.value("node", "?"), 8).c_str(), a.value("rank", 0), a.value("state", "?").c_str(),
                          static_cast<long long>(a.value("mailbox", 0LL)),
                          static_cast<long long>(a.value("messages", 0LL)), 100.0 * a.value("busy_share", 0.0),
                          a.value("busy_s", 0.0));
    if (a.contains("last_error")) row += "  ! " + a.at("last_error").get<std::string>();
    line(row);
  }
  line("");
  line(fmt("REQUESTS IN FLIGHT (%zu)", requests.size()));
  if (!requests.empty())
    line(fmt("%-8s %8s %-12s %-6s %6s %7s %6s  %s", "node", "id", "phase", "mode", "ratio", "age s", "tokens", "tiers"));
  for (const auto& r : requests) {
    std::string phase = r.value("phase", "?");
    if (phase == "prefill") phase += fmt(" %d/%d", r.value("layer", 0), r.value("layers", 0));
    std::string tiers;
    for (const auto& t : r.value("chunk_tiers", nlohmann::json::array())) tiers += t.get<std::string>() + " ";
    line(fmt("%-8s %8llu %-12s %-6s %6.3f %7.2f %6lld  %s", cut(r.value("node", "?"), 8).c_str(),
             static_cast<unsigned long long>(r.value("id", 0ULL)), phase.c_str(), r.value("mode", "").c_str(), r.value("ratio", 0.0), r.value("age_s", 0.0),
             static_cast<long long>(r.value("tokens_out", 0LL)), tiers.c_str()));
  }
  line("");
  line(opt.status);
  line("q quit  s sort  / filter (Enter ends, empty clears)");
  return out;
}

}  // namespace bs::tools
