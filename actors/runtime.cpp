#include "actors/runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <unistd.h>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"
#include "actors/inspection.h"
#include "actors/stream_delivery.h"
#include "blend/rag_prompt.h"

#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"
#include "kernels/kv_view.h"

namespace bs {
namespace {

// A scoped actor for a caller's thread (Runtime's blocking calls). CAF 0.17 pins
// the actor system's logger in a thread-local of every thread that makes a scoped
// actor, and ~actor_system waits until the logger is gone: a caller's threads that
// outlive the runtime (an HTTP server's pool) would hang its shutdown forever. The
// pin is dropped when the call is done.
class CallerActor {
 public:
  explicit CallerActor(caf::actor_system& sys) : self_(sys) {}
  caf::blocking_actor* operator->() const { return self_.operator->(); }

 private:
  struct Unpin {
    ~Unpin() { caf::logger::set_current_actor_system(nullptr); }
  } unpin_;  // destroyed after self_
  caf::scoped_actor self_;
};


// The default check layers (1..6) need a model of at least 7 layers; on a smaller
// one they narrow to the layers it has (said on stderr), so a small model runs on
// the defaults. Any other check layer past the model is a configuration error,
// reported at start-up rather than on every request.
void fit_check_layers_to_model(BlendOptions& blend, int n_layers) {
  const auto past = std::find_if(blend.check_layers.begin(), blend.check_layers.end(),
                                 [&](int l) { return l >= n_layers; });
  if (past == blend.check_layers.end()) return;
  if (blend.check_layers != BlendOptions{}.check_layers || !blend.schedule.empty() || n_layers < 2)
    throw std::invalid_argument("blend.check_layers: layer " + std::to_string(*past) +
                                " is past the model's last layer (" + std::to_string(n_layers - 1) + " of a " +
                                std::to_string(n_layers) + "-layer model)");
  std::vector<int> fit;
  for (int l : blend.check_layers)
    if (l < n_layers) fit.push_back(l);
  blend.check_layers = fit;
  std::fprintf(stderr, "blendserve: blend.check_layers: the default [1..%d] narrowed to [1..%d] for this %d-layer model\n",
               BlendOptions{}.check_layers.back(), fit.back(), n_layers);
}

// query_first_from_layer past the model's last layer: the default narrows to the last
// layer (the engine scores that one), a value named in the config is an error.
void fit_query_first_to_model(BlendOptions& blend, int n_layers) {
  if (blend.query_first_from_layer < n_layers) return;
  if (blend.query_first_from_layer != BlendOptions{}.query_first_from_layer)
    throw std::invalid_argument("blend.query_first_from_layer: layer " + std::to_string(blend.query_first_from_layer) +
                                " is past the model's last layer (" + std::to_string(n_layers - 1) + " of a " +
                                std::to_string(n_layers) + "-layer model)");
  blend.query_first_from_layer = n_layers - 1;
}

// CAF's scheduler threads only pass messages: few of them, sleeping soon when
// idle, so they never compete with the compute thread for the cores. Every actor
// whose handlers may block runs detached, on a thread of its own: the intake
// (tokenizing), the controller (SSD lookups: open, header read), the loaders, the
// SSD writer and the remote writer (I/O), the decoder (sampling, the caller's
// callbacks), the inspector (the trace file), write-back (its RAM put page-locks the
// entry on a device backend: a driver call of milliseconds for a large chunk) and the
// rank workers (a copy to a rank's device may block). The layer worker and the
// supervisor only pass messages, on the scheduler's threads.
struct RuntimeSystemConfig : caf::actor_system_config {
  RuntimeSystemConfig() {
    set("scheduler.max-threads", size_t{2});
    set("work-stealing.aggressive-poll-attempts", size_t{10});
    set("work-stealing.moderate-poll-attempts", size_t{50});
    set("logger.verbosity", caf::atom("quiet"));
    add_runtime_message_types(*this);
    add_error_category(runtime_error_category(), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
      std::string s = errc_name(static_cast<RequestErrc>(code));
      if (ctx.match_elements<std::string>()) s += ": " + ctx.get_as<std::string>(0);
      return s;
    });
  }
};

// A runtime error answered at the actor boundary, as the RequestError it stands for.
RequestError request_error_of(caf::actor_system& sys, const caf::error& failure) {
  std::string message = sys.render(failure);
  if (failure.category() == runtime_error_category() && failure.context().match_elements<std::string>())
    message = failure.context().get_as<std::string>(0);
  const auto code = failure.category() == runtime_error_category() ? static_cast<RequestErrc>(failure.code())
                                                                    : RequestErrc::internal;
  return RequestError(code, message);
}

// The name of loader i of tier t's pool.
std::string loader_name(const RuntimeContext& ctx, size_t tier, int i) {
  return "loader-" + ctx.tiers[tier].name + "-" + std::to_string(i);
}

// The text of an actor's exit reason: the message of a runtime error, else CAF's rendering.
std::string describe_exit(caf::actor_system& sys, const caf::error& reason) {
  if (reason.category() == runtime_error_category() && reason.context().match_elements<std::string>())
    return reason.context().get_as<std::string>(0);
  return sys.render(reason);
}

// Text a caller may fall behind its stream by before the request is cancelled (far
// above any answer: a context of 8k tokens is ~40 KB of text).
constexpr size_t kMaxPendingStreamBytes = size_t{4} << 20;
// How long shutdown waits for the callers' callbacks of ended requests to return.
constexpr std::chrono::seconds kCallbackDrain{10};

// "60 s", "0.5 s": a config duration in a sentence.
std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace

std::string resolve_model_path(const RuntimeConfig& config) {
  if (!config.model_path.empty()) return config.model_path;
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

struct Runtime::Actors {
  // The callers' callbacks run here, a stream at a time per thread (stuck or slow ones
  // hold only their own stream); declared first, so it is destroyed last.
  std::unique_ptr<StreamDelivery> delivery;
  RuntimeSystemConfig cfg;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<Handles> h = std::make_shared<Handles>();
  supervisor_actor supervisor;
  std::unordered_map<std::string, CountersPtr> counters;  // by actor name, kept across restarts
  std::mutex mu;
  int documents = 0;  // store_document calls waiting for the worker (shutdown waits for them)
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::vector<caf::actor> reporting;  // spawn_reporting_actor's: stopped at shutdown with the others
  bool stopped = false;

  // Spawns the actor called `name` (a fresh one: at start and after it died), puts
  // it in the Handles and returns it.
  caf::actor spawn(RuntimeContext* ctx, const std::string& name);
  // The supervisor's hooks: fail what the dead actor held and start its successor
  // (admission paused for backoff_s), or fail the runtime for good (give_up).
  caf::actor restart(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason,
                     double backoff_s);
  void give_up(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason, int deaths);
  // What the dead actor `name` held, failed with `failure` (both hooks).
  void fail_held(RuntimeContext* ctx, const std::string& name, uint64_t id, const std::string& failure);
  // Ends a request with an error now (on_done once; its slot back; the worker
  // drops what it holds for it), however far it got.
  void fail_request(RuntimeContext* ctx, const RecordPtr& r, const std::string& why);
};

caf::actor Runtime::Actors::spawn(RuntimeContext* ctx, const std::string& name) {
  auto& sys = *system;
  CountersPtr& c = counters[name];
  const bool fresh = !c;
  if (fresh) c = make_counters(name);
  if (name == "inspector") {
    auto x = sys.spawn<caf::detached>(inspector, ctx->config.trace_history,
                                      resolve_data_dir(ctx->config) + "/traces", ctx->config.node_name, c);
    h->update([&](ActorSet& s) { s.inspector = x; });
    // A new inspector knows no actor yet: every counter registers again (the
    // supervisor's too, which is spawned after the first inspector).
    for (const auto& [other, counters_of] : counters)
      if (other != "inspector") caf::anon_send(x, register_atom::value, counters_of);
    return caf::actor_cast<caf::actor>(x);
  }
  if (fresh) caf::anon_send(h->inspector(), register_atom::value, c);
  // Puts the new actor in its place in the handles.
  auto put = [&](auto ActorSet::*field, auto x) {
    h->update([&](ActorSet& s) { s.*field = x; });
    return caf::actor_cast<caf::actor>(x);
  };
  if (name == "intake") return put(&ActorSet::intake, sys.spawn<caf::detached>(intake, ctx, h, c));
  if (name == "controller") return put(&ActorSet::controller, sys.spawn<caf::detached>(controller, ctx, h, c));
  if (name == "ssd-writer") return put(&ActorSet::ssd_writer, sys.spawn<caf::detached>(writer, ctx, c));
  if (name == "remote-writer")
    return put(&ActorSet::remote_writer, sys.spawn<caf::detached>(remote_writer, ctx, c));
  if (name == "layer-worker") return put(&ActorSet::worker, sys.spawn(layer_worker, ctx, h, c));
  if (name == "write-back") return put(&ActorSet::write_back, sys.spawn<caf::detached>(write_back, ctx, h, c));
  if (name == "decoder") return put(&ActorSet::decoder, sys.spawn<caf::detached>(decoder, ctx, h, c));
  // "rank-worker-<r>": tensor-parallel follower rank r.
  for (int r = 1; ctx->tp && r < ctx->tp->size(); ++r)
    if (name == "rank-worker-" + std::to_string(r)) {
      auto x = sys.spawn<caf::detached>(rank_worker, ctx, h, r, c);
      h->update([&](ActorSet& s) {
        s.rank_workers.resize(static_cast<size_t>(ctx->tp->size() - 1));
        s.rank_workers[static_cast<size_t>(r - 1)] = x;
      });
      return caf::actor_cast<caf::actor>(x);
    }
  // "loader-<tier>-<i>": loader i of the tier's pool.
  for (size_t t = 0; t < ctx->tiers.size(); ++t)
    for (int i = 0; i < ctx->tiers[t].loaders; ++i)
      if (name == loader_name(*ctx, t, i)) {
        auto x = sys.spawn<caf::detached>(loader, ctx, h, static_cast<TierId>(t), c);
        h->update([&](ActorSet& s) {
          s.loaders.resize(ctx->tiers.size());
          s.loaders[t].resize(static_cast<size_t>(ctx->tiers[t].loaders));
          s.loaders[t][static_cast<size_t>(i)] = x;
        });
        return caf::actor_cast<caf::actor>(x);
      }
  throw std::logic_error("no actor is called " + name);
}

void Runtime::Actors::fail_request(RuntimeContext* ctx, const RecordPtr& r, const std::string& why) {
  r->cancelled = true;  // what still runs for it stops at its next step
  if (r->finished.exchange(true)) return;
  RequestResult res;
  res.id = r->id;
  res.finish_reason = "error";
  res.error = why;
  res.deadline_exceeded = r->expired.load();
  res.total_seconds = r->trace->now_s();
  r->trace->set("finish_reason", res.finish_reason);
  r->trace->set("error", why);
  ctx->traces.close(r->id);
  caf::anon_send(h->inspector(), trace_atom::value, r->trace->json());
  if (r->admitted.exchange(false)) {
    // The worker drops its load target and cache (a prefill stops at its next layer);
    // the intake gives back its slot and pages.
    caf::anon_send(h->worker(), end_atom::value, r->id);
    caf::anon_send(h->intake(), release_atom::value, r->id);
  }
  ctx->requests.erase(r->id);
  if (r->callbacks.on_done) r->callbacks.on_done(res);
}

caf::actor Runtime::Actors::restart(RuntimeContext* ctx, const std::string& name, uint64_t id,
                                    const caf::error& reason, double backoff_s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return {};
  }
  const std::string why = describe_exit(*system, reason);
  if (backoff_s > 0) {
    // Before the successor exists: a new intake reads the pause when it starts.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(backoff_s);
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
    int64_t prev = ctx->admit_after_ns.load();
    while (prev < ns && !ctx->admit_after_ns.compare_exchange_weak(prev, ns)) {
    }
    std::fprintf(stderr, "blendserve: %s; starting a new %s actor (died again within %g s: admission paused %g s)\n",
                 why.c_str(), name.c_str(), ctx->config.restart_window, backoff_s);
  } else {
    std::fprintf(stderr, "blendserve: %s; starting a new %s actor\n", why.c_str(), name.c_str());
  }
  ctx->restarts.fetch_add(1);
  counters[name]->restarts.fetch_add(1);
  counters[name]->set_error(why);
  const caf::actor next = spawn(ctx, name);
  fail_held(ctx, name, id, name + " stopped (" + why + ")");
  if (name == "intake") caf::anon_send(h->intake(), reconcile_atom::value);
  return next;
}

void Runtime::Actors::give_up(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason,
                              int deaths) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
  }
  const std::string why = describe_exit(*system, reason);
  const std::string failure = "the " + name + " actor died " + std::to_string(deaths) + " times within " +
                              fmt_seconds(ctx->config.restart_window) + " (limits.max_restarts " +
                              std::to_string(ctx->config.max_restarts) + "); the last time: " + why +
                              ". This server no longer serves requests; restart it";
  std::fprintf(stderr, "blendserve: %s\n", failure.c_str());
  // First the failure (submit refuses from now on), then what is in flight.
  ctx->failure.set(failure);
  counters[name]->set_error(why);
  fail_held(ctx, name, id, failure);
  // Queued and running requests of every kind end now: no successor will take them.
  for (const auto& r : ctx->requests.all()) fail_request(ctx, r, failure);
  if (name == "intake") {
    // Its gauges have no writer any more: nothing runs or waits.
    ctx->in_flight.store(0);
    ctx->queued.store(0);
  }
}

