// The actors' message protocols, one actor at a time, under CAF's deterministic
// test coordinator (caf/test/dsl.hpp): every actor is a plain scheduled actor, so
// nothing runs until the test lets it (`expect`, `allow`, `sched.run()`), and the
// messages an actor sends can be checked one by one, in order, before anyone
// handles them. The actors under test are the real ones (actors/runtime/*.cpp) over a
// RuntimeContext on the real model; the actors around them are test doubles that
// only log what they receive. Requests travel as values (RequestPlan,
// PrefillOutcome, ids); the worker's prefills run on the compute thread, which a
// test holds or waits for before it lets the actors go on. The prefill's numbers
// are covered by tests/test_blend_runtime.cpp.
#define CAF_SUITE actor_protocol
#include <caf/test/dsl.hpp>
#include <caf/test/unit_test_impl.hpp>

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
#include "blend/rag_prompt.h"
#include "kernels/backend.h"

namespace bs {

// Readable values in CAF's check messages (found by ADL; without them CAF
// prints "<unprintable>").
std::string to_string(const KeyedKv& kk) { return "kv(" + kk.key.hex() + ")"; }

}  // namespace bs

namespace {

using namespace bs;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// Loading the model and computing chunk KV can be slow on a busy 2-core machine: allow
// more than CAF's default 30 s per test (`-r` on the command line still wins).
[[maybe_unused]] const bool longer_watchdog = [] {
  caf::test::engine::max_runtime(300);
  return true;
}();

std::string model_path() {
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

const std::string kQuestion = "Which river flows through Basel? Answer briefly.";
const std::vector<std::string> kDocs = {
    "The Rhine flows from the Swiss Alps to the North Sea and passes Basel, Strasbourg, Cologne and Rotterdam.",
    "Marie Curie was the first person to win Nobel Prizes in two sciences: physics in 1903 and chemistry in 1911.",
    "The Great Barrier Reef lies off the coast of Queensland, Australia, and is the largest coral reef system.",
};

// -- test doubles: they log what they receive and do nothing else -------------

using Log = std::shared_ptr<std::vector<std::string>>;

intake_actor::behavior_type intake_double(intake_actor::pointer, Log log) {
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

controller_actor::behavior_type controller_double(controller_actor::pointer, Log log) {
  return {
      [=](plan_atom, const RequestPlan&) { log->push_back("controller:plan"); },
      [=](profile_atom, const std::string& source, int64_t, double) { log->push_back("controller:profile:" + source); },
      [=](get_profile_atom) -> std::string { return "{}"; },
  };
}

loader_actor::behavior_type loader_double(loader_actor::pointer, Log log, std::string name) {
  return {
      [=](load_atom, const RequestPlan&, const LoadTargetPtr&) { log->push_back(name + ":load"); },
  };
}

writer_actor::behavior_type writer_double(writer_actor::pointer, Log log, std::string name) {
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
rank_worker_actor::behavior_type rank_worker_double(rank_worker_actor::pointer, std::shared_ptr<RankInbox> in) {
  return {
      [=](rank_job_atom, const RankJob&) {},
      [=](rank_open_atom, uint64_t, int64_t) {},
      [=](rank_kv_atom, const RankKv& kv) { in->kv.push_back(kv); },
      [=](rank_load_end_atom, uint64_t id, uint64_t loader) { in->ends.emplace_back(id, loader); },
  };
}

worker_actor::behavior_type worker_double(worker_actor::pointer, Log log) {
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

write_back_actor::behavior_type write_back_double(write_back_actor::pointer, Log log) {
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

supervisor_actor::behavior_type supervisor_double(supervisor_actor::pointer, Log log) {
  return {
      [=](supervise_atom, const caf::actor&, const std::string&) { log->push_back("supervisor:supervise"); },
      [=](fail_atom, uint64_t, const std::string&) { log->push_back("supervisor:fail"); },
  };
}

decoder_actor::behavior_type decoder_double(decoder_actor::pointer, Log log) {
  return {
      [=](start_atom, const PrefillOutcome&) { log->push_back("decoder:start"); },
      [=](logits_atom, uint64_t, const DecodeStep&) { log->push_back("decoder:logits"); },
      [=](finish_atom, uint64_t) { log->push_back("decoder:finish"); },
  };
}

inspector_actor::behavior_type inspector_double(inspector_actor::pointer, Log log) {
  return {
      [=](register_atom, CountersPtr) { log->push_back("inspector:register"); },
      [=](trace_atom, const std::string&) { log->push_back("inspector:trace"); },
      [=](get_trace_atom, int32_t) -> std::string { return "[]"; },
      [=](actors_atom) -> std::string { return R"({"actors":[]})"; },
  };
}

// `needle` if `text` contains it, else `text`: CAF_CHECK_EQUAL(mentions(text, x), x)
// shows the whole text when it fails.
std::string mentions(const std::string& text, const std::string& needle) {
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

constexpr TierId kRam = 0, kSsd = 1;  // the fixture's tier list

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
    r.prefix_block_keys = ctx->engine->prefix_block_keys(r.prompt.prefix, r.prefix_block, 1000);
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
int64_t mismatches(const KvCache& cache, const ChunkKv& kv, int layer, int64_t offset) {
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

int count_events(const RequestTrace& t, const std::string& actor, const std::string& what) {
  int n = 0;
  for (const auto& e : t.events()) n += e.actor == actor && e.what == what;
  return n;
}

}  // namespace

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 0. plans are values --------------------------------------------------------

CAF_TEST(a_plan_and_an_outcome_survive_serialization_and_are_registered_by_name) {
  auto r = intake_output({kDocs[0], kDocs[1]}, 0.3f, BlendMode::Blend);
  r.chunk_tier = {kRam, kMissTier};
  r.prefix_block = 16;
  r.prefix_block_keys = {ChunkKey{1, 2}, ChunkKey{3, 4}};
  r.prefix_block_tier = {kSsd, kRam};
  r.loaded.prefix_cached = 32;
  r.loaded.chunk_loaded = {1, 0};
  r.options.schedule = {0.5f, 0.25f};
  r.options.sink_tokens = 3;
  r.options.selection = Selection::Impact;  // not the default: it must travel
  r.options.query_first_from_layer = 4;
  r.sampling.stop = {"</s>", "\n\n"};
  r.sampling.seed = 77;
  r.decision = R"({"ratio":0.3})";
  PrefillOutcome out{r, "", {1.5f, -2.0f}, 120, 32, 12, true};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  CAF_REQUIRE(!sink(out));
  PrefillOutcome back;
  caf::binary_deserializer source{sys, buf};
  CAF_REQUIRE(!source(back));
  const RequestPlan& p = back.plan;
  CAF_CHECK_EQUAL(p.id, r.id);
  CAF_CHECK_EQUAL(p.prompt.prefix, r.prompt.prefix);
  CAF_CHECK_EQUAL(p.prompt.chunks, r.prompt.chunks);
  CAF_CHECK_EQUAL(p.prompt.suffix, r.prompt.suffix);
  CAF_CHECK_EQUAL(p.prefix_block, 16);
  CAF_CHECK(p.prefix_block_keys == r.prefix_block_keys);
  CAF_CHECK(p.chunk_keys == r.chunk_keys);
  CAF_CHECK(p.options.mode == BlendMode::Blend);
  CAF_CHECK_EQUAL(p.options.ratio, 0.3f);
  CAF_CHECK_EQUAL(p.options.check_layers, r.options.check_layers);
  CAF_CHECK_EQUAL(p.options.schedule, r.options.schedule);
  CAF_CHECK_EQUAL(p.options.sink_tokens, 3);
  CAF_CHECK(p.options.selection == Selection::Impact);
  CAF_CHECK_EQUAL(p.options.query_first_from_layer, 4);
  CAF_CHECK(p.options.deviation == r.options.deviation && p.options.quota == r.options.quota &&
            p.options.filtering == r.options.filtering);
  CAF_CHECK(p.ratio_requested);
  CAF_CHECK_EQUAL(p.sampling.stop, r.sampling.stop);
  CAF_CHECK_EQUAL(p.sampling.seed, 77u);
  CAF_CHECK_EQUAL(p.sampling.max_tokens, 8);
  CAF_CHECK_EQUAL(p.chunk_tier, r.chunk_tier);
  CAF_CHECK_EQUAL(p.prefix_block_tier, (std::vector<TierId>{kSsd, kRam}));
  CAF_CHECK_EQUAL(p.loaded.prefix_cached, 32);
  CAF_CHECK_EQUAL(p.loaded.chunk_loaded, r.loaded.chunk_loaded);
  CAF_CHECK_EQUAL(p.decision, r.decision);
  CAF_CHECK_EQUAL(back.logits, out.logits);
  CAF_CHECK_EQUAL(back.cached_tokens, 120);
  CAF_CHECK_EQUAL(back.prefix_cached_tokens, 32);
  CAF_CHECK_EQUAL(back.recomputed_tokens, 12);
  CAF_CHECK(back.fallback);
  // Registered under the names another node knows them by.
  for (const char* name : {"bs::RequestPlan", "bs::PrefillOutcome", "bs::DecodeStep", "bs::DecodeAsk"})
    CAF_CHECK(sys.types().make_value(name) != nullptr);
}

// -- 1. intake ----------------------------------------------------------------

CAF_TEST(intake_answers_the_id_and_hands_the_prepared_plan_to_the_controller) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  auto rec = new_record({kDocs[0], kDocs[1]});
  const auto a = submit(rec);
  CAF_REQUIRE(a.id);
  CAF_CHECK_EQUAL(*a.id, rec->id);
  CAF_CHECK(!a.error);
  // One message out: (plan, the plan) to the controller.
  CAF_REQUIRE_EQUAL(sched.jobs.size(), 1u);
  const RequestPlan r = planned_by_intake();
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, std::vector<std::string>{"controller:plan"});
  CAF_CHECK_EQUAL(r.id, rec->id);
  // The prompt: prefix + one chunk per document + suffix, keyed.
  CAF_REQUIRE_EQUAL(r.prompt.chunks.size(), 2u);
  CAF_REQUIRE_EQUAL(r.chunk_keys.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    CAF_CHECK_EQUAL(r.prompt.chunks[i], tokens_of(kDocs[i]));
    CAF_CHECK(r.chunk_keys[i] == key_of(kDocs[i]));
  }
  CAF_CHECK(!(r.chunk_keys[0] == r.chunk_keys[1]));
  CAF_CHECK(!r.prompt.prefix.empty());
  CAF_CHECK(!r.prompt.suffix.empty());
  // The prefix's whole blocks (before the first chunk), chained keys.
  CAF_CHECK_EQUAL(r.prefix_block, ctx->config.prefix_block_tokens);
  CAF_CHECK_EQUAL(static_cast<int64_t>(r.prefix_block_keys.size()),
                  static_cast<int64_t>(r.prompt.prefix.size()) / ctx->config.prefix_block_tokens);
  CAF_CHECK(r.prefix_block_keys ==
            ctx->engine->prefix_block_keys(r.prompt.prefix, r.prefix_block, 1000));
  // Options from the config; sampling completed with the template's stops.
  CAF_CHECK(r.options.mode == ctx->config.blend.mode);
  CAF_CHECK_EQUAL(r.options.ratio, ctx->config.blend.ratio);
  CAF_CHECK_EQUAL(r.options.check_layers, ctx->config.blend.check_layers);
  CAF_CHECK(!r.ratio_requested);
  CAF_CHECK_EQUAL(r.sampling.max_tokens, 8);
  CAF_CHECK_EQUAL(r.sampling.stop, ctx->model->chat_template().stop_strings());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(rec->admitted.load());
  CAF_CHECK_EQUAL(count_events(*rec->trace, "intake", "tokenize"), 1);

  // A request's own mode and ratio override the config's.
  auto rec2 = new_record({kDocs[2]}, 0.4f, BlendMode::Reuse);
  const auto a2 = submit(rec2);
  CAF_CHECK_EQUAL(a2.id.value_or(0), rec2->id);
  const RequestPlan r2 = planned_by_intake();
  CAF_CHECK(r2.options.mode == BlendMode::Reuse);
  CAF_CHECK_EQUAL(r2.options.ratio, 0.4f);
  CAF_CHECK(r2.ratio_requested);
  CAF_CHECK_EQUAL(r2.prompt.chunks.size(), 1u);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
}

CAF_TEST(intake_refuses_invalid_requests_with_a_runtime_error_and_sends_nothing) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start

  auto empty = new_record({kDocs[0]});
  empty->request.messages.clear();
  auto a = submit(empty);
  check_runtime_error(a, RequestErrc::invalid, "messages must not be empty");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  auto robot = new_record({kDocs[0]});
  robot->request.messages = {{"robot", "beep"}, {"user", kQuestion}};
  a = submit(robot);
  check_runtime_error(a, RequestErrc::invalid, "unknown role 'robot'");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  ctx->config.max_prompt_tokens = 24;
  auto longer = new_record({kDocs[0], kDocs[1]});
  a = submit(longer);
  check_runtime_error(a, RequestErrc::too_long, "at most 24 fit");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  // An id without a record (the caller did not register it) is refused too.
  auto reply = self->request(h->intake(), caf::infinite, submit_atom::value, uint64_t{987654});
  expect((submit_atom, uint64_t), from(self).to(h->intake()).with(_, 987654u));
  Answer unknown;
  reply.receive([&](uint64_t id) { unknown.id = id; }, [&](caf::error& e) { unknown.error = std::move(e); });
  check_runtime_error(unknown, RequestErrc::internal, "not known");

  // None of them holds an admission slot.
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK(log->empty());
}

CAF_TEST(intake_admits_at_most_max_requests_in_flight) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 0;  // no queue: refused at once
  auto running = new_record({kDocs[1]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  auto r = new_record({kDocs[0]});
  auto a = submit(r);
  check_runtime_error(a, RequestErrc::overloaded, "too many requests: 1 in flight and 0 waiting");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  // Once the slot is free (the running request's release), the same request is admitted.
  CAF_CHECK(running->admitted.exchange(false));
  self->send(h->intake(), release_atom::value, running->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, running->id));
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  a = submit(r);
  CAF_CHECK_EQUAL(a.id.value_or(0), r->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, r->id);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
}

CAF_TEST(intake_queues_beyond_max_requests_in_order_and_refuses_beyond_the_queue) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 2;
  auto running = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  CAF_CHECK(running->admitted.load());
  // Two more wait: answered with their ids (prepared, so a bad one would have been
  // refused now), nothing sent on.
  auto q1 = new_record({kDocs[1]});
  auto q2 = new_record({kDocs[2]});
  CAF_CHECK_EQUAL(submit(q1).id.value_or(0), q1->id);
  // With room in the queue, an invalid request is still refused as invalid, not queued.
  auto bad = new_record({kDocs[0]});
  bad->request.sampling.max_tokens = 0;
  check_runtime_error(submit(bad), RequestErrc::invalid, "max_tokens must be >= 1");
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(submit(q2).id.value_or(0), q2->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 2);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(!q1->admitted.load());
  // The queue is full: overloaded (before any tokenizing).
  auto over = new_record({kDocs[0]});
  check_runtime_error(submit(over), RequestErrc::overloaded, "1 in flight and 2 waiting");
  CAF_CHECK(!sched.has_job());
  // The running request ends (whoever ends it clears `admitted` and sends the
  // release): the first queued one starts, the second still waits.
  CAF_CHECK(running->admitted.exchange(false));
  self->send(h->intake(), release_atom::value, running->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, running->id));
  const RequestPlan started = planned_by_intake();
  CAF_CHECK_EQUAL(started.id, q1->id);
  CAF_CHECK_EQUAL(started.prompt.chunks.size(), 1u);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(q1->admitted.load());
  // A queued request cancelled by id (the intake marks it: it is the one writer of a
  // record's cancel) leaves the queue and goes to the decoder, which finishes it
  // (cancelled); it never held a slot.
  CAF_CHECK(!q2->cancelled.load());
  self->send(h->intake(), cancel_atom::value, q2->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q2->id));
  expect((finish_atom, uint64_t), from(h->intake()).to(h->decoder()).with(_, q2->id));
  CAF_CHECK(q2->cancelled.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  CAF_CHECK(!q2->admitted.load());
  CAF_CHECK_EQUAL(count_events(*q2->trace, "intake", "queued"), 1);
  // Cancelling a running request marks it and tells the worker (it stops at its next
  // step), after the mark.
  self->send(h->intake(), cancel_atom::value, q1->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q1->id));
  CAF_CHECK(q1->cancelled.load());
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, q1->id));
  CAF_CHECK(!sched.has_job());
  // An unknown (finished) request: nothing.
  self->send(h->intake(), cancel_atom::value, uint64_t{987654});
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, uint64_t{987654}));
  CAF_CHECK(!sched.has_job());
  // A slot with nobody waiting: nothing to start. A second release of the same
  // request changes nothing.
  CAF_CHECK(q1->admitted.exchange(false));
  for (int i = 0; i < 2; ++i) {
    self->send(h->intake(), release_atom::value, q1->id);
    expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, q1->id));
    CAF_CHECK(!sched.has_job());
    CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  }
  CAF_CHECK_EQUAL(ctx->kv_pool->reserved_pages(), 0);
  CAF_CHECK_EQUAL(ctx->kv_pool->foreign_reservation_writes(), 0);
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"controller:plan", "controller:plan", "decoder:finish",
                                                  "worker:cancel"}));
}

