// The runtime's loaders and writer, on the real model and real files: a throttled
// load overlaps the compute layer by layer; a RAM-only request behind a slow SSD
// load keeps its TTFT (the waiting prefill yields the compute thread); a request cancelled while its KV loads from a slow (throttled) SSD stops
// its loader at the next layer and ends at once while a decoding stream beside it
// keeps stepping; a loader that throws mid-load fails only its request, the
// supervisor starts a new loader and the next request loads through it; a burst of
// write-backs onto a stalled disk stays within the writer's byte bound while a read
// from the same tier goes through. Every wait in these tests is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "counting_request.h"
#include "model_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using testing::TempDir;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// The documents of the first `n` cases of the small RAG set, `docs` each.
std::vector<std::vector<std::string>> documents(int n, int docs = 3) {
  std::ifstream in(std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl");
  std::vector<std::vector<std::string>> out;
  std::string line;
  while (static_cast<int>(out.size()) < n && std::getline(in, line)) {
    auto j = json::parse(line);
    std::vector<std::string> d;
    for (int i = 0; i < docs; ++i) d.push_back(j.at("documents").at(i).get<std::string>());
    out.push_back(std::move(d));
  }
  return out;
}

RuntimeRequest rag_request(std::vector<std::string> docs, int max_tokens = 4) {
  RuntimeRequest r;
  r.messages = {{"user", "What do these documents say? Answer briefly."}};
  r.documents = std::move(docs);
  r.sampling.max_tokens = max_tokens;
  r.ratio = 0.15f;
  return r;
}


// SSD only (every stored chunk is read from disk), no write-back (unless a test
// turns it on), everything under `dir`.
RuntimeConfig ssd_only_in(const fs::path& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.direct_io = false;  // the temp dir may be a tmpfs; the throttle makes it slow
  c.ram.enabled = false;
  c.write_back = false;
  return c;
}

// The result of a submitted request, or a test failure after `limit`.
struct Pending {
  std::promise<RequestResult> done;
  std::future<RequestResult> result = done.get_future();
  RequestCallbacks callbacks() {
    RequestCallbacks cb;
    cb.on_done = [this](const RequestResult& r) { done.set_value(r); };
    return cb;
  }
};

// The trace of request `id` among the runtime's last traces (null if absent).
json trace_of(Runtime& rt, uint64_t id) {
  for (const auto& t : json::parse(rt.traces_json(64)))
    if (t.at("id").get<uint64_t>() == id) return t;
  return nullptr;
}

// Restarts of the actors called `prefix` or `prefix-<i>` (a tier's loader pool); -1 if none is.
int64_t restarts_of(Runtime& rt, const std::string& prefix) {
  int64_t n = -1;
  for (const auto& a : json::parse(rt.actors_json())) {
    const auto name = a.at("actor").get<std::string>();
    if (name == prefix || name.rfind(prefix + "-", 0) == 0) n = std::max<int64_t>(n, 0) + a.value("restarts", int64_t{0});
  }
  return n;
}

ChunkKey key_from_hex(const std::string& hex) {
  ChunkKey k;
  k.hi = std::stoull(hex.substr(0, 16), nullptr, 16);
  k.lo = std::stoull(hex.substr(16), nullptr, 16);
  return k;
}

// Per layer, from a request's trace: when the SSD loader began reading it and when
// the worker's compute of it ended (seconds since submit; -1 where absent).
struct LayerTimes {
  std::vector<double> load_begin, load_end, compute_begin, compute_end;
};
LayerTimes layer_times(const json& trace, int n_layers) {
  LayerTimes t;
  for (auto* v : {&t.load_begin, &t.load_end, &t.compute_begin, &t.compute_end}) v->assign(n_layers, -1.0);
  for (const auto& e : trace.at("events")) {
    const int l = e.value("layer", -1);
    if (l < 0 || l >= n_layers) continue;
    if (e.at("actor") == "loader-ssd" && e.at("what") == "load") {
      t.load_begin[l] = e.at("begin_s").get<double>();
      t.load_end[l] = e.at("end_s").get<double>();
    }
    if (e.at("actor") == "worker" && e.at("what") == "compute") {
      t.compute_begin[l] = e.at("begin_s").get<double>();
      t.compute_end[l] = e.at("end_s").get<double>();
    }
  }
  return t;
}

// The overlap, from the trace: with the SSD throttled so that loading a layer takes
// about as long as computing one, the loader reads layer l+1 while the worker still
// computes layer l, and the first token comes before load + compute end to end.
// The overlap is the deviation rule's (query-first, the default, recomputes after the
// whole load: BlendRuntime's QueryFirstThroughTheActors...).
TEST(BlendLoaders, AThrottledLoadOverlapsTheCompute) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig cfg = ssd_only_in(dir.path());
  cfg.blend.selection = Selection::Deviation;
  Runtime rt(cfg);
  auto& ctx = rt.context();
  const auto docs = documents(1)[0];
  for (const auto& d : docs) rt.store_document(d);
  ctx.ssd->set_read_throttle(40e6);
  Pending p;
  const uint64_t id = rt.submit(rag_request(docs, 2), p.callbacks());
  ASSERT_EQ(p.result.wait_for(120s), std::future_status::ready) << "the request hung";
  const auto r = p.result.get();
  ASSERT_NE(r.finish_reason, "error") << r.error;
  ASSERT_EQ(r.chunks_from("ssd"), 3);
  const json t = trace_of(rt, id);
  ASSERT_FALSE(t.is_null());
  const int n_layers = ctx.model->config().n_layers;
  const auto lt = layer_times(t, n_layers);
  int overlapped = 0;
  double compute = 0;
  for (int l = 0; l < n_layers; ++l) {
    ASSERT_GE(lt.load_begin[l], 0) << "layer " << l << " was not loaded";
    ASSERT_GE(lt.compute_end[l], 0) << "layer " << l << " was not computed";
    compute += lt.compute_end[l] - lt.compute_begin[l];
    // Layer l is computed only once it is loaded.
    EXPECT_GE(lt.compute_begin[l], lt.load_end[l] - 1e-3) << "layer " << l;
    if (l + 1 < n_layers && lt.load_begin[l + 1] < lt.compute_end[l]) ++overlapped;
  }
  const double load = t.at("load_span_s").get<double>();
  std::printf("[ measured ] load %.3f s, compute %.3f s, TTFT %.3f s; layer l+1 loading while l computes in %d of "
              "%d layers\n", load, compute, r.ttft_seconds, overlapped, n_layers - 1);
  EXPECT_GE(overlapped, (n_layers - 1) / 2);
  EXPECT_LT(r.ttft_seconds, load + compute);
}