void Runtime::Actors::fail_held(RuntimeContext* ctx, const std::string& name, uint64_t id,
                                const std::string& failure) {
  if (name.rfind("loader-", 0) == 0) {
    // Its requests' layers will not come: the worker, which owns their load targets,
    // fails them (and counts the loader done with them).
    caf::anon_send(h->worker(), loader_down_atom::value, id, failure);
  } else if (name == "ssd-writer") {
    // The writes queued in its mailbox died with it (a cache: recomputed on a miss).
    ctx->ssd_write_queue.bytes.store(0);
  } else if (name == "remote-writer") {
    ctx->remote_write_queue.bytes.store(0);
  } else if (name == "write-back") {
    // Stores in its mailbox died with it (a cache: recomputed on a miss); no request waits for them.
  } else if (name == "intake") {
    // Its queue and its ledger of slots and pages died with it: every request it held,
    // queued or running, fails; then a new intake rebuilds the ledger from the records
    // still admitted (by it, meanwhile; restart sends it reconcile), now that the
    // releases it may have missed (sent to the dead one) can no longer matter.
    for (const auto& r : ctx->requests.all()) fail_request(ctx, r, failure);
  } else if (name != "inspector") {
    // Running requests pass through the controller, worker and decoder by message:
    // any of them may have been in the dead actor's mailbox.
    if (name.rfind("rank-worker-", 0) == 0) {
      // Jobs in its mailbox died with it: rank 0's job waiting on that rank stops now,
      // and the group is rebuilt before the next job. Its requests' caches are its
      // compute thread's, not the actor's: they live on and go at their End.
      const int rank = std::stoi(name.substr(std::string("rank-worker-").size()));
      ctx->tp->forget_jobs(rank);
      ctx->tp->comm(rank).abort(failure);
      // Its load targets died with it: the worker fails the prefills loading there.
      caf::anon_send(h->worker(), rank_down_atom::value, static_cast<int32_t>(rank), failure);
    }
    // A layer worker that died failed its own prefills' gates as it went (the loaders
    // stop at their next layer); its caches and decode batcher went with it.
    for (const auto& r : ctx->requests.all())
      if (r->admitted.load()) fail_request(ctx, r, failure);
  }
}