// limits.max_request_seconds, on the test clock: at the deadline the intake cancels
// a running request (the worker is told; it ends as an error at its next step) and
// finishes a queued one through the decoder (it leaves the queue, its wait traced);
// both are marked expired with the sentence they end with. 10 s later a request that
// has still not ended is failed where it stands (the supervisor is asked to: it runs
// every fail decision); one that ended is left alone.
CAF_TEST(intake_expires_requests_at_max_request_seconds_running_or_queued) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 1;
  ctx->config.max_request_seconds = 5;
  auto running = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  // Submitted a second after the first (its deadline a second later: the timers are
  // set from the real clock's submit times, the test clock runs them in that order).
  auto queued = new_record({kDocs[1]});
  queued->submitted += std::chrono::seconds(1);
  CAF_CHECK_EQUAL(submit(queued).id.value_or(0), queued->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  // Nothing before the deadline.
  advance_time(std::chrono::seconds(4));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK(!running->expired.load());
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, running->id, 0));
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, running->id));
  CAF_CHECK(running->expired.load());
  CAF_CHECK(running->cancelled.load());
  CAF_CHECK_EQUAL(running->expiry_error, "the request ran longer than limits.max_request_seconds (5 s)");
  CAF_CHECK(!sched.has_job());
  CAF_CHECK(!queued->expired.load());
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, queued->id, 0));
  expect((finish_atom, uint64_t), from(h->intake()).to(h->decoder()).with(_, queued->id));
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, queued->id));
  CAF_CHECK(queued->expired.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  CAF_CHECK_EQUAL(count_events(*queued->trace, "intake", "queued"), 1);
  // The queued one ended (the decoder finished it); the running one did not stop.
  queued->finished = true;
  ctx->requests.erase(queued->id);
  advance_time(std::chrono::seconds(9));  // the running one's stage 0 + 10 s
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, running->id, 1));
  expect((fail_atom, uint64_t, std::string), from(h->intake()).to(h->supervisor()).with(
      _, running->id, "the request ran longer than limits.max_request_seconds (5 s) and had not stopped 10 s later"));
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, queued->id, 1));
  CAF_CHECK(!sched.has_job());  // the queued one had ended: nothing is failed
  ctx->config.max_request_seconds = 0;
}

