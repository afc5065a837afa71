// Automatic prefix caching through the actor runtime on the real model: a prompt's
// first tokens are stored in chained blocks (blend.prefix_block_tokens) from the
// request's own cache, and a later prompt that begins with the same blocks loads them.
// Exact: the tokens a request gives with its prefix loaded equal those a cold runtime
// gives on the same prompt (greedy). A conversation's next turn loads the blocks of the
// turn before; an identical request loads all of its prompt but the last block's rest;
// a tiny RAM budget evicts blocks and never serves one that is not the prompt's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"
#include "model_fixture.h"
#include "settles.h"
#include "rag_runtime_fixture.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

RuntimeConfig config_in(const fs::path& dir, bool ssd = true) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.enabled = ssd;
  return c;
}

// A plain conversation (no documents): a system prompt and the user's long message.
RuntimeRequest chat(std::vector<ChatMessage> messages, int max_tokens = 12) {
  RuntimeRequest r;
  r.messages = std::move(messages);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// Case i's documents (its first `docs`) and question as one message.
std::string long_message(int i, size_t docs = 3) {
  const auto c = testing::rag_cases(i + 1)[static_cast<size_t>(i)];
  std::string text;
  for (size_t d = 0; d < std::min(docs, c.documents.size()); ++d) text += c.documents[d] + "\n\n";
  return text + c.question;
}

// Waits until every block of the request's prompt that can be stored is stored: the
// whole blocks, and the partial block that ends before the last token (blocks are
// copied after the first token, on the compute thread's background).
void wait_blocks(Runtime& rt, const RuntimeRequest& req) {
  auto& ctx = rt.context();
  const auto prompt = assemble_rag_prompt(ctx.model->tokenizer(), ctx.model->chat_template(), req.messages, {});
  const auto all = prompt.concatenated();
  const int64_t B = ctx.config.prefix_block_tokens, n = static_cast<int64_t>(all.size());
  auto keys = ctx.engine->prefix_block_keys(all, B, n / B * B);
  const auto to_last = ctx.engine->prefix_block_keys(all, B, n - 1);
  keys.insert(keys.end(), to_last.begin(), to_last.end());
  ASSERT_FALSE(keys.empty());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto stored = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const ChunkKey& k) { return ctx.tiered->contains(k); });
  };
  while (!stored() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(stored()) << "the prompt's blocks were not stored";
}

// The answers of a runtime that reuses nothing (no prefix blocks, no write-back, no
// SSD: for these chats without documents, every request as on a cold runtime), one
// runtime for all of a test's requests.
std::vector<RequestResult> cold(const std::vector<RuntimeRequest>& reqs) {
  TempDir dir;
  RuntimeConfig c = config_in(dir.path(), /*ssd=*/false);
  c.prefix_block_tokens = 0;
  c.write_back = false;
  Runtime rt(c);
  std::vector<RequestResult> out;
  for (const auto& r : reqs) out.push_back(rt.run(r));
  return out;
}
RequestResult cold(const RuntimeRequest& req) { return cold(std::vector<RuntimeRequest>{req})[0]; }

TEST(PrefixCache, AnIdenticalRequestLoadsItsPromptAndAnswersTheSame) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  const auto req = chat({{"system", "You answer from the passages."}, {"user", long_message(0)}});
  const auto first = rt.run(req);
  ASSERT_NE(first.finish_reason, "error") << first.error;
  EXPECT_EQ(first.prefix_cached_tokens, 0);
  wait_blocks(rt, req);
  const auto second = rt.run(req);
  ASSERT_NE(second.finish_reason, "error") << second.error;
  // Every token before the last: the whole blocks, then the partial block up to it.
  EXPECT_EQ(second.prefix_cached_tokens, second.prompt_tokens - 1);
  EXPECT_GE(second.cached_tokens, second.prompt_tokens * 95 / 100) << second.prompt_tokens;
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.text, first.text);
}

