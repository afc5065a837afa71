// A request cancelled while its prefill runs (the HTTP client left, Runtime::cancel)
// stops at the next layer boundary instead of computing the rest of a long prompt:
// its slot and the compute thread are free again within one layer's time, it ends
// "cancelled" with no token, and the runtime answers the next request as before.
// Real model, real runtime. The prefill is known to be running (not queued, not
// done) when the cancel comes: a decoding stream beside it steps between its layers
// (limits.decode_interleave), and only a running prefill makes such steps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "interleave_config.h"
#include "counting_request.h"
#include "model_fixture.h"
#include "temp_dir.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;



// ~3000 tokens of prose, computed in full: every layer of its prefill takes a while.
RuntimeRequest long_prompt(const Runtime& rt) {
  RuntimeRequest r;
  r.raw = true;
  for (int i = 0; rt.context().model->tokenizer().encode(r.raw_prompt, false).size() < 3000; ++i)
    r.raw_prompt += "Entry " + std::to_string(i) +
                    ". The harbour master kept a ledger of every ship that came in before the storm: its cargo of "
                    "timber, copper or grain, the name of its captain and the hour the tide let it through. ";
  r.sampling.max_tokens = 4;
  return r;
}

TEST(PrefillCancel, ACancelledRequestStopsItsPrefillAtTheNextLayer) {
  REQUIRE_MODEL();
  testing::TempDir dir;
  Runtime rt(testing::interleave_config_in(dir.path()));
  const int n_layers = rt.context().model->config().n_layers;

  // A stream that decodes for the whole test (cancelled at the end).
  std::atomic<int> pieces{0};
  std::promise<void> streaming;
  std::promise<RequestResult> stream_done;
  RequestCallbacks scb;
  scb.on_text = [&](std::string_view) {
    if (++pieces == 2) streaming.set_value();
    return true;
  };
  scb.on_done = [&](const RequestResult& r) { stream_done.set_value(r); };
  const uint64_t stream_id = rt.submit(testing::counting_request(4000), std::move(scb));
  auto streaming_future = streaming.get_future();
  ASSERT_EQ(streaming_future.wait_for(std::chrono::minutes(5)), std::future_status::ready) << "the stream never started";

  // The long request; cancelled once its prefill has let the stream step once.
  const auto before = rt.decode_stats();
  std::promise<RequestResult> long_done;
  RequestCallbacks lcb;
  lcb.on_done = [&](const RequestResult& r) { long_done.set_value(r); };
  const RuntimeRequest long_req = long_prompt(rt);
  const uint64_t long_id = rt.submit(long_req, std::move(lcb));
  auto long_future = long_done.get_future();
  const auto give_up = clock_type::now() + std::chrono::minutes(5);
  while (rt.decode_stats().interleaved_steps == before.interleaved_steps &&
         long_future.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready && clock_type::now() < give_up) {
  }
  ASSERT_GT(rt.decode_stats().interleaved_steps, before.interleaved_steps) << "the prefill never let the stream step";
  ASSERT_NE(long_future.wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "the prefill ended before it could be cancelled";
  ASSERT_TRUE(rt.cancel(long_id));

  ASSERT_EQ(long_future.wait_for(std::chrono::minutes(5)), std::future_status::ready);
  const RequestResult cancelled = long_future.get();
  EXPECT_EQ(cancelled.finish_reason, "cancelled") << cancelled.error;
  EXPECT_TRUE(cancelled.tokens.empty());

  // Its trace says where the prefill stopped: at a layer boundary inside the model,
  // not after the last layer (the old behaviour: the whole prefill, then "cancelled").
  const auto traces = nlohmann::json::parse(rt.traces_json(8));
  int stopped_before = -1;
  for (const auto& t : traces)
    if (t.value("id", uint64_t{0}) == long_id)
      for (const auto& e : t["events"])
        if (e.value("what", "").rfind("prefill cancelled before layer", 0) == 0) stopped_before = e.value("layer", -1);
  EXPECT_GT(stopped_before, 0) << traces.dump();
  EXPECT_LT(stopped_before, n_layers) << traces.dump();

  // The stream kept its place and goes on; then the runtime answers the same long
  // request in full, as if nothing had happened.
  const int after_cancel = pieces.load();
  const auto t0 = clock_type::now();
  while (pieces.load() < after_cancel + 2 && clock_type::now() - t0 < std::chrono::minutes(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(pieces.load(), after_cancel + 2) << "the stream stopped after the cancel";
  ASSERT_TRUE(rt.cancel(stream_id));
  auto stream_future = stream_done.get_future();
  ASSERT_EQ(stream_future.wait_for(std::chrono::minutes(2)), std::future_status::ready);

  const RequestResult full = rt.run(long_req);
  EXPECT_EQ(full.finish_reason, "length") << full.error;
  EXPECT_EQ(full.tokens.size(), 4u);
}

}  // namespace
}  // namespace bs
