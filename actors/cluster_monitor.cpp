#include "actors/cluster_monitor.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/control_system_config.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;
using refresh_atom = caf::atom_constant<caf::atom("ctlrefr")>;

double now_s() { return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); }

// Where the actor publishes its snapshots for the readers.
struct Published {
  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::shared_ptr<const ClusterView> view = std::make_shared<ClusterView>();
};

struct MemberState {
  MemberView view;
  caf::actor agent;  // null while not connected
  bool connecting = false, report_pending = false;
};

struct MonitorState {
  std::vector<MemberState> members;
  int64_t version = 0;
};

using monitor_actor = caf::stateful_actor<MonitorState>;

caf::behavior monitor(monitor_actor* self, ClusterMonitorOptions opt, std::shared_ptr<Published> out) {
  for (const auto& m : opt.members) {
    MemberState s;
    s.view.member = m;
    self->state.members.push_back(std::move(s));
  }
  const auto heartbeat = seconds_span(opt.heartbeat_interval_s);
  const auto connect_timeout = seconds_span(opt.connection_timeout_s);
  // A report that has not come within two intervals: the member is down (noticed
  // within 3 x heartbeat of its last answer).
  const auto report_timeout = seconds_span(2 * opt.heartbeat_interval_s);
  auto publish = [self, out] {
    auto v = std::make_shared<ClusterView>();
    v->version = ++self->state.version;
    for (const auto& m : self->state.members) v->members.push_back(m.view);
    {
      std::lock_guard<std::mutex> lock(out->mu);
      out->view = std::move(v);
    }
    out->changed.notify_all();
  };
  auto mark_down = [self, publish](size_t i, std::string why) {
    auto& m = self->state.members[i];
    if (m.agent) self->demonitor(m.agent);
    m.agent = nullptr;
    m.report_pending = false;
    if (m.view.up) ++m.view.downs;
    m.view.up = false;
    m.view.last_error = std::move(why);
    publish();
  };
  auto ask = [self, opt, report_timeout, publish, mark_down](size_t i) {
    auto& m = self->state.members[i];
    if (!m.agent || m.report_pending) return;
    m.report_pending = true;
    const int64_t t = unix_ms_now();
    const caf::actor agent = m.agent;
    self->request(agent, report_timeout, node_report_atom::value, opt.self, t, control_proof(opt.secret, opt.self, t))
        .then(
            [self, i, agent, publish](NodeReport& r) {
              auto& m = self->state.members[i];
              if (m.agent != agent) return;  // an answer from a connection given up on since
              m.report_pending = false;
              m.view.up = true;
              m.view.last_report_s = now_s();
              m.view.last_error.clear();
              try {
                m.view.held = r.bloom_words.empty() ? KeyBloom() : KeyBloom(r.bloom_words, r.bloom_probes);
              } catch (const std::invalid_argument&) {
                m.view.held = KeyBloom();  // a malformed filter routes as if nothing were held
              }
              m.view.report = std::move(r);
              publish();
            },
            [self, i, agent, mark_down](caf::error& e) {
              if (self->state.members[i].agent != agent) return;
              mark_down(i, "no report: " + self->system().render(e));
            });
  };
  auto connect = [self, connect_timeout, ask, mark_down, publish](size_t i) {
    auto& m = self->state.members[i];
    if (m.agent || m.connecting) return;
    m.connecting = true;
    auto mm = self->system().middleman().actor_handle();
    self->request(mm, connect_timeout, caf::connect_atom::value, m.view.member.host,
                  static_cast<uint16_t>(m.view.member.port))
        .then(
            [self, i, ask, mark_down](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
              auto& m = self->state.members[i];
              m.connecting = false;
              if (!ptr) return mark_down(i, "no control actor published there");
              m.agent = caf::actor_cast<caf::actor>(std::move(ptr));
              self->monitor(m.agent);
              ask(i);
            },
            [self, i, mark_down](caf::error& e) {
              self->state.members[i].connecting = false;
              mark_down(i, "cannot connect: " + self->system().render(e));
            });
    (void)publish;
  };
  self->set_down_handler([self, mark_down](caf::down_msg& msg) {
    for (size_t i = 0; i < self->state.members.size(); ++i)
      if (self->state.members[i].agent && self->state.members[i].agent.address() == msg.source)
        mark_down(i, "connection lost: " + self->system().render(msg.reason));
  });
  for (size_t i = 0; i < self->state.members.size(); ++i) connect(i);
  self->delayed_send(self, heartbeat, control_tick_atom::value);
  return {
      [self, heartbeat, ask, connect](control_tick_atom) {
        for (size_t i = 0; i < self->state.members.size(); ++i) {
          if (self->state.members[i].agent)
            ask(i);
          else
            connect(i);
        }
        self->delayed_send(self, heartbeat, control_tick_atom::value);
      },
      [self, ask](refresh_atom) {
        for (size_t i = 0; i < self->state.members.size(); ++i) ask(i);
      },
  };
}

}  // namespace

const MemberView* ClusterView::find(const std::string& name) const {
  for (const auto& m : members)
    if (m.member.name == name) return &m;
  return nullptr;
}

struct ClusterMonitor::Impl {
  ControlSystemConfig cfg;
  caf::actor_system system;
  std::shared_ptr<Published> out = std::make_shared<Published>();
  caf::actor actor;
  explicit Impl(const ClusterMonitorOptions& opt) : cfg(opt.heartbeat_interval_s, opt.connection_timeout_s), system(cfg) {}
};

ClusterMonitor::ClusterMonitor(ClusterMonitorOptions opt) : impl_(std::make_unique<Impl>(opt)) {
  // Every member is in the view from the start, down until its first report.
  auto first = std::make_shared<ClusterView>();
  for (const auto& m : opt.members) {
    MemberView mv;
    mv.member = m;
    first->members.push_back(std::move(mv));
  }
  impl_->out->view = std::move(first);
  impl_->actor = impl_->system.spawn(monitor, std::move(opt), impl_->out);
}

ClusterMonitor::~ClusterMonitor() { caf::anon_send_exit(impl_->actor, caf::exit_reason::user_shutdown); }

std::shared_ptr<const ClusterView> ClusterMonitor::view() const {
  std::lock_guard<std::mutex> lock(impl_->out->mu);
  return impl_->out->view;
}

bool ClusterMonitor::wait_all_up(double timeout_s) const {
  std::unique_lock<std::mutex> lock(impl_->out->mu);
  return impl_->out->changed.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    const auto& v = *impl_->out->view;
    for (const auto& m : v.members)
      if (!m.up) return false;
    return true;
  });
}

void ClusterMonitor::refresh() { caf::anon_send(impl_->actor, refresh_atom::value); }

}  // namespace bs
