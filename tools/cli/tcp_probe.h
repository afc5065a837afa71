// Whether something listens on host:port: a TCP connect, non-blocking and bounded,
// then closed; and a loopback port free to listen on. `blendctl cluster up` waits on it for a storage node's data port,
// `bench control` for the node it started.
#pragma once

#include <string>

namespace bs::tools {

// host: an address or a name (every address it resolves to is tried in turn).
bool tcp_accepts(const std::string& host, int port, double timeout_s);

// A loopback TCP port free now: bound to port 0, read back, closed. Another process may
// take it before the caller binds it; the benchmarks that start a server on it say so
// when it fails. std::runtime_error if no socket can be bound.
int free_loopback_port();

}  // namespace bs::tools
