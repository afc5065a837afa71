#include "actors/runtime/runtime.h"

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

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "actors/runtime/inspection.h"
#include "actors/runtime/runtime_actors.h"
#include "actors/runtime/stream_delivery.h"
#include "blend/rag_prompt.h"

#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"
#include "kernels/kv_view.h"

namespace bs {
using namespace runtime_detail;
namespace {

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

// A compute thread frees its scratch (Backend::release_scratch) once it has had no job
// for this long: longer than the gaps between one stream's decode steps and between
// requests that arrive back to back, so busy traffic never pays for growing it again
// (a 512-token prefill's ~40 MB of page faults, a few ms beside its ~1 s); an idle
// server then holds its model, KV pool and caches, not its longest prompt's activations.
constexpr auto kScratchIdleRelease = std::chrono::seconds(1);

ComputeThread::IdleHook release_scratch_when_idle(kernels::Backend& backend) {
  return {kScratchIdleRelease, [&backend] { backend.release_scratch(); }};
}

}  // namespace


std::string resolve_model_path(const RuntimeConfig& config) {
  if (!config.model_path.empty()) return config.model_path;
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}


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
  if (name == "intake") return put(&ActorSet::intake, sys.spawn<caf::detached>(intake, intake_env(*ctx), h, c));
  if (name == "controller")
    return put(&ActorSet::controller, sys.spawn<caf::detached>(controller, controller_env(*ctx), h, c));
  if (name == "ssd-writer")
    return put(&ActorSet::ssd_writer, sys.spawn<caf::detached>(writer, ssd_writer_env(*ctx), c));
  if (name == "remote-writer")
    return put(&ActorSet::remote_writer, sys.spawn<caf::detached>(writer, remote_writer_env(*ctx), c));
  if (name == "layer-worker") return put(&ActorSet::worker, sys.spawn(layer_worker, worker_env(*ctx), h, c));
  if (name == "write-back")
    return put(&ActorSet::write_back, sys.spawn<caf::detached>(write_back, write_back_env(*ctx), h, c));
  if (name == "decoder") return put(&ActorSet::decoder, sys.spawn<caf::detached>(decoder, decoder_env(*ctx), h, c));
  // "rank-worker-<r>": tensor-parallel follower rank r.
  for (int r = 1; ctx->tp && r < ctx->tp->size(); ++r)
    if (name == "rank-worker-" + std::to_string(r)) {
      auto x = sys.spawn<caf::detached>(rank_worker, ctx->tp.get(), h, r, c);
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
        auto x = sys.spawn<caf::detached>(loader, loader_env(*ctx), h, static_cast<TierId>(t), c);
        h->update([&](ActorSet& s) {
          s.loaders.resize(ctx->tiers.size());
          s.loaders[t].resize(static_cast<size_t>(ctx->tiers[t].loaders));
          s.loaders[t][static_cast<size_t>(i)] = x;
        });
        return caf::actor_cast<caf::actor>(x);
      }
  throw std::logic_error("no actor is called " + name);
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
  // Every rule of a config, however it was made (a file was checked as it was read;
  // CLI flags and tests build theirs in code): before any backend, so a wrong
  // combination is refused on any machine, with or without a GPU.
  check_runtime_config(ctx.config);
  const bool on_cuda = ctx.config.device_kind == "cuda";
  const std::string comm_kind = kernels::resolve_communicator_kind(ctx.config.communicator, ctx.config.device_kind);
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
    choice.batch_invariant = ctx.config.batch_invariant;
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
  kernels::kv_dtype_from_name(ctx.config.kv_dtype, kv_dtype);  // checked above
  const int tp = ctx.config.tp;
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
  ctx.compute = std::make_unique<ComputeThread>(
      rank_threads, std::chrono::seconds(2), make_counters(tp > 1 ? "compute-thread-rank-0" : "compute-thread"),
      ComputeThread::kDefaultMaxBackground, release_scratch_when_idle(*ctx.backend));
  if (tp > 1) {
    ctx.tp = std::make_unique<TpRanks>(std::move(comms), std::move(make_comms), *ctx.tf, timeout);
    for (int r = 1; r < tp; ++r) {
      RankFollower::Parts p;
      p.backend = make_backend(r);
      p.model = load_shard(*p.backend, r);
      p.tf = std::make_unique<Transformer>(*p.model, &ctx.tp->comm(r), timeout);
      p.kv_pool = make_pool(*p.backend, p.model->config());
      p.engine = std::make_unique<BlendEngine>(*p.tf, prelude);
      p.compute = std::make_unique<ComputeThread>(
          rank_threads, std::chrono::seconds(2), make_counters("compute-thread-rank-" + std::to_string(r)),
          ComputeThread::kDefaultMaxBackground, release_scratch_when_idle(*p.backend));
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
  hooks.fail = [actors, c](uint64_t id, const std::string& why) {
    if (const RecordPtr r = c->requests.find(id)) actors->fail_request(c, r, why);
  };
  hooks.limits = RestartLimits{ctx.config.max_restarts, ctx.config.restart_window, ctx.config.restart_backoff,
                               ctx.config.restart_backoff_max};
  a.supervisor = sys.spawn(supervisor, std::move(hooks), a.counters["supervisor"] = make_counters("supervisor"));
  h->update([&](ActorSet& set) { set.supervisor = a.supervisor; });
  caf::anon_send(h->inspector(), register_atom::value, a.counters["supervisor"]);
  for (size_t i = 0; i < names.size(); ++i) caf::anon_send(a.supervisor, supervise_atom::value, spawned[i], names[i]);
  // Demotion: an entry evicted from RAM goes to the SSD unless it is there already, or
  // is a provisional entry (a request's in-context KV: RAM only, actors/runtime/chunk_flights.h).
  if (ctx.ram && ctx.ssd) {
    ctx.ram->set_eviction_listener([c, h](const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
      if (!c->ssd->contains(key) && !c->flights.provisional(key))
        enqueue_write(ssd_writer_env(*c), h->ssd_writer(), KeyedKv{key, std::move(kv)});
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
  if (!ctx_->requests.find(id)) return false;
  // The intake marks it cancelled (it is the one writer of a record's cancel) and tells
  // the worker: a queued request leaves the queue now; a running one ends at its next
  // step (a prefill at its next layer boundary, its loaders at their next layer).
  caf::anon_send(actors_->h->intake(), cancel_atom::value, id);
  return true;
}


void Runtime::shutdown(bool finish_write_back) {
  auto& a = *actors_;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.stopped) return;
    a.stopped = true;
    // First: the intake refuses whatever reaches it from now on.
    ctx_->shutting_down = true;
    // Every request cancelled by the intake (queued: finished now; running: the worker
    // is told, and it stops at its next step).
    for (const auto& r : ctx_->requests.all()) caf::anon_send(a.h->intake(), cancel_atom::value, r->id);
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