// Two requests whose chunks are all on a slow SSD, submitted together: the tier's
// loader pool (tiers.ssd.loaders, 2) loads both at once, so the second request's
// load begins while the first one's is still running (with one loader per tier it
// waited for the whole first load). Times from the traces, shifted by each
// request's submit time as the test saw it.
TEST(BlendLoaders, TwoRequestsLoadFromOneTierAtOnce) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(ssd_only_in(dir.path()));
  auto& ctx = rt.context();
  ASSERT_EQ(ctx.config.ssd.loaders, 2);
  const auto sets = documents(2);
  for (const auto& docs : sets)
    for (const auto& d : docs) rt.store_document(d);
  ctx.ssd->set_read_throttle(20e6);
  Pending a, b;
  const auto t0 = clock_type::now();
  const uint64_t id_a = rt.submit(rag_request(sets[0], 2), a.callbacks());
  const double b_submitted = seconds_since(t0);
  const uint64_t id_b = rt.submit(rag_request(sets[1], 2), b.callbacks());
  ASSERT_EQ(a.result.wait_for(180s), std::future_status::ready) << "the first request hung";
  ASSERT_EQ(b.result.wait_for(180s), std::future_status::ready) << "the second request hung";
  const auto ra = a.result.get(), rb = b.result.get();
  ASSERT_NE(ra.finish_reason, "error") << ra.error;
  ASSERT_NE(rb.finish_reason, "error") << rb.error;
  ASSERT_EQ(ra.chunks_from("ssd"), 3);
  ASSERT_EQ(rb.chunks_from("ssd"), 3);
  // [first load begins, last load ends] of a request, in seconds since its submit.
  auto load_span = [&](uint64_t id) {
    const json t = trace_of(rt, id);
    double begin = -1, end = -1;
    for (const auto& e : t.at("events"))
      if (e.at("actor") == "loader-ssd" && e.at("what") == "load") {
        const double b0 = e.at("begin_s").get<double>(), e0 = e.at("end_s").get<double>();
        begin = begin < 0 ? b0 : std::min(begin, b0);
        end = std::max(end, e0);
      }
    return std::pair{begin, end};
  };
  const auto [a_begin, a_end] = load_span(id_a);
  const auto [b_begin_rel, b_end_rel] = load_span(id_b);
  ASSERT_GE(a_begin, 0);
  ASSERT_GE(b_begin_rel, 0);
  const double b_begin = b_submitted + b_begin_rel;  // on the first request's clock (within the submit call's time)
  std::printf("[ measured ] first load %.3f..%.3f s, second load begins at %.3f s\n", a_begin, a_end, b_begin);
  EXPECT_LT(b_begin, a_end - 0.25 * (a_end - a_begin)) << "the second load waited for the first";
}