// After a role's repeated death the supervisor pauses admission (admit_after_ns): a
// request that arrives meanwhile is queued, and starts when the pause ends (the
// intake's resume on the test clock), not before.
CAF_TEST(intake_holds_admission_while_a_restart_backoff_lasts) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 4;
  ctx->config.max_queue = 4;
  const auto until = std::chrono::steady_clock::now() + std::chrono::hours(1);
  ctx->admit_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
  auto r = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(r).id.value_or(0), r->id);
  CAF_CHECK(!r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK(!sched.has_job());
  // The pause ends (the supervisor's time passes); the resume message admits it.
  ctx->admit_after_ns = 0;
  advance_time(std::chrono::hours(1));
  expect((resume_atom), from(h->intake()).to(h->intake()));
  CAF_CHECK_EQUAL(planned_by_intake().id, r->id);
  CAF_CHECK(r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
}

// The slots and pages are the intake's state. One that dies takes its ledger with
// it; its successor rebuilds the ledger from the records still admitted (when it
// starts, and again on the supervisor's reconcile), so a release the dead one never
// got cannot leak a slot or pages, and a release of a request it does not hold
// changes nothing. Nobody but the intake wrote the pool's reservations.
CAF_TEST(a_restarted_intake_rebuilds_its_slots_and_pages_from_the_records) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 2;
  ctx->config.max_queue = 2;
  auto a = new_record({kDocs[0]});
  auto b = new_record({kDocs[1]});
  CAF_CHECK_EQUAL(submit(a).id.value_or(0), a->id);
  planned_by_intake();
  CAF_CHECK_EQUAL(submit(b).id.value_or(0), b->id);
  planned_by_intake();
  auto& pool = *ctx->kv_pool;
  const int64_t pa = a->kv_pages.load(), pb = b->kv_pages.load();
  CAF_REQUIRE(pa > 0 && pb > 0);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa + pb);
  // The intake dies. Meanwhile b ends: its release goes to the dead actor and is lost.
  caf::actor dead = caf::actor_cast<caf::actor>(h->intake());
  anon_send_exit(dead, caf::exit_reason::kill);
  sched.run();
  CAF_CHECK(b->admitted.exchange(false));
  anon_send(h->intake(), release_atom::value, b->id);
  sched.run();
  ctx->requests.erase(b->id);
  // The new intake: its ledger holds a alone.
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa);
  // A late release of b (it never held a slot here) and the reconcile change nothing.
  self->send(h->intake(), release_atom::value, b->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, b->id));
  self->send(h->intake(), reconcile_atom::value);
  expect((reconcile_atom), from(self).to(h->intake()));
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa);
  // There is room for one more: admitted by the new intake, counted beside a.
  auto c = new_record({kDocs[2]});
  CAF_CHECK_EQUAL(submit(c).id.value_or(0), c->id);
  planned_by_intake();
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa + c->kv_pages.load());
  // a and c end: everything is back.
  for (const auto& r : {a, c}) {
    CAF_CHECK(r->admitted.exchange(false));
    self->send(h->intake(), release_atom::value, r->id);
    expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, r->id));
  }
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK_EQUAL(pool.reserved_pages(), 0);
  CAF_CHECK_EQUAL(pool.foreign_reservation_writes(), 0);
}

// Admission counts KV cache pages too: with the pool's pages promised to running
// requests, a request waits in the queue though slots are free, and starts (its
// pages promised) once a release finds them.
CAF_TEST(intake_admits_only_while_the_requests_kv_pages_fit) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 8;
  ctx->config.max_queue = 2;
  const auto& mc = cfg();
  ctx->kv_pool = KvPagePool::make(*ctx->backend, mc.n_layers, mc.n_kv_heads, mc.head_dim, 8);  // 512 positions
  auto& pool = *ctx->kv_pool;
  const int64_t others = pool.total_pages() - 1;
  CAF_REQUIRE(pool.try_reserve(others));  // running requests hold all but one page
  auto r = new_record({kDocs[0]});
  r->request.sampling.max_tokens = 100;  // a document, a question and 100 tokens: more than one page
  CAF_CHECK_EQUAL(submit(r).id.value_or(0), r->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK(!r->admitted.load());
  CAF_CHECK_EQUAL(pool.reserved_pages(), others);
  // The running requests end (their pages go back with their slots): it starts. (They
  // held their pages outside the intake's ledger here, so the release names a request
  // it does not know: that changes no count, and the queue still gets its try.)
  pool.unreserve(others);
  self->send(h->intake(), release_atom::value, uint64_t{0});
  expect((release_atom, uint64_t), from(self).to(h->intake()));
  const RequestPlan started = planned_by_intake();
  CAF_CHECK_EQUAL(started.id, r->id);
  const int64_t pages = pool.pages_for(started.cache_capacity());
  CAF_CHECK(pages > 1);
  CAF_CHECK_EQUAL(r->kv_pages.load(), pages);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pages);
  CAF_CHECK(r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  // A request larger than the whole cache is refused as too long, never queued.
  auto huge = new_record({kDocs[0]});
  huge->request.sampling.max_tokens = 4096;
  check_runtime_error(submit(huge), RequestErrc::too_long, "KV cache pages");
  pool.unreserve(pages);
}

// -- 2. controller -------------------------------------------------------------

CAF_TEST(controller_plans_ram_ssd_and_missed_chunks_and_hands_the_plan_to_the_worker) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  const auto ram_kv = kv_of(kDocs[0]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), ram_kv));
  // The SSD entry in the other 16-bit dtype: the estimate counts each entry's own bytes.
  const auto computed = kv_of(kDocs[1]);
  auto ssd_kv = std::make_shared<ChunkKv>(*computed);
  ssd_kv->dtype = computed->dtype == kernels::TensorType::BF16 ? kernels::TensorType::F16 : kernels::TensorType::BF16;
  ssd_kv->set_fp32(computed->k_fp32(), computed->v_fp32());
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), ssd_kv));
  CAF_REQUIRE(!ctx->ram->contains(key_of(kDocs[1])));

  const auto in = intake_output(kDocs);
  const auto r = plan(in);  // one message out: the plan to the worker (it starts the loaders)
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kSsd, kMissTier}));
  CAF_CHECK_EQUAL(r.loaded.chunk_loaded, (std::vector<char>{1, 1, 0}));
  CAF_CHECK_EQUAL(r.loaded.prefix_cached, 0);
  CAF_CHECK(r.prefix_block_tier.empty());
  CAF_CHECK_EQUAL(r.cache_capacity(), r.prompt.size() + r.sampling.max_tokens);
  // The controller only looked: the SSD file is closed again, the RAM entry not pinned.
  // Default profiles: loading is far faster than the recompute, the ratio is the floor.
  const auto decision = json::parse(r.decision);
  CAF_CHECK_EQUAL(decision.at("reason").get<std::string>(), "floor");
  CAF_CHECK_EQUAL(r.options.ratio, ctx->config.blend.ratio);
  // Each token's K and V of every layer, in the entry's dtype.
  const int64_t token_elements = 2 * int64_t{cfg().n_layers} * cfg().kv_dim();
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ram").get<int64_t>(),
                  static_cast<int64_t>(r.prompt.chunks[0].size()) * token_elements * ram_kv->elem_bytes());
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ssd").get<int64_t>(),
                  static_cast<int64_t>(r.prompt.chunks[1].size()) * token_elements * 2);
  CAF_CHECK_EQUAL(ram_kv->elem_bytes(), kernels::kv_dtype_bytes(ctx->model->kv_dtype()));
  // The trace has the decision and the tiers by name.
  const auto trace = json::parse(ctx->traces.find(r.id)->json());
  CAF_CHECK_EQUAL(trace.at("chunk_tiers"), json({"ram", "ssd", "miss"}));
  CAF_CHECK_EQUAL(trace.at("controller").at("reason").get<std::string>(), "floor");
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"worker:prefill"}));

  // Mode full: nothing is looked up.
  const auto full = plan(intake_output(kDocs, std::nullopt, BlendMode::Full));
  CAF_CHECK_EQUAL(full.chunk_tier, (std::vector<TierId>{kMissTier, kMissTier, kMissTier}));
  CAF_CHECK_EQUAL(full.loaded.chunk_loaded, (std::vector<char>{0, 0, 0}));
  CAF_CHECK(!sched.has_job());
}

