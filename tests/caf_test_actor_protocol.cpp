// The actors' message protocols, one actor at a time, under CAF's deterministic
// test coordinator (caf/test/dsl.hpp): every actor is a plain scheduled actor, so
// nothing runs until the test lets it (`expect`, `allow`, `sched.run()`), and the
// messages an actor sends can be checked one by one, in order, before anyone
// handles them. The actors under test are the real ones (actors/*.cpp) over a
// RuntimeContext on the real model; the actors around them are test doubles that
// only log what they receive. The prefill itself (on the compute thread, not
// deterministic) is covered by tests/test_blend_runtime.cpp.
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

#include "actors/actor_counters.h"
#include "actors/actors.h"
#include "blend/rag_prompt.h"
#include "kernels/backend.h"

namespace bs {

// Readable values in CAF's check messages (found by ADL; without them CAF
// prints "<unprintable>").
std::string to_string(const RequestPtr& r) { return r ? "request#" + std::to_string(r->id) : "request<null>"; }
std::string to_string(const KeyedKv& kk) { return "kv(" + kk.key.hex() + ")"; }
std::string to_string(Tier t) { return tier_name(t); }

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
      [=](submit_atom, RequestPtr r) -> uint64_t {
        log->push_back("intake:submit");
        return r->id;
      },
      [=](release_atom) { log->push_back("intake:release"); },
      [=](cancel_atom, uint64_t) { log->push_back("intake:cancel"); },
  };
}

controller_actor::behavior_type controller_double(controller_actor::pointer, Log log) {
  return {
      [=](plan_atom, RequestPtr) { log->push_back("controller:plan"); },
      [=](profile_atom, const std::string& source, int64_t, double) { log->push_back("controller:profile:" + source); },
      [=](get_profile_atom) -> std::string { return "{}"; },
  };
}