// A request whose chunks are in RAM, submitted while another request's chunks load
// from a slow SSD: the slow request's prefill waits for its layers without holding
// the compute thread, so the RAM-only request's first token comes about as fast as
// when it runs alone (the old worker computed one prefill at a time, waits
// included: the RAM-only request waited for the whole slow load).
TEST(BlendLoaders, ARamOnlyRequestBehindASlowSsdLoadKeepsItsTtft) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = ssd_only_in(dir.path());
  cfg.ram.enabled = true;
  Runtime rt(cfg);
  auto& ctx = rt.context();
  const auto sets = documents(2);
  // The slow request's chunks only on the SSD, the other's in RAM (and on the SSD).
  std::vector<ChunkKey> slow_keys;
  for (const auto& d : sets[0]) slow_keys.push_back(key_from_hex(rt.store_document(d).id));
  for (const auto& d : sets[1]) rt.store_document(d);
  const auto ram_request = rag_request(sets[1], 1);

  // Alone (the first run warms the code paths; the median of three after it).
  rt.run(ram_request);
  std::vector<double> alone;
  for (int i = 0; i < 3; ++i) {
    const auto r = rt.run(ram_request);
    ASSERT_EQ(r.chunks_from("ram"), 3) << r.error;
    alone.push_back(r.ttft_seconds);
  }
  std::sort(alone.begin(), alone.end());
  const double ttft_alone = alone[1];

  // Behind a slow SSD load: 5 MB/s, ~5 s for the three chunks. Three rounds, the
  // median compared (a single TTFT on a 2-core VM varies by +-15% by itself); the
  // slow request's chunks leave RAM before each round (its load promoted them). The
  // load is made this slow so that the bound below holds with room on any CPU: behind
  // a 2.7 s load (10 MB/s) a CI machine measured the RAM-only TTFT at 1.66 s (1.8x its
  // 0.91 s alone: the slow request's recompute shares the 2 cores), over half of 2.7 s.
  ctx.ssd->set_read_throttle(5e6);
  std::vector<double> behind_ttft, slow_ttft;
  for (int round = 0; round < 3; ++round) {
    for (const auto& k : slow_keys) ctx.ram->erase(k);
    std::promise<void> loading;
    std::atomic<bool> signalled{false};
    ctx.loader_fault = [&](const std::string& tier, int layer) {
      if (tier == "ssd" && layer == 1 && !signalled.exchange(true)) loading.set_value();
    };
    Pending slow;
    const auto t_slow = clock_type::now();
    const uint64_t slow_id = rt.submit(rag_request(sets[0], 1), slow.callbacks());
    ASSERT_EQ(loading.get_future().wait_for(60s), std::future_status::ready) << "the SSD load did not start";
    Pending fast;
    rt.submit(ram_request, fast.callbacks());
    ASSERT_EQ(fast.result.wait_for(120s), std::future_status::ready) << "the RAM-only request hung";
    const auto behind = fast.result.get();
    ASSERT_EQ(behind.chunks_from("ram"), 3) << behind.error;
    const double fast_done = seconds_since(t_slow);
    ASSERT_EQ(slow.result.wait_for(120s), std::future_status::ready) << "the slow request hung";
    ctx.loader_fault = nullptr;
    const auto slow_result = slow.result.get();
    ASSERT_NE(slow_result.finish_reason, "error") << slow_result.error;
    EXPECT_EQ(slow_result.chunks_from("ssd"), 3);
    std::printf("[ measured ] round %d: RAM-only TTFT behind a slow SSD load %.3f s (%.2fx alone); the slow "
                "request's TTFT %.3f s, the RAM-only one was done %.3f s after it was submitted\n",
                round, behind.ttft_seconds, behind.ttft_seconds / ttft_alone, slow_result.ttft_seconds, fast_done);
    behind_ttft.push_back(behind.ttft_seconds);
    slow_ttft.push_back(slow_result.ttft_seconds);
    // The slow one was still loading when the RAM-only one had its answer.
    EXPECT_GT(slow_result.ttft_seconds, fast_done);
    // Its trace shows the waits: it was parked, not computing, while it waited.
    const json t = trace_of(rt, slow_id);
    ASSERT_FALSE(t.is_null());
    EXPECT_GT(t.at("wait_s").get<double>(), 0.5);
  }
  std::sort(behind_ttft.begin(), behind_ttft.end());
  std::sort(slow_ttft.begin(), slow_ttft.end());
  std::printf("[ measured ] RAM-only TTFT alone %.3f s, behind a slow SSD load %.3f s (%.2fx), medians of 3\n",
              ttft_alone, behind_ttft[1], behind_ttft[1] / ttft_alone);
  // Not held behind the load: the old worker gave the RAM-only request a TTFT of at
  // least the slow load's. How close it stays to its TTFT alone is a speed figure (the
  // line above; it moves with whatever else shares the 2 cores: a run with a build
  // beside it measured 1.50x), not something a unit test can bound.
  EXPECT_LT(behind_ttft[1], 0.5 * slow_ttft[1]);
}