CAF_TEST(controller_raises_the_ratio_when_the_ssd_is_the_bottleneck) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), kv_of(kDocs[1])));
  const float floor = ctx->config.blend.ratio;

  auto p = profile();
  CAF_CHECK_EQUAL(p.at("ssd_samples").get<int>(), 0);
  CAF_CHECK_EQUAL(p.at("ssd_bytes_per_s").get<double>(), 1.5e9);
  // A very slow SSD: two samples of 1 MB/s; a sample without units or time is ignored.
  for (int i = 0; i < 2; ++i) {
    self->send(h->controller(), profile_atom::value, std::string("ssd"), int64_t{2'000'000}, 2.0);
    expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", 2'000'000, 2.0));
  }
  self->send(h->controller(), profile_atom::value, std::string("ssd"), int64_t{0}, 1.0);
  expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", 0, 1.0));
  p = profile();
  CAF_CHECK_EQUAL(p.at("ssd_samples").get<int>(), 2);
  CAF_CHECK(std::abs(p.at("ssd_bytes_per_s").get<double>() - 1e6) < 1e-3);
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 0);
  // Samples count by their size: a 1 MB load at 100 MB/s (its time mostly per-layer
  // setup), then a 50 MB one at 1 GB/s, estimate the tier near 1 GB/s — the decayed
  // bytes over the decayed seconds, (0.7 x 1 MB + 50 MB) / (0.7 x 10 ms + 50 ms) — not
  // the per-sample average's 370 MB/s, which would predict the next large load at
  // 2.7x its time.
  for (const auto& [bytes, seconds] : {std::pair<int64_t, double>{1'000'000, 0.01}, {50'000'000, 0.05}}) {
    self->send(h->controller(), profile_atom::value, std::string("ram"), bytes, seconds);
    expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ram", bytes, seconds));
  }
  p = profile();
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 2);
  const double ram_rate = p.at("ram_bytes_per_s").get<double>();
  CAF_CHECK(std::abs(ram_rate - (0.7 * 1e6 + 50e6) / (0.7 * 0.01 + 0.05)) < 1.0);
  CAF_CHECK_GREATER(ram_rate, 0.85e9);

  // No requested ratio: the load takes longer than the recompute at the floor, so
  // the ratio goes up (here to 1: the load takes longer than a full recompute).
  auto r = plan(intake_output({kDocs[1]}));
  CAF_CHECK_EQUAL(r.chunk_tier, (std::vector<TierId>{kSsd}));
  CAF_CHECK_GREATER(r.options.ratio, floor);
  CAF_CHECK_EQUAL(r.options.ratio, 1.0f);
  auto d = json::parse(r.decision);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>().rfind("load-bound", 0), 0u);
  CAF_CHECK_EQUAL(d.at("ratio_floor").get<float>(), floor);
  CAF_CHECK(std::abs(d.at("inputs").at("ssd_bytes_per_s").get<double>() - 1e6) < 1e-3);
  CAF_CHECK_GREATER(d.at("est_load_s").get<double>(), d.at("est_compute_at_floor_s").get<double>());

  // A requested ratio is kept.
  auto fixed = plan(intake_output({kDocs[1]}, 0.2f));
  CAF_CHECK_EQUAL(fixed.options.ratio, 0.2f);
  d = json::parse(fixed.decision);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>(), "requested");

  // The planned recompute (overhead + the rows the filtering in use computes per
  // layer) meets the load time, less the margin, exactly where that lies between
  // floor and 1: a fresh controller whose one SSD sample makes margin x load time
  // the recompute time at ratio 0.5.
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  auto half_in = intake_output({kDocs[1]});
  const int64_t cached = static_cast<int64_t>(half_in.prompt.chunks[0].size());
  const int64_t other = half_in.prompt.size() - cached;
  const int64_t bytes = cached * 2 * int64_t{cfg().n_layers} * cfg().kv_dim() * 4;
  const double per_row_layer = profile().at("compute_s_per_token_layer").get<double>();
  const double overhead = profile().at("overhead_s_per_prompt_token").get<double>() * half_in.prompt.size();
  BlendOptions at_half = half_in.options;
  at_half.ratio = 0.5f;
  const auto rows = planned_rows_per_layer(at_half, cfg().n_layers, other, cached);
  double row_layers = 0;
  for (double x : rows) row_layers += x;
  // Gradual filtering (the default): every cached row through the layers before the
  // first check, fewer after each: more than the ratio's share, less than all.
  CAF_CHECK_GREATER(row_layers, (other + 0.5 * cached) * cfg().n_layers);
  CAF_CHECK_LESS(row_layers, static_cast<double>(other + cached) * cfg().n_layers);
  const double seconds = (overhead + per_row_layer * row_layers) / ControllerState::load_margin;
  self->send(h->controller(), profile_atom::value, std::string("ssd"), bytes, seconds);
  expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", bytes, seconds));
  auto half = plan(half_in);
  CAF_CHECK(std::abs(half.options.ratio - 0.5f) < 1e-4f);
  // The trace's prediction: the loads end at est_load; the compute fits in 0.85 of
  // it, so the first token comes just after the last layer's load, and before the
  // load plus all of the compute.
  const auto hd = json::parse(half.decision);
  const double est_load = hd.at("est_load_s").get<double>(), est_ttft = hd.at("est_ttft_s").get<double>();
  CAF_CHECK_GREATER(est_ttft, est_load);
  CAF_CHECK_LESS(est_ttft, est_load + hd.at("est_compute_s").get<double>());
}

// -- 3. loader (RAM) -----------------------------------------------------------

CAF_TEST(ram_loader_streams_layer_by_layer_into_the_target_then_ends_and_reports_its_profile) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, ctx.get(), h, kRam, make_counters("loader-ram-0")));
  sched.run();  // the spawned actors start
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv0));
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[1]), kv1));

  const auto r = plan(intake_output({kDocs[0], kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kRam}));
  const auto ram = loader_of(kRam);
  auto target = make_target(r, {ram.id()});
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  // The worker: the loader's n_layers layers in order, by request id, then its end.
  const int n_layers = cfg().n_layers;
  for (int32_t l = 0; l < n_layers; ++l)
    expect((layer_atom, uint64_t, int32_t), from(ram).to(h->worker()).with(_, r.id, l));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  // The controller: the bytes it moved and the time it took.
  const int64_t tokens = static_cast<int64_t>(r.prompt.chunks[0].size() + r.prompt.chunks[1].size());
  const int64_t bytes = 2 * tokens * n_layers * cfg().kv_dim() * 4;
  const auto [atom, source, units, seconds] = extract<profile_atom, std::string, int64_t, double>(h->controller());
  CAF_CHECK_GREATER(seconds, 0.0);
  expect((profile_atom, std::string, int64_t, double), from(ram).to(h->controller()).with(_, "ram", bytes, _));
  CAF_CHECK(!sched.has_job());
  const auto p = profile();
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 1);
  CAF_CHECK(std::abs(p.at("ram_bytes_per_s").get<double>() - bytes / seconds) < 1e-6 * (bytes / seconds));

  // The target's cache holds each chunk's stored KV at the chunk's offset, as stored.
  for (int l : {0, n_layers - 1}) {
    CAF_CHECK_EQUAL(mismatches(target->cache, *kv0, l, r.prompt.chunk_offset(0)), 0);
    CAF_CHECK_EQUAL(mismatches(target->cache, *kv1, l, r.prompt.chunk_offset(1)), 0);
  }
  // Guard: the comparison sees a difference where there is one.
  CAF_CHECK_GREATER(mismatches(target->cache, *kv0, 0, r.prompt.chunk_offset(1)), 0);
  CAF_CHECK_EQUAL(count_events(*ctx->traces.find(r.id), "loader-ram", "load"), n_layers);
}

