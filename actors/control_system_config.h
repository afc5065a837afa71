// The actor system a control-plane end runs in (a member's ControlEndpoint, the
// frontend's ClusterMonitor): its own, apart from the runtime's, with CAF's
// middleman loaded, one scheduler thread (control messages are few), CAF's BASP
// heartbeat and silent-connection timeout from the cluster config, and the
// cluster's message types.
#pragma once

#include <chrono>

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include "actors/cluster_messages.h"

namespace bs {

inline caf::timespan seconds_span(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

struct ControlSystemConfig : caf::actor_system_config {
  ControlSystemConfig(double heartbeat_interval_s, double connection_timeout_s) {
    load<caf::io::middleman>();
    set("scheduler.max-threads", size_t{1});
    set("logger.verbosity", caf::atom("quiet"));
    set("middleman.heartbeat-interval", seconds_span(heartbeat_interval_s));
    set("middleman.connection-timeout", seconds_span(connection_timeout_s));
    add_cluster_message_types(*this);
  }
};

}  // namespace bs
