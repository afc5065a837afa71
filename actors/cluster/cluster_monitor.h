// The frontend's view of the cluster: one actor that owns the member table and
// asks every member for its NodeReport once per heartbeat interval, over the
// control plane's link (storage/framed_link.h: TLS 1.3 with mutual authentication,
// or plaintext where the cluster file says so). Each member's connection is owned
// by an actor of its own (detached: it waits on the network with deadlines, the
// connect bounded by the connection timeout, the reply by two intervals) that
// sends the answer back as a value. A member that does not answer within two
// intervals, refuses, or whose connection drops is marked down (within 3 x
// heartbeat of its last answer), and is asked again every heartbeat until it
// answers: it comes back by itself.
//
// Holdings come as deltas (actors/cluster/holdings.h): the monitor asks with the version
// it has of each member's keys and applies what comes back.
//
// Readers (the HTTP threads routing requests) get immutable snapshots (`view()`),
// replaced whole after every change, never a reference into the actor's state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/cluster_messages.h"
#include "actors/cluster/holdings.h"
#include "storage/tls.h"

namespace bs {

struct MonitoredMember {
  std::string name, role, host;  // role: "worker" | "storage"
  int port = 0;                  // its control port
};

struct ClusterMonitorOptions {
  std::string self = "frontend";  // this node's name (the proof says who asks)
  std::string secret;
  double heartbeat_interval_s = 1;
  double connection_timeout_s = 5;  // a connect attempt (TCP and TLS handshake)
  tls::Files tls;                   // this node's certificate (all empty: plaintext); a member's must name it
  std::vector<MonitoredMember> members;
};

struct MemberView {
  MonitoredMember member;
  bool up = false;
  double last_report_s = 0;   // steady-clock seconds of the newest report (0: none yet)
  NodeReport report;          // the newest one (its holdings: the last delta applied)
  std::shared_ptr<const HeldKeys> held = std::make_shared<HeldKeys>();  // the keys it holds, as known here
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
  // Throws std::runtime_error when the TLS files cannot be loaded.
  explicit ClusterMonitor(ClusterMonitorOptions opt);
  ~ClusterMonitor();  // returns within ~50 ms: a link waiting on the network gives up
  ClusterMonitor(const ClusterMonitor&) = delete;
  ClusterMonitor& operator=(const ClusterMonitor&) = delete;

  std::shared_ptr<const ClusterView> view() const;
  // Waits (at most timeout_s) until every member is up; false on timeout.
  bool wait_all_up(double timeout_s) const;
  // Asks every member for a report now (e.g. after routing a request whose chunks
  // a worker is about to store), instead of at the next heartbeat.
  void refresh();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
