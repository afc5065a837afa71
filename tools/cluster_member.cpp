// The storage and frontend roles of `blendserve --node` (tools/cluster_member.h).
#include "tools/cluster_member.h"

#include <cstdio>

namespace bs::tools {

// TODO(lead): the storage role (StorageServer over the node's DiskKvStore) replaces
// this body.
int run_storage_member(const ClusterConfig& cluster, const std::string& name) {
  std::fprintf(stderr, "blendserve: the storage role is not built yet (node %s of cluster %s)\n", name.c_str(),
               cluster.name.c_str());
  return 2;
}

// TODO(lead): the frontend role (control plane and request forwarding) replaces this
// body.
int run_frontend_member(const ClusterConfig& cluster, const std::string& name) {
  std::fprintf(stderr, "blendserve: the frontend role is not built yet (node %s of cluster %s)\n", name.c_str(),
               cluster.name.c_str());
  return 2;
}

}  // namespace bs::tools
