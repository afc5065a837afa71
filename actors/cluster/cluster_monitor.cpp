#include "actors/cluster/cluster_monitor.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <optional>

#include <caf/all.hpp>

#include "actors/cluster/control_wire.h"
#include "storage/framed_link.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;
using tick_atom = caf::atom_constant<caf::atom("ctltick")>;
using refresh_atom = caf::atom_constant<caf::atom("ctlrefr")>;
using ask_atom = caf::atom_constant<caf::atom("ctlask")>;
using answer_atom = caf::atom_constant<caf::atom("ctlans")>;

double now_s() { return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); }

caf::timespan seconds_span(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

// Where the actor publishes its snapshots for the readers.
struct Published {
  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::shared_ptr<const ClusterView> view = std::make_shared<ClusterView>();
};

// ---- a member's link: owns its connection ----

struct LinkState {
  std::shared_ptr<FramedClient> client;
  double connect_timeout_s = 5, reply_timeout_s = 2;
  std::shared_ptr<const std::atomic<bool>> stop;
};

// (ask_atom, attempt, request bytes) -> sends (answer_atom, index, attempt, reply, error)
// to the monitor: reply empty and error set on failure.
caf::behavior link_actor(caf::event_based_actor* self, caf::actor monitor, uint64_t index, LinkState st) {
  return {
      [self, monitor, index, st](ask_atom, uint64_t attempt, const std::string& request) {
        std::string error;
        std::optional<std::string> reply;
        try {  // never dies: linked to the monitor, its death would end the monitor too
          reply = st.client->call(request, st.connect_timeout_s, st.reply_timeout_s, &error, st.stop.get());
        } catch (const std::exception& e) {
          error = std::string("control link: ") + e.what();
        }
        self->send(monitor, answer_atom::value, index, attempt, reply ? std::move(*reply) : std::string(),
                   reply ? std::string() : error);
      },
  };
}

// ---- the monitor: owns the member table ----

struct MemberState {
  MemberView view;
  caf::actor link;
  bool pending = false;  // an ask is with the link
  uint64_t attempt = 0;  // of the newest ask
  double asked_s = 0;
  bool late = false;     // the pending ask has been counted as missed
};

struct MonitorState {
  std::vector<MemberState> members;
  int64_t version = 0;
};

using monitor_actor = caf::stateful_actor<MonitorState>;

caf::behavior monitor(monitor_actor* self, ClusterMonitorOptions opt, std::shared_ptr<Published> out,
                      std::vector<std::shared_ptr<FramedClient>> clients, std::shared_ptr<const std::atomic<bool>> stop) {
  const double hb = opt.heartbeat_interval_s;
  for (size_t i = 0; i < opt.members.size(); ++i) {
    MemberState s;
    s.view.member = opt.members[i];
    // Detached: its thread waits on the network; linked: it ends with the monitor.
    s.link = self->spawn<caf::detached + caf::linked>(
        link_actor, caf::actor_cast<caf::actor>(self), uint64_t{i},
        LinkState{clients[i], opt.connection_timeout_s, 2 * hb, stop});
    self->state.members.push_back(std::move(s));
  }
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
    if (m.view.up) ++m.view.downs;
    m.view.up = false;
    m.view.last_error = std::move(why);
    publish();
  };
  auto ask = [self, opt](size_t i) {
    auto& m = self->state.members[i];
    if (m.pending) return;
    m.pending = true;
    m.late = false;
    m.asked_s = now_s();
    ControlRequest req;
    req.from = opt.self;
    req.to = m.view.member.name;
    req.unix_ms = unix_ms_now();
    req.proof = control_proof(opt.secret, req.from, req.to, req.unix_ms);
    req.holdings_epoch = m.view.held->epoch();
    req.holdings_base = m.view.held->version();
    self->send(m.link, ask_atom::value, ++m.attempt, encode_control_request(req));
  };
  auto answered = [self, publish, mark_down](size_t i, std::string reply, std::string error) {
    auto& m = self->state.members[i];
    if (reply.empty()) return mark_down(i, error);
    std::string why;
    auto r = decode_report_reply(reply, &why);
    if (!r) return mark_down(i, why);
    if (r->node != m.view.member.name) return mark_down(i, "answered as \"" + r->node + "\"");
    if (auto held = m.view.held->apply(r->holdings)) {
      m.view.held = std::make_shared<const HeldKeys>(std::move(*held));
    } else {
      // A delta from a base this monitor does not have, or unsorted keys: ask for
      // the whole set next time, and route meanwhile as if nothing were held.
      m.view.held = std::make_shared<const HeldKeys>();
    }
    m.view.up = true;
    m.view.last_report_s = now_s();
    m.view.last_error.clear();
    m.view.report = std::move(*r);
    publish();
  };
  self->delayed_send(self, seconds_span(hb), tick_atom::value);
  for (size_t i = 0; i < self->state.members.size(); ++i) ask(i);
  return {
      [self, hb, ask, mark_down](tick_atom) {
        const double now = now_s();
        for (size_t i = 0; i < self->state.members.size(); ++i) {
          auto& m = self->state.members[i];
          if (!m.pending) {
            ask(i);
          } else if (!m.late && now - m.asked_s >= 2 * hb) {
            // Its link still waits (a frozen member); the answer is too late to count.
            m.late = true;
            char within[48];
            std::snprintf(within, sizeof within, "no report within %.3g s", 2 * hb);
            mark_down(i, within);
          }
        }
        self->delayed_send(self, seconds_span(hb), tick_atom::value);
      },
      [self, ask](refresh_atom) {
        for (size_t i = 0; i < self->state.members.size(); ++i) ask(i);
      },
      [self, answered](answer_atom, uint64_t index, uint64_t attempt, std::string& reply, std::string& error) {
        if (index >= self->state.members.size()) return;
        auto& m = self->state.members[index];
        if (attempt != m.attempt) return;
        m.pending = false;
        if (m.late && !reply.empty()) {
          // Answered after it was counted down: it lives, but was not there in time;
          // it is up again with its next answer in time.
          return;
        }
        answered(index, std::move(reply), std::move(error));
      },
  };
}

