#include "actors/cluster/control_endpoint.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <stdexcept>

#include "actors/cluster/control_wire.h"
#include "storage/framed_link.h"

namespace bs {

struct ControlEndpoint::Impl {
  std::atomic<int64_t> refused{0};
  std::unique_ptr<FramedServer> server;
};

ControlEndpoint::ControlEndpoint(ControlEndpointOptions opt, std::function<NodeReport()> report,
                                 std::shared_ptr<HoldingsLog> holdings)
    : impl_(std::make_unique<Impl>()) {
  Impl* impl = impl_.get();
  FramedServerOptions so;
  so.name = "control " + opt.node;
  so.host = opt.host;
  so.port = opt.port;
  so.tls = opt.tls;
  so.tls_peers = opt.tls_peers;
  so.max_connections = 16;
  so.max_request_bytes = 64 << 10;  // a request is a few hundred bytes
  so.io_timeout_s = opt.connection_timeout_s;
  so.idle_timeout_s = 3 * std::max(opt.connection_timeout_s, opt.heartbeat_interval_s);
  impl_->server = std::make_unique<FramedServer>(
      so, [impl, secret = opt.secret, node = opt.node, report = std::move(report),
           holdings = std::move(holdings)](std::string_view bytes) -> std::string {
        std::string why;
        const auto req = decode_control_request(bytes, &why);
        if (!req || req->to != node || !control_proof_valid(secret, req->from, req->to, req->unix_ms, req->proof)) {
          if (impl->refused.fetch_add(1) < 10)  // a stranger knocking: say so, but do not flood the log
            std::fprintf(stderr, "blendserve %s: control request from \"%s\" refused: %s\n", node.c_str(),
                         req ? req->from.c_str() : "?",
                         !req ? why.c_str() : req->to != node ? "addressed to another member" : "wrong cluster secret or stale");
          return encode_error_reply("control request refused: wrong cluster secret, stale, or not for this member");
        }
        NodeReport r;
        try {
          r = report();
          if (holdings) {
            r.holdings = holdings->since(req->holdings_epoch, req->holdings_base);
            r.chunks_held = static_cast<int64_t>(holdings->held());
          }
        } catch (const std::exception& e) {
          return encode_error_reply(std::string("report failed: ") + e.what());
        }
        return encode_report_reply(r);
      });
}

ControlEndpoint::~ControlEndpoint() = default;

int ControlEndpoint::port() const { return impl_->server->port(); }
int64_t ControlEndpoint::refused() const { return impl_->refused.load(); }
int64_t ControlEndpoint::tls_failures() const { return impl_->server->stats().tls_failures; }

}  // namespace bs