CAF_TEST(a_loader_stops_for_a_failed_gate_or_an_entry_that_is_gone) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, ctx.get(), h, kRam, make_counters("loader-ram-0")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv_of(kDocs[0])));
  const auto ram = loader_of(kRam);
  const auto r = plan(intake_output({kDocs[0]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam}));

  // The gate failed (a cancel, another loader's failure, a timeout) before the
  // loader ran: it reads no layer, ends its work and reports no profile.
  auto target = make_target(r, {ram.id()});
  target->gate.fail("cancelled");
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  disallow((layer_atom, uint64_t, int32_t), from(_).to(h->worker()));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(count_events(*ctx->traces.find(r.id), "loader-ram", "load stopped"), 1);

  // The entry was evicted between the plan and the load: a recoverable failure (the
  // worker begins the prefill again with that part computed), then the end.
  target = make_target(r, {ram.id()});
  CAF_REQUIRE(ctx->ram->erase(key_of(kDocs[0])));
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  const auto [atom, id, part, why] = extract<load_fail_atom, uint64_t, int32_t, std::string>(h->worker());
  CAF_CHECK_EQUAL(mentions(why, "no longer in the ram tier"), "no longer in the ram tier");
  CAF_CHECK_EQUAL(part, 0);  // the plan's part that failed: the one chunk
  expect((load_fail_atom, uint64_t, int32_t, std::string), from(ram).to(h->worker()).with(_, r.id, 0, why));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  CAF_CHECK(!sched.has_job());
}

// Tensor parallel, 3 ranks of SmolLM2's 3 KV heads (one each): the loader reads each
// layer once, writes rank 0's head into the target (the only cache it is handed) and
// sends each follower's worker that rank's head as a value, then tells each follower
// it is done before it tells the worker. A loader that wrote a follower's memory, or
// sent a rank another rank's heads, fails here.
CAF_TEST(tensor_parallel_a_loader_writes_rank_0s_heads_and_sends_each_follower_its_own_as_values) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, ctx.get(), h, kRam, make_counters("loader-ram-0")));
  std::vector<std::shared_ptr<RankInbox>> inbox{std::make_shared<RankInbox>(), std::make_shared<RankInbox>()};
  h->update([&](ActorSet& a) {
    a.rank_workers = {sys.spawn(rank_worker_double, inbox[0]), sys.spawn(rank_worker_double, inbox[1])};
  });
  sched.run();  // the spawned actors start
  const int ranks = 3;
  CAF_REQUIRE_EQUAL(cfg().n_kv_heads, ranks);
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv0));
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[1]), kv1));
  const auto r = plan(intake_output({kDocs[0], kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kRam}));
  const auto ram = loader_of(kRam);
  // Rank 0's target: a cache of its one head.
  auto target = std::make_shared<LoadTarget>();
  target->cache = KvCache(cfg().n_layers, 1, cfg().head_dim, r.cache_capacity(), kv0->dtype);
  target->ranks = ranks;
  target->gate.reset(cfg().n_layers, {ram.id()}, ranks);
  log->clear();
  self->send(ram, load_atom::value, r, target);
  sched.run();

  const int n_layers = cfg().n_layers;
  const int64_t hd = cfg().head_dim;
  // Stored head `head` of layer l of a chunk, K or V, as bytes.
  auto stored = [&](const ChunkKv& kv, int l, int head, bool k) {
    const size_t run = static_cast<size_t>(kv.length() * hd * kv.elem_bytes());
    const auto* at = reinterpret_cast<const char*>(k ? kv.k_layer(l) : kv.v_layer(l)) + head * run;
    return std::vector<char>(at, at + run);
  };
  for (int f = 0; f < 2; ++f) {
    const RankInbox& in = *inbox[static_cast<size_t>(f)];
    CAF_REQUIRE_EQUAL(in.kv.size(), static_cast<size_t>(n_layers));
    for (int l = 0; l < n_layers; ++l) {
      const RankKv& got = in.kv[static_cast<size_t>(l)];
      CAF_CHECK_EQUAL(got.id, r.id);
      CAF_CHECK_EQUAL(got.layer, l);  // in order
      CAF_CHECK_EQUAL(got.loader, ram.id());
      CAF_REQUIRE_EQUAL(got.parts.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        const ChunkKv& kv = i == 0 ? *kv0 : *kv1;
        const RankKvPart& part = got.parts[i];
        CAF_CHECK_EQUAL(part.offset, r.prompt.chunk_offset(i));
        CAF_CHECK_EQUAL(part.length, kv.length());
        CAF_CHECK_EQUAL(part.dtype, static_cast<int32_t>(kv.dtype));
        CAF_CHECK(part.k == stored(kv, l, f + 1, true));  // rank f + 1's head, nobody else's
        CAF_CHECK(part.v == stored(kv, l, f + 1, false));
      }
    }
    CAF_CHECK_EQUAL(in.ends, (std::vector<std::pair<uint64_t, uint64_t>>{{r.id, ram.id()}}));
  }
  // Rank 0's cache holds head 0 of each chunk, as stored.
  for (int l : {0, n_layers - 1})
    for (size_t i = 0; i < 2; ++i) {
      const ChunkKv& kv = i == 0 ? *kv0 : *kv1;
      std::vector<char> k(static_cast<size_t>(kv.length() * hd * kv.elem_bytes())), v(k.size());
      target->cache.read_rows_raw(l, 0, r.prompt.chunk_offset(i), kv.length(), k.data(), v.data());
      CAF_CHECK(k == stored(kv, l, 0, true));
      CAF_CHECK(v == stored(kv, l, 0, false));
    }
  // Rank 0's own deliveries: every layer once (the followers' come from their
  // workers), and the copy event of each.
  for (int l = 0; l < n_layers; ++l) {
    CAF_CHECK(!target->gate.delivered(l));  // the followers have not said so
    CAF_CHECK_EQUAL(target->copied.take(l).size(), 1u);
  }
  CAF_CHECK(target->gate.holds(ram.id()));  // done on rank 0 only when the worker hears it
  // The worker heard of rank 0's layers, in order, then of the end.
  std::vector<std::string> worker_log;
  for (const auto& e : *log)
    if (e.rfind("worker:", 0) == 0) worker_log.push_back(e);
  CAF_REQUIRE_EQUAL(worker_log.size(), static_cast<size_t>(n_layers + 1));
  for (int l = 0; l < n_layers; ++l) CAF_CHECK_EQUAL(worker_log[static_cast<size_t>(l)], "worker:layer:" + std::to_string(l));
  CAF_CHECK_EQUAL(worker_log.back(), "worker:loadend");
}

// -- 3b. writer (SSD) ----------------------------------------------------------

CAF_TEST(ssd_writer_stores_in_order_and_its_queue_is_bounded_in_bytes) {
  auto writer_counters = make_counters("ssd-writer");
  put(&ActorSet::ssd_writer, sys.spawn(writer, ctx.get(), writer_counters));
  sched.run();  // the spawned actors start
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]), kv2 = kv_of(kDocs[2]);
  const auto b0 = static_cast<int64_t>(kv0->bytes()), b1 = static_cast<int64_t>(kv1->bytes());
  // Room for the first two entries, not the third.
  ctx->config.ssd.write_queue_bytes = b0 + b1;
  CAF_CHECK(enqueue_write(*ctx, h->ssd_writer(), KeyedKv{key_of(kDocs[0]), kv0}));
  CAF_CHECK(enqueue_write(*ctx, h->ssd_writer(), KeyedKv{key_of(kDocs[1]), kv1}));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), b0 + b1);
  CAF_CHECK(!enqueue_write(*ctx, h->ssd_writer(), KeyedKv{key_of(kDocs[2]), kv2}));  // dropped, counted
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.dropped.load(), 1);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.high_water.load(), b0 + b1);
  // Nothing is written before the writer runs; then both, in order, and the queue is empty.
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[0])));
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[0])));
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[1])));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), b1);
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[1])));
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[2])));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), 0);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.written.load(), 2);
  // Room again: the third is taken now. A key already stored is not rewritten.
  CAF_CHECK(enqueue_write(*ctx, h->ssd_writer(), KeyedKv{key_of(kDocs[2]), kv2}));
  CAF_CHECK(enqueue_write(*ctx, h->ssd_writer(), KeyedKv{key_of(kDocs[0]), kv0}));
  const int64_t puts = ctx->ssd->stats().puts;
  CAF_CHECK_EQUAL(ask<bool>(h->ssd_writer(), flush_atom::value), true);  // after every store before it
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[2])));
  CAF_CHECK_EQUAL(ctx->ssd->stats().puts, puts + 1);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), 0);
  CAF_CHECK(ctx->ram->get(key_of(kDocs[2])) == nullptr);  // the writer writes its tier only
  CAF_CHECK_EQUAL(writer_counters->messages.load(), 5);
}

// -- 4. loader (SSD), corrupt file ---------------------------------------------

