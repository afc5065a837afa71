// What a cluster member says of itself on every heartbeat (actors/cluster_messages.h
// NodeReport): a worker its admission state, what its chunk keys are made of, and
// a Bloom filter of the keys its RAM and SSD tiers hold; a storage node its tier.
#pragma once

#include <string>

#include "actors/cluster_messages.h"

namespace bs {

class Runtime;
class DiskKvStore;

// Thread-safe: reads the runtime's counters and the tiers' key indexes (each under
// its own lock). `node`: the member's name.
NodeReport make_worker_report(const Runtime& runtime, const std::string& node);
NodeReport make_storage_report(const DiskKvStore& store, const std::string& node);

}  // namespace bs