TEST(PrefixCache, TheNextTurnLoadsTheTurnBeforeAndAnswersAsAColdRuntime) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  std::vector<ChatMessage> conversation = {{"system", "You answer from the passages."}, {"user", long_message(1)}};
  const auto turn1 = chat(conversation);
  const auto a1 = rt.run(turn1);
  ASSERT_NE(a1.finish_reason, "error") << a1.error;
  wait_blocks(rt, turn1);
  conversation.push_back({"assistant", a1.text});
  conversation.push_back({"user", "Say that again in other words."});
  const auto turn2 = chat(conversation);
  const auto a2 = rt.run(turn2);
  ASSERT_NE(a2.finish_reason, "error") << a2.error;
  // Turn 1's whole blocks (all of its prompt but the last block's rest) came stored.
  const int64_t B = rt.context().config.prefix_block_tokens;
  EXPECT_GE(a2.prefix_cached_tokens, (a1.prompt_tokens - 1) / B * B);
  EXPECT_GE(a2.prefix_cached_tokens, a1.prompt_tokens * 90 / 100);
  EXPECT_EQ(a2.tokens, cold(turn2).tokens);
}

TEST(PrefixCache, ATinyBudgetEvictsBlocksAndNeverServesAnotherPromptsKv) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig c = config_in(dir.path(), /*ssd=*/false);
  // Four blocks of SmolLM2's KV (B tokens x 30 layers x 2 x 192 x 2 bytes each) and a bit.
  const int64_t B = c.prefix_block_tokens;
  const int64_t block_bytes = B * 30 * 2 * 192 * 2;
  c.ram.budget_bytes = 4 * block_bytes + 4096;
  Runtime rt(c);
  // Prompts that share a long system prompt (two blocks and more), then part, each
  // longer than the budget: the shared blocks stay (used by every prompt), the others
  // are evicted; each answer equals a cold runtime's.
  const std::string system = "You answer from these notes.\n\n" + testing::rag_cases(1)[0].documents[0];
  std::vector<RuntimeRequest> reqs;
  for (int i = 1; i < 4; ++i) reqs.push_back(chat({{"system", system}, {"user", long_message(i, 1)}}, 6));
  std::vector<std::vector<int32_t>> cold_tokens;
  for (const auto& r : cold(reqs)) cold_tokens.push_back(r.tokens);
  int64_t loaded = 0;
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto r = rt.run(reqs[i]);
      ASSERT_NE(r.finish_reason, "error") << r.error;
      EXPECT_LE(r.prefix_cached_tokens, 4 * B);
      if (round == 1) loaded += r.prefix_cached_tokens;
      EXPECT_EQ(r.tokens, cold_tokens[i]) << "round " << round << " prompt " << i;
    }
  EXPECT_GT(loaded, 0) << "the shared blocks were never loaded";
  const auto st = rt.context().ram->stats();
  EXPECT_LE(st.bytes, c.ram.budget_bytes);
  EXPECT_GT(st.evictions, 0);
}

// model.batch_invariant at tp 1 and 3: every prompt row is computed as that row alone,
// so a request with its prefix loaded (the stored rows, then the rest in a prefill of
// another row count) answers a cold runtime's greedy tokens whatever the prompt.
// "Say hello." is a near-tie: with the default products (AVX2 EPYC, f32), computed
// after a 16-token hit (the questions before it stored the chat template's first
// block) and then asked again with 32 of its 33 tokens stored, it answers "Hello
// there..." where one prefill answers "Hello! I'm here..." (a product of 17 or 1 rows
// rounds otherwise than one of 33).
// Here: short questions asked again (their blocks stored, the last token computed),
// and a conversation's next turn (turn 1's blocks stored, the rest computed).
class BatchInvariantPrefix : public ::testing::TestWithParam<int> {};