loader_actor::behavior_type loader_double(loader_actor::pointer, Log log, std::string name) {
  return {
      [=](load_atom, RequestPtr) { log->push_back(name + ":load"); },
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

worker_actor::behavior_type worker_double(worker_actor::pointer, Log log) {
  return {
      [=](prefill_atom, RequestPtr) { log->push_back("worker:prefill"); },
      [=](layer_atom, RequestPtr, int32_t l) { log->push_back("worker:layer:" + std::to_string(l)); },
      [=](load_end_atom, RequestPtr, uint64_t) { log->push_back("worker:loadend"); },
      [=](load_fail_atom, RequestPtr, const std::string&) { log->push_back("worker:loadfail"); },
      [=](stepped_atom, uint64_t) { log->push_back("worker:stepped"); },
      [=](tick_atom) { log->push_back("worker:tick"); },
      [=](decode_atom, RequestPtr, int32_t) { log->push_back("worker:decode"); },
      [=](warm_atom, RequestPtr) { log->push_back("worker:warm"); },
      [=](document_atom, const std::vector<int32_t>&) -> caf::result<KeyedKv> {
        log->push_back("worker:document");
        return make_runtime_error(RequestErrc::internal, "a test double computes nothing");
      },
      [=](document_done_atom, const DocumentKv&) { log->push_back("worker:docdone"); },
  };
}

fusor_actor::behavior_type fusor_double(fusor_actor::pointer, Log log) {
  return {
      [=](prefilled_atom, RequestPtr) { log->push_back("fusor:prefilled"); },
      [=](kv_ready_atom, KeyedKv) { log->push_back("fusor:kvready"); },
      [=](flush_atom) -> bool { return true; },
  };
}

decoder_actor::behavior_type decoder_double(decoder_actor::pointer, Log log) {
  return {
      [=](start_atom, RequestPtr) { log->push_back("decoder:start"); },
      [=](logits_atom, RequestPtr) { log->push_back("decoder:logits"); },
  };
}

inspector_actor::behavior_type inspector_double(inspector_actor::pointer, Log log) {
  return {
      [=](register_atom, CountersPtr) { log->push_back("inspector:register"); },
      [=](trace_atom, const std::string&) { log->push_back("inspector:trace"); },
      [=](get_trace_atom, int32_t) -> std::string { return "[]"; },
      [=](actors_atom) -> std::string { return "[]"; },
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
    c.config.model_path = path;
    c.config.data_dir = dir.string();
    c.config.ssd.path = (dir / "kv").string();
    c.config.ssd.direct_io = false;  // the temp dir may be a tmpfs; the protocol is the same
    c.backend = kernels::make_cpu_backend();
    c.precision = c.backend->default_precision();
    c.model = std::make_unique<LlamaModel>(path, *c.backend, c.precision);
    c.tf = std::make_unique<Transformer>(*c.model);
    c.ram = std::make_unique<MemoryKvStore>(int64_t{256} << 20);
    c.ssd = std::make_unique<DiskKvStore>(c.config.ssd.path, int64_t{1} << 30, false);
    c.tiered = std::make_unique<TieredKvStore>(c.ram.get(), c.ssd.get());
    c.engine = std::make_unique<BlendEngine>(*c.tf);
    c.from_store = std::make_unique<StoreBackedBlend>(*c.engine, *c.tiered);
    c.compute = std::make_unique<ComputeThread>(0);
  }

  ~context_base() {
    ctx.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct fixture : context_base, test_coordinator_fixture<test_config> {
  std::shared_ptr<Handles> h = std::make_shared<Handles>();
  Log log = std::make_shared<std::vector<std::string>>();

  // Every handle starts as a test double; a test replaces the ones it tests.
  fixture() {
    put(&ActorSet::intake, sys.spawn(intake_double, log));
    put(&ActorSet::controller, sys.spawn(controller_double, log));
    put_loader(Tier::Ram, sys.spawn(loader_double, log, std::string("ram_loader")));
    put_loader(Tier::Ssd, sys.spawn(loader_double, log, std::string("ssd_loader")));
    put(&ActorSet::ssd_writer, sys.spawn(writer_double, log, std::string("ssd_writer")));
    put(&ActorSet::worker, sys.spawn(worker_double, log));
    put(&ActorSet::fusor, sys.spawn(fusor_double, log));
    put(&ActorSet::decoder, sys.spawn(decoder_double, log));
    put(&ActorSet::inspector, sys.spawn(inspector_double, log));
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
  void put_loader(Tier t, loader_actor x) {
    h->update([&](ActorSet& s) { s.loaders[static_cast<size_t>(t)] = std::move(x); });
  }

  const LlamaConfig& cfg() const { return ctx->model->config(); }
  std::vector<int32_t> tokens_of(const std::string& doc) const {
    return document_chunk_tokens(ctx->model->tokenizer(), doc);
  }
  ChunkKey key_of(const std::string& doc) const { return ctx->engine->chunk_key(tokens_of(doc)); }
  std::shared_ptr<const ChunkKv> kv_of(const std::string& doc) const {
    return ctx->engine->compute_chunk_kv(tokens_of(doc));
  }

  // A request as a caller submits it.
  RequestPtr new_request(std::vector<std::string> docs, std::optional<float> ratio = std::nullopt,
                         std::optional<BlendMode> mode = std::nullopt) {
    auto r = std::make_shared<RequestState>();
    r->id = ctx->next_id.fetch_add(1);
    r->submitted = RequestState::clock::now();
    r->request.messages = {{"user", kQuestion}};
    r->request.documents = std::move(docs);
    r->request.sampling.max_tokens = 8;
    r->request.ratio = ratio;
    r->request.mode = mode;
    return r;
  }

  // What the intake makes of it (prompt, keys, options), for tests that start at
  // the controller; the intake test checks the intake fills in the same.
  RequestPtr intake_output(std::vector<std::string> docs, std::optional<float> ratio = std::nullopt,
                           std::optional<BlendMode> mode = std::nullopt) {
    auto r = new_request(std::move(docs), ratio, mode);
    r->prompt = assemble_rag_prompt(ctx->model->tokenizer(), ctx->model->chat_template(), r->request.messages,
                                    r->request.documents);
    r->options = ctx->config.blend;
    if (mode) r->options.mode = *mode;
    if (ratio) r->options.ratio = *ratio;
    r->prefix_key = ctx->engine->prefix_key(r->prompt.prefix);
    for (const auto& c : r->prompt.chunks) r->chunk_keys.push_back(ctx->engine->chunk_key(c));
    return r;
  }

  // Sends r to the intake, lets the intake (only it) handle it, returns its answer.
  struct Answer {
    std::optional<uint64_t> id;
    caf::error error;
  };
  Answer submit(const RequestPtr& r) {
    auto reply = self->request(h->intake(), caf::infinite, submit_atom::value, r);
    expect((submit_atom, RequestPtr), from(self).to(h->intake()).with(_, r));
    CAF_REQUIRE(!self->mailbox().empty());  // answered synchronously: receive() does not block
    Answer a;
    reply.receive([&](uint64_t id) { a.id = id; }, [&](caf::error& e) { a.error = std::move(e); });
    return a;
  }

  // The controller's plan for r, handled by the controller alone.
  void plan(const RequestPtr& r) {
    self->send(h->controller(), plan_atom::value, r);
    expect((plan_atom, RequestPtr), from(self).to(h->controller()).with(_, r));
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
  auto& c = const_cast<KvCache&>(cache);
  for (int head = 0; head < kv.kv_heads; ++head)
    for (int64_t i = 0; i < m; ++i) {
      const float* sk = kv.k_layer(layer) + (head * m + i) * hd;
      const float* sv = kv.v_layer(layer) + (head * m + i) * hd;
      bad += std::memcmp(c.k_at(layer, head, offset + i), sk, hd * sizeof(float)) != 0;
      bad += std::memcmp(c.v_at(layer, head, offset + i), sv, hd * sizeof(float)) != 0;
    }
  return bad;
}

}  // namespace

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 1. intake ----------------------------------------------------------------

CAF_TEST(intake_answers_the_id_and_hands_the_prepared_request_to_the_controller) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  auto r = new_request({kDocs[0], kDocs[1]});
  r->id = 42;
  const auto a = submit(r);
  CAF_REQUIRE(a.id);
  CAF_CHECK_EQUAL(*a.id, 42u);
  CAF_CHECK(!a.error);
  // One message out: (plan, r) to the controller.
  CAF_REQUIRE_EQUAL(sched.jobs.size(), 1u);
  expect((plan_atom, RequestPtr), from(h->intake()).to(h->controller()).with(_, r));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, std::vector<std::string>{"controller:plan"});
  // The prompt: prefix + one chunk per document + suffix, keyed.
  CAF_REQUIRE_EQUAL(r->prompt.chunks.size(), 2u);
  CAF_REQUIRE_EQUAL(r->chunk_keys.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    CAF_CHECK_EQUAL(r->prompt.chunks[i], tokens_of(kDocs[i]));
    CAF_CHECK(r->chunk_keys[i] == key_of(kDocs[i]));
  }
  CAF_CHECK(!(r->chunk_keys[0] == r->chunk_keys[1]));
  CAF_CHECK(!r->prompt.prefix.empty());
  CAF_CHECK(!r->prompt.suffix.empty());
  CAF_CHECK(r->prefix_key == ctx->engine->prefix_key(r->prompt.prefix));
  // Options from the config; sampling completed with the template's stops.
  CAF_CHECK(r->options.mode == ctx->config.blend.mode);
  CAF_CHECK_EQUAL(r->options.ratio, ctx->config.blend.ratio);
  CAF_CHECK_EQUAL(r->options.check_layers, ctx->config.blend.check_layers);
  CAF_CHECK_EQUAL(r->request.sampling.max_tokens, 8);
  CAF_CHECK_EQUAL(r->request.sampling.stop, ctx->model->chat_template().stop_strings());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);

  // A request's own mode and ratio override the config's.
  auto r2 = new_request({kDocs[2]}, 0.4f, BlendMode::Reuse);
  const auto a2 = submit(r2);
  CAF_CHECK_EQUAL(a2.id.value_or(0), r2->id);
  expect((plan_atom, RequestPtr), from(h->intake()).to(h->controller()).with(_, r2));
  CAF_CHECK(r2->options.mode == BlendMode::Reuse);
  CAF_CHECK_EQUAL(r2->options.ratio, 0.4f);
  CAF_CHECK_EQUAL(r2->prompt.chunks.size(), 1u);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
}

CAF_TEST(intake_refuses_invalid_requests_with_a_runtime_error_and_sends_nothing) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start

  auto empty = new_request({kDocs[0]});
  empty->request.messages.clear();
  auto a = submit(empty);
  check_runtime_error(a, RequestErrc::invalid, "messages must not be empty");
  disallow((plan_atom, RequestPtr), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  auto robot = new_request({kDocs[0]});
  robot->request.messages = {{"robot", "beep"}, {"user", kQuestion}};
  a = submit(robot);
  check_runtime_error(a, RequestErrc::invalid, "unknown role 'robot'");
  disallow((plan_atom, RequestPtr), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  ctx->config.max_prompt_tokens = 24;
  auto longer = new_request({kDocs[0], kDocs[1]});
  a = submit(longer);
  check_runtime_error(a, RequestErrc::too_long, "at most 24 fit");
  disallow((plan_atom, RequestPtr), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  // None of them holds an admission slot.
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK(log->empty());
}

CAF_TEST(intake_admits_at_most_max_requests_in_flight) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 0;  // no queue: refused at once
  ctx->in_flight = 1;
  auto r = new_request({kDocs[0]});
  auto a = submit(r);
  check_runtime_error(a, RequestErrc::overloaded, "too many requests: 1 in flight and 0 waiting");
  disallow((plan_atom, RequestPtr), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  // Once the slot is free, the same request is admitted.
  ctx->in_flight = 0;
  a = submit(r);
  CAF_CHECK_EQUAL(a.id.value_or(0), r->id);
  expect((plan_atom, RequestPtr), from(h->intake()).to(h->controller()).with(_, r));
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
}

CAF_TEST(intake_queues_beyond_max_requests_in_order_and_refuses_beyond_the_queue) {
  put(&ActorSet::intake, sys.spawn(intake, ctx.get(), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 2;
  auto running = new_request({kDocs[0]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  expect((plan_atom, RequestPtr), from(h->intake()).to(h->controller()).with(_, running));
  CAF_CHECK(running->admitted);
  // Two more wait: answered with their ids (prepared, so a bad one would have been
  // refused now), nothing sent on.
  auto q1 = new_request({kDocs[1]});
  auto q2 = new_request({kDocs[2]});
  CAF_CHECK_EQUAL(submit(q1).id.value_or(0), q1->id);
  // With room in the queue, an invalid request is still refused as invalid, not queued.
  auto bad = new_request({kDocs[0]});
  bad->request.sampling.max_tokens = 0;
  check_runtime_error(submit(bad), RequestErrc::invalid, "max_tokens must be >= 1");
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(submit(q2).id.value_or(0), q2->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 2);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(!q1->admitted);
  CAF_CHECK_EQUAL(q1->prompt.chunks.size(), 1u);
  // The queue is full: overloaded (before any tokenizing).
  auto over = new_request({kDocs[0]});
  check_runtime_error(submit(over), RequestErrc::overloaded, "1 in flight and 2 waiting");
  CAF_CHECK(!sched.has_job());
  // The running request ends: the first queued one starts, the second still waits.
  ctx->in_flight = 0;
  self->send(h->intake(), release_atom::value);
  expect((release_atom), from(self).to(h->intake()));
  expect((plan_atom, RequestPtr), from(h->intake()).to(h->controller()).with(_, q1));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(q1->admitted);
  // A queued request cancelled by id leaves the queue and goes to the decoder, which
  // finishes it (cancelled); it never held a slot.
  q2->cancelled = true;
  self->send(h->intake(), cancel_atom::value, q2->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q2->id));
  expect((start_atom, RequestPtr), from(h->intake()).to(h->decoder()).with(_, q2));
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  CAF_CHECK(!q2->admitted);
  bool queued_event = false;
  for (const auto& e : q2->events()) queued_event |= e.actor == "intake" && e.what == "queued";
  CAF_CHECK(queued_event);
  // Cancelling a request that is not queued sends nothing.
  self->send(h->intake(), cancel_atom::value, q1->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q1->id));
  CAF_CHECK(!sched.has_job());
  // A slot with nobody waiting: nothing to start.
  ctx->in_flight = 0;
  self->send(h->intake(), release_atom::value);
  expect((release_atom), from(self).to(h->intake()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"controller:plan", "controller:plan", "decoder:start"}));
}

// -- 2. controller -------------------------------------------------------------

CAF_TEST(controller_plans_ram_ssd_and_missed_chunks_and_starts_loaders_then_worker) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv_of(kDocs[0])));
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), kv_of(kDocs[1])));
  CAF_REQUIRE(!ctx->ram->contains(key_of(kDocs[1])));

  auto r = intake_output(kDocs);
  plan(r);
  CAF_CHECK_EQUAL(r->chunk_tier, (std::vector<Tier>{Tier::Ram, Tier::Ssd, Tier::Miss}));
  CAF_CHECK_EQUAL(r->plan.chunk_loaded, (std::vector<char>{1, 1, 0}));
  CAF_CHECK(!r->plan.prefix_loaded);
  CAF_CHECK(r->prefix_tier == Tier::Miss);
  CAF_CHECK_EQUAL(r->gate.loaders(), 2);
  CAF_REQUIRE_EQUAL(r->readers.size(), 4u);  // 3 chunks + the prefix
  CAF_CHECK(r->readers[0] != nullptr && r->readers[0]->k_view(0) != nullptr);   // RAM: a view
  CAF_CHECK(r->readers[1] != nullptr && r->readers[1]->k_view(0) == nullptr);   // SSD: reads
  CAF_CHECK(r->readers[2] == nullptr);
  CAF_CHECK_EQUAL(r->cache.capacity, r->prompt.size() + r->request.sampling.max_tokens);
  CAF_CHECK_EQUAL(r->cache.n_layers, cfg().n_layers);
  // Default profiles: loading is far faster than the recompute, the ratio is the floor.
  const auto decision = json::parse(r->controller_json);
  CAF_CHECK_EQUAL(decision.at("reason").get<std::string>(), "floor");
  CAF_CHECK_EQUAL(r->options.ratio, ctx->config.blend.ratio);
  const int64_t token_bytes = 2 * int64_t{cfg().n_layers} * cfg().kv_dim() * 4;
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ram").get<int64_t>(),
                  static_cast<int64_t>(r->prompt.chunks[0].size()) * token_bytes);
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ssd").get<int64_t>(),
                  static_cast<int64_t>(r->prompt.chunks[1].size()) * token_bytes);

  // Exactly three messages, in this order: load -> RAM loader, load -> SSD loader,
  // prefill -> worker.
  CAF_CHECK_EQUAL(ready_jobs(), (std::vector<caf::resumable*>{job_of(h->loader(Tier::Ram)), job_of(h->loader(Tier::Ssd)),
                                                              job_of(h->worker())}));
  expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ram)).with(_, r));
  expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ssd)).with(_, r));
  expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, r));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ram_loader:load", "ssd_loader:load", "worker:prefill"}));
}

