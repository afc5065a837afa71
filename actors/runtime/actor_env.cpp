// Each actor's environment, taken from the runtime's context (actor_env.h).
#include "actors/runtime/actor_env.h"

#include "actors/runtime/runtime_context.h"

namespace bs {

IntakeEnv intake_env(RuntimeContext& ctx) {
  return {ctx.config,      ctx.model.get(), ctx.engine.get(), ctx.kv_pool.get(), ctx.tiered.get(),
          ctx.pasted.get(), ctx.requests,   ctx.traces,       ctx.in_flight,     ctx.queued,
          ctx.admit_after_ns, ctx.shutting_down};
}

ControllerEnv controller_env(RuntimeContext& ctx) { return {ctx.config, ctx.model.get(), ctx.tiers, ctx.traces}; }

LoaderEnv loader_env(RuntimeContext& ctx) {
  return {ctx.backend.get(), ctx.model.get(), ctx.tiers, ctx.ram.get(), ctx.traces, &ctx.loader_fault};
}

WriterEnv ssd_writer_env(RuntimeContext& ctx) {
  return {ctx.ssd.get(), &ctx.ssd_write_queue, ctx.config.ssd.write_queue_bytes, &ctx.writer_fault};
}

// The storage node's queue has the SSD's byte limit.
WriterEnv remote_writer_env(RuntimeContext& ctx) {
  return {ctx.remote.get(), &ctx.remote_write_queue, ctx.config.ssd.write_queue_bytes, &ctx.writer_fault};
}

WorkerEnv worker_env(RuntimeContext& ctx) {
  return {ctx.config,        ctx.backend.get(), ctx.model.get(),   ctx.tf.get(),      ctx.engine.get(),
          ctx.kv_pool.get(), ctx.compute.get(), ctx.tp.get(),      ctx.tiers,         ctx.ram.get(),
          ctx.tiered.get(),  ctx.pasted.get(),  ctx.flights,       ctx.traces,        ctx.decode_steps,
          ctx.decode_tokens, ctx.interleaved_steps, ctx.write_backs_refused};
}

WriteBackEnv write_back_env(RuntimeContext& ctx) {
  return {ctx.config,       ctx.tiers,        ctx.ram.get(),       ctx.ssd.get(),
          ctx.remote.get(), ctx.tiered.get(), ctx.pasted.get(),    ssd_writer_env(ctx),
          remote_writer_env(ctx)};
}

DecoderEnv decoder_env(RuntimeContext& ctx) { return {ctx.model.get(), ctx.tiers, ctx.requests, ctx.traces}; }

}  // namespace bs