TEST_P(BatchInvariantPrefix, ARequestWithItsPrefixLoadedAnswersAsAColdRuntime) {
  REQUIRE_MODEL();
  const int tp = GetParam();
  auto config = [&](const fs::path& dir, bool reuse) {
    RuntimeConfig c = config_in(dir, /*ssd=*/false);
    c.batch_invariant = true;
    c.tp = tp;
    if (!reuse) {
      c.prefix_block_tokens = 0;
      c.write_back = false;
    }
    return c;
  };
  std::vector<RuntimeRequest> again;
  for (const char* q : {"What is 2+2?", "Name a colour.", "Say hello.", "What is the sun?"})
    again.push_back(chat({{"user", q}}, 24));
  std::vector<ChatMessage> conversation = {{"system", "You answer from the passages."}, {"user", long_message(2, 2)}};
  const auto turn1 = chat(conversation, 8);
  TempDir warm_dir;
  Runtime rt(config(warm_dir.path(), true));
  EXPECT_NE(rt.context().backend->kernel_id().find("+batch-invariant"), std::string::npos);
  const int64_t B = rt.context().config.prefix_block_tokens;
  std::vector<RequestResult> warm;  // each request's answer with its blocks stored
  for (const auto& req : again) {
    ASSERT_NE(rt.run(req).finish_reason, "error");
    wait_blocks(rt, req);
    warm.push_back(rt.run(req));
    ASSERT_NE(warm.back().finish_reason, "error") << warm.back().error;
    EXPECT_EQ(warm.back().prefix_cached_tokens, warm.back().prompt_tokens - 1);
    EXPECT_GT(warm.back().prefix_cached_tokens, 0);
  }
  const auto a1 = rt.run(turn1);
  ASSERT_NE(a1.finish_reason, "error") << a1.error;
  wait_blocks(rt, turn1);
  conversation.push_back({"assistant", a1.text});
  conversation.push_back({"user", "Say that again in other words."});
  again.push_back(chat(conversation, 8));
  warm.push_back(rt.run(again.back()));
  ASSERT_NE(warm.back().finish_reason, "error") << warm.back().error;
  EXPECT_GE(warm.back().prefix_cached_tokens, (a1.prompt_tokens - 1) / B * B);

  TempDir cold_dir;
  Runtime cold_rt(config(cold_dir.path(), false));
  for (size_t i = 0; i < again.size(); ++i) {
    const auto cold_answer = cold_rt.run(again[i]);
    EXPECT_EQ(cold_answer.prefix_cached_tokens, 0);
    EXPECT_EQ(warm[i].tokens, cold_answer.tokens) << "request " << i << ": " << warm[i].text << " | "
                                                  << cold_answer.text;
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, BatchInvariantPrefix, ::testing::Values(1, 3),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// Passages learnt on first sight (blend.learn_passage_tokens): three passages pasted
// into a plain message are stored (computed alone in the background, as documents are)
// and found when pasted again in the reverse order with another question: blended,
// at least 80% of the prompt from stored KV.
TEST(LearntPassages, PassagesPastedOnceAreBlendedWhenPastedAgainInAnotherOrder) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  auto c = testing::rag_cases(1)[0];
  // One paragraph each (the dataset's documents hold blank lines of their own).
  for (auto& d : c.documents)
    for (size_t at; (at = d.find("\n\n")) != std::string::npos;) d.replace(at, 2, "\n");
  auto pasted = [](const std::vector<std::string>& docs, const std::string& question) {
    std::string text = "Use these passages.\n\n";
    for (const auto& d : docs) text += d + "\n\n";
    return chat({{"user", text + question}});
  };
  const auto first = rt.run(pasted(c.documents, c.question));
  ASSERT_NE(first.finish_reason, "error") << first.error;
  EXPECT_EQ(first.chunks, 0);
  auto& ctx = rt.context();
  EXPECT_TRUE(testing::settles(
      [&] {
        for (const auto& d : c.documents)
          if (!ctx.tiered->contains(ctx.engine->chunk_key(document_chunk_tokens(ctx.model->tokenizer(), d))))
            return false;
        return true;
      },
      120));
  std::vector<std::string> reversed(c.documents.rbegin(), c.documents.rend());
  const auto second = rt.run(pasted(reversed, "Answer in one word: " + c.question));
  ASSERT_NE(second.finish_reason, "error") << second.error;
  // The three passages came stored (the text before them is a part of its own, computed).
  EXPECT_EQ(second.chunks - second.chunks_missed, 3);
  EXPECT_GE(second.cached_tokens, second.prompt_tokens * 80 / 100) << second.prompt_tokens;
  // Off: nothing is learnt.
  TempDir off_dir;
  RuntimeConfig off = config_in(off_dir.path());
  off.learn_passage_tokens = 0;
  Runtime rt_off(off);
  rt_off.run(pasted(c.documents, c.question));
  const auto again = rt_off.run(pasted(reversed, c.question));
  EXPECT_EQ(again.chunks, 0);
}

// Reusable at once (actors/runtime/chunk_flights.h): documents sent with a request and then at
// once in the reverse order. The second request loads every chunk: the first
// request's rows of them, stored in RAM as provisional entries before its first token;
// their KV computed alone replaces them in the background, each chunk computed once.
TEST(ReuseAtOnce, DocumentsSentThenAtOnceReversedHitEveryChunk) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  const auto c = testing::rag_cases(1)[0];
  RuntimeRequest a = chat({{"user", c.question}}, 4);
  a.documents = c.documents;
  const auto first = rt.run(a);
  ASSERT_NE(first.finish_reason, "error") << first.error;
  const int n = static_cast<int>(c.documents.size());
  EXPECT_EQ(first.chunks_missed, n);
  RuntimeRequest b = a;
  std::reverse(b.documents.begin(), b.documents.end());
  const auto second = rt.run(b);
  ASSERT_NE(second.finish_reason, "error") << second.error;
  EXPECT_EQ(second.chunks, n);
  EXPECT_EQ(second.chunks_missed, 0);
  EXPECT_EQ(second.chunks_from("ram"), n);
  EXPECT_EQ(rt.reuse_stats().provisional_entries, n);
  // The clean entries replace them: each chunk computed alone once, none provisional.
  auto& ctx = rt.context();
  EXPECT_TRUE(testing::settles(
      [&] {
        const auto rs = rt.reuse_stats();
        return rs.chunks_computed >= n && rs.computes_in_flight == 0;
      },
      120));
  EXPECT_EQ(rt.reuse_stats().chunks_computed, n);
  for (const auto& d : c.documents) {
    const auto key = ctx.engine->chunk_key(document_chunk_tokens(ctx.model->tokenizer(), d));
    EXPECT_TRUE(ctx.tiered->contains(key));
    EXPECT_FALSE(ctx.flights.provisional(key));
  }
  // The clean entries serve as the provisional ones did.
  const auto third = rt.run(b);
  ASSERT_NE(third.finish_reason, "error") << third.error;
  EXPECT_EQ(third.chunks_missed, 0);
  EXPECT_EQ(third.chunks_from("ram"), n);
}