CAF_TEST(controller_starts_only_the_loaders_with_work) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv_of(kDocs[0])));
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), kv_of(kDocs[1])));

  // RAM hits only: no message to the SSD loader.
  auto ram_only = intake_output({kDocs[0], kDocs[2]});
  plan(ram_only);
  CAF_CHECK_EQUAL(ram_only->chunk_tier, (std::vector<Tier>{Tier::Ram, Tier::Miss}));
  CAF_CHECK_EQUAL(ram_only->gate.loaders(), 1);
  CAF_CHECK_EQUAL(ready_jobs(), (std::vector<caf::resumable*>{job_of(h->loader(Tier::Ram)), job_of(h->worker())}));
  disallow((load_atom, RequestPtr), from(_).to(h->loader(Tier::Ssd)));
  expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ram)).with(_, ram_only));
  expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, ram_only));
  CAF_CHECK(!sched.has_job());

  // Mode full: nothing is looked up, nothing is loaded, only the prefill.
  auto full = intake_output(kDocs, std::nullopt, BlendMode::Full);
  plan(full);
  CAF_CHECK_EQUAL(full->chunk_tier, (std::vector<Tier>{Tier::Miss, Tier::Miss, Tier::Miss}));
  CAF_CHECK_EQUAL(full->plan.chunk_loaded, (std::vector<char>{0, 0, 0}));
  CAF_CHECK_EQUAL(full->gate.loaders(), 0);
  CAF_CHECK_EQUAL(ready_jobs(), (std::vector<caf::resumable*>{job_of(h->worker())}));
  disallow((load_atom, RequestPtr), from(_).to(h->loader(Tier::Ram)));
  disallow((load_atom, RequestPtr), from(_).to(h->loader(Tier::Ssd)));
  expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, full));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ram_loader:load", "worker:prefill", "worker:prefill"}));
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

  // No requested ratio: the load takes longer than the recompute at the floor, so
  // the ratio goes up (here to 1: the load takes longer than a full recompute).
  auto r = intake_output({kDocs[1]});
  plan(r);
  CAF_CHECK_EQUAL(r->chunk_tier, (std::vector<Tier>{Tier::Ssd}));
  CAF_CHECK_GREATER(r->options.ratio, floor);
  CAF_CHECK_EQUAL(r->options.ratio, 1.0f);
  auto d = json::parse(r->controller_json);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>().rfind("load-bound", 0), 0u);
  CAF_CHECK_EQUAL(d.at("ratio_floor").get<float>(), floor);
  CAF_CHECK(std::abs(d.at("inputs").at("ssd_bytes_per_s").get<double>() - 1e6) < 1e-3);
  CAF_CHECK_GREATER(d.at("est_load_s").get<double>(), d.at("est_compute_at_floor_s").get<double>());
  sched.run();  // the doubles take the load and the prefill

  // A requested ratio is kept.
  auto fixed = intake_output({kDocs[1]}, 0.2f);
  plan(fixed);
  CAF_CHECK_EQUAL(fixed->options.ratio, 0.2f);
  d = json::parse(fixed->controller_json);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>(), "requested");
  sched.run();

  // The planned recompute (overhead + the rows the filtering in use computes per
  // layer) meets the load time, less the margin, exactly where that lies between
  // floor and 1: a fresh controller whose one SSD sample makes margin x load time
  // the recompute time at ratio 0.5.
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  auto half = intake_output({kDocs[1]});
  const int64_t cached = static_cast<int64_t>(half->prompt.chunks[0].size());
  const int64_t other = half->prompt.size() - cached;
  const int64_t bytes = cached * 2 * int64_t{cfg().n_layers} * cfg().kv_dim() * 4;
  const double per_row_layer = profile().at("compute_s_per_token_layer").get<double>();
  const double overhead = profile().at("overhead_s_per_prompt_token").get<double>() * half->prompt.size();
  BlendOptions at_half = half->options;
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
  plan(half);
  CAF_CHECK(std::abs(half->options.ratio - 0.5f) < 1e-4f);
  // The trace's prediction: the loads end at est_load; the compute fits in 0.85 of
  // it, so the first token comes just after the last layer's load, and before the
  // load plus all of the compute.
  const auto hd = json::parse(half->controller_json);
  const double est_load = hd.at("est_load_s").get<double>(), est_ttft = hd.at("est_ttft_s").get<double>();
  CAF_CHECK_GREATER(est_ttft, est_load);
  CAF_CHECK_LESS(est_ttft, est_load + hd.at("est_compute_s").get<double>());
  sched.run();
}

