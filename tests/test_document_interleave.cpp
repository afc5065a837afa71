// Storing a document (POST /v1/documents, Runtime::store_document) while streams
// decode, on the real model and the real runtime: its compute runs on the compute
// thread like a prefill, and like a prefill it lets the decoding streams step
// between its layers (limits.decode_interleave) instead of freezing them. The
// streams still get exactly the tokens they get alone, and the document is stored:
// a request that retrieves it loads it instead of computing it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"
#include "interleave_config.h"
#include "model_fixture.h"
#include "temp_dir.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;


// A raw prompt the model continues by counting on (no stop strings, greedy), for
// exactly max_tokens tokens.
RuntimeRequest counting(int from, int max_tokens) {
  RuntimeRequest r;
  r.raw = true;
  for (int i = from; i < from + 12; ++i) r.raw_prompt += std::to_string(i) + ", ";
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(DocumentStore, DecodeStepsRunBetweenTheLayersOfADocumentsCompute) {
  REQUIRE_MODEL();
  testing::TempDir dir;
  Runtime rt(testing::interleave_config_in(dir.path()));
  const auto& ctx = rt.context();
  // ~1600 tokens of prose as one chunk: every layer of its compute takes a while.
  std::string doc;
  for (int i = 0; document_chunk_tokens(ctx.model->tokenizer(), doc).size() < 1600; ++i)
    doc += "Entry " + std::to_string(i) +
           ". The harbour master kept a ledger of every ship that came in before the storm: its cargo of timber, "
           "copper or grain, the name of its captain and the hour the tide let it through the narrow channel. ";

  const auto stream_req = counting(1, 120);
  const RequestResult alone = rt.run(stream_req);
  ASSERT_EQ(alone.finish_reason, "length") << alone.error;
  ASSERT_EQ(alone.tokens.size(), 120u);

  // The same stream, decoding while the document is stored.
  std::atomic<int> pieces{0};
  std::promise<void> streaming;
  std::promise<RequestResult> stream_done;
  RequestCallbacks cb;
  cb.on_text = [&](std::string_view) {
    if (++pieces == 3) streaming.set_value();
    return true;
  };
  cb.on_done = [&](const RequestResult& r) { stream_done.set_value(r); };
  rt.submit(stream_req, std::move(cb));
  auto streaming_future = streaming.get_future();
  ASSERT_EQ(streaming_future.wait_for(std::chrono::minutes(5)), std::future_status::ready) << "the stream never started";

  const auto before = rt.decode_stats();
  const int pieces_before = pieces.load();
  const auto t0 = clock_type::now();
  const std::string key = rt.store_document(doc).id;
  const double store_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  const int pieces_during = pieces.load() - pieces_before;
  const auto after = rt.decode_stats();

  auto done_future = stream_done.get_future();
  ASSERT_EQ(done_future.wait_for(std::chrono::minutes(5)), std::future_status::ready) << "the stream never ended";
  const RequestResult together = done_future.get();
  ASSERT_EQ(together.finish_reason, "length") << together.error;
  // Decode steps between the document's layers change nothing in the stream.
  EXPECT_EQ(together.tokens, alone.tokens);
  EXPECT_EQ(together.text, alone.text);

  // The stream went on while the document was computed. Nothing else computes
  // here (no prefill, no write-back), so every step run inline was the store's; a
  // second one needs the first one's token back from the decoder, which streams
  // its text on the way.
  const double interval = ctx.config.decode_interleave;
  ASSERT_GT(store_s, 4 * interval) << "the store is too short to show interleaving";
  const int64_t interleaved = after.interleaved_steps - before.interleaved_steps;
  EXPECT_GE(interleaved, 2) << "decode steps during the " << store_s << " s store";
  EXPECT_LE(interleaved, ctx.model->config().n_layers) << "at most one step between two layers";
  EXPECT_GE(pieces_during, 1) << "stream text during the " << store_s << " s store";
  EXPECT_GE(after.tokens - before.tokens, interleaved);

  // Stored: storing it again computes nothing, and a request retrieving it loads it.
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(rt.store_document(doc).id, key);
  RuntimeRequest rag;
  rag.documents = {doc};
  rag.messages = {{"user", "Which cargoes did the ships carry?"}};
  rag.sampling.max_tokens = 2;
  const RequestResult hit = rt.run(rag);
  ASSERT_NE(hit.finish_reason, "error") << hit.error;
  EXPECT_EQ(hit.chunks, 1);
  EXPECT_EQ(hit.chunks_missed, 0);
  EXPECT_EQ(hit.chunks_from("ram") + hit.chunks_from("ssd"), 1);
  EXPECT_GT(hit.cached_tokens, 1500);
}

// The errors are the ones store_document always had.
TEST(DocumentStore, ADocumentTooLongOrAfterShutdownIsRefused) {
  REQUIRE_MODEL();
  testing::TempDir dir;
  Runtime rt(testing::interleave_config_in(dir.path()));
  std::string huge;
  const auto context = rt.context().model->config().context_length;
  while (static_cast<int64_t>(document_chunk_tokens(rt.context().model->tokenizer(), huge).size()) < context)
    huge += "word after word after word after word after word after word after word after word. ";
  try {
    rt.store_document(huge);
    ADD_FAILURE() << "a document longer than the context was stored";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, RequestErrc::too_long) << e.what();
  }
  rt.shutdown();
  try {
    rt.store_document("A short document about lighthouses.");
    ADD_FAILURE() << "a document was stored after shutdown";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, RequestErrc::shutting_down) << e.what();
  }
}

}  // namespace
}  // namespace bs
