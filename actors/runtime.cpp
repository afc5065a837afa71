#include "actors/runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"
#include "blend/rag_prompt.h"

namespace bs {
namespace {

std::string default_model_path() {
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

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

// CAF's scheduler threads only pass messages: few of them, and sleeping soon
// when idle, so they never compete with the compute thread for the cores.
struct RuntimeSystemConfig : caf::actor_system_config {
  RuntimeSystemConfig() {
    set("scheduler.max-threads", size_t{2});
    set("work-stealing.aggressive-poll-attempts", size_t{10});
    set("work-stealing.moderate-poll-attempts", size_t{50});
    set("logger.verbosity", caf::atom("quiet"));
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

}  // namespace

struct Runtime::Actors {
  RuntimeSystemConfig cfg;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<Handles> h = std::make_shared<Handles>();
  std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<RequestState>> live;
  int documents = 0;  // store_document calls waiting for the worker (shutdown waits for them)
  bool stopped = false;
};

Runtime::Runtime(const RuntimeConfig& config) : ctx_(std::make_unique<RuntimeContext>()) {
  auto& ctx = *ctx_;
  ctx.config = config;
  if (ctx.config.model_path.empty()) ctx.config.model_path = default_model_path();
  ctx.backend = kernels::make_cpu_backend();
  ctx.precision = kernels::choose_precision(ctx.config.precision, *ctx.backend);
  ctx.model = std::make_unique<LlamaModel>(ctx.config.model_path, *ctx.backend, ctx.precision);
  fit_check_layers_to_model(ctx.config.blend, ctx.model->config().n_layers);
  ctx.tf = std::make_unique<Transformer>(*ctx.model);
  if (ctx.config.ram.enabled) ctx.ram = std::make_unique<MemoryKvStore>(ctx.config.ram.budget_bytes);
  if (ctx.config.ssd.enabled) {
    ctx.ssd = std::make_unique<DiskKvStore>(resolve_ssd_path(ctx.config), ctx.config.ssd.budget_bytes,
                                            ctx.config.ssd.direct_io);
    if (ctx.config.ssd.throttle_bytes_per_s > 0) ctx.ssd->set_read_throttle(ctx.config.ssd.throttle_bytes_per_s);
  }
  ctx.tiered = std::make_unique<TieredKvStore>(ctx.ram.get(), ctx.ssd.get());
  ctx.engine = std::make_unique<BlendEngine>(*ctx.tf, *ctx.tiered,
                                             ctx.model->tokenizer().encode(ctx.config.chunk_prelude, true));
  ctx.compute = std::make_unique<ComputeThread>(ctx.config.threads);

  actors_ = std::make_unique<Actors>();
  auto& a = *actors_;
  a.system = std::make_unique<caf::actor_system>(a.cfg);
  auto& sys = *a.system;
  auto h = a.h;
  RuntimeContext* c = ctx_.get();
  auto inspector_counters = make_counters("inspector");
  h->inspector = sys.spawn(inspector, ctx.config.trace_history, resolve_data_dir(ctx.config) + "/traces",
                           inspector_counters);
  auto reg = [&](const char* name) {
    auto counters = make_counters(name);
    caf::anon_send(h->inspector, register_atom::value, counters);
    return counters;
  };
  h->intake = sys.spawn(intake, c, h, reg("intake"));
  h->controller = sys.spawn(controller, c, h, reg("controller"));
  h->ram_loader = sys.spawn<caf::detached>(loader, c, h, Tier::Ram, reg("loader-ram"));
  if (ctx.ssd) h->ssd_loader = sys.spawn<caf::detached>(loader, c, h, Tier::Ssd, reg("loader-ssd"));
  h->worker = sys.spawn(layer_worker, c, h, reg("layer-worker"));
  h->fusor = sys.spawn(fusor, c, h, reg("fusor"));
  h->decoder = sys.spawn(decoder, c, h, reg("decoder"));
  // Demotion: an entry evicted from RAM goes to the SSD unless it is there already.
  if (ctx.ram && ctx.ssd) {
    auto ssd_loader = h->ssd_loader;
    DiskKvStore* ssd = ctx.ssd.get();
    ctx.ram->set_eviction_listener([ssd_loader, ssd](const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
      if (!ssd->contains(key)) caf::anon_send(ssd_loader, store_atom::value, KeyedKv{key, std::move(kv)});
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
  auto r = std::make_shared<RequestState>();
  r->submitted = RequestState::clock::now();
  r->request = std::move(request);
  // Forget the request when it ends (the map holds weak pointers only).
  auto user_done = std::move(callbacks.on_done);
  Actors* actors = actors_.get();
  callbacks.on_done = [actors, user_done](const RequestResult& res) {
    {
      std::lock_guard<std::mutex> lock(actors->mu);
      actors->live.erase(res.id);
    }
    if (user_done) user_done(res);
  };
  r->callbacks = std::move(callbacks);
  const uint64_t id = ctx_->next_id.fetch_add(1);
  r->id = id;
  {
    // Registered before the intake answers: on_done may run before receive() returns.
    std::lock_guard<std::mutex> lock(a.mu);
    a.live[id] = r;
  }
  caf::error failure;
  {
    caf::scoped_actor self{*a.system};
    self->request(a.h->intake, caf::infinite, submit_atom::value, r)
        .receive([&](uint64_t) {}, [&](caf::error& e) { failure = std::move(e); });
  }
  if (failure) {
    {
      std::lock_guard<std::mutex> lock(a.mu);
      a.live.erase(id);
    }
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
  submit(std::move(request), std::move(cb));
  return fut.get();
}

bool Runtime::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(actors_->mu);
  if (actors_->stopped) return false;  // shutdown cancels everything itself
  auto it = actors_->live.find(id);
  if (it == actors_->live.end()) return false;
  auto r = it->second.lock();
  if (!r) return false;
  r->cancelled = true;
  // A queued request leaves the queue now; a running one ends at its next step.
  caf::anon_send(actors_->h->intake, cancel_atom::value, id);
  return true;
}

int Runtime::in_flight() const { return ctx_->in_flight.load(); }

int Runtime::queued() const { return ctx_->queued.load(); }

Runtime::DecodeStats Runtime::decode_stats() const {
  return {ctx_->decode_steps.load(), ctx_->decode_tokens.load(), ctx_->interleaved_steps.load()};
}

std::string Runtime::store_document(const std::string& text) {
  const auto tokens = document_chunk_tokens(ctx_->model->tokenizer(), text);
  if (tokens.empty()) throw RequestError(RequestErrc::invalid, "the document is empty");
  if (static_cast<int64_t>(tokens.size()) >= ctx_->model->config().context_length)
    throw RequestError(RequestErrc::too_long, "the document has " + std::to_string(tokens.size()) +
                                                  " tokens; the model's context is " +
                                                  std::to_string(ctx_->model->config().context_length));
  const ChunkKey key = ctx_->engine->chunk_key(tokens);
  if (!ctx_->tiered->contains(key)) {
    // The layer worker computes it on the compute thread, like every other
    // compute, with the decoding streams' steps between its layers.
    auto& a = *actors_;
    worker_actor worker;
    {
      std::lock_guard<std::mutex> lock(a.mu);
      if (a.stopped) throw RequestError(RequestErrc::shutting_down, "the runtime is shut down");
      worker = a.h->worker;
      ++a.documents;  // the actor system outlives this call (shutdown waits)
    }
    std::shared_ptr<const ChunkKv> kv;
    std::optional<RequestError> failure;  // shutting down (the worker or the compute thread stopped), internal
    {
      caf::scoped_actor self{*a.system};
      self->request(worker, caf::infinite, document_atom::value, tokens)
          .receive([&](KeyedKv& kk) { kv = std::move(kk.kv); },
                   [&](caf::error& e) {
                     failure = e.category() == runtime_error_category()
                                   ? request_error_of(*a.system, e)
                                   : RequestError(RequestErrc::shutting_down, "the runtime is shut down");
                   });
    }
    {
      std::lock_guard<std::mutex> lock(a.mu);
      --a.documents;
    }
    if (failure) throw *failure;
    ctx_->tiered->put(key, std::move(kv));
  }
  return key.hex();
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
  return ctx_->tiered->erase(key);
}

std::string Runtime::traces_json(int n) {
  std::string out = "[]";
  caf::scoped_actor self{*actors_->system};
  self->request(actors_->h->inspector, std::chrono::seconds(10), get_trace_atom::value, static_cast<int32_t>(n))
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::actors_json() {
  std::string out = "[]";
  caf::scoped_actor self{*actors_->system};
  self->request(actors_->h->inspector, std::chrono::seconds(10), actors_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  auto j = nlohmann::json::parse(out);
  j.push_back({{"actor", "compute-thread"},
               {"messages", ctx_->compute->jobs_done()},
               {"busy_s", ctx_->compute->busy_seconds()},
               {"mailbox", ctx_->compute->queued()}});
  return j.dump();
}

std::string Runtime::profile_json() {
  std::string out = "{}";
  caf::scoped_actor self{*actors_->system};
  self->request(actors_->h->controller, std::chrono::seconds(10), get_profile_atom::value)
      .receive([&](const std::string& s) { out = s; }, [&](caf::error&) {});
  return out;
}

std::string Runtime::stores_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (KvStore* s : {static_cast<KvStore*>(ctx_->ram.get()), static_cast<KvStore*>(ctx_->ssd.get())}) {
    if (!s) continue;
    const auto st = s->stats();
    j[std::string(s->name())] = {{"hits", st.hits},       {"misses", st.misses},   {"puts", st.puts},
                                 {"evictions", st.evictions}, {"bytes", st.bytes}, {"entries", st.entries},
                                 {"corrupt", st.corrupt},  {"budget", s->budget()}};
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
    for (auto& [id, w] : a.live)
      if (auto r = w.lock()) {
        r->cancelled = true;
        caf::anon_send(a.h->intake, cancel_atom::value, id);  // queued: finished now
      }
  }
  // Requests in flight end at their next step (a prefill in progress completes
  // first); every accepted request has had its on_done when `live` is empty.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto busy = [&] {
    std::lock_guard<std::mutex> lock(a.mu);
    return ctx_->in_flight.load() > 0 || ctx_->queued.load() > 0 || !a.live.empty() || a.documents > 0;
  };
  while (busy() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Background write-back computes are dropped (they are a cache, recomputed on
  // demand); the one running finishes. Then every store already handed to the
  // fusor or the SSD loader is written before the actors stop.
  ctx_->compute->stop(finish_write_back);
  {
    caf::scoped_actor self{*a.system};
    self->request(a.h->fusor, std::chrono::seconds(120), flush_atom::value).receive([](bool) {}, [](caf::error&) {});
  }
  if (ctx_->ram) ctx_->ram->set_eviction_listener({});
  for (const caf::actor& x :
       {caf::actor_cast<caf::actor>(a.h->intake), caf::actor_cast<caf::actor>(a.h->controller),
        caf::actor_cast<caf::actor>(a.h->ram_loader), caf::actor_cast<caf::actor>(a.h->ssd_loader),
        caf::actor_cast<caf::actor>(a.h->worker), caf::actor_cast<caf::actor>(a.h->fusor),
        caf::actor_cast<caf::actor>(a.h->decoder), caf::actor_cast<caf::actor>(a.h->inspector)})
    if (x) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  *a.h = Handles{};
  a.system.reset();  // waits for every actor to finish
}

}  // namespace bs