// -- 3. loader (RAM) -----------------------------------------------------------

CAF_TEST(ram_loader_streams_layer_by_layer_then_ends_and_reports_its_profile) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(Tier::Ram, sys.spawn(loader, ctx.get(), h, Tier::Ram, make_counters("loader-ram")));
  sched.run();  // the spawned actors start
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv0));
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[1]), kv1));

  auto r = intake_output({kDocs[0], kDocs[1]});
  plan(r);
  CAF_REQUIRE_EQUAL(r->chunk_tier, (std::vector<Tier>{Tier::Ram, Tier::Ram}));
  expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ram)).with(_, r));
  // The worker: the controller's prefill, then the loader's n_layers layers in
  // order, then its end.
  const int n_layers = cfg().n_layers;
  expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, r));
  for (int32_t l = 0; l < n_layers; ++l)
    expect((layer_atom, RequestPtr, int32_t), from(h->loader(Tier::Ram)).to(h->worker()).with(_, r, l));
  expect((load_end_atom, RequestPtr, uint64_t), from(h->loader(Tier::Ram)).to(h->worker()).with(_, r, h->loader(Tier::Ram).id()));
  // The controller: the bytes it moved and the time it took.
  const int64_t tokens = static_cast<int64_t>(r->prompt.chunks[0].size() + r->prompt.chunks[1].size());
  const int64_t bytes = 2 * tokens * n_layers * cfg().kv_dim() * 4;
  const auto [atom, source, units, seconds] = extract<profile_atom, std::string, int64_t, double>(h->controller());
  CAF_CHECK_GREATER(seconds, 0.0);
  expect((profile_atom, std::string, int64_t, double), from(h->loader(Tier::Ram)).to(h->controller()).with(_, "ram", bytes, _));
  CAF_CHECK(!sched.has_job());
  const auto p = profile();
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 1);
  CAF_CHECK(std::abs(p.at("ram_bytes_per_s").get<double>() - bytes / seconds) < 1e-6 * (bytes / seconds));

  // The cache holds each chunk's stored KV at the chunk's offset, as stored.
  for (int l : {0, n_layers - 1}) {
    CAF_CHECK_EQUAL(mismatches(r->cache, *kv0, l, r->prompt.chunk_offset(0)), 0);
    CAF_CHECK_EQUAL(mismatches(r->cache, *kv1, l, r->prompt.chunk_offset(1)), 0);
  }
  // Guard: the comparison sees a difference where there is one.
  CAF_CHECK_GREATER(mismatches(r->cache, *kv0, 0, r->prompt.chunk_offset(1)), 0);
  int load_events = 0;
  for (const auto& e : r->events()) load_events += e.actor == "loader-ram" && e.what == "load";
  CAF_CHECK_EQUAL(load_events, n_layers);

}

