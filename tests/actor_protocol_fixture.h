// What the actor protocol tests share (caf_test_actor_protocol.cpp and
// caf_test_protocol_*.cpp, one binary): the test doubles that only log what they
// receive, the runtime context built by hand as Runtime builds it, and the fixture
// that puts every actor's handle in place (a double until a test spawns the real one)
// and drives the deterministic test coordinator. Each file defines CAF_SUITE before it
// includes this header.
#pragma once

#include <caf/test/dsl.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"
#include "kernels/backend.h"

namespace bs {

// Readable values in CAF's check messages (found by ADL; without them CAF
// prints "<unprintable>").
inline std::string to_string(const KeyedKv& kk) { return "kv(" + kk.key.hex() + ")"; }

namespace protocol_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

inline std::string model_path() {
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

inline const std::string kQuestion = "Which river flows through Basel? Answer briefly.";
inline const std::vector<std::string> kDocs = {
    "The Rhine flows from the Swiss Alps to the North Sea and passes Basel, Strasbourg, Cologne and Rotterdam.",
    "Marie Curie was the first person to win Nobel Prizes in two sciences: physics in 1903 and chemistry in 1911.",
    "The Great Barrier Reef lies off the coast of Queensland, Australia, and is the largest coral reef system.",
};

// -- test doubles: they log what they receive and do nothing else -------------

using Log = std::shared_ptr<std::vector<std::string>>;

inline intake_actor::behavior_type intake_double(intake_actor::pointer, Log log) {
  return {
      [=](submit_atom, uint64_t id) -> uint64_t {
        log->push_back("intake:submit");
        return id;
      },
      [=](release_atom, uint64_t) { log->push_back("intake:release"); },
      [=](reconcile_atom) { log->push_back("intake:reconcile"); },
      [=](cancel_atom, uint64_t) { log->push_back("intake:cancel"); },
      [=](expire_atom, uint64_t, int32_t) { log->push_back("intake:expire"); },
      [=](resume_atom) { log->push_back("intake:resume"); },
  };
}

inline controller_actor::behavior_type controller_double(controller_actor::pointer, Log log) {
  return {
      [=](plan_atom, const RequestPlan&) { log->push_back("controller:plan"); },
      [=](profile_atom, const std::string& source, int64_t, double) { log->push_back("controller:profile:" + source); },
      [=](get_profile_atom) -> std::string { return "{}"; },
  };
}

inline loader_actor::behavior_type loader_double(loader_actor::pointer, Log log, std::string name) {
  return {
      [=](load_atom, const RequestPlan&, const LoadTargetPtr&) { log->push_back(name + ":load"); },
  };
}

inline writer_actor::behavior_type writer_double(writer_actor::pointer, Log log, std::string name) {
  return {
      [=](store_atom, KeyedKv) { log->push_back(name + ":store"); },
      [=](flush_atom) -> bool {
        log->push_back(name + ":flush");
        return true;
      },
  };
}

// A follower rank's worker: keeps what it was sent (the loaders' values, their ends).
struct RankInbox {
  std::vector<RankKv> kv;
  std::vector<std::pair<uint64_t, uint64_t>> ends;  // (request, loader)
};
inline rank_worker_actor::behavior_type rank_worker_double(rank_worker_actor::pointer, std::shared_ptr<RankInbox> in) {
  return {
      [=](rank_job_atom, const RankJob&) {},
      [=](rank_open_atom, uint64_t, int64_t) {},
      [=](rank_kv_atom, const RankKv& kv) { in->kv.push_back(kv); },
      [=](rank_load_end_atom, uint64_t id, uint64_t loader) { in->ends.emplace_back(id, loader); },
  };
}

inline worker_actor::behavior_type worker_double(worker_actor::pointer, Log log) {
  return {
      [=](prefill_atom, const RequestPlan&) { log->push_back("worker:prefill"); },
      [=](layer_atom, uint64_t, int32_t l) { log->push_back("worker:layer:" + std::to_string(l)); },
      [=](load_end_atom, uint64_t, uint64_t) { log->push_back("worker:loadend"); },
      [=](load_fail_atom, uint64_t, int32_t, const std::string&) { log->push_back("worker:loadfail"); },
      [=](rank_opened_atom, uint64_t, int32_t r, bool) { log->push_back("worker:rankok:" + std::to_string(r)); },
      [=](rank_load_end_atom, uint64_t, uint64_t, int32_t r) { log->push_back("worker:rankend:" + std::to_string(r)); },
      [=](loader_down_atom, uint64_t, const std::string&) { log->push_back("worker:loaderdown"); },
      [=](rank_down_atom, int32_t r, const std::string&) { log->push_back("worker:rankdown:" + std::to_string(r)); },
      [=](stepped_atom, uint64_t, const PrefillWorkPtr&) { log->push_back("worker:stepped"); },
      [=](tick_atom) { log->push_back("worker:tick"); },
      [=](cancel_atom, uint64_t) { log->push_back("worker:cancel"); },
      [=](decode_atom, uint64_t, const DecodeAsk&) { log->push_back("worker:decode"); },
      [=](end_atom, uint64_t) { log->push_back("worker:end"); },
      [=](document_atom, const std::vector<int32_t>&) -> caf::result<KeyedKv> {
        log->push_back("worker:document");
        return make_runtime_error(RequestErrc::internal, "a test double computes nothing");
      },
      [=](document_done_atom, const DocumentKv&) { log->push_back("worker:docdone"); },
  };
}

inline write_back_actor::behavior_type write_back_double(write_back_actor::pointer, Log log) {
  return {
      [=](kv_ready_atom, KeyedKv) { log->push_back("write-back:kvready"); },
      [=](flush_atom) -> bool { return true; },
      [=](doc_write_atom, const DocumentWrite&) -> DocumentWritten {
        log->push_back("write-back:docwrite");
        return {};
      },
      [=](doc_erase_atom, const ChunkKey&) -> bool {
        log->push_back("write-back:docerase");
        return false;
      },
  };
}

inline supervisor_actor::behavior_type supervisor_double(supervisor_actor::pointer, Log log) {
  return {
      [=](supervise_atom, const caf::actor&, const std::string&) { log->push_back("supervisor:supervise"); },
      [=](fail_atom, uint64_t, const std::string&) { log->push_back("supervisor:fail"); },
  };
}

inline decoder_actor::behavior_type decoder_double(decoder_actor::pointer, Log log) {
  return {
      [=](start_atom, const PrefillOutcome&) { log->push_back("decoder:start"); },
      [=](logits_atom, uint64_t, const DecodeStep&) { log->push_back("decoder:logits"); },
      [=](finish_atom, uint64_t) { log->push_back("decoder:finish"); },
  };
}

inline inspector_actor::behavior_type inspector_double(inspector_actor::pointer, Log log) {
  return {
      [=](register_atom, CountersPtr) { log->push_back("inspector:register"); },
      [=](trace_atom, const std::string&) { log->push_back("inspector:trace"); },
      [=](get_trace_atom, int32_t) -> std::string { return "[]"; },
      [=](actors_atom) -> std::string { return R"({"actors":[]})"; },
  };
}

// `needle` if `text` contains it, else `text`: CAF_CHECK_EQUAL(mentions(text, x), x)
// shows the whole text when it fails.
inline std::string mentions(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos ? needle : text;
}

// -- fixture ------------------------------------------------------------------

// The actor system of the fixture renders runtime errors like the Runtime's.
struct test_config : caf::actor_system_config {
  test_config() {
    add_runtime_message_types(*this);
    add_error_category(runtime_error_category(), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
      std::string s = errc_name(static_cast<RequestErrc>(code));
      if (ctx.match_elements<std::string>()) s += ": " + ctx.get_as<std::string>(0);
      return s;
    });
  }
};

// The runtime context, built by hand as Runtime does. A base class listed before
// the test coordinator fixture, so it is destroyed after the actor system (the
// actors hold a raw pointer to it).
struct context_base {
  fs::path dir;
  std::unique_ptr<RuntimeContext> ctx;