TEST(BlendLoaders, ACancelDuringASlowSsdLoadStopsTheLoaderAndTheStreamsKeepStepping) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = ssd_only_in(dir.path());
  Runtime rt(cfg);
  auto& ctx = rt.context();
  const auto docs = documents(1)[0];
  for (const auto& d : docs) rt.store_document(d);  // on the SSD now
  // A slow disk: 10 MB/s. The three chunks' KV then takes seconds to load, a
  // layer of it a fraction of a second.
  ctx.ssd->set_read_throttle(10e6);

  // A stream that decodes throughout; its token times give the gaps.
  std::mutex mu;
  std::vector<clock_type::time_point> token_times;
  Pending stream;
  auto scb = stream.callbacks();
  scb.on_text = [&](std::string_view) {
    std::lock_guard<std::mutex> lock(mu);
    token_times.push_back(clock_type::now());
    return true;
  };
  const uint64_t stream_id = rt.submit(testing::counting_request(2000), std::move(scb));
  auto tokens_so_far = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return token_times.size();
  };
  const auto warm_deadline = clock_type::now() + 60s;
  while (tokens_so_far() < 20 && clock_type::now() < warm_deadline) std::this_thread::sleep_for(5ms);
  ASSERT_GE(tokens_so_far(), 20u) << "the stream did not start";

  // The RAG request: its loader reads layer by layer; once it is at layer 3 the
  // load is provably under way, and the request is cancelled.
  std::promise<void> at_layer_3;
  std::atomic<bool> signalled{false};
  ctx.loader_fault = [&](const std::string& tier, int layer) {
    if (tier == "ssd" && layer == 3 && !signalled.exchange(true)) at_layer_3.set_value();
  };
  Pending rag;
  const auto t_submit = clock_type::now();
  const uint64_t rag_id = rt.submit(rag_request(docs), rag.callbacks());
  ASSERT_EQ(at_layer_3.get_future().wait_for(60s), std::future_status::ready) << "the SSD load did not start";
  const auto t_cancel = clock_type::now();
  ASSERT_TRUE(rt.cancel(rag_id));
  ASSERT_EQ(rag.result.wait_for(60s), std::future_status::ready) << "the cancelled request did not end";
  const double cancel_to_done = seconds_since(t_cancel);
  const auto r = rag.result.get();
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_TRUE(r.tokens.empty());
  // Let the stream step a little longer, then stop it.
  std::this_thread::sleep_for(300ms);
  const auto t_after = clock_type::now();
  rt.cancel(stream_id);
  ASSERT_EQ(stream.result.wait_for(60s), std::future_status::ready);

  // The loader stopped reading: fewer bytes than the plan's, and a trace event says where.
  const json t = trace_of(rt, rag_id);
  ASSERT_FALSE(t.is_null());
  const int64_t planned = t.at("controller").at("inputs").at("bytes_ssd").get<int64_t>();
  int64_t read = 0;
  int stopped_at = -1;
  for (const auto& e : t.at("events")) {
    if (e.at("actor") == "loader-ssd" && e.at("what") == "load") read += e.value("bytes", int64_t{0});
    if (e.at("actor") == "loader-ssd" && e.at("what") == "load stopped") stopped_at = e.at("layer").get<int>();
  }
  const int n_layers = ctx.model->config().n_layers;
  EXPECT_GT(planned, 0);
  EXPECT_LT(read, planned / 2) << "the loader read on after the cancel";
  EXPECT_GE(stopped_at, 3);
  EXPECT_LT(stopped_at, n_layers / 2);
  // The request ended within about one layer's load, not the rest of the load.
  const double layer_load = static_cast<double>(planned) / n_layers / 10e6;
  const double rest_of_load = static_cast<double>(planned - read) / 10e6;
  std::printf("[ measured ] cancel -> done %.3f s; one layer loads in %.3f s; the rest of the load %.3f s; "
              "read %lld of %lld bytes\n",
              cancel_to_done, layer_load, rest_of_load, static_cast<long long>(read), static_cast<long long>(planned));
  EXPECT_LT(cancel_to_done, layer_load + 0.5);
  EXPECT_LT(cancel_to_done, rest_of_load / 2);
  // The stream never froze: from the cancel until after the request ended, its
  // largest gap stays under 2 x decode_interleave + one step, where one step is the
  // largest gap while the prefill ran before the cancel (a layer's compute is not
  // interrupted: its time is the stream's step then). The old code froze the stream
  // until the loader had read every remaining layer (seconds here).
  auto largest_gap = [&](clock_type::time_point from, clock_type::time_point to) {
    double gap = 0;
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 1; i < token_times.size(); ++i)
      if (token_times[i] > from && token_times[i - 1] < to)
        gap = std::max(gap, std::chrono::duration<double>(token_times[i] - token_times[i - 1]).count());
    return gap;
  };
  const double one_step = largest_gap(t_submit, t_cancel);
  const double gap = largest_gap(t_cancel, t_after);
  const double bound = 2 * cfg.decode_interleave + one_step;
  std::printf("[ measured ] stream's largest gap after the cancel %.3f s (bound %.3f s; largest gap before it, "
              "while the prefill ran, %.3f s)\n", gap, bound, one_step);
  EXPECT_LT(gap, bound);
  EXPECT_GT(gap, 0);
}