CAF_TEST(a_loader_stops_reading_for_a_cancelled_request_or_a_failed_gate) {
  put(&ActorSet::controller, sys.spawn(controller, ctx.get(), h, make_counters("controller")));
  put_loader(Tier::Ram, sys.spawn(loader, ctx.get(), h, Tier::Ram, make_counters("loader-ram")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv_of(kDocs[0])));
  const uint64_t loader_id = h->loader(Tier::Ram).id();
  for (const bool cancel : {true, false}) {
    auto r = intake_output({kDocs[0]});
    plan(r);
    CAF_REQUIRE(r->gate.holds(loader_id));
    // Cancelled (the client left) or failed (another loader's failure, a timeout)
    // before the loader ran: it reads no layer, ends its work and reports no profile.
    if (cancel) r->cancelled = true;
    else r->gate.fail("test: another loader failed");
    expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ram)).with(_, r));
    expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, r));
    disallow((layer_atom, RequestPtr, int32_t), from(_).to(h->worker()));
    expect((load_end_atom, RequestPtr, uint64_t), from(h->loader(Tier::Ram)).to(h->worker()).with(_, r, loader_id));
    disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
    CAF_CHECK(!sched.has_job());
    bool stopped = false;
    for (const auto& e : r->events()) stopped |= e.what == "load stopped" && e.layer == 0;
    CAF_CHECK(stopped);
    CAF_CHECK(r->readers[0] == nullptr);  // the pinned RAM entry is released
  }
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
  put_loader(Tier::Ssd, sys.spawn(loader, ctx.get(), h, Tier::Ssd, make_counters("loader-ssd")));
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

  auto r = intake_output({kDocs[1]});
  plan(r);
  CAF_REQUIRE_EQUAL(r->chunk_tier, (std::vector<Tier>{Tier::Ssd}));  // the header is intact
  CAF_CHECK_EQUAL(r->gate.loaders(), 1);
  expect((load_atom, RequestPtr), from(h->controller()).to(h->loader(Tier::Ssd)).with(_, r));
  expect((prefill_atom, RequestPtr), from(h->controller()).to(h->worker()).with(_, r));
  for (int32_t l = 0; l < 3; ++l)
    expect((layer_atom, RequestPtr, int32_t), from(h->loader(Tier::Ssd)).to(h->worker()).with(_, r, l));
  const auto [atom, failed, why] = extract<load_fail_atom, RequestPtr, std::string>(h->worker());
  CAF_CHECK_EQUAL(mentions(why, key.hex()), key.hex());
  CAF_CHECK_EQUAL(mentions(why, "layer 3"), "layer 3");
  expect((load_fail_atom, RequestPtr, std::string), from(h->loader(Tier::Ssd)).to(h->worker()).with(_, r, why));
  expect((load_end_atom, RequestPtr, uint64_t), from(h->loader(Tier::Ssd)).to(h->worker()).with(_, r, h->loader(Tier::Ssd).id()));
  disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(profile().at("ssd_samples").get<int>(), 0);
  // The corrupt file is gone; nothing was promoted to RAM.
  CAF_CHECK(!fs::exists(path));
  CAF_CHECK(!ctx->ssd->contains(key));
  CAF_CHECK_EQUAL(ctx->ssd->stats().corrupt, 1);
  CAF_CHECK(!ctx->ram->contains(key));
}

