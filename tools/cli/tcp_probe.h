// Whether something listens on host:port: a TCP connect, non-blocking and bounded,
// then closed. `blendctl cluster up` waits on it for a storage node's data port,
// `bench control` for the node it started.
#pragma once

#include <string>

namespace bs::tools {

// host: an address or a name (every address it resolves to is tried in turn).
bool tcp_accepts(const std::string& host, int port, double timeout_s);

}  // namespace bs::tools