// device.kv_cache_bytes = 0: room for limits.max_requests contexts of the model's
// full length, at most half the machine's memory (pages are touched only when used,
// so a large pool costs address space, not memory, until requests fill it), or on a
// device backend at most 90% of its free memory.
static int64_t kv_cache_default_bytes(const RuntimeConfig& config, const LlamaConfig& mc, kernels::TensorType dtype,
                                      const kernels::Backend& backend) {
  const int64_t per_position =
      2 * static_cast<int64_t>(mc.n_layers) * mc.n_kv_heads * mc.head_dim * kernels::kv_dtype_bytes(dtype);
  const int64_t page = int64_t{1} << KvPagePool::kDefaultPageShift;
  const int64_t context_pages = (mc.context_length + page - 1) / page;
  const int64_t want = static_cast<int64_t>(config.max_requests) * context_pages * page * per_position;
  const long phys = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  const int64_t half_memory = phys > 0 && page_size > 0 ? static_cast<int64_t>(phys) * page_size / 2 : want;
  // A device backend's pool is device memory, touched or not: 90% of what is free once
  // the weights are there (activations and cuBLAS take the rest).
  const int64_t device_free = backend.free_memory_bytes();
  if (device_free >= 0) return std::min(want, device_free / 10 * 9);
  return std::min(want, half_memory);
}

