// blendctl top's text (tools/cli/top_view.*, a pure function of a snapshot): a single
// server's node line, and a cluster frontend's snapshot, where the frontend lists its
// members, a storage node and a member that is down have their own lines, and
// requests say which worker runs them (ids are each worker's own).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/cli/top_view.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;

json worker_node(const std::string& name, int request_id) {
  return {{"name", name},
          {"role", "worker"},
          {"up", true},
          {"backend", "cpu/avx2"},
          {"tp", 1},
          {"queue", {{"in_flight", 1}, {"max_requests", 8}, {"queued", 0}, {"max_queue", 64}}},
          {"kv_pages", {{"used", 12}, {"total", 1024}}},
          {"tiers", {{"ram", {{"entries", 3}, {"bytes", 1.0e6}, {"hits", 3}, {"misses", 1}}}}},
          {"actors", {{{"actor", "layer-worker"}, {"node", name}, {"state", "busy"}, {"busy_share", 0.5}}}},
          {"requests", {{{"id", request_id}, {"phase", "decode"}, {"mode", "blend"}}}}};
}

bool has_line(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

TEST(TopView, OneServerNodeLine) {
  json n = worker_node("local", 7);
  n.erase("role");
  n.erase("up");
  const auto lines = top_lines(json{{"nodes", {n}}}, TopViewOptions{});
  EXPECT_TRUE(has_line(lines, "node local cpu/avx2 tp 1  run 1/8  queue 0/64  KV pages 12/1024"));
  EXPECT_TRUE(has_line(lines, "REQUESTS IN FLIGHT (1)"));
}

TEST(TopView, AClusterFrontendsSnapshotListsEveryMember) {
  const json snapshot = {
      {"nodes",
       {{{"name", "frontend"},
         {"role", "frontend"},
         {"members", {{{"name", "worker-1"}, {"up", true}}, {{"name", "worker-2"}, {"up", true}},
                      {{"name", "worker-3"}, {"up", false}}, {{"name", "storage"}, {"up", true}}}},
         {"actors", json::array()},
         {"requests", json::array()}},
        worker_node("worker-1", 1),
        worker_node("worker-2", 1),
        {{"name", "worker-3"}, {"role", "worker"}, {"up", false}, {"actors", json::array()}},
        {{"name", "storage"}, {"role", "storage"}, {"up", true}, {"tiers", {{"ssd", {{"entries", 9}, {"bytes", 3.0e6}}}}}}}}};
  TopViewOptions opt;
  opt.width = 80;
  const auto lines = top_lines(snapshot, opt);
  EXPECT_TRUE(has_line(lines, "node frontend (frontend)  members up 3/4"));
  EXPECT_TRUE(has_line(lines, "node worker-1 cpu/avx2 tp 1"));
  EXPECT_TRUE(has_line(lines, "node worker-3 (worker)  DOWN"));
  EXPECT_TRUE(has_line(lines, "node storage (storage)"));
  EXPECT_TRUE(has_line(lines, "  ssd       9 chunks"));
  // Both workers run a request numbered 1: the node column tells them apart.
  EXPECT_TRUE(has_line(lines, "REQUESTS IN FLIGHT (2)"));
  EXPECT_TRUE(has_line(lines, "worker-1        1 decode"));
  EXPECT_TRUE(has_line(lines, "worker-2        1 decode"));
  for (const auto& l : lines) EXPECT_LE(l.size(), 80u) << l;
}

}  // namespace
}  // namespace bs::tools
