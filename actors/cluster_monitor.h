// The frontend's view of the cluster: one actor that connects to every member's
// control endpoint (CAF middleman, each connect bounded by the connection timeout,
// retried every heartbeat while the member is away), monitors it, and asks each
// connected member for its NodeReport every heartbeat interval. A member that does
// not answer within two intervals, or whose connection drops, is marked down
// (within 3 x heartbeat) and connected again by itself when it returns.
//
// The actor owns the member table; readers (the HTTP threads routing requests)
// get immutable snapshots (`view()`), replaced whole after every change, never
// a reference into the actor's state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster_messages.h"
#include "storage/key_bloom.h"

namespace bs {

struct MonitoredMember {
  std::string name, role, host;  // role: "worker" | "storage"
  int port = 0;                  // its control port
};

struct ClusterMonitorOptions {
  std::string self = "frontend";  // this node's name (the proof says who asks)
  std::string secret;
  double heartbeat_interval_s = 1;
  double connection_timeout_s = 5;  // a connect attempt, and CAF's silent-connection limit
  std::vector<MonitoredMember> members;
};

struct MemberView {
  MonitoredMember member;
  bool up = false;
  double last_report_s = 0;   // steady-clock seconds of the newest report (0: none yet)
  NodeReport report;          // the newest one
  KeyBloom held;              // report's chunk keys (empty when none or malformed)
  int64_t downs = 0;          // times it went down since start
  std::string last_error;     // why it is (or last was) down
};

struct ClusterView {
  std::vector<MemberView> members;  // in the order of the options
  int64_t version = 0;              // bumped on every change
  const MemberView* find(const std::string& name) const;
};

class ClusterMonitor {
 public:
  explicit ClusterMonitor(ClusterMonitorOptions opt);
  ~ClusterMonitor();
  ClusterMonitor(const ClusterMonitor&) = delete;
  ClusterMonitor& operator=(const ClusterMonitor&) = delete;

  std::shared_ptr<const ClusterView> view() const;
  // Waits (at most timeout_s) until every member is up; false on timeout.
  bool wait_all_up(double timeout_s) const;
  // Asks every connected member for a report now (e.g. after routing a request
  // whose chunks a worker is about to store), instead of at the next heartbeat.
  void refresh();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