Runtime::Runtime(const RuntimeConfig& config) : ctx_(std::make_unique<RuntimeContext>()) {
  auto& ctx = *ctx_;
  ctx.config = config;
  ctx.config.model_path = resolve_model_path(ctx.config);
  kernels::DecodeActivations decode{};
  if (ctx.config.decode_activations != "auto" &&
      !kernels::decode_activations_from_name(ctx.config.decode_activations, decode))
    throw ConfigError("model.decode_activations: unknown value '" + ctx.config.decode_activations +
                      "' (auto, exact, int8)");
  if (ctx.config.gpus.empty()) throw ConfigError("device.gpus: must name at least one device (e.g. [0])");
  // The ranks' devices and what joins them (before any backend: a wrong combination is
  // refused on any machine, with or without a GPU).
  const bool on_cuda = ctx.config.device_kind == "cuda";
  if (!kernels::is_communicator_kind(ctx.config.communicator))
    throw ConfigError("device.communicator: unknown communicator '" + ctx.config.communicator +
                      "' (auto, inprocess, nccl)");
  const std::string comm_kind = kernels::resolve_communicator_kind(ctx.config.communicator, ctx.config.device_kind);
  if (comm_kind == "nccl" && !on_cuda)
    throw ConfigError("device.communicator: nccl joins GPU ranks, and device.kind is " + ctx.config.device_kind +
                      " (inprocess or auto joins CPU ranks)");
  if (comm_kind == "inprocess" && on_cuda && ctx.config.tp > 1)
    throw ConfigError("device.communicator: inprocess joins CPU ranks through host memory; GPU ranks need nccl "
                      "(or auto)");
  if (on_cuda && ctx.config.tp > 1) {
    const size_t tp_ranks = static_cast<size_t>(ctx.config.tp);
    if (ctx.config.gpus.size() < tp_ranks)
      throw ConfigError("device.gpus: tp " + std::to_string(ctx.config.tp) +
                        " on cuda puts each rank on a GPU of its own: list " + std::to_string(ctx.config.tp) +
                        " devices (e.g. [0, 1]); " + std::to_string(ctx.config.gpus.size()) + " listed");
    for (size_t a = 0; a < tp_ranks; ++a)
      for (size_t b = a + 1; b < tp_ranks; ++b)
        if (ctx.config.gpus[a] == ctx.config.gpus[b])
          throw ConfigError("device.gpus: GPU " + std::to_string(ctx.config.gpus[a]) + " is listed for ranks " +
                            std::to_string(a) + " and " + std::to_string(b) +
                            "; NCCL 2.28 refuses two ranks on one GPU");
  }
  // Rank r's device: gpus[r] on cuda.
  auto device_of = [&](int rank) {
    return on_cuda && static_cast<size_t>(rank) < ctx.config.gpus.size() ? ctx.config.gpus[static_cast<size_t>(rank)]
                                                                         : ctx.config.gpus.front();
  };
  // One backend per rank (each owns its buffers and workspace), on the rank's device.
  auto make_backend = [&](int rank) {
    kernels::BackendChoice choice;
    choice.kind = ctx.config.device_kind;
    choice.gpu = device_of(rank);
    choice.decode_activations = ctx.config.decode_activations;
    choice.wait_timeout_s = ctx.config.device_wait_timeout;
    try {
      return kernels::make_backend(choice);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("device.kind: ") + e.what());
    } catch (const std::runtime_error& e) {
      throw ConfigError(std::string("device.kind: ") + e.what());
    }
  };
  ctx.backend = make_backend(0);
  ctx.precision = kernels::choose_precision(ctx.config.precision, *ctx.backend);
  kernels::TensorType kv_dtype = kernels::TensorType::F32;
  if (!kernels::kv_dtype_from_name(ctx.config.kv_dtype, kv_dtype))
    throw ConfigError("device.kv_dtype: unknown KV dtype '" + ctx.config.kv_dtype + "' (f32, f16, bf16)");
  const int tp = ctx.config.tp;
  if (tp < 1) throw ConfigError("device.tp: must be >= 1 (1 = no tensor parallelism)");
  // Rank r's shard of the model; a degree that does not divide it is a configuration error.
  // The operator's chat template (model.chat_template) replaces the model's: checked once
  // the first shard has loaded (its tokens come from the model's tokenizer), a wrong one
  // refused as a configuration error, then given to every shard.
  std::optional<ChatTemplate> chat_template;
  auto load_shard = [&](kernels::Backend& backend, int rank) {
    std::unique_ptr<LlamaModel> m;
    try {
      m = std::make_unique<LlamaModel>(ctx.config.model_path, backend, ctx.precision, kv_dtype, TpShard{rank, tp});
    } catch (const std::invalid_argument& e) {
      if (tp > 1) throw ConfigError(std::string("device.tp: ") + e.what());
      throw;
    }
    if (!ctx.config.chat_template.empty()) {
      try {
        if (!chat_template) chat_template = ChatTemplate::from_operator(ctx.config.chat_template, m->tokenizer());
      } catch (const std::invalid_argument& e) {
        throw ConfigError(std::string("model.chat_template: ") + e.what());
      }
      m->set_chat_template(*chat_template);
    }
    return m;
  };
  ctx.model = load_shard(*ctx.backend, 0);
  fit_check_layers_to_model(ctx.config.blend, ctx.model->config().n_layers);
  fit_query_first_to_model(ctx.config.blend, ctx.model->config().n_layers);
  // Tensor parallel: the cores split between the ranks (at least one thread each).
  const int all_threads = ctx.config.threads > 0 ? ctx.config.threads
                                                 : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int rank_threads = tp > 1 ? std::max(1, all_threads / tp) : ctx.config.threads;
  // The group: device.communicator's kind over the ranks' devices; a rebuild after a
  // failure makes the same kind again (TpRanks).
  std::vector<int> rank_devices;
  for (int r = 0; r < tp; ++r) rank_devices.push_back(device_of(r));
  const auto timeout = Transformer::kDefaultCollectiveTimeout;
  auto make_comms = [comm_kind, rank_devices, timeout] {
    return kernels::make_group(comm_kind, rank_devices, timeout);
  };
  auto first_group = [&] {
    try {
      return make_comms();
    } catch (const std::exception& e) {
      throw std::runtime_error("device.communicator: the " + comm_kind + " group of " + std::to_string(tp) +
                               " ranks did not form: " + e.what());
    }
  };
  std::vector<std::unique_ptr<kernels::Communicator>> comms;
  if (tp > 1) {
    comms = first_group();
    ctx.tf = std::make_unique<Transformer>(*ctx.model, comms[0].get(), timeout);
  } else if (ctx.config.communicator == "nccl") {
    // tp 1 over NCCL, asked for by name: the model's all-reduces through a group of one.
    ctx.solo_comm = std::move(first_group().front());
    ctx.tf = std::make_unique<Transformer>(*ctx.model, ctx.solo_comm.get(), timeout, Transformer::Solo::Run);
  } else {
    ctx.tf = std::make_unique<Transformer>(*ctx.model);
  }
  // device.kv_cache_bytes holds every rank's KV: each rank's pool has the same pages
  // (a request needs as many on every rank), each of its own heads.
  const auto& full = ctx.model->full_config();
  const int64_t kv_bytes =
      ctx.config.kv_cache_bytes > 0 ? ctx.config.kv_cache_bytes : kv_cache_default_bytes(ctx.config, full, kv_dtype, *ctx.backend);
  constexpr int page_shift = KvPagePool::kDefaultPageShift;
  const int64_t kv_pages = KvPagePool::pages_in(kv_bytes, full.n_layers, full.n_kv_heads, full.head_dim, page_shift, kv_dtype);
  auto make_pool = [&](kernels::Backend& backend, const LlamaConfig& mc) {
    try {
      return KvPagePool::make(backend, mc.n_layers, mc.n_kv_heads, mc.head_dim, kv_pages, page_shift, kv_dtype);
    } catch (const std::bad_alloc&) {
      throw ConfigError("device.kv_cache_bytes: cannot allocate a KV cache of " + std::to_string(kv_bytes) +
                        " bytes on this machine");
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("device.kv_cache_bytes: ") + e.what());
    }
  };
  ctx.kv_pool = make_pool(*ctx.backend, ctx.model->config());
  if (ctx.config.ram.enabled) {
    // On a device backend the RAM tier's entries are page-locked as they are stored, so
    // a loader's DMA reads them in place (Backend::pin_host; the CPU backends pin nothing).
    MemoryKvStore::Pinner pinner;
    if (!ctx.backend->host_accessible()) {
      kernels::Backend* be = ctx.backend.get();
      pinner = [be](const void* p, int64_t bytes) { return be->pin_host(p, bytes); };
    }
    ctx.ram = std::make_unique<MemoryKvStore>(ctx.config.ram.budget_bytes, std::move(pinner));
  }
  if (ctx.config.find_pasted) ctx.pasted = std::make_unique<PastedChunkIndex>();
  if (ctx.config.ssd.enabled) {
    // The chunks already on the SSD are findable pasted from the first request on.
    DiskKvStore::EntryVisitor learn;
    if (ctx.pasted) learn = [index = ctx.pasted.get()](const ChunkKey&, std::span<const int32_t> t) { index->add(t); };
    ctx.ssd = std::make_unique<DiskKvStore>(resolve_ssd_path(ctx.config), ctx.config.ssd.budget_bytes,
                                            ctx.config.ssd.direct_io, learn, ctx.config.ssd.file_io);
    if (ctx.config.ssd.throttle_bytes_per_s > 0) ctx.ssd->set_read_throttle(ctx.config.ssd.throttle_bytes_per_s);
  }
  if (ctx.config.remote.enabled) {
    const RemoteTierConfig& rc = ctx.config.remote;
    // The storage nodes (a cluster's; else the one at host:port), each its own store.
    std::vector<RemoteNodeAddress> addresses = rc.nodes;
    if (addresses.empty()) addresses.push_back({rc.host + ":" + std::to_string(rc.port), rc.host, rc.port});
    std::vector<ReplicaNode> nodes;
    for (const auto& a : addresses) {
      RemoteStoreOptions ro;
      ro.host = a.host;
      ro.port = a.port;
      ro.secret = rc.secret;
      ro.connect_timeout_s = rc.connect_timeout_s;
      ro.io_timeout_s = rc.io_timeout_s;
      ro.retry_after_s = rc.retry_after_s;
      ro.layers_in_flight = rc.layers_in_flight;
      ro.max_connections = rc.max_connections;
      ro.tls = rc.tls;
      ro.tls_peer_name = rc.nodes.empty() ? rc.tls_peer_name : a.name;
      nodes.push_back({a.name, std::move(ro)});
    }
    try {
      ctx.remote = std::make_unique<ReplicatedKvStore>(std::move(nodes), std::min<int>(rc.replication,
                                                                                        static_cast<int>(addresses.size())));
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("tiers.remote: ") + e.what());
    } catch (const std::runtime_error& e) {  // TLS files missing or not the CA's
      throw ConfigError(std::string("tiers.remote: ") + e.what() +
                        " (a cluster's certificates are made by `blendctl cluster init F`)");
    }
  }
  // The stored tiers in lookup order, with the controller's start values (RAM
  // copies, a laptop SSD, a 10 Gbit/s link) until it measured them.
  if (ctx.ram) ctx.tiers.push_back({"ram", ctx.ram.get(), 8e9, ctx.config.ram.loaders});
  if (ctx.ssd) ctx.tiers.push_back({"ssd", ctx.ssd.get(), 1.5e9, ctx.config.ssd.loaders});
  if (ctx.remote) ctx.tiers.push_back({"remote", ctx.remote.get(), 1.2e9, ctx.config.remote.loaders});
  std::vector<KvStore*> stores;
  for (const auto& t : ctx.tiers)
    if (t.store != ctx.remote.get()) stores.push_back(t.store);
  ctx.tiered = std::make_unique<TieredKvStore>(stores);
  const std::vector<int32_t> prelude = chunk_prelude_tokens(ctx.model->tokenizer(), ctx.config.chunk_prelude);
  ctx.engine = std::make_unique<BlendEngine>(*ctx.tf, prelude);
  ctx.compute = std::make_unique<ComputeThread>(rank_threads, std::chrono::seconds(2),
                                                make_counters(tp > 1 ? "compute-thread-rank-0" : "compute-thread"));
  if (tp > 1) {
    ctx.tp = std::make_unique<TpRanks>(std::move(comms), std::move(make_comms), *ctx.tf, timeout);
    for (int r = 1; r < tp; ++r) {
      RankFollower::Parts p;
      p.backend = make_backend(r);
      p.model = load_shard(*p.backend, r);
      p.tf = std::make_unique<Transformer>(*p.model, &ctx.tp->comm(r), timeout);
      p.kv_pool = make_pool(*p.backend, p.model->config());
      p.engine = std::make_unique<BlendEngine>(*p.tf, prelude);
      p.compute = std::make_unique<ComputeThread>(rank_threads, std::chrono::seconds(2),
                                                  make_counters("compute-thread-rank-" + std::to_string(r)));
      ctx.tp->add_follower(std::make_unique<RankFollower>(r, std::move(p), *ctx.tp, ctx.traces));
    }
  }

  actors_ = std::make_unique<Actors>();
  auto& a = *actors_;
  // A thread per stream that may produce text at once, two for the ends of the others.
  a.delivery = std::make_unique<StreamDelivery>(ctx.config.max_requests + 2, kMaxPendingStreamBytes);
  a.system = std::make_unique<caf::actor_system>(a.cfg);
  auto& sys = *a.system;
  auto h = a.h;
  RuntimeContext* c = ctx_.get();
  // Before any actor exists: the intake calls it from its own thread.
  ctx.fail_request = [&a, c](const RecordPtr& r, const std::string& why) { a.fail_request(c, r, why); };
  // The compute threads report as actors do; the inspector registers every counter
  // of this table when it starts.
  a.counters[ctx.compute->counters()->name] = ctx.compute->counters();
  for (int r = 1; ctx.tp && r < tp; ++r) {
    const auto& fc = ctx.tp->follower(r).compute().counters();
    a.counters[fc->name] = fc;
  }
  std::vector<std::string> names{"inspector", "intake", "controller"};
  for (size_t t = 0; t < ctx.tiers.size(); ++t)
    for (int i = 0; i < ctx.tiers[t].loaders; ++i) names.push_back(loader_name(ctx, t, i));
  if (ctx.ssd) names.push_back("ssd-writer");
  if (ctx.remote && ctx.config.remote.write_back) names.push_back("remote-writer");
  names.insert(names.end(), {"layer-worker", "write-back", "decoder"});
  for (int r = 1; r < tp; ++r) names.push_back("rank-worker-" + std::to_string(r));
  std::vector<caf::actor> spawned;
  for (const auto& name : names) spawned.push_back(a.spawn(c, name));
  if (ctx.tp)
    ctx.tp->set_send([h](int rank, RankJob job) {
      caf::anon_send(h->rank_worker(rank), rank_job_atom::value, std::move(job));
    });
  Actors* actors = &a;
  SupervisorHooks hooks;
  hooks.restart = [actors, c](const std::string& name, uint64_t id, const caf::error& why, double backoff_s) {
    return actors->restart(c, name, id, why, backoff_s);
  };
  hooks.give_up = [actors, c](const std::string& name, uint64_t id, const caf::error& why, int deaths) {
    actors->give_up(c, name, id, why, deaths);
  };
  hooks.limits = RestartLimits{ctx.config.max_restarts, ctx.config.restart_window, ctx.config.restart_backoff,
                               ctx.config.restart_backoff_max};
  a.supervisor = sys.spawn(supervisor, std::move(hooks), a.counters["supervisor"] = make_counters("supervisor"));
  caf::anon_send(h->inspector(), register_atom::value, a.counters["supervisor"]);
  for (size_t i = 0; i < names.size(); ++i) caf::anon_send(a.supervisor, supervise_atom::value, spawned[i], names[i]);
  // Demotion: an entry evicted from RAM goes to the SSD unless it is there already, or
  // is a provisional entry (a request's in-context KV: RAM only, actors/chunk_flights.h).
  if (ctx.ram && ctx.ssd) {
    ctx.ram->set_eviction_listener([c, h](const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
      if (!c->ssd->contains(key) && !c->flights.provisional(key))
        enqueue_write(*c, h->ssd_writer(), KeyedKv{key, std::move(kv)});
    });
  }
}

