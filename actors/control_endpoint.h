// A cluster member's end of the control plane: an actor published on the member's
// control port (CAF's middleman, bound to the configured address) that answers the
// frontend's heartbeat with the member's NodeReport. Runs its own small actor
// system with the middleman loaded, apart from the runtime's: a member's control
// traffic never queues behind its compute messages, and the runtime stays free of
// networking. Heartbeat and connection timeout of CAF's BASP connections are set
// from the cluster config, so a frozen frontend's connection is dropped too.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "actors/cluster_messages.h"

namespace bs {

struct ControlEndpointOptions {
  std::string node;     // this member's name (the reports say it)
  std::string host;     // address to bind the control port to
  int port = 0;         // control port; 0 = any free one (port() says which)
  std::string secret;   // the cluster secret: requests without its proof are refused
  double heartbeat_interval_s = 1;  // CAF's BASP heartbeat on every connection
  double connection_timeout_s = 5;  // a connection silent this long is dropped
};

class ControlEndpoint {
 public:
  // `report` makes this member's report; called on the endpoint's own (detached)
  // actor thread, once per heartbeat of each frontend, so it may take locks but
  // should take well under a heartbeat. Throws std::runtime_error when the port
  // cannot be bound.
  ControlEndpoint(ControlEndpointOptions opt, std::function<NodeReport()> report);
  ~ControlEndpoint();
  ControlEndpoint(const ControlEndpoint&) = delete;
  ControlEndpoint& operator=(const ControlEndpoint&) = delete;

  int port() const;
  // Requests refused for a missing, wrong or stale proof since start.
  int64_t refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