struct MonitorSystemConfig : caf::actor_system_config {
  MonitorSystemConfig() {
    set("scheduler.max-threads", size_t{1});  // the monitor; each link has its own thread
    set("logger.verbosity", caf::atom("quiet"));
  }
};

}  // namespace

const MemberView* ClusterView::find(const std::string& name) const {
  for (const auto& m : members)
    if (m.member.name == name) return &m;
  return nullptr;
}

struct ClusterMonitor::Impl {
  MonitorSystemConfig cfg;
  caf::actor_system system{cfg};
  std::shared_ptr<Published> out = std::make_shared<Published>();
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  caf::actor actor;
};

ClusterMonitor::ClusterMonitor(ClusterMonitorOptions opt) {
  // The clients first: TLS files that cannot be loaded throw here, to the caller.
  std::vector<std::shared_ptr<FramedClient>> clients;
  for (const auto& m : opt.members)
    clients.push_back(std::make_shared<FramedClient>(
        FramedClientOptions{.host = m.host, .port = m.port, .tls = opt.tls, .peer_name = m.name}));
  impl_ = std::make_unique<Impl>();
  // Every member is in the view from the start, down until its first report.
  auto first = std::make_shared<ClusterView>();
  for (const auto& m : opt.members) {
    MemberView mv;
    mv.member = m;
    first->members.push_back(std::move(mv));
  }
  impl_->out->view = std::move(first);
  impl_->actor = impl_->system.spawn(monitor, std::move(opt), impl_->out, std::move(clients),
                                     std::shared_ptr<const std::atomic<bool>>(impl_->stop));
}

ClusterMonitor::~ClusterMonitor() {
  impl_->stop->store(true);  // a link waiting on the network returns within 50 ms
  caf::anon_send_exit(impl_->actor, caf::exit_reason::user_shutdown);
}

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