TEST(BlendLoaders, ALoaderThatThrowsMidLoadFailsItsRequestAndIsRestarted) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(ssd_only_in(dir.path()));
  auto& ctx = rt.context();
  const auto docs = documents(1)[0];
  for (const auto& d : docs) rt.store_document(d);
  EXPECT_EQ(restarts_of(rt, "loader-ssd"), 0);

  // The SSD loader throws at layer 5 of the next request: the actor dies.
  std::atomic<bool> armed{true};
  ctx.loader_fault = [&](const std::string& tier, int layer) {
    if (tier == "ssd" && layer == 5 && armed.exchange(false)) throw std::runtime_error("test hook: a broken read");
  };
  Pending failing;
  rt.submit(rag_request(docs), failing.callbacks());
  ASSERT_EQ(failing.result.wait_for(120s), std::future_status::ready) << "the request hung";
  const auto bad = failing.result.get();
  EXPECT_EQ(bad.finish_reason, "error");
  EXPECT_THAT(bad.error, HasSubstr("loader-ssd"));
  EXPECT_THAT(bad.error, HasSubstr("test hook: a broken read"));
  EXPECT_TRUE(bad.tokens.empty());
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }));  // its slot is free again
  // Only the intake wrote the slots' page reservations (the actor that ended each
  // request sent it the release).
  EXPECT_EQ(rt.context().kv_pool->foreign_reservation_writes(), 0);
  // The supervisor started a new loader (its counters carry on, restarts counted) ...
  const auto deadline = clock_type::now() + 30s;
  while (restarts_of(rt, "loader-ssd") < 1 && clock_type::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(restarts_of(rt, "loader-ssd"), 1);
  EXPECT_EQ(ctx.restarts.load(), 1);

  // ... and the next request loads every chunk through it.
  Pending next;
  rt.submit(rag_request(docs), next.callbacks());
  ASSERT_EQ(next.result.wait_for(120s), std::future_status::ready) << "the next request hung";
  const auto good = next.result.get();
  EXPECT_NE(good.finish_reason, "error") << good.error;
  EXPECT_EQ(good.chunks_from("ssd"), 3);
  EXPECT_GT(good.tokens.size(), 0u);
}

