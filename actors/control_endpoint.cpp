#include "actors/control_endpoint.h"

#include <atomic>
#include <cstdio>
#include <stdexcept>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/control_system_config.h"

namespace bs {
namespace {

struct AgentState {
  std::string secret, node;
  std::function<NodeReport()> report;
  std::shared_ptr<std::atomic<int64_t>> refused;
};

caf::behavior control_agent(caf::event_based_actor*, AgentState st) {
  return {
      [st](node_report_atom, const std::string& from, int64_t unix_ms, const std::string& proof) -> caf::result<NodeReport> {
        if (!control_proof_valid(st.secret, from, unix_ms, proof)) {
          if (st.refused->fetch_add(1) < 10)  // a stranger knocking: say so, but do not flood the log
            std::fprintf(stderr, "blendserve %s: control request from \"%s\" refused: wrong cluster secret or stale\n",
                         st.node.c_str(), from.c_str());
          return caf::make_error(caf::sec::invalid_argument, "control request refused: wrong cluster secret");
        }
        // Nobody supervises the agent: a report that fails is an error answer (the
        // frontend counts the member down until a report succeeds), never its death.
        try {
          return st.report();
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("report failed: ") + e.what());
        }
      },
  };
}

}  // namespace

struct ControlEndpoint::Impl {
  ControlSystemConfig cfg;
  caf::actor_system system;
  caf::actor agent;
  int port = 0;
  std::shared_ptr<std::atomic<int64_t>> refused = std::make_shared<std::atomic<int64_t>>(0);

  Impl(const ControlEndpointOptions& opt) : cfg(opt.heartbeat_interval_s, opt.connection_timeout_s), system(cfg) {}
};

ControlEndpoint::ControlEndpoint(ControlEndpointOptions opt, std::function<NodeReport()> report)
    : impl_(std::make_unique<Impl>(opt)) {
  auto refused = impl_->refused;
  const std::string secret = opt.secret, node = opt.node;
  // On the endpoint's own scheduler thread (its system has one): a report takes
  // the tiers' key-index locks briefly, never I/O. Not detached: a detached actor
  // that a remote node still references can keep ~actor_system waiting for its
  // thread: with a detached agent, about one run in six of test_cluster_control
  // hung in ~actor_system waiting for that thread (CAF 0.17.6). Spawned with its
  // state as an argument, not a capturing lambda without arguments: CAF 0.17's
  // init_fun_factory dereferences a null tuple pointer for those (UBSan reports it).
  impl_->agent = impl_->system.spawn(control_agent, AgentState{secret, node, std::move(report), refused});
  auto published = impl_->system.middleman().publish(impl_->agent, static_cast<uint16_t>(opt.port), opt.host.c_str(),
                                                     true);
  if (!published) {
    caf::anon_send_exit(impl_->agent, caf::exit_reason::user_shutdown);
    throw std::runtime_error("control port " + opt.host + ":" + std::to_string(opt.port) + ": " +
                             impl_->system.render(published.error()));
  }
  impl_->port = *published;
}

ControlEndpoint::~ControlEndpoint() {
  caf::anon_send_exit(impl_->agent, caf::exit_reason::user_shutdown);
}

int ControlEndpoint::port() const { return impl_->port; }
int64_t ControlEndpoint::refused() const { return impl_->refused->load(); }

}  // namespace bs