// -- 5. worker: the loaders' gate messages --------------------------------------

CAF_TEST(worker_passes_layer_load_end_and_load_failure_to_the_gate) {
  put(&ActorSet::worker, sys.spawn(layer_worker, ctx.get(), h, make_counters("layer-worker")));
  sched.run();  // the spawned actors start
  auto r = std::make_shared<RequestState>();
  const uint64_t loader_a = 101, loader_b = 102;
  r->gate.reset(4, {loader_a, loader_b});
  CAF_CHECK_EQUAL(r->gate.loaders(), 2);
  CAF_CHECK(r->gate.holds(loader_a) && r->gate.holds(loader_b));

  // Layer 0 is there once both loaders delivered it; each wait is bounded.
  CAF_CHECK(!r->gate.wait_for(0, 10ms));
  self->send(h->worker(), layer_atom::value, r, int32_t{0});
  expect((layer_atom, RequestPtr, int32_t), from(self).to(h->worker()).with(_, r, 0));
  CAF_CHECK(!r->gate.wait_for(0, 10ms));
  auto wait0 = std::async(std::launch::async, [r] { return r->gate.wait_for(0, 10s); });
  CAF_CHECK(wait_on(wait0, 100ms) == Waited::blocked);
  self->send(h->worker(), layer_atom::value, r, int32_t{0});
  expect((layer_atom, RequestPtr, int32_t), from(self).to(h->worker()).with(_, r, 0));
  CAF_REQUIRE(wait_on(wait0, 10s) == Waited::ready);
  CAF_CHECK(wait0.get());
  CAF_CHECK(!r->gate.wait_for(1, 10ms));  // later layers still wait

  // load end, per loader and idempotent: the wait for the loaders ends with the last.
  CAF_CHECK(!r->gate.wait_loaders_done_for(10ms));
  self->send(h->worker(), load_end_atom::value, r, loader_a);
  expect((load_end_atom, RequestPtr, uint64_t), from(self).to(h->worker()).with(_, r, loader_a));
  self->send(h->worker(), load_end_atom::value, r, loader_a);
  expect((load_end_atom, RequestPtr, uint64_t), from(self).to(h->worker()).with(_, r, loader_a));
  CAF_CHECK(!r->gate.holds(loader_a));
  CAF_CHECK(r->gate.holds(loader_b));
  CAF_CHECK(!r->gate.wait_loaders_done_for(10ms));
  auto done = std::async(std::launch::async, [r] { return r->gate.wait_loaders_done_for(10s); });
  CAF_CHECK(wait_on(done, 100ms) == Waited::blocked);
  self->send(h->worker(), load_end_atom::value, r, loader_b);
  expect((load_end_atom, RequestPtr, uint64_t), from(self).to(h->worker()).with(_, r, loader_b));
  CAF_REQUIRE(wait_on(done, 10s) == Waited::ready);
  CAF_CHECK(done.get());

  // A loader's failure (one stored entry): recoverable, and every wait after it throws,
  // even for a layer that arrived; loaders see failed() and stop.
  auto wait1 = std::async(std::launch::async, [r] { return r->gate.wait_for(1, 10s); });
  CAF_CHECK(wait_on(wait1, 100ms) == Waited::blocked);
  const std::string why = "chunk 0123 layer 1 failed its read or checksum";
  CAF_CHECK(!r->gate.failed());
  self->send(h->worker(), load_fail_atom::value, r, why);
  expect((load_fail_atom, RequestPtr, std::string), from(self).to(h->worker()).with(_, r, why));
  CAF_REQUIRE(wait_on(wait1, 10s) == Waited::ready);
  std::string thrown;
  bool recoverable = false;
  try {
    wait1.get();
  } catch (const LayerGate::LoadFailed& e) {
    thrown = e.what();
    recoverable = e.recoverable;
  }
  CAF_CHECK_EQUAL(thrown, why);
  CAF_CHECK(recoverable);
  CAF_CHECK(r->gate.failed());
  bool throws = false;
  try {
    r->gate.wait_for(0, 10ms);
  } catch (const LayerGate::LoadFailed&) {
    throws = true;
  }
  CAF_CHECK(throws);
  // A failure from anywhere else (a loader that died, a timeout) is not recoverable;
  // the first failure wins.
  auto other = std::make_shared<RequestState>();
  other->gate.reset(2, {loader_a});
  other->gate.fail("the loader-ram actor failed: boom");
  other->gate.fail("later", true);
  try {
    other->gate.wait_for(0, 10ms);
  } catch (const LayerGate::LoadFailed& e) {
    CAF_CHECK_EQUAL(std::string(e.what()), "the loader-ram actor failed: boom");
    CAF_CHECK(!e.recoverable);
  }
  // The gate messages need no answer and start nothing.
  CAF_CHECK(!sched.has_job());
  CAF_CHECK(log->empty());
  CAF_CHECK_EQUAL(ctx->compute->jobs_done(), 0);
}