// Single flight: eight requests at once about the same new documents. Every one is
// answered; each chunk is computed alone once, whichever requests missed it.
TEST(ReuseAtOnce, EightRequestsAtOnceOnTheSameNewDocumentsComputeEachChunkOnce) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig cfg = config_in(dir.path());
  cfg.max_requests = 8;
  Runtime rt(cfg);
  const auto c = testing::rag_cases(1)[0];
  std::vector<std::thread> clients;
  std::vector<RequestResult> results(8);
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&, i] {
      RuntimeRequest r = chat({{"user", c.question + (i % 2 ? " Answer briefly." : "")}}, 4);
      r.documents = c.documents;
      if (i % 3 == 1) std::reverse(r.documents.begin(), r.documents.end());
      results[static_cast<size_t>(i)] = rt.run(r);
    });
  for (auto& t : clients) t.join();
  for (const auto& r : results) ASSERT_NE(r.finish_reason, "error") << r.error;
  const int n = static_cast<int>(c.documents.size());
  EXPECT_TRUE(testing::settles([&] { return rt.reuse_stats().computes_in_flight == 0; }, 120));
  const auto rs = rt.reuse_stats();
  EXPECT_EQ(rs.chunks_computed, n);
  auto& ctx = rt.context();
  for (const auto& d : c.documents)
    EXPECT_TRUE(ctx.tiered->contains(ctx.engine->chunk_key(document_chunk_tokens(ctx.model->tokenizer(), d))));
}

}  // namespace
}  // namespace bs
