// rank worker (one per tensor-parallel follower rank, actors/tp_ranks.h): takes the
// jobs rank 0 sends, in rank 0's order, and runs each on its rank's compute thread,
// which owns the rank's requests (caches, prefill state). It decides nothing: what
// runs, and every choice inside a job, is rank 0's. Only passes messages (the
// compute thread blocks, never this actor).
#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {

rank_worker_actor::behavior_type rank_worker(rank_worker_actor::pointer self, RuntimeContext* ctx, int rank,
                                             CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](rank_job_atom, RankJob& job) {
        BusyScope busy(*c, self->mailbox().size());
        RankFollower& me = ctx->tp->follower(rank);
        // Shutting down: the job will not run (rank 0 stopped computing too).
        if (!me.compute().submit([&me, job = std::move(job)] { me.execute(job); })) ctx->tp->job_done(rank);
      },
  };
}

}  // namespace bs