CAF_TEST(worker_batches_decode_steps_and_a_request_that_fails_fails_alone) {
  put(&ActorSet::worker, sys.spawn(layer_worker, ctx.get(), h, make_counters("layer-worker")));
  sched.run();  // the spawned actors start
  const int64_t vocab = cfg().vocab;
  // Two decoding requests: one with room for its next token, one whose cache is full.
  auto decoding = [&](int64_t room) {
    auto r = std::make_shared<RequestState>();
    r->id = ctx->next_id.fetch_add(1);
    const std::vector<int32_t> prompt = tokens_of(kDocs[r->id % kDocs.size()]);
    r->prefill.cache = ctx->tf->make_cache(static_cast<int64_t>(prompt.size()) + room);
    ctx->tf->forward(prompt, r->prefill.cache);
    return r;
  };
  auto healthy = decoding(4), full = decoding(0);
  KvCache alone = healthy->prefill.cache;  // the same step alone, for the logits
  const int32_t token = 42;
  const auto want = ctx->tf->forward(std::span<const int32_t>(&token, 1), alone);

  // The compute thread is busy, so both steps wait in the batcher for one job.
  std::promise<void> release, started;
  auto busy = release.get_future().share();
  auto running = started.get_future();
  CAF_REQUIRE(ctx->compute->submit([busy, &started] {
    started.set_value();
    busy.wait();
  }));
  running.wait();  // off the queue and running: the queue holds only what follows
  self->send(h->worker(), decode_atom::value, healthy, token);
  expect((decode_atom, RequestPtr, int32_t), from(self).to(h->worker()).with(_, healthy, token));
  self->send(h->worker(), decode_atom::value, full, token);
  expect((decode_atom, RequestPtr, int32_t), from(self).to(h->worker()).with(_, full, token));
  CAF_CHECK_EQUAL(ctx->decode_batcher.pending(), 2u);
  CAF_CHECK_EQUAL(ctx->compute->queued(), 1);  // one drain job for both
  const int64_t done_before = ctx->compute->jobs_done();
  release.set_value();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (ctx->compute->jobs_done() < done_before + 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  CAF_REQUIRE_EQUAL(ctx->compute->jobs_done(), done_before + 2);

  // One batched step was tried; the full cache made it throw, so each ran alone:
  // the healthy request got exactly its one-token logits, the full one its error.
  CAF_CHECK_EQUAL(ctx->decode_steps.load(), 1);
  CAF_CHECK_EQUAL(ctx->decode_tokens.load(), 2);
  CAF_CHECK(healthy->prefill_error.empty());
  CAF_REQUIRE_EQUAL(healthy->prefill.logits.size(), static_cast<size_t>(vocab));
  CAF_CHECK(std::memcmp(healthy->prefill.logits.data(), want.data(), want.size() * sizeof(float)) == 0);
  CAF_CHECK_EQUAL(healthy->prefill.cache.length, alone.length);
  CAF_CHECK_EQUAL(mentions(full->prefill_error, "capacity"), "capacity");
  CAF_CHECK_EQUAL(full->prefill.cache.length, full->prefill.cache.capacity);
  CAF_CHECK_EQUAL(healthy->decode_steps, 1);
  CAF_CHECK_EQUAL(healthy->decode_batch_sum, 2);
  // Both go back to the decoder (which finishes the failed one with its error).
  expect((logits_atom, RequestPtr), to(h->decoder()).with(_, healthy));
  expect((logits_atom, RequestPtr), to(h->decoder()).with(_, full));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"decoder:logits", "decoder:logits"}));
}

// -- 6. inspector --------------------------------------------------------------

CAF_TEST(inspector_lists_registered_actors_and_keeps_the_last_traces) {
  const int history = 3;
  const fs::path trace_dir = dir / "traces";
  put(&ActorSet::inspector, sys.spawn(inspector, history, trace_dir.string(), make_counters("inspector")));
  sched.run();  // the spawned actors start
  auto intake_counters = make_counters("intake");
  intake_counters->messages = 5;
  self->send(h->inspector(), register_atom::value, intake_counters);
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, intake_counters));
  self->send(h->inspector(), register_atom::value, make_counters("fusor"));
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, _));

  auto actors = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  CAF_REQUIRE_EQUAL(actors.size(), 3u);
  CAF_CHECK_EQUAL(actors[0].at("actor").get<std::string>(), "inspector");
  CAF_CHECK_EQUAL(actors[1].at("actor").get<std::string>(), "intake");
  CAF_CHECK_EQUAL(actors[1].at("messages").get<int64_t>(), 5);
  CAF_CHECK_EQUAL(actors[2].at("actor").get<std::string>(), "fusor");
  CAF_CHECK_EQUAL(actors[2].at("messages").get<int64_t>(), 0);

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
  // The last trace is on disk for `blendctl trace --last`.
  std::ifstream last(trace_dir / "last.json");
  std::string text((std::istreambuf_iterator<char>(last)), {});
  CAF_CHECK_EQUAL(text, (json{{"id", 5}}.dump() + "\n"));
  // The inspector counts (at least) the traces it handled in its own counters.
  actors = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  CAF_CHECK_GREATER_OR_EQUAL(actors[0].at("messages").get<int64_t>(), history + 2);
}

