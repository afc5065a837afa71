// supervisor: monitors every actor of the runtime and restarts only the one that
// died (Erlang/OTP's one-for-one strategy, without OTP's restart intensity limit: an
// actor that dies again at once is restarted again). When one dies, the runtime's
// restart hook fails what it held with a clean error (a loader's requests, the queued
// writes of a writer, or every request when a request-carrying actor died), puts a
// successor in its place, and this actor monitors the successor. Exits of
// user_shutdown are the runtime stopping: nothing is restarted then.
#include <cstdio>

#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {

std::function<caf::error(caf::scheduled_actor*, std::exception_ptr&)> exit_on_exception(std::string actor) {
  return [actor](caf::scheduled_actor*, std::exception_ptr& x) -> caf::error {
    std::string what = "an unknown exception";
    try {
      std::rethrow_exception(x);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    return make_runtime_error(RequestErrc::internal, "the " + actor + " actor failed: " + what);
  };
}

supervisor_actor::behavior_type supervisor(supervisor_actor::stateful_pointer<SupervisorState> self,
                                           SupervisorHooks hooks, CountersPtr c) {
  self->set_down_handler([=](caf::down_msg& dm) {
    BusyScope busy(*c, self->mailbox().size());
    auto& children = self->state.children;
    const auto it = children.find(dm.source);
    if (it == children.end()) return;
    const std::string name = it->second;
    children.erase(it);
    if (dm.reason == caf::exit_reason::user_shutdown) return;  // the runtime stops it
    const caf::actor next = hooks.restart(name, dm.source.id(), dm.reason);
    if (!next) return;
    self->monitor(next);
    children.emplace(next.address(), name);
  });
  return {
      [=](supervise_atom, const caf::actor& child, const std::string& name) {
        BusyScope busy(*c, self->mailbox().size());
        if (!child) return;
        self->monitor(child);
        self->state.children.emplace(child.address(), name);
      },
  };
}

}  // namespace bs