TEST(BlendLoaders, WriteBacksOntoAStalledDiskStayWithinTheQueueBoundAndReadsGoOn) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = ssd_only_in(dir.path());
  cfg.write_back = true;
  cfg.ssd.write_queue_bytes = int64_t{24} << 20;  // room for about one chunk of these documents
  Runtime rt(cfg);
  auto& ctx = rt.context();
  const auto sets = documents(4);
  for (const auto& d : sets[0]) rt.store_document(d);  // the set the read will load

  // The disk stalls: the writer's first write blocks until the test releases it.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> writing{false};
  ctx.writer_fault = [&] {
    writing = true;
    released.wait_for(120s);
  };
  // A burst: three requests whose nine chunks all miss; their write-backs (after the
  // first token, in the background) go to the stalled writer.
  std::vector<std::unique_ptr<Pending>> burst;
  for (int i = 1; i <= 3; ++i) {
    burst.push_back(std::make_unique<Pending>());
    rt.submit(rag_request(sets[static_cast<size_t>(i)]), burst.back()->callbacks());
  }
  for (auto& p : burst) {
    ASSERT_EQ(p->result.wait_for(120s), std::future_status::ready);
    EXPECT_NE(p->result.get().finish_reason, "error");
  }
  // Every write-back compute has run (the compute thread is idle) and the writer
  // is stuck in its first write.
  const auto deadline = clock_type::now() + 120s;
  const auto& q = ctx.ssd_write_queue;
  while (!(writing.load() && q.dropped.load() > 0 && ctx.compute->queued() == 0) && clock_type::now() < deadline)
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(writing.load()) << "no write reached the writer";
  EXPECT_GT(q.dropped.load(), 0) << "nine chunks cannot all fit a queue of about one";
  EXPECT_LE(q.high_water.load(), cfg.ssd.write_queue_bytes);
  EXPECT_EQ(q.written.load(), 0);

  // A read from the same tier while the writer is stuck: it loads and answers.
  Pending read;
  const auto t0 = clock_type::now();
  rt.submit(rag_request(sets[0]), read.callbacks());
  ASSERT_EQ(read.result.wait_for(60s), std::future_status::ready) << "a read waited behind the stalled writer";
  const auto r = read.result.get();
  EXPECT_NE(r.finish_reason, "error") << r.error;
  EXPECT_EQ(r.chunks_from("ssd"), 3);
  EXPECT_EQ(q.written.load(), 0);  // still stalled while the read went through
  std::printf("[ measured ] read behind a stalled writer: %.3f s; queue high water %lld of %lld bytes, %lld dropped\n",
              seconds_since(t0), static_cast<long long>(q.high_water.load()),
              static_cast<long long>(cfg.ssd.write_queue_bytes), static_cast<long long>(q.dropped.load()));
  // /metrics reads these through stores_json.
  const auto stores = json::parse(rt.stores_json());
  EXPECT_EQ(stores.at("ssd").at("writes_dropped").get<int64_t>(), q.dropped.load());
  EXPECT_EQ(stores.at("ssd").at("write_queue_limit").get<int64_t>(), cfg.ssd.write_queue_bytes);

  // The disk comes back: what was queued is written, the queue drains.
  release.set_value();
  rt.shutdown();  // flushes the writer
  EXPECT_GE(q.written.load(), 1);
  EXPECT_EQ(q.bytes.load(), 0);
}

}  // namespace
}  // namespace bs