// -- 7. fusor ------------------------------------------------------------------

CAF_TEST(fusor_stores_computed_chunks_and_hands_prefilled_requests_on) {
  put(&ActorSet::fusor, sys.spawn(fusor, ctx.get(), h, make_counters("fusor")));
  sched.run();  // the spawned actors start

  // kv ready: into RAM here, to the SSD through the SSD writer.
  const ChunkKey key = key_of(kDocs[2]);
  const auto kv = kv_of(kDocs[2]);
  self->send(h->fusor(), kv_ready_atom::value, KeyedKv{key, kv});
  expect((kv_ready_atom, KeyedKv), from(self).to(h->fusor()).with(_, _));
  CAF_CHECK(ctx->ram->get(key) == kv);
  CAF_REQUIRE_EQUAL(ready_jobs(), std::vector<caf::resumable*>{job_of(h->ssd_writer())});
  const auto [store, forwarded] = extract<store_atom, KeyedKv>(h->ssd_writer());
  CAF_CHECK(forwarded.key == key);
  CAF_CHECK(forwarded.kv == kv);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), static_cast<int64_t>(kv->bytes()));  // counted while queued
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(!ctx->ssd->contains(key));  // written by the SSD writer, not here
  // flush: delegated to the SSD writer, whose answer comes after its stores.
  CAF_CHECK_EQUAL(ask<bool>(h->fusor(), flush_atom::value), true);
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ssd_writer:store", "ssd_writer:flush"}));
  log->clear();

  // prefilled, write-back on, no error: start the decoder, then warm the missed chunks.
  CAF_REQUIRE(ctx->config.write_back);
  auto ok = intake_output({kDocs[0]});
  self->send(h->fusor(), prefilled_atom::value, ok);
  expect((prefilled_atom, RequestPtr), from(self).to(h->fusor()).with(_, ok));
  CAF_CHECK_EQUAL(ready_jobs(), (std::vector<caf::resumable*>{job_of(h->decoder()), job_of(h->worker())}));
  expect((start_atom, RequestPtr), from(h->fusor()).to(h->decoder()).with(_, ok));
  expect((warm_atom, RequestPtr), from(h->fusor()).to(h->worker()).with(_, ok));
  CAF_CHECK(!sched.has_job());

  // A failed prefill: only the start (the decoder reports the error).
  auto failed = intake_output({kDocs[0]});
  failed->prefill_error = "boom";
  self->send(h->fusor(), prefilled_atom::value, failed);
  expect((prefilled_atom, RequestPtr), from(self).to(h->fusor()).with(_, failed));
  disallow((warm_atom, RequestPtr), from(_).to(h->worker()));
  expect((start_atom, RequestPtr), from(h->fusor()).to(h->decoder()).with(_, failed));
  CAF_CHECK(!sched.has_job());

  // A cancelled request is not warmed either.
  auto cancelled = intake_output({kDocs[0]});
  cancelled->cancelled = true;
  self->send(h->fusor(), prefilled_atom::value, cancelled);
  expect((prefilled_atom, RequestPtr), from(self).to(h->fusor()).with(_, cancelled));
  disallow((warm_atom, RequestPtr), from(_).to(h->worker()));
  expect((start_atom, RequestPtr), from(h->fusor()).to(h->decoder()).with(_, cancelled));
  CAF_CHECK(!sched.has_job());

  // Write-back off: only the start.
  ctx->config.write_back = false;
  auto no_wb = intake_output({kDocs[0]});
  self->send(h->fusor(), prefilled_atom::value, no_wb);
  expect((prefilled_atom, RequestPtr), from(self).to(h->fusor()).with(_, no_wb));
  disallow((warm_atom, RequestPtr), from(_).to(h->worker()));
  expect((start_atom, RequestPtr), from(h->fusor()).to(h->decoder()).with(_, no_wb));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"decoder:start", "worker:warm", "decoder:start", "decoder:start",
                                                  "decoder:start"}));
}

// -- 8. decoder ------------------------------------------------------------------

CAF_TEST(decoder_frees_the_slot_of_a_running_request_and_finishes_a_queued_one_as_cancelled) {
  put(&ActorSet::decoder, sys.spawn(decoder, ctx.get(), h, make_counters("decoder")));
  sched.run();  // the spawned actors start
  auto results = std::make_shared<std::vector<RequestResult>>();
  const int64_t vocab = cfg().vocab;

  // A running request (it holds a slot) whose first token ends it: the trace to the
  // inspector, the slot back to the intake (the next queued request starts), on_done.
  auto running = intake_output({kDocs[0]});
  running->admitted = true;
  ctx->in_flight = 1;
  running->prefill.logits.assign(static_cast<size_t>(vocab), 0.0f);
  running->prefill.logits[static_cast<size_t>(ctx->model->tokenizer().eos_id())] = 1.0f;
  running->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), start_atom::value, running);
  expect((start_atom, RequestPtr), from(self).to(h->decoder()).with(_, running));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  expect((release_atom), from(h->decoder()).to(h->intake()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_REQUIRE_EQUAL(results->size(), 1u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "stop");

  // A request cancelled in the queue never held a slot: finished as cancelled, no release.
  auto queued = intake_output({kDocs[1]});
  queued->cancelled = true;
  queued->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), start_atom::value, queued);
  expect((start_atom, RequestPtr), from(self).to(h->decoder()).with(_, queued));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_REQUIRE_EQUAL(results->size(), 2u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "cancelled");
  CAF_CHECK(results->back().tokens.empty());
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"inspector:trace", "intake:release", "inspector:trace"}));
}

CAF_TEST_FIXTURE_SCOPE_END()
