// A cluster member's end of the control plane: a FramedServer (storage/framed_link.h)
// on the member's control port that answers the frontend's request, once per
// heartbeat, with the member's NodeReport. Its own thread: a member's control
// traffic never queues behind its compute or its data plane, so a busy member still
// answers its heartbeats.
//
// Who gets an answer: with TLS, only a peer whose certificate the cluster CA signed
// and that names one of `tls_peers` (the frontends) completes the handshake; in
// plaintext and under TLS alike, the request must carry a fresh proof of the cluster
// secret naming this member as its receiver (actors/config/cluster_secret.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/cluster_messages.h"
#include "actors/cluster/holdings.h"
#include "storage/tls.h"

namespace bs {

struct ControlEndpointOptions {
  std::string node;     // this member's name (the reports say it; a request must name it)
  std::string host;     // address to bind the control port to
  int port = 0;         // control port; 0 = any free one (port() says which)
  std::string secret;   // the cluster secret: requests without its proof are refused
  double heartbeat_interval_s = 1;
  double connection_timeout_s = 5;  // a connection silent this long (x 3: a few missed asks) is closed
  tls::Files tls;                   // this member's certificate (all empty: plaintext)
  std::vector<std::string> tls_peers;  // with TLS: who may ask (the frontends' names)
};

class ControlEndpoint {
 public:
  // `report` makes this member's report (without holdings); `holdings` (may be null:
  // none) says what it holds, as a delta per asker. Both run on the endpoint's own
  // thread, once per heartbeat of each frontend: they may take locks but should
  // take well under a heartbeat; if `report` throws, the answer is an error ("report
  // failed: ..."), and the endpoint goes on. Throws std::runtime_error when the port
  // cannot be bound or the TLS files cannot be loaded.
  ControlEndpoint(ControlEndpointOptions opt, std::function<NodeReport()> report,
                  std::shared_ptr<HoldingsLog> holdings = nullptr);
  ~ControlEndpoint();
  ControlEndpoint(const ControlEndpoint&) = delete;
  ControlEndpoint& operator=(const ControlEndpoint&) = delete;

  int port() const;
  // Requests refused for a missing, wrong or stale proof since start.
  int64_t refused() const;
  // Handshakes that failed (a peer without a certificate of the cluster CA, or not
  // among tls_peers; not TLS at all).
  int64_t tls_failures() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