CAF_TEST(ssd_loader_fails_the_load_on_a_corrupt_layer_and_reports_no_profile) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(kSsd, 0, sys.spawn(loader, ctx.get(), h, kSsd, make_counters("loader-ssd-0")));
  sched.run();  // the spawned actors start
  const ChunkKey key = key_of(kDocs[1]);
  CAF_REQUIRE(ctx->ssd->put(key, kv_of(kDocs[1])));
  const std::string path = ctx->ssd->path_of(key);
  CAF_REQUIRE_EQUAL(path, (fs::path(ctx->ssd->dir()) / (key.hex() + ".bskv")).string());
  // Layout (storage/disk_store.h): a 4096-byte header, then equal 4096-aligned
  // layer spans, K first. Flip a byte inside the K data of layer 3.
  const int64_t m = static_cast<int64_t>(tokens_of(kDocs[1]).size());
  const int64_t layer_bytes = 2 * m * cfg().kv_dim() * 4;
  const int64_t span = (layer_bytes + 4095) / 4096 * 4096;
  const off_t at = static_cast<off_t>(4096 + 3 * span + 100);
  CAF_REQUIRE_LESS(100, m * cfg().kv_dim() * 4);
  CAF_REQUIRE_EQUAL(static_cast<int64_t>(fs::file_size(path)), 4096 + cfg().n_layers * span);
  {
    const int fd = ::open(path.c_str(), O_RDWR);
    CAF_REQUIRE(fd >= 0);
    unsigned char b = 0;
    CAF_REQUIRE_EQUAL(::pread(fd, &b, 1, at), 1);
    b ^= 0x5a;
    CAF_REQUIRE_EQUAL(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  }

  const auto r = plan(intake_output({kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kSsd}));  // the header is intact
  const auto ssd = loader_of(kSsd);
  auto target = make_target(r, {ssd.id()});
  self->send(ssd, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ssd).with(_, _, _));
  for (int32_t l = 0; l < 3; ++l)
    expect((layer_atom, uint64_t, int32_t), from(ssd).to(h->worker()).with(_, r.id, l));
  const auto [atom, failed, part, why] = extract<load_fail_atom, uint64_t, int32_t, std::string>(h->worker());
  CAF_CHECK_EQUAL(mentions(why, key.hex()), key.hex());
  CAF_CHECK_EQUAL(mentions(why, "layer 3"), "layer 3");
  CAF_CHECK_EQUAL(part, 0);
  expect((load_fail_atom, uint64_t, int32_t, std::string), from(ssd).to(h->worker()).with(_, r.id, 0, why));
  expect((load_end_atom, uint64_t, uint64_t), from(ssd).to(h->worker()).with(_, r.id, ssd.id()));
  disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(profile().at("ssd_samples").get<int>(), 0);
  // The corrupt file is gone; nothing was promoted to RAM.
  CAF_CHECK(!fs::exists(path));
  CAF_CHECK(!ctx->ssd->contains(key));
  CAF_CHECK_EQUAL(ctx->ssd->stats().corrupt, 1);
  CAF_CHECK(!ctx->ram->contains(key));
}

// -- 5. worker ------------------------------------------------------------------

CAF_TEST(a_layer_gate_counts_each_loaders_layers_and_ends_and_keeps_the_first_failure) {
  LayerGate gate;
  const uint64_t loader_a = 101, loader_b = 102;
  gate.reset(4, {loader_a, loader_b});
  CAF_CHECK_EQUAL(gate.loaders(), 2);
  CAF_CHECK(gate.holds(loader_a) && gate.holds(loader_b));
  // Layer 0 is there once both loaders delivered it; each wait is bounded.
  CAF_CHECK(!gate.wait_for(0, 10ms));
  gate.arrive(0);
  CAF_CHECK(!gate.delivered(0));
  auto wait0 = std::async(std::launch::async, [&gate] { return gate.wait_for(0, 10s); });
  CAF_CHECK(wait_on(wait0, 100ms) == Waited::blocked);
  gate.arrive(0);
  CAF_REQUIRE(wait_on(wait0, 10s) == Waited::ready);
  CAF_CHECK(wait0.get());
  CAF_CHECK(gate.delivered(0));
  CAF_CHECK(!gate.delivered(1));  // later layers still wait
  // Loader ends, per loader and idempotent: the wait for the loaders ends with the last.
  gate.loader_done(loader_a);
  gate.loader_done(loader_a);
  CAF_CHECK(!gate.holds(loader_a) && gate.holds(loader_b));
  CAF_CHECK(!gate.loaders_done());
  auto done = std::async(std::launch::async, [&gate] { return gate.wait_loaders_done_for(10s); });
  CAF_CHECK(wait_on(done, 100ms) == Waited::blocked);
  gate.loader_done(loader_b);
  CAF_REQUIRE(wait_on(done, 10s) == Waited::ready);
  CAF_CHECK(done.get());
  CAF_CHECK(gate.loaders_done());
  // A stored entry's failure is recoverable; every wait after it throws; the first wins.
  auto wait1 = std::async(std::launch::async, [&gate] { return gate.wait_for(1, 10s); });
  CAF_CHECK(wait_on(wait1, 100ms) == Waited::blocked);
  gate.fail("chunk 0123 layer 1 failed its read or checksum", true);
  gate.fail("later");
  CAF_REQUIRE(wait_on(wait1, 10s) == Waited::ready);
  bool recoverable = false;
  std::string thrown;
  try {
    wait1.get();
  } catch (const LayerGate::LoadFailed& e) {
    thrown = e.what();
    recoverable = e.recoverable;
  }
  CAF_CHECK_EQUAL(thrown, "chunk 0123 layer 1 failed its read or checksum");
  CAF_CHECK(recoverable);
  std::string why;
  CAF_CHECK(gate.failure(why, recoverable));
  CAF_CHECK_EQUAL(why, thrown);
}

CAF_TEST(worker_publishes_the_load_target_sends_each_tier_to_its_least_busy_loader_and_stops_a_cancelled_prefill) {
  put(&ActorSet::worker, sys.spawn(layer_worker, ctx.get(), h, make_counters("layer-worker")));
  sched.run();  // the spawned actors start
  // The compute thread is held, so the prefill's first step job waits in its queue.
  std::promise<void> release = hold_compute();
  const int64_t jobs_before = ctx->compute->jobs_done();

  // A: one chunk from RAM, one from the SSD.
  auto a = intake_output({kDocs[0], kDocs[1]});
  a.chunk_tier = {kRam, kSsd};
  a.loaded.chunk_loaded = {1, 1};
  self->send(h->worker(), prefill_atom::value, a);
  expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
  // Each loader is handed the target with the plan (the worker keeps it: no table).
  const auto [load_a, plan_a, target] = extract<load_atom, RequestPlan, LoadTargetPtr>(loader_of(kRam, 0));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kRam, 0)).with(_, _, target));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kSsd, 0)).with(_, _, target));
  CAF_REQUIRE(target != nullptr);
  CAF_CHECK_EQUAL(plan_a.id, a.id);
  CAF_CHECK_EQUAL(target->gate.loaders(), 2);
  CAF_CHECK(target->gate.holds(loader_of(kRam, 0).id()) && target->gate.holds(loader_of(kSsd, 0).id()));
  CAF_CHECK_EQUAL(target->cache.capacity, a.cache_capacity());
  CAF_CHECK_EQUAL(ctx->compute->queued(), 1);  // its first step job

  // B, RAM only, while A's loads run: the other RAM loader takes it.
  auto b = intake_output({kDocs[2]});
  b.chunk_tier = {kRam};
  b.loaded.chunk_loaded = {1};
  self->send(h->worker(), prefill_atom::value, b);
  expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
  const auto [load_b, plan_b, b_target] = extract<load_atom, RequestPlan, LoadTargetPtr>(loader_of(kRam, 1));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kRam, 1)).with(_, _, b_target));
  CAF_REQUIRE(b_target != nullptr && b_target != target);
  CAF_CHECK(!sched.has_job());

  // The loaders' messages reach A's gate by request id.
  for (const auto& l : {loader_of(kRam, 0), loader_of(kSsd, 0)}) {
    self->send(h->worker(), layer_atom::value, a.id, int32_t{0});
    expect((layer_atom, uint64_t, int32_t), from(self).to(h->worker()).with(_, a.id, 0));
    (void)l;
  }
  CAF_CHECK(target->gate.delivered(0));
  CAF_CHECK(!target->gate.delivered(1));

  // A is cancelled: its gate fails at once (its loaders stop at their next layer).
  self->send(h->worker(), cancel_atom::value, a.id);
  expect((cancel_atom, uint64_t), from(self).to(h->worker()).with(_, a.id));
  std::string why;
  bool recoverable = true;
  CAF_CHECK(target->gate.failure(why, recoverable));
  CAF_CHECK_EQUAL(why, "cancelled");
  CAF_CHECK(!recoverable);

  // The compute thread goes on: A's job sees the cancel at its first layer. The
  // worker runs one prefill job at a time: B's first job is queued once A's came
  // back, and parks (its layer 0 is not there). The prefill of A ends once its
  // loaders stopped: then the decoder gets A's outcome, an error, and the target is gone.
  release.set_value();
  wait_compute(jobs_before + 2);  // the held job and A's
  expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, a.id, _));
  wait_compute(jobs_before + 3);  // B's
  expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, b.id, _));
  CAF_CHECK_GREATER(target.use_count(), 1);  // the worker keeps it: its loaders have not stopped
  for (const auto& l : {loader_of(kRam, 0), loader_of(kSsd, 0)}) {
    self->send(h->worker(), load_end_atom::value, a.id, l.id());
    expect((load_end_atom, uint64_t, uint64_t), from(self).to(h->worker()).with(_, a.id, l.id()));
  }
  sched.run();  // the worker concludes A
  CAF_CHECK_EQUAL(target.use_count(), 1);  // the worker dropped it (only this test holds it)
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ram_loader0:load", "ssd_loader0:load", "ram_loader1:load",
                                                  "decoder:start"}));
  // B still waits for its RAM layers: its target stays, until the request ends.
  CAF_CHECK_GREATER(b_target.use_count(), 1);
  CAF_CHECK(!b_target->gate.failed());
  self->send(h->worker(), end_atom::value, b.id);
  sched.run();
  CAF_CHECK(b_target->gate.failed());
  // Its loader stops at the failed gate: the worker concludes B (without it, B would
  // wait limits.load_timeout for its loader in real time) and the target goes.
  self->send(h->worker(), load_end_atom::value, b.id, loader_of(kRam, 1).id());
  sched.run();
  CAF_CHECK_EQUAL(b_target.use_count(), 1);
  CAF_CHECK_EQUAL(log->size(), 5u);
  CAF_CHECK_EQUAL(log->back(), "decoder:start");  // B's outcome, an error
}