  context_base() {
    static int counter = 0;
    dir = fs::temp_directory_path() / ("bs_caf_protocol_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string path = model_path();
    if (!fs::exists(path)) CAF_FAIL("model missing: " << path << " (run tools/setup.sh)");
    ctx = std::make_unique<RuntimeContext>();
    auto& c = *ctx;
    c.config = default_runtime_config();
    // The controller's plans below are the deviation rule's (gradual filtering, the
    // recompute overlapping the load); query-first's, the default, are tested through
    // the runtime (test_blend_runtime).
    c.config.blend.selection = Selection::Deviation;
    c.config.model_path = path;
    c.config.data_dir = dir.string();
    c.config.ssd.path = (dir / "kv").string();
    c.config.ssd.direct_io = false;  // the temp dir may be a tmpfs; the protocol is the same
    // One model for every test of the binary: the weights are read-only.
    static const std::shared_ptr<kernels::Backend> backend = kernels::make_cpu_backend();
    static const auto model = std::make_shared<const LlamaModel>(path, *backend, backend->default_precision());
    c.backend = backend;
    c.precision = backend->default_precision();
    c.model = model;
    c.tf = std::make_unique<Transformer>(*c.model);
    const auto& mc = c.model->config();
    c.kv_pool = KvPagePool::make(*c.backend, mc.n_layers, mc.n_kv_heads, mc.head_dim, 256);  // 16384 positions
    c.ram = std::make_unique<MemoryKvStore>(int64_t{256} << 20);
    c.ssd = std::make_unique<DiskKvStore>(c.config.ssd.path, int64_t{1} << 30, false);
    c.tiers = {{"ram", c.ram.get(), 8e9, 2}, {"ssd", c.ssd.get(), 1.5e9, 2}};
    c.tiered = std::make_unique<TieredKvStore>(std::vector<KvStore*>{c.ram.get(), c.ssd.get()});
    c.engine = std::make_unique<BlendEngine>(*c.tf);
    c.compute = std::make_unique<ComputeThread>(0);
  }

  ~context_base() {
    ctx.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

inline constexpr TierId kRam = 0, kSsd = 1;  // the fixture's tier list

struct fixture : context_base, test_coordinator_fixture<test_config> {
  std::shared_ptr<Handles> h = std::make_shared<Handles>();
  Log log = std::make_shared<std::vector<std::string>>();

  // Every handle starts as a test double; a test replaces the ones it tests. Each
  // tier has a pool of two loaders.
  fixture() {
    // No request deadline (its timers would fire in run()); the deadline's test sets one.
    ctx->config.max_request_seconds = 0;
    put(&ActorSet::intake, sys.spawn(intake_double, log));
    put(&ActorSet::controller, sys.spawn(controller_double, log));
    for (int i = 0; i < 2; ++i) {
      put_loader(kRam, i, sys.spawn(loader_double, log, "ram_loader" + std::to_string(i)));
      put_loader(kSsd, i, sys.spawn(loader_double, log, "ssd_loader" + std::to_string(i)));
    }
    put(&ActorSet::ssd_writer, sys.spawn(writer_double, log, std::string("ssd_writer")));
    put(&ActorSet::worker, sys.spawn(worker_double, log));
    put(&ActorSet::write_back, sys.spawn(write_back_double, log));
    put(&ActorSet::decoder, sys.spawn(decoder_double, log));
    put(&ActorSet::inspector, sys.spawn(inspector_double, log));
    put(&ActorSet::supervisor, sys.spawn(supervisor_double, log));
    sched.run();  // the spawned actors start
  }

  ~fixture() override {
    run();
    h->update([](ActorSet& s) { s = ActorSet{}; });  // the behaviours hold `h`: break the cycle so the actors end
  }

  // Puts an actor (a double, or the real one under test) in the handles.
  template <class T>
  void put(T ActorSet::*field, T x) {
    h->update([&](ActorSet& s) { s.*field = std::move(x); });
  }
  void put_loader(TierId t, int i, loader_actor x) {
    h->update([&](ActorSet& s) {
      s.loaders.resize(2);
      s.loaders[static_cast<size_t>(t)].resize(2);
      s.loaders[static_cast<size_t>(t)][static_cast<size_t>(i)] = std::move(x);
    });
  }
  loader_actor loader_of(TierId t, int i = 0) const { return h->loaders(t)[static_cast<size_t>(i)]; }

  const LlamaConfig& cfg() const { return ctx->model->config(); }
  std::vector<int32_t> tokens_of(const std::string& doc) const {
    return document_chunk_tokens(ctx->model->tokenizer(), doc);
  }
  ChunkKey key_of(const std::string& doc) const { return ctx->engine->chunk_key(tokens_of(doc)); }
  std::shared_ptr<const ChunkKv> kv_of(const std::string& doc) const {
    return ctx->engine->compute_chunk_kv(tokens_of(doc));
  }

  // A request as a caller submits it: its front-end record, in the book, with an open trace.
  RecordPtr new_record(std::vector<std::string> docs, std::optional<float> ratio = std::nullopt,
                       std::optional<BlendMode> mode = std::nullopt) {
    auto r = std::make_shared<RequestRecord>();
    r->id = ctx->next_id.fetch_add(1);
    r->submitted = std::chrono::steady_clock::now();
    r->request.messages = {{"user", kQuestion}};
    r->request.documents = std::move(docs);
    r->request.sampling.max_tokens = 8;
    r->request.ratio = ratio;
    r->request.mode = mode;
    r->trace = ctx->traces.open(r->id, r->submitted);
    ctx->requests.put(r);
    return r;
  }

  // What the intake makes of it (prompt, keys, options), for tests that start at
  // the controller; the intake test checks the intake makes the same.
  RequestPlan intake_output(std::vector<std::string> docs, std::optional<float> ratio = std::nullopt,
                            std::optional<BlendMode> mode = std::nullopt) {
    auto rec = new_record(std::move(docs), ratio, mode);
    RequestPlan r;
    r.id = rec->id;
    r.prompt = assemble_rag_prompt(ctx->model->tokenizer(), ctx->model->chat_template(), rec->request.messages,
                                   rec->request.documents);
    r.options = ctx->config.blend;
    if (mode) r.options.mode = *mode;
    if (ratio) r.options.ratio = *ratio;
    r.ratio_requested = ratio.has_value();
    r.sampling = rec->request.sampling;
    r.prefix_block = ctx->config.prefix_block_tokens;
    r.prefix_end = static_cast<int64_t>(r.prompt.prefix.size());
    r.prefix_block_keys = ctx->engine->prefix_block_keys(r.prompt.prefix, r.prefix_block, r.prefix_end);
    for (const auto& c : r.prompt.chunks) r.chunk_keys.push_back(ctx->engine->chunk_key(c));
    r.chunk_tier.assign(r.prompt.chunks.size(), kMissTier);
    r.loaded.chunk_loaded.assign(r.prompt.chunks.size(), 0);
    return r;
  }

  // Sends the record's id to the intake, lets the intake (only it) handle it, returns its answer.
  struct Answer {
    std::optional<uint64_t> id;
    caf::error error;
  };
  Answer submit(const RecordPtr& r) {
    auto reply = self->request(h->intake(), caf::infinite, submit_atom::value, r->id);
    expect((submit_atom, uint64_t), from(self).to(h->intake()).with(_, r->id));
    CAF_REQUIRE(!self->mailbox().empty());  // answered synchronously: receive() does not block
    Answer a;
    reply.receive([&](uint64_t id) { a.id = id; }, [&](caf::error& e) { a.error = std::move(e); });
    return a;
  }

  // The plan the intake sent the controller (consumed).
  RequestPlan planned_by_intake() {
    const auto [atom, plan] = extract<plan_atom, RequestPlan>(h->controller());
    expect((plan_atom, RequestPlan), from(h->intake()).to(h->controller()).with(_, _));
    return plan;
  }

  // The controller's plan for r, handled by the controller alone; returns what it
  // hands the worker (consumed).
  RequestPlan plan(const RequestPlan& r) {
    self->send(h->controller(), plan_atom::value, r);
    expect((plan_atom, RequestPlan), from(self).to(h->controller()).with(_, _));
    CAF_REQUIRE_EQUAL(ready_jobs(), std::vector<caf::resumable*>{job_of(h->worker())});
    const auto [atom, out] = extract<prefill_atom, RequestPlan>(h->worker());
    expect((prefill_atom, RequestPlan), from(h->controller()).to(h->worker()).with(_, _));
    return out;
  }

  // A load target as the worker makes it (and sends it with the plan), for tests
  // that start at a loader.
  LoadTargetPtr make_target(const RequestPlan& r, std::vector<uint64_t> loaders) {
    auto t = std::make_shared<LoadTarget>();
    t->cache = ctx->tf->make_cache(r.cache_capacity());
    t->gate.reset(cfg().n_layers, std::move(loaders));
    return t;
  }

  // The actors whose mailboxes are not empty, in the order they became ready: the
  // order of the first message each was sent.
  std::vector<caf::resumable*> ready_jobs() const { return {sched.jobs.begin(), sched.jobs.end()}; }
  template <class Handle>
  static caf::resumable* job_of(const Handle& x) {
    return dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(x));
  }

  // Sends a request from `self`, runs every actor until nothing is left, returns
  // the answer. (test_coordinator_fixture::request needs a FAIL macro that CAF
  // 0.17.6's unit_test.hpp does not define.)
  template <class T, class Handle, class... Ts>
  T ask(const Handle& hdl, Ts... xs) {
    auto reply = self->request(hdl, caf::infinite, std::move(xs)...);
    run();
    CAF_REQUIRE(!self->mailbox().empty());
    T out{};
    reply.receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { CAF_FAIL(sys.render(e)); });
    return out;
  }

  json profile() { return json::parse(ask<std::string>(h->controller(), get_profile_atom::value)); }

  // Occupies the compute thread with a job that runs until the returned promise is
  // set: what is submitted meanwhile waits in its queue (the held job is off the
  // queue and running when this returns).
  std::promise<void> hold_compute() {
    std::promise<void> release;
    auto started = std::make_shared<std::promise<void>>();  // outlives this call: the job still holds it
    auto busy = release.get_future().share();
    auto running = started->get_future();
    CAF_REQUIRE(ctx->compute->submit([busy, started] {
      started->set_value();
      busy.wait();
    }));
    running.wait();
    return release;
  }

  // Waits (bounded) until the compute thread ran `jobs` jobs in all (a job held by
  // hold_compute counts once released) and has none queued.
  void wait_compute(int64_t jobs) {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while ((ctx->compute->jobs_done() < jobs || ctx->compute->queued() > 0) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(2ms);
    CAF_REQUIRE_GREATER_OR_EQUAL(ctx->compute->jobs_done(), jobs);
  }

  void check_runtime_error(const Answer& a, RequestErrc code, const std::string& needle) {
    CAF_CHECK(!a.id);
    CAF_REQUIRE(a.error);
    CAF_CHECK_EQUAL(a.error.category(), runtime_error_category());
    CAF_CHECK_EQUAL(a.error.code(), static_cast<uint8_t>(code));
    std::string text;
    if (a.error.context().match_elements<std::string>()) text = a.error.context().get_as<std::string>(0);
    CAF_CHECK_EQUAL(mentions(text, needle), needle);
  }
};

// Whether the wait running in `f` (another thread) finished within `limit`. A test
// releases a wait that stays blocked (gate.fail / loader_done) before it ends, so
// that the future's destructor can join the thread.
enum class Waited { ready, blocked };
template <class F>
Waited wait_on(std::future<F>& f, std::chrono::milliseconds limit) {
  return f.wait_for(limit) == std::future_status::ready ? Waited::ready : Waited::blocked;
}

// Counts the K and V rows (per head) of cache positions [offset, offset + m) in
// `layer` that differ from the stored chunk's layer (as stored: K not yet rotated
// to the offset).
inline int64_t mismatches(const KvCache& cache, const ChunkKv& kv, int layer, int64_t offset) {
  int64_t bad = 0;
  const int64_t m = kv.length(), hd = kv.head_dim;
  for (int head = 0; head < kv.kv_heads; ++head)
    for (int64_t i = 0; i < m; ++i) {
      const std::byte* sk = kv.k_layer(layer) + (head * m + i) * hd * kv.elem_bytes();
      const std::byte* sv = kv.v_layer(layer) + (head * m + i) * hd * kv.elem_bytes();
      bad += std::memcmp(cache.k_at(layer, head, offset + i), sk, hd * sizeof(float)) != 0;
      bad += std::memcmp(cache.v_at(layer, head, offset + i), sv, hd * sizeof(float)) != 0;
    }
  return bad;
}

inline int count_events(const RequestTrace& t, const std::string& actor, const std::string& what) {
  int n = 0;
  for (const auto& e : t.events()) n += e.actor == actor && e.what == what;
  return n;
}

}  // namespace protocol_test
}  // namespace bs
