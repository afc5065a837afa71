// The runtime's gauges for /metrics (http/server.cpp renders them with its counters,
// http/metrics.h): the backend, admission and the KV page pool, decode batching,
// supervision and tensor parallelism, KV reuse, each store tier and each actor.
#pragma once

#include <vector>

#include "actors/runtime/runtime.h"
#include "http/metrics.h"

namespace bs::http {

// Read now from the runtime's thread-safe views.
std::vector<Gauge> runtime_gauges(Runtime& runtime);

}  // namespace bs::http
