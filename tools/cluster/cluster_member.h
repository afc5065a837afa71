// The cluster roles that are not the runtime's serve path (`blendserve --config F
// --node NAME` with role storage or frontend; a worker runs `serve` with its member
// runtime config and answers the frontend's heartbeat on its control port). Each
// runs in the foreground until SIGINT/SIGTERM.
#pragma once

#include <string>

#include "actors/config/cluster_config.h"
#include "actors/cluster/control_endpoint.h"

namespace bs::tools {

// The control endpoint of member `me` (any role but the frontend): its control port,
// the cluster's heartbeat and timeouts, and with TLS its certificate, answering only
// the frontend.
ControlEndpointOptions control_options(const ClusterConfig& cluster, const ClusterNode& me);

// Runs the storage node `name` of `cluster` (its role is storage): its SSD tier
// (member_runtime_config: data_dir, tiers.ssd) served on its host:data_port to the
// workers' remote tier, with the cluster secret. Returns the process's exit code.
int run_storage_member(const ClusterConfig& cluster, const std::string& name);

// Runs the frontend `name` of `cluster` (its role is frontend): the users' OpenAI
// endpoint on its host:http_port, forwarding to cluster.workers(), with the
// cluster's heartbeat and timeouts. Returns the process's exit code.
int run_frontend_member(const ClusterConfig& cluster, const std::string& name);

}  // namespace bs::tools