Runtime::~Runtime() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blendserve: shutdown: %s\n", e.what());
  }
}

uint64_t Runtime::submit(RuntimeRequest request, RequestCallbacks callbacks) {
  auto& a = *actors_;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
  }
  if (ctx_->failure.failed()) throw RequestError(RequestErrc::unavailable, ctx_->failure.why());
  auto r = std::make_shared<RequestRecord>();
  r->id = ctx_->next_id.fetch_add(1);
  r->submitted = std::chrono::steady_clock::now();
  r->request = std::move(request);
  r->callbacks = a.delivery->wrap(std::move(callbacks));
  r->trace = ctx_->traces.open(r->id, r->submitted);
  const uint64_t id = r->id;
  // Registered before the intake answers: on_done may run before receive() returns.
  ctx_->requests.put(r);
  caf::error failure;
  {
    CallerActor self{*a.system};
    // The intake answers once it has tokenized and keyed the prompt (milliseconds);
    // the bound only matters if it died with the request in its mailbox.
    self->request(a.h->intake(), std::chrono::seconds(60), submit_atom::value, id)
        .receive([&](uint64_t) {}, [&](caf::error& e) { failure = std::move(e); });
  }
  if (failure) {
    ctx_->requests.erase(id);
    ctx_->traces.close(id);
    throw request_error_of(*a.system, failure);
  }
  return id;
}