CAF_TEST(worker_prefills_then_batches_decode_steps_and_a_request_that_fails_fails_alone) {
  put(&ActorSet::worker, sys.spawn(layer_worker, ctx.get(), h, make_counters("layer-worker")));
  put(&ActorSet::decoder, sys.spawn(decoder_double, log));
  sched.run();  // the spawned actors start
  const int64_t vocab = cfg().vocab;
  ctx->config.write_back = false;
  // Two requests without stored KV (mode full): one with room for 4 more tokens,
  // one whose cache is full after its prompt.
  auto healthy = intake_output({kDocs[0]}, std::nullopt, BlendMode::Full);
  healthy.sampling.max_tokens = 4;
  auto full = intake_output({kDocs[1]}, std::nullopt, BlendMode::Full);
  full.sampling.max_tokens = 0;
  std::vector<PrefillOutcome> outcomes;
  for (const auto& plan : {healthy, full}) {
    const int64_t before = ctx->compute->jobs_done();
    self->send(h->worker(), prefill_atom::value, plan);
    expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
    wait_compute(before + 1);
    expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, plan.id, _));
    const auto [atom, out] = extract<start_atom, PrefillOutcome>(h->decoder());
    expect((start_atom, PrefillOutcome), to(h->decoder()).with(_, _));
    CAF_CHECK(out.error.empty());
    CAF_CHECK_EQUAL(out.plan.id, plan.id);
    CAF_CHECK_EQUAL(out.logits.size(), static_cast<size_t>(vocab));
    outcomes.push_back(out);
  }

  // The reference: the same prompt and token through the transformer alone.
  const int32_t token = 42;
  const auto& tf = *ctx->tf;
  KvCache alone = tf.make_cache(healthy.prompt.size() + 1);
  tf.forward(healthy.prompt.concatenated(), alone);
  const auto want = tf.forward(std::span<const int32_t>(&token, 1), alone);

  // The compute thread is busy, so both steps wait in the batcher for one job.
  std::promise<void> release = hold_compute();
  for (const auto& plan : {healthy, full}) {
    self->send(h->worker(), decode_atom::value, plan.id, DecodeAsk{token, {}});
    expect((decode_atom, uint64_t, DecodeAsk), from(self).to(h->worker()).with(_, plan.id, _));
  }
  // Both wait in the worker's batcher (its own state): one drain job for both.
  CAF_CHECK_EQUAL(ctx->compute->queued(), 1);
  const int64_t done_before = ctx->compute->jobs_done();
  release.set_value();
  wait_compute(done_before + 2);

  // One batched step was tried; the full cache made it throw, so each ran alone:
  // the healthy request got its one-token logits, the full one its error.
  CAF_CHECK_EQUAL(ctx->decode_steps.load(), 1);
  CAF_CHECK_EQUAL(ctx->decode_tokens.load(), 2);
  const auto [a1, id1, step1] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  expect((logits_atom, uint64_t, DecodeStep), to(h->decoder()).with(_, healthy.id, _));
  const auto [a2, id2, step2] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  expect((logits_atom, uint64_t, DecodeStep), to(h->decoder()).with(_, full.id, _));
  CAF_CHECK(step1.error.empty());
  CAF_CHECK_EQUAL(step1.batch, 2);
  CAF_REQUIRE_EQUAL(step1.logits.size(), static_cast<size_t>(vocab));
  float diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(step1.logits[i] - want[i]));
  CAF_CHECK_LESS(diff, 2e-2f);  // the engine's full prefill and the plain forward round alike, not bit for bit
  CAF_CHECK(step2.logits.empty());
  CAF_CHECK_EQUAL(mentions(step2.error, "capacity"), "capacity");
  // The prefills' compute profiles went to the controller.
  sched.run();
  CAF_CHECK_EQUAL(std::count(log->begin(), log->end(), "controller:profile:compute"), 2);
  CAF_CHECK(!sched.has_job());

  // A request that ended: its slot is gone, a late step is answered with an error.
  self->send(h->worker(), end_atom::value, full.id);
  expect((end_atom, uint64_t), from(self).to(h->worker()).with(_, full.id));
  self->send(h->worker(), decode_atom::value, full.id, DecodeAsk{token, {}});
  expect((decode_atom, uint64_t, DecodeAsk), from(self).to(h->worker()).with(_, full.id, _));
  const auto [a3, id3, step3] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  CAF_CHECK_EQUAL(mentions(step3.error, "no cache"), "no cache");
  expect((logits_atom, uint64_t, DecodeStep), from(h->worker()).to(h->decoder()).with(_, full.id, _));
}

// -- 6. inspector --------------------------------------------------------------

CAF_TEST(inspector_lists_registered_actors_and_keeps_the_last_traces) {
  const int history = 3;
  const fs::path trace_dir = dir / "traces";
  // A numbered trace of an earlier process: ids start again at 1, so it goes.
  fs::create_directories(trace_dir);
  std::ofstream(trace_dir / "7.json") << "{}";
  put(&ActorSet::inspector, sys.spawn(inspector, history, trace_dir.string(), std::string("node-a"),
                                      make_counters("inspector")));
  sched.run();  // the spawned actors start
  CAF_CHECK(!fs::exists(trace_dir / "7.json"));
  auto intake_counters = make_counters("intake");
  intake_counters->messages = 5;
  self->send(h->inspector(), register_atom::value, intake_counters);
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, intake_counters));
  self->send(h->inspector(), register_atom::value, make_counters("write-back"));
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, _));
  // An actor in the middle of a message that began 2 s ago, 50 more waiting.
  auto stuck = make_counters("rank-worker-2");
  stuck->busy_since_ns = steady_now_ns() - 2'000'000'000;
  stuck->mailbox = 50;
  stuck->set_error("the rank-worker-2 actor failed: injected");
  self->send(h->inspector(), register_atom::value, stuck);
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, _));

  auto table = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  auto actors = table.at("actors");
  CAF_REQUIRE_EQUAL(actors.size(), 4u);
  CAF_CHECK_EQUAL(actors[0].at("actor").get<std::string>(), "inspector");
  CAF_CHECK_EQUAL(actors[1].at("actor").get<std::string>(), "intake");
  CAF_CHECK_EQUAL(actors[1].at("kind").get<std::string>(), "intake");
  CAF_CHECK_EQUAL(actors[1].at("node").get<std::string>(), "node-a");
  CAF_CHECK_EQUAL(actors[1].at("messages").get<int64_t>(), 5);
  CAF_CHECK_EQUAL(actors[1].at("state").get<std::string>(), "idle");
  CAF_CHECK_EQUAL(actors[1].at("busy_share").get<double>(), 0.0);
  CAF_CHECK(!actors[1].contains("last_error"));
  CAF_CHECK_EQUAL(actors[2].at("actor").get<std::string>(), "write-back");
  CAF_CHECK_EQUAL(actors[2].at("messages").get<int64_t>(), 0);
  // The stuck one: busy, its message in hand counted, the whole window busy.
  CAF_CHECK_EQUAL(actors[3].at("kind").get<std::string>(), "rank-worker");
  CAF_CHECK_EQUAL(actors[3].at("rank").get<int>(), 2);
  CAF_CHECK_EQUAL(actors[3].at("state").get<std::string>(), "busy");
  CAF_CHECK_EQUAL(actors[3].at("mailbox").get<int64_t>(), 50);
  CAF_CHECK_GREATER_OR_EQUAL(actors[3].at("busy_s").get<double>(), 2.0);
  CAF_CHECK_GREATER(actors[3].at("busy_share").get<double>(), 0.99);
  CAF_CHECK_EQUAL(actors[3].at("last_error").get<std::string>(), "the rank-worker-2 actor failed: injected");

  for (int i = 1; i <= history + 2; ++i) {
    const std::string trace = json{{"id", i}}.dump();
    self->send(h->inspector(), trace_atom::value, trace);
    expect((trace_atom, std::string), from(self).to(h->inspector()).with(_, trace));
  }
  auto ids = [&](int32_t n) {
    std::vector<int> out;
    const auto j = json::parse(ask<std::string>(h->inspector(), get_trace_atom::value, n));
    CAF_CHECK(j.is_array());
    for (const auto& t : j) out.push_back(t.at("id").get<int>());
    return out;
  };
  CAF_CHECK_EQUAL(ids(100), (std::vector<int>{3, 4, 5}));
  CAF_CHECK_EQUAL(ids(history), (std::vector<int>{3, 4, 5}));
  CAF_CHECK_EQUAL(ids(2), (std::vector<int>{4, 5}));
  CAF_CHECK_EQUAL(ids(0), std::vector<int>{});
  CAF_CHECK_EQUAL(ids(-1), std::vector<int>{});
  // The last trace is on disk for `blendctl trace --last`, the last `history` by id.
  std::ifstream last(trace_dir / "last.json");
  std::string text((std::istreambuf_iterator<char>(last)), {});
  CAF_CHECK_EQUAL(text, (json{{"id", 5}}.dump() + "\n"));
  for (int i = 1; i <= history + 2; ++i)
    CAF_CHECK_EQUAL(fs::exists(trace_dir / (std::to_string(i) + ".json")), i > 2);
  // The inspector counts (at least) the traces it handled in its own counters, and
  // the traces it let go.
  table = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  CAF_CHECK_GREATER_OR_EQUAL(table.at("actors")[0].at("messages").get<int64_t>(), history + 2);
  CAF_CHECK_EQUAL(table.at("traces").at("dropped").get<int64_t>(), 2);
  CAF_CHECK_EQUAL(table.at("traces").at("kept").get<int64_t>(), history);
}

