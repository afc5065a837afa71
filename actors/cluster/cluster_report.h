// What a cluster member says of itself on every heartbeat (actors/cluster/cluster_messages.h
// NodeReport): a worker its admission state, what its chunk keys are made of and
// whether it loads from the storage nodes; a storage node its tier. The keys each
// holds come from its HoldingsLog (actors/cluster/holdings.h), as deltas, filled in by the
// control endpoint per asker.
#pragma once

#include <memory>
#include <string>

#include "actors/cluster/cluster_messages.h"
#include "actors/cluster/holdings.h"

namespace bs {

class Runtime;
class DiskKvStore;

// Thread-safe: reads the runtime's counters (each an atomic or under its own lock).
// `node`: the member's name. The holdings are left empty.
NodeReport make_worker_report(const Runtime& runtime, const std::string& node);
NodeReport make_storage_report(const DiskKvStore& store, const std::string& node);

// The keys of the worker's RAM and SSD tiers / of the storage node's tier, listed
// again only when the tiers' put, eviction or entry counters moved.
std::shared_ptr<HoldingsLog> worker_holdings(const Runtime& runtime);
std::shared_ptr<HoldingsLog> storage_holdings(const DiskKvStore& store);

}  // namespace bs