RequestResult Runtime::run(RuntimeRequest request, std::function<bool(std::string_view)> on_text) {
  auto done = std::make_shared<std::promise<RequestResult>>();
  auto fut = done->get_future();
  RequestCallbacks cb;
  cb.on_text = std::move(on_text);
  cb.on_done = [done](const RequestResult& res) { done->set_value(res); };
  const uint64_t id = submit(std::move(request), std::move(cb));
  // The intake ends the request at limits.max_request_seconds (and fails it where it
  // stands 10 s later); this wait's own bound only matters if that did not happen.
  const double limit = ctx_->config.max_request_seconds;
  if (limit > 0 && fut.wait_for(std::chrono::duration<double>(limit + 60)) != std::future_status::ready) {
    cancel(id);
    throw RequestError(RequestErrc::internal, "request " + std::to_string(id) + " had no answer " +
                                                  fmt_seconds(limit + 60) + " after it was submitted");
  }
  return fut.get();
}

std::string Runtime::failure() const { return ctx_->failure.why(); }

bool Runtime::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(actors_->mu);
  if (actors_->stopped) return false;  // shutdown cancels everything itself
  const RecordPtr r = ctx_->requests.find(id);
  if (!r) return false;
  r->cancelled = true;
  // A queued request leaves the queue now; a running one ends at its next step
  // (a prefill at its next layer boundary, its loaders at their next layer).
  caf::anon_send(actors_->h->intake(), cancel_atom::value, id);
  caf::anon_send(actors_->h->worker(), cancel_atom::value, id);
  return true;
}