// -- 7. write-back --------------------------------------------------------------

CAF_TEST(write_back_stores_computed_chunks_in_ram_and_through_the_ssd_writer) {
  put(&ActorSet::write_back, sys.spawn(write_back, ctx.get(), h, make_counters("write-back")));
  sched.run();  // the spawned actors start
  const ChunkKey key = key_of(kDocs[2]);
  const auto kv = kv_of(kDocs[2]);
  self->send(h->write_back(), kv_ready_atom::value, KeyedKv{key, kv});
  expect((kv_ready_atom, KeyedKv), from(self).to(h->write_back()).with(_, _));
  CAF_CHECK(ctx->ram->get(key) == kv);
  CAF_REQUIRE_EQUAL(ready_jobs(), std::vector<caf::resumable*>{job_of(h->ssd_writer())});
  const auto [store, forwarded] = extract<store_atom, KeyedKv>(h->ssd_writer());
  CAF_CHECK(forwarded.key == key);
  CAF_CHECK(forwarded.kv == kv);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), static_cast<int64_t>(kv->bytes()));  // counted while queued
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(!ctx->ssd->contains(key));  // written by the SSD writer, not here
  // flush: delegated to the SSD writer, whose answer comes after its stores.
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), flush_atom::value), true);
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ssd_writer:store", "ssd_writer:flush"}));
}

// A document is written by the write-back actor at once (not queued through the SSD
// writer: its caller waits for the answer): the answer names the tiers that hold it
// and the pasted-passage index learns its tokens; erase removes it from every tier.
CAF_TEST(write_back_writes_and_erases_documents_at_once_and_answers_where_they_are) {
  put(&ActorSet::write_back, sys.spawn(write_back, ctx.get(), h, make_counters("write-back")));
  sched.run();  // the spawned actors start
  ctx->pasted = std::make_unique<PastedChunkIndex>();
  const ChunkKey key = key_of(kDocs[1]);
  const auto kv = kv_of(kDocs[1]);
  CAF_REQUIRE(!ctx->tiered->contains(key));
  const auto written =
      ask<DocumentWritten>(h->write_back(), doc_write_atom::value, DocumentWrite{key, kv, kv->tokens, false, false});
  CAF_CHECK(ctx->ram->get(key) == kv);
  CAF_CHECK(ctx->ssd->contains(key));  // written here, not queued
  CAF_CHECK_EQUAL(written.tiers, (std::vector<std::string>{"ram", "ssd"}));
  CAF_CHECK(!written.on_storage_node);
  CAF_CHECK(log->empty());  // no writer was asked
  CAF_CHECK_EQUAL(ctx->pasted->size(), 1u);
  // Stored already: nothing is written again, the answer still names the tiers.
  const auto again = ask<DocumentWritten>(h->write_back(), doc_write_atom::value,
                                          DocumentWrite{key, nullptr, kv->tokens, true, false});
  CAF_CHECK_EQUAL(again.tiers, (std::vector<std::string>{"ram", "ssd"}));
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), doc_erase_atom::value, key), true);
  CAF_CHECK(!ctx->tiered->contains(key));
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), doc_erase_atom::value, key), false);  // gone
}

// -- 8. decoder ------------------------------------------------------------------

CAF_TEST(decoder_ends_a_running_request_frees_its_cache_and_slot_and_finishes_a_queued_one_as_cancelled) {
  put(&ActorSet::decoder, sys.spawn(decoder, ctx.get(), h, make_counters("decoder")));
  sched.run();  // the spawned actors start
  auto results = std::make_shared<std::vector<RequestResult>>();
  const int64_t vocab = cfg().vocab;

  // A running request (it holds a slot) whose first token ends it: the trace to the
  // inspector, its cache freed in the worker, the slot back to the intake, on_done.
  auto running = intake_output({kDocs[0], kDocs[1]});
  auto rec = ctx->requests.find(running.id);
  rec->admitted = true;
  rec->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  ctx->in_flight = 1;
  running.sampling.stop = ctx->model->chat_template().stop_strings();
  running.chunk_tier = {kRam, kMissTier};
  PrefillOutcome out{running, "", std::vector<float>(static_cast<size_t>(vocab), 0.0f), 40, 0, 4, false};
  out.logits[static_cast<size_t>(ctx->model->tokenizer().eos_id())] = 1.0f;
  self->send(h->decoder(), start_atom::value, out);
  expect((start_atom, PrefillOutcome), from(self).to(h->decoder()).with(_, _));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  expect((end_atom, uint64_t), from(h->decoder()).to(h->worker()).with(_, running.id));
  expect((release_atom, uint64_t), from(h->decoder()).to(h->intake()).with(_, running.id));
  CAF_CHECK(!sched.has_job());
  // The slot and pages are the intake's to give back: the decoder only told it.
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(!rec->admitted.load());
  CAF_REQUIRE_EQUAL(results->size(), 1u);
  const auto& r = results->back();
  CAF_CHECK_EQUAL(r.finish_reason, "stop");
  CAF_CHECK_EQUAL(r.chunks, 2);
  CAF_CHECK_EQUAL(r.chunks_from("ram"), 1);
  CAF_CHECK_EQUAL(r.chunks_missed, 1);
  CAF_CHECK_EQUAL(r.cached_tokens, 40);
  CAF_CHECK_EQUAL(r.recomputed_tokens, 4);
  CAF_CHECK(ctx->requests.find(running.id) == nullptr);  // the record is gone

  // A request cancelled in the queue never held a slot: finished as cancelled, no release.
  auto queued = new_record({kDocs[1]});
  queued->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), finish_atom::value, queued->id);
  expect((finish_atom, uint64_t), from(self).to(h->decoder()).with(_, queued->id));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  CAF_CHECK(!sched.has_job());
  CAF_REQUIRE_EQUAL(results->size(), 2u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "cancelled");
  CAF_CHECK(results->back().tokens.empty());

  // A failed prefill: the error is the result; the slot and the cache go.
  auto failing = intake_output({kDocs[2]});
  ctx->requests.find(failing.id)->admitted = true;
  ctx->requests.find(failing.id)->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), start_atom::value, PrefillOutcome{failing, "loading the stored KV failed: boom", {}, 0, 0, 0, false});
  expect((start_atom, PrefillOutcome), from(self).to(h->decoder()).with(_, _));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  expect((end_atom, uint64_t), from(h->decoder()).to(h->worker()).with(_, failing.id));
  expect((release_atom, uint64_t), from(h->decoder()).to(h->intake()).with(_, failing.id));
  CAF_REQUIRE_EQUAL(results->size(), 3u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "error");
  CAF_CHECK_EQUAL(results->back().error, "loading the stored KV failed: boom");
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"inspector:trace", "worker:end", "intake:release", "inspector:trace",
                                                  "inspector:trace", "worker:end", "intake:release"}));
}

CAF_TEST_FIXTURE_SCOPE_END()
