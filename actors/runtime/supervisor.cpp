// supervisor: monitors every actor of the runtime and restarts only the one that
// died (Erlang/OTP's one-for-one strategy), within a restart intensity per role
// (actors/runtime/restart_intensity.h, limits.max_restarts within limits.restart_window):
// when one dies, the runtime's restart hook fails what it held with a clean error (a
// loader's requests, the queued writes of a writer, or every request when a
// request-carrying actor died), puts a successor in its place (with the backoff the
// intensity asks for), and this actor monitors the successor; a role that died more
// often than allowed gets the give-up hook instead and no successor. Exits of
// user_shutdown are the runtime stopping: nothing is restarted then. A request the
// intake gives up on (past its deadline, not stopped) is failed here too (fail_atom),
// so every restart, give-up and fail decision runs on this actor.
#include <chrono>
#include <cstdio>

#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

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
    auto& intensity = self->state.intensity.try_emplace(name, hooks.limits).first->second;
    const double now_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    const RestartDecision d = intensity.on_death(now_s);
    if (!d.restart) {
      hooks.give_up(name, dm.source.id(), dm.reason, d.deaths_in_window);
      return;
    }
    const caf::actor next = hooks.restart(name, dm.source.id(), dm.reason, d.backoff_s);
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
      [=](fail_atom, uint64_t id, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        hooks.fail(id, why);
      },
  };
}

}  // namespace bs