Runtime::StoredDocument Runtime::store_document(const std::string& text) {
  const auto tokens = document_chunk_tokens(ctx_->model->tokenizer(), text);
  if (tokens.empty()) throw RequestError(RequestErrc::invalid, "the document is empty");
  if (static_cast<int64_t>(tokens.size()) >= ctx_->model->config().context_length)
    throw RequestError(RequestErrc::too_long, "the document has " + std::to_string(tokens.size()) +
                                                  " tokens; the model's context is " +
                                                  std::to_string(ctx_->model->config().context_length));
  const ChunkKey key = ctx_->engine->chunk_key(tokens);
  StoredDocument out;
  out.id = key.hex();
  out.tokens = static_cast<int64_t>(tokens.size());
  out.already_stored = ctx_->tiered->contains(key);
  out.source = "local";
  // The storage node's copy: checked once here, so a document already there is
  // neither computed again nor pushed again. A node that is down answers false at
  // once (RemoteKvStore's retry_after), which costs a compute, never a wrong answer.
  const bool on_node = ctx_->remote && ctx_->remote->contains(key);
  std::shared_ptr<const ChunkKv> kv;
  if (!out.already_stored && on_node) {
    kv = ctx_->remote->get(key);  // every layer checked against the node's checksums; nullptr on any failure
    if (kv) out.source = "remote";
  }
  if (!out.already_stored && !kv) {
    // The layer worker computes it on the compute thread, like every other
    // compute, with the decoding streams' steps between its layers.
    auto& a = *actors_;
    worker_actor worker;
    {
      std::lock_guard<std::mutex> lock(a.mu);
      if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
      worker = a.h->worker();
      ++a.documents;  // the actor system outlives this call (shutdown waits)
    }
    std::optional<RequestError> failure;  // shutting down (the worker or the compute thread stopped), internal
    {
      CallerActor self{*a.system};
      // The compute waits behind prefills and decode steps; ten load timeouts bound it.
      const auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::duration<double>(10 * ctx_->config.load_timeout));
      self->request(worker, bound, document_atom::value, tokens)
          .receive([&](KeyedKv& kk) { kv = std::move(kk.kv); },
                   [&](caf::error& e) {
                     if (e.category() == runtime_error_category())
                       failure = request_error_of(*a.system, e);
                     else if (e == caf::sec::request_timeout)
                       failure = RequestError(RequestErrc::internal, "the document's compute did not finish within " +
                                                                         std::to_string(bound.count() / 1000) + " s");
                     else
                       failure = RequestError(RequestErrc::shutting_down, "the runtime is shut down");
                   });
    }
    {
      std::lock_guard<std::mutex> lock(a.mu);
      --a.documents;
    }
    if (failure) throw *failure;
    out.source = "computed";
  }
  out.on_storage_node = on_node;
  if (ctx_->remote && ctx_->config.remote.write_back && !on_node) {
    if (!kv) kv = ctx_->tiered->get(key);  // held here only: the node gets this node's copy
    // Synchronous (bounded by the remote tier's I/O timeout): the caller learns
    // whether the cluster has the document, unlike write-back's best-effort queue.
    out.on_storage_node = kv && ctx_->remote->put(key, kv);
  }
  if (!out.already_stored && kv) ctx_->tiered->put(key, std::move(kv));
  for (const auto& t : ctx_->tiers)
    if (t.store != ctx_->remote.get() && t.store->contains(key)) out.tiers.push_back(t.name);
  if (out.tiers.empty() && !out.on_storage_node)
    throw RequestError(RequestErrc::internal, "the document could not be stored: every tier of this node refused "
                                              "it (GET /v1/inspect/stores shows the write errors)");
  if (ctx_->pasted) ctx_->pasted->add(tokens);
  return out;
}

bool Runtime::erase_document(const std::string& key_hex) {
  if (key_hex.size() != 32) return false;
  ChunkKey key;
  try {
    key.hi = std::stoull(key_hex.substr(0, 16), nullptr, 16);
    key.lo = std::stoull(key_hex.substr(16), nullptr, 16);
  } catch (const std::exception&) {
    return false;
  }
  if (key.hex() != key_hex) return false;
  const bool here = ctx_->tiered->erase(key);
  const bool on_node = ctx_->remote && ctx_->remote->erase(key);
  return here || on_node;
}

std::string Runtime::traces_json(int n) {
  std::string out = "[]";
  CallerActor self{*actors_->system};
  self->request(actors_->h->inspector(), std::chrono::seconds(10), get_trace_atom::value, static_cast<int32_t>(n))
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::actors_json() {
  std::string out;
  CallerActor self{*actors_->system};
  self->request(actors_->h->inspector(), std::chrono::seconds(10), actors_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  if (out.empty()) return "[]";  // the inspector is being restarted
  auto j = nlohmann::json::parse(out).at("actors");
  // A follower rank's compute thread also says how many requests' caches it holds.
  for (auto& row : j)
    for (int r = 1; ctx_->tp && r < ctx_->tp->size(); ++r)
      if (row.value("actor", "") == "compute-thread-rank-" + std::to_string(r))
        row["requests"] = ctx_->tp->follower(r).requests();
  return j.dump();
}

std::string Runtime::requests_json() const { return requests_in_flight(*ctx_).dump(); }

std::string Runtime::request_trace_json(uint64_t id) {
  if (const RecordPtr r = ctx_->requests.find(id)) return r->trace->json();
  for (const auto& t : nlohmann::json::parse(traces_json(std::max(ctx_->config.trace_history, 1))))
    if (t.value("id", uint64_t{0}) == id) return t.dump();
  return "";
}

std::string Runtime::snapshot_json() {
  nlohmann::json node;
  node["name"] = ctx_->config.node_name;
  node["backend"] = ctx_->backend->kernel_id();
  node["tp"] = ctx_->tp ? ctx_->tp->size() : 1;
  node["model"] = ctx_->model->path();
  node["queue"] = {{"in_flight", in_flight()},
                   {"queued", queued()},
                   {"max_requests", ctx_->config.max_requests},
                   {"max_queue", ctx_->config.max_queue}};
  const auto kv = kv_pages();
  node["kv_pages"] = {{"total", kv.total}, {"used", kv.used}, {"reserved", kv.reserved}, {"page_bytes", kv.page_bytes}};
  const auto ds = decode_stats();
  node["decode"] = {{"steps", ds.steps}, {"tokens", ds.tokens}, {"interleaved_steps", ds.interleaved_steps}};
  node["tiers"] = nlohmann::json::parse(stores_json());
  const auto rs = reuse_stats();
  node["reuse"] = {{"chunks_computed", rs.chunks_computed},
                   {"computes_joined", rs.computes_joined},
                   {"provisional_entries", rs.provisional_entries},
                   {"computes_in_flight", rs.computes_in_flight},
                   {"write_backs_refused", rs.write_backs_refused}};
  node["actor_restarts"] = actor_restarts();
  std::string table;
  {
    CallerActor self{*actors_->system};
    self->request(actors_->h->inspector(), std::chrono::seconds(10), actors_atom::value)
        .receive([&](const std::string& s) { table = s; }, [&](caf::error&) {});
  }
  if (!table.empty()) {
    auto t = nlohmann::json::parse(table);
    node["actors"] = std::move(t.at("actors"));
    node["traces"] = std::move(t.at("traces"));
  } else {
    node["actors"] = nlohmann::json::array();
  }
  node["requests"] = requests_in_flight(*ctx_);
  nlohmann::json recent = nlohmann::json::array();
  for (const auto& t : nlohmann::json::parse(traces_json(20))) recent.push_back(finished_request_summary(t));
  node["recent"] = std::move(recent);
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - actors_->started).count();
  return nlohmann::json{{"time_s", uptime}, {"nodes", nlohmann::json::array({std::move(node)})}}.dump();
}

std::function<void()> Runtime::spawn_reporting_actor(const std::string& name, std::function<void()> work) {
  auto& a = *actors_;
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
  if (a.counters.count(name)) throw std::invalid_argument("an actor is already called " + name);
  CountersPtr c = a.counters[name] = make_counters(name);
  // Detached: its work may block, as any blocking actor of the runtime runs.
  caf::actor x = a.system->spawn<caf::detached>([c, work](caf::event_based_actor* self) -> caf::behavior {
    return {[=](int32_t) {
      BusyScope busy(*c, self->mailbox().size());
      // Unsupervised: a failing message is reported, never the end of the actor.
      try {
        work();
      } catch (const std::exception& e) {
        c->set_error(e.what());
      }
    }};
  });
  a.reporting.push_back(x);
  caf::anon_send(a.h->inspector(), register_atom::value, c);
  caf::actor_addr addr = x.address();
  return [addr] {
    if (auto target = caf::actor_cast<caf::actor>(addr)) caf::anon_send(target, int32_t{0});
  };
}

std::string Runtime::profile_json() {
  std::string out = "{}";
  CallerActor self{*actors_->system};
  self->request(actors_->h->controller(), std::chrono::seconds(10), get_profile_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::stores_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& tier : ctx_->tiers) {
    KvStore* s = tier.store;
    const auto st = s->stats();
    j[tier.name] = {{"hits", st.hits},       {"misses", st.misses},   {"puts", st.puts},
                                 {"evictions", st.evictions}, {"bytes", st.bytes}, {"entries", st.entries},
                                 {"corrupt", st.corrupt},  {"write_errors", st.write_errors}, {"budget", s->budget()},
                                 {"load_bytes", tier.load->bytes.load()}, {"load_s", tier.load->ns.load() * 1e-9},
                                 {"loads", tier.load->loads.load()}};
  }
  if (ctx_->ssd) {
    const auto& q = ctx_->ssd_write_queue;
    auto& ssd = j["ssd"];
    ssd["write_queue_bytes"] = q.bytes.load();
    ssd["write_queue_high_water"] = q.high_water.load();
    ssd["write_queue_limit"] = ctx_->config.ssd.write_queue_bytes;
    ssd["writes_dropped"] = q.dropped.load();
    ssd["writes"] = q.written.load();
  }
  if (ctx_->remote) {
    const auto& q = ctx_->remote_write_queue;
    auto& remote = j["remote"];
    remote["endpoint"] = ctx_->config.remote.host + ":" + std::to_string(ctx_->config.remote.port);
    remote["last_error"] = ctx_->remote->last_error();
    remote["write_back"] = ctx_->config.remote.write_back;
    remote["write_queue_bytes"] = q.bytes.load();
    remote["writes_dropped"] = q.dropped.load();
    remote["writes"] = q.written.load();
  }
  return j.dump();
}

void Runtime::shutdown(bool finish_write_back) {
  auto& a = *actors_;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.stopped) return;
    a.stopped = true;
    // First: the intake refuses whatever reaches it from now on.
    ctx_->shutting_down = true;
    for (const auto& r : ctx_->requests.all()) {
      r->cancelled = true;
      caf::anon_send(a.h->intake(), cancel_atom::value, r->id);  // queued: finished now
      caf::anon_send(a.h->worker(), cancel_atom::value, r->id);  // running: stops at its next step
    }
  }
  // Requests in flight end at their next step (a prefill at its next layer
  // boundary); every accepted request has had its on_done when the book is empty.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto busy = [&] {
    std::lock_guard<std::mutex> lock(a.mu);
    return ctx_->in_flight.load() > 0 || ctx_->queued.load() > 0 || ctx_->requests.size() > 0 || a.documents > 0;
  };
  while (busy() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Every request has ended; their callbacks run out (a caller's callback that is stuck
  // is left behind after kCallbackDrain: it cannot hold the shutdown).
  a.delivery->shutdown(kCallbackDrain);
  // Background write-back computes are dropped (they are a cache, recomputed on
  // demand); the one running finishes. Then every store already handed to the
  // write-back actor or the tiers' writers is written before the actors stop.
  ctx_->compute->stop(finish_write_back);
  // The followers run what rank 0 ran (the jobs it sent), then stop.
  for (int r = 1; ctx_->tp && r < ctx_->tp->size(); ++r) ctx_->tp->follower(r).compute().stop(false);
  {
    CallerActor self{*a.system};
    self->request(a.h->write_back(), std::chrono::seconds(120), flush_atom::value).receive([](bool) {}, [](caf::error&) {});
  }
  if (ctx_->ram) ctx_->ram->set_eviction_listener({});
  {
    // Each actor is watched going down; only then are the handles dropped (an actor
    // that still runs may read them). Dropping them ends the cycle actor -> Handles
    // -> actor, so the detached actors' threads can end; no strong handle of this
    // block outlives it. The supervisor restarts nothing from here on (`stopped`,
    // and exits for shutdown are not deaths to repair).
    const ActorSet all = a.h->all();
    std::vector<caf::actor> actors{caf::actor_cast<caf::actor>(a.supervisor), caf::actor_cast<caf::actor>(all.intake),
                                   caf::actor_cast<caf::actor>(all.controller), caf::actor_cast<caf::actor>(all.ssd_writer),
                                   caf::actor_cast<caf::actor>(all.remote_writer),
                                   caf::actor_cast<caf::actor>(all.worker),     caf::actor_cast<caf::actor>(all.write_back),
                                   caf::actor_cast<caf::actor>(all.decoder),    caf::actor_cast<caf::actor>(all.inspector)};
    for (const auto& pool : all.loaders)
      for (const auto& l : pool) actors.push_back(caf::actor_cast<caf::actor>(l));
    for (const auto& rw : all.rank_workers) actors.push_back(caf::actor_cast<caf::actor>(rw));
    actors.insert(actors.end(), a.reporting.begin(), a.reporting.end());
    a.reporting.clear();
    CallerActor self{*a.system};
    size_t waiting = 0;
    for (const caf::actor& x : actors)
      if (x) {
        self->monitor(x);
        caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
        ++waiting;
      }
    bool timed_out = false;
    while (waiting > 0 && !timed_out)
      self->receive([&](const caf::down_msg&) { --waiting; },
                    caf::after(std::chrono::seconds(30)) >> [&] { timed_out = true; });
    if (timed_out) std::fprintf(stderr, "blendserve: shutdown: %zu actors did not stop within 30 s\n", waiting);
  }
  a.h->update([](ActorSet& s) { s = ActorSet{}; });
  a.supervisor = supervisor_actor{};
  a.system.reset();  // waits for every actor to finish
}

}  // namespace bs
