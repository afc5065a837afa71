// The forward pass against llama.cpp (an implementation we did not write), run on
// an F32 export of the same weights: tests/fixtures/golden_logits.json, made by
// tools/fixtures/make_golden.py. Then the fast bf16 path against our fp32 path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/kv_view.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "tests/golden_fixture.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

using kernels::Precision;
using kernels::TensorType;
using kernels::kv_dtype_name;

using testing::golden;

std::vector<float> all_logits(const LlamaModel& m, const std::vector<int32_t>& ids) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()));
  return tf.forward(ids, cache, /*all_logits=*/true);
}

std::vector<int32_t> greedy(const LlamaModel& m, const std::vector<int32_t>& ids, int steps) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()) + steps);
  auto logits = tf.forward(ids, cache);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = argmax(logits.data(), m.config().vocab);
    out.push_back(next);
    if (i + 1 < steps) logits = tf.forward(std::span<const int32_t>(&next, 1), cache);
  }
  return out;
}

TEST(ModelGolden, FixturePromptsTokenizeIdentically) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  ASSERT_GE(golden().size(), 5u);
  for (const auto& g : golden()) EXPECT_EQ(m.tokenizer().encode(g.text, true), g.ids) << g.text;
}

// Tolerance on the final-position logits of the fp32 path vs llama.cpp fp32:
// max |Δ| < 1e-3 (measured 5e-5; logits span about ±30); sums run in different orders.
TEST(ModelGolden, Fp32FinalLogitsMatchReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  for (const auto& g : golden()) {
    Transformer tf(m);
    auto cache = tf.make_cache(static_cast<int64_t>(g.ids.size()));
    auto logits = tf.forward(g.ids, cache);
    ASSERT_EQ(logits.size(), g.final_logits.size());
    double max_diff = 0;
    for (size_t i = 0; i < logits.size(); ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(logits[i] - g.final_logits[i])));
    EXPECT_LT(max_diff, 1e-3) << g.text.substr(0, 60);
    EXPECT_EQ(argmax(logits.data(), m.config().vocab), argmax(g.final_logits.data(), m.config().vocab));
    std::printf("[fp32 vs llama.cpp] %zu tokens: max |dlogit| = %.5f\n", g.ids.size(), max_diff);
  }
}

TEST(ModelGolden, Fp32GreedyContinuationsMatchReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  for (const auto& g : golden()) EXPECT_EQ(greedy(m, g.ids, 32), g.greedy) << g.text.substr(0, 60);
}

TEST(ModelGolden, Fp32TeacherForcedTop1MatchesReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  const int64_t V = m.config().vocab;
  int64_t agree = 0, total = 0;
  for (const auto& g : golden()) {
    auto logits = all_logits(m, g.ids);
    ASSERT_EQ(g.position_top1.size(), g.ids.size());
    for (size_t t = 0; t < g.ids.size(); ++t, ++total) agree += argmax(&logits[t * V], V) == g.position_top1[t];
  }
  std::printf("[fp32 vs llama.cpp] teacher-forced top-1: %lld / %lld\n", static_cast<long long>(agree),
              static_cast<long long>(total));
  EXPECT_GE(static_cast<double>(agree) / static_cast<double>(total), 0.999);
}

// Half-precision KV (device.kv_dtype f16 / bf16) against the fp32-KV golden
// (llama.cpp, F32): how far each moves the final-position logits and the
// teacher-forced top-1 over every fixture position, printed for the README. K is
// rounded after RoPE, attention accumulates in fp32. Measured (AVX-512 Xeon): f16
// 0.014 max |Δlogit|, bf16 0.086, both 463/463 positions; bounds with about 3x room:
// f16 within 0.05 and >= 99.5% agreement, bf16 within 0.3 and >= 99%.
TEST(ModelGolden, HalfPrecisionKvStaysNearTheFp32KvGolden) {
  REQUIRE_MODEL();
  for (const TensorType dtype : {TensorType::F16, TensorType::BF16}) {
    const auto& m = testing::shared_model(Precision::F32, dtype);
    const int64_t V = m.config().vocab;
    int64_t agree = 0, total = 0;
    double max_final = 0;
    for (const auto& g : golden()) {
      auto logits = all_logits(m, g.ids);
      for (size_t t = 0; t < g.ids.size(); ++t, ++total) agree += argmax(&logits[t * V], V) == g.position_top1[t];
      const float* last = &logits[(g.ids.size() - 1) * V];
      for (int64_t i = 0; i < V; ++i)
        max_final = std::max(max_final, static_cast<double>(std::fabs(last[i] - g.final_logits[i])));
    }
    const double rate = static_cast<double>(agree) / static_cast<double>(total);
    std::printf("[%s KV vs llama.cpp fp32] final-position max |dlogit| %.4f; teacher-forced top-1 %lld / %lld\n",
                kv_dtype_name(dtype), max_final, static_cast<long long>(agree), static_cast<long long>(total));
    EXPECT_LT(max_final, dtype == TensorType::F16 ? 0.05 : 0.3) << kv_dtype_name(dtype);
    EXPECT_GE(rate, dtype == TensorType::F16 ? 0.995 : 0.99) << kv_dtype_name(dtype);
  }
}

// The logits of every position computed as decode steps (one token at a time: the
// decode-size products, where DecodeActivations applies), [ids.size(), vocab].
std::vector<float> decode_logits(const LlamaModel& m, const std::vector<int32_t>& ids) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()));
  const int64_t V = m.config().vocab;
  std::vector<float> out(ids.size() * V);
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto logits = tf.forward(std::span<const int32_t>(&ids[t], 1), cache);
    std::copy(logits.begin(), logits.end(), out.begin() + static_cast<int64_t>(t) * V);
  }
  return out;
}

// DecodeActivations::Int8 (activations of the decode products of every block type
// rounded to int8 per block, as llama.cpp does) against the exact path on the same AVX2
// kernels, every fixture position teacher-forced through decode steps, and both against
// the llama.cpp golden; printed for the README. Measured (AMD EPYC, AVX2 kernels): 433 /
// 463 positions (93.5%) keep their top-1, max |dlogit| 6.1 — short of the 99.5% that would
// make int8 the default, so it is opt-in (model.decode_activations). The bounds hold
// the measured quality (>= 90%) and the exact path at llama.cpp's (>= 99.9%).
TEST(ModelGolden, Int8DecodeActivationsAgainstTheExactPath) {
  REQUIRE_MODEL();
  if (kernels::cpu::detect_cpu_isa() < kernels::cpu::CpuIsa::Avx2) GTEST_SKIP() << "the int8 path needs AVX2";
  auto exact_backend = kernels::make_cpu_backend_for(kernels::cpu::CpuIsa::Avx2, kernels::DecodeActivations::Exact);
  auto int8_backend = kernels::make_cpu_backend_for(kernels::cpu::CpuIsa::Avx2, kernels::DecodeActivations::Int8);
  ASSERT_EQ(int8_backend->kernel_id(), "cpu/avx2+int8");
  const LlamaModel exact(testing::model_path(), *exact_backend, Precision::F32);
  const LlamaModel int8(testing::model_path(), *int8_backend, Precision::F32);
  EXPECT_NE(exact.fingerprint(), int8.fingerprint());  // chunks of one are never served to the other
  const int64_t V = exact.config().vocab;
  int64_t agree_exact = 0, agree_golden = 0, exact_golden = 0, total = 0;
  double max_all = 0, max_final = 0;
  for (const auto& g : golden()) {
    const auto a = decode_logits(exact, g.ids), b = decode_logits(int8, g.ids);
    for (size_t t = 0; t < g.ids.size(); ++t, ++total) {
      const int32_t top_b = argmax(&b[t * V], V);
      agree_exact += top_b == argmax(&a[t * V], V);
      agree_golden += top_b == g.position_top1[t];
      exact_golden += argmax(&a[t * V], V) == g.position_top1[t];
      for (int64_t i = 0; i < V; ++i) max_all = std::max(max_all, static_cast<double>(std::fabs(a[t * V + i] - b[t * V + i])));
    }
    const float* last = &b[(g.ids.size() - 1) * V];
    for (int64_t i = 0; i < V; ++i)
      max_final = std::max(max_final, static_cast<double>(std::fabs(last[i] - g.final_logits[i])));
  }
  std::printf("[int8 decode activations] top-1 vs exact path %lld / %lld, vs llama.cpp %lld (exact path: %lld); "
              "max |dlogit| vs exact %.4f; final-position max |dlogit| vs llama.cpp %.4f\n",
              static_cast<long long>(agree_exact), static_cast<long long>(total), static_cast<long long>(agree_golden),
              static_cast<long long>(exact_golden), max_all, max_final);
  EXPECT_GE(static_cast<double>(agree_exact) / static_cast<double>(total), 0.90);
  EXPECT_GE(static_cast<double>(agree_golden) / static_cast<double>(total), 0.90);
  EXPECT_GE(static_cast<double>(exact_golden) / static_cast<double>(total), 0.999);
  EXPECT_GT(max_all, 0.0);  // the int8 path ran
}

// The fast path: bf16 GEMMs against our fp32 path, teacher-forced over the fixture
// prompts. Targets: top-1 agreement on every position where fp32's best token leads
// its runner-up by more than kNearTie logits, >= 98% of all positions, mean |Δlogit|
// < 0.15, and the final-position logits within 1.0 (max) of fp32. Near-ties are left
// to the rounding: oneDNN's GEMM on AMX (a Sapphire Rapids Xeon) adds in another order
// than on AVX512-BF16 alone (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 on the same Xeon) and
// flips 5 of the 463 positions instead of 1, each where fp32's top two are within 0.04
// logits; every position with a lead above 0.1 agrees on both.
TEST(ModelGolden, Bf16PathAgreesWithFp32Path) {
  REQUIRE_MODEL();
  if (!testing::shared_backend().supports(Precision::BF16))
    GTEST_SKIP() << "no native bf16 on " << testing::shared_backend().kernel_id() << ": the fast path is f32";
  constexpr float kNearTie = 0.1f;
  const auto& f32 = testing::shared_model(Precision::F32);
  const auto& bf16 = testing::shared_model(Precision::BF16);
  const int64_t V = f32.config().vocab;
  int64_t agree = 0, total = 0, decisive = 0, decisive_agree = 0;
  double sum_abs = 0, max_abs = 0, max_final = 0;
  int64_t count = 0;
  for (const auto& g : golden()) {
    auto a = all_logits(f32, g.ids), b = all_logits(bf16, g.ids);
    for (size_t t = 0; t < g.ids.size(); ++t, ++total) {
      const float* fa = &a[t * V];
      const int32_t top_a = argmax(fa, V), top_b = argmax(&b[t * V], V);
      float runner_up = -INFINITY;
      for (int64_t i = 0; i < V; ++i)
        if (i != top_a) runner_up = std::max(runner_up, fa[i]);
      agree += top_a == top_b;
      if (fa[top_a] - runner_up > kNearTie) {
        ++decisive;
        decisive_agree += top_a == top_b;
      } else if (top_a != top_b) {
        std::printf("[bf16 vs fp32] near-tie flip at position %zu: fp32 leads bf16's pick by %.4f\n", t,
                    static_cast<double>(fa[top_a] - fa[top_b]));
      }
      for (int64_t i = 0; i < V; ++i) {
        const double d = std::fabs(a[t * V + i] - b[t * V + i]);
        sum_abs += d;
        max_abs = std::max(max_abs, d);
        if (t + 1 == g.ids.size()) max_final = std::max(max_final, d);
        ++count;
      }
    }
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(total);
  std::printf("[bf16 vs fp32] top-1 %.4f over %lld positions (%lld / %lld where fp32 leads by > %.1f); mean |dlogit| "
              "%.4f, max %.3f, final positions max %.3f\n",
              rate, static_cast<long long>(total), static_cast<long long>(decisive_agree),
              static_cast<long long>(decisive), static_cast<double>(kNearTie), sum_abs / count, max_abs, max_final);
  EXPECT_EQ(decisive_agree, decisive);
  EXPECT_GE(decisive, total * 9 / 10);  // near-ties are the exception
  EXPECT_GE(rate, 0.98);
  EXPECT_LT(sum_abs / count, 0.15);
  EXPECT_LT(max_final, 1.0);
}

TEST(ModelChat, AnswersTheCapitalOfFrance) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode(m.chat_template().apply({{"user", "What is the capital of France?"}}, true), true);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()) + 64);
  SamplingParams p;
  p.max_tokens = 64;
  auto r = generate(tf, cache, ids, p);
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_EQ(r.finish_reason, "stop");  // ends its turn with <|im_end|>
}

TEST(ModelGenerate, MaxTokensAndStopStrings) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode("1, 2, 3, 4, 5, 6, 7,", false);
  SamplingParams p;
  p.max_tokens = 5;
  auto cache = tf.make_cache(64);
  auto r = generate(tf, cache, ids, p);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.finish_reason, "length");
  // Stop string: the counting continues " 8, 9, ..."; stop at "10" and don't include it.
  p.max_tokens = 30;
  p.stop = {"10"};
  auto cache2 = tf.make_cache(64);
  std::string streamed;
  auto r2 = generate(tf, cache2, ids, p, [&](std::string_view s) {
    streamed += s;
    return true;
  });
  EXPECT_EQ(r2.finish_reason, "stop");
  EXPECT_EQ(r2.text.find("10"), std::string::npos) << r2.text;
  EXPECT_NE(r2.text.find("9"), std::string::npos) << r2.text;
  EXPECT_EQ(streamed, r2.text);  // the streamed pieces are exactly the final text
}

TEST(ModelGenerate, SamplingIsSeededAndValid) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode("Once upon a time", false);
  SamplingParams p;
  p.max_tokens = 12;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 42;
  auto run = [&](SamplingParams q) {
    auto cache = tf.make_cache(64);
    return generate(tf, cache, ids, q).tokens;
  };
  const auto a = run(p), b = run(p);
  EXPECT_EQ(a, b);  // same seed, same tokens
  p.seed = 43;
  int differing = 0;
  for (int s = 43; s < 47; ++s) {
    p.seed = s;
    differing += run(p) != a;
  }
  EXPECT_GT(differing, 0);  // other seeds explore
  // top_k = 1 is greedy whatever the temperature
  p.top_k = 1;
  SamplingParams g;
  g.max_tokens = 12;
  EXPECT_EQ(run(p), run(g));
}

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at
// most U+10FFFF, no truncated sequence at the end).
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;  // a continuation byte or 0xF8..0xFF where a character must start
    }
    if (i + len > n) return false;
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

TEST(ModelGenerate, Utf8ValidatorItself) {
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9 \xE6\x97\xA5 \xE2\x9C\x93 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xE6\x97"));      // truncated
  EXPECT_FALSE(valid_utf8("\x97\xA5"));      // starts inside a character
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));      // overlong
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // surrogate
}

// Greedy generation with a streaming callback: the pieces, in order.
struct Streamed {
  GenerationResult result;
  std::vector<std::string> pieces;
};
Streamed generate_streamed(const Transformer& tf, const std::vector<int32_t>& ids, const SamplingParams& p) {
  Streamed s;
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()) + p.max_tokens + 1);
  s.result = generate(tf, cache, ids, p, [&](std::string_view piece) {
    s.pieces.emplace_back(piece);
    return true;
  });
  return s;
}

// The streaming contract: the pieces concatenate to the final text and every
// running concatenation is a prefix of it (nothing emitted is ever taken back).
void expect_stream_is_final_text(const Streamed& s) {
  std::string so_far;
  for (const auto& piece : s.pieces) {
    EXPECT_FALSE(piece.empty());
    so_far += piece;
    EXPECT_EQ(s.result.text.compare(0, so_far.size(), so_far), 0)
        << "streamed '" << so_far << "' is not a prefix of the final text '" << s.result.text << "'";
  }
  EXPECT_EQ(so_far, s.result.text);
}

// A stop string that spans several tokens and starts inside one: the counting
// prompt continues " 8, 9, 10, ..." one character per token (" ", "9", ",", " ",
// "1", "0"), and "9, 10" begins after the space. The text must end right before it,
// and while "9, 1" is pending it must be held back, never streamed and retracted.
TEST(ModelGenerate, StopStringAcrossSeveralTokensIsCutAndNeverStreamed) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  const auto ids = m.tokenizer().encode("1, 2, 3, 4, 5, 6, 7,", false);
  SamplingParams p;
  p.max_tokens = 30;
  const auto plain = generate_streamed(tf, ids, p);
  ASSERT_EQ(plain.result.finish_reason, "length");
  expect_stream_is_final_text(plain);
  const std::string stop = "9, 10";
  const size_t at = plain.result.text.find(stop);
  ASSERT_NE(at, std::string::npos) << plain.result.text;
  // The occurrence crosses token boundaries: count the tokens it overlaps.
  {
    size_t begin = 0;
    int overlapped = 0;
    for (int32_t id : plain.result.tokens) {
      const size_t end = begin + m.tokenizer().token_bytes(id).size();
      if (end > at && begin < at + stop.size()) ++overlapped;
      begin = end;
    }
    ASSERT_GE(overlapped, 3) << "the stop string must span several tokens for this test";
  }

  p.stop = {stop};
  const auto cut = generate_streamed(tf, ids, p);
  EXPECT_EQ(cut.result.finish_reason, "stop");
  EXPECT_EQ(cut.result.text, plain.result.text.substr(0, at));
  for (const auto& piece : cut.pieces) EXPECT_EQ(piece.find(stop), std::string::npos) << piece;
  expect_stream_is_final_text(cut);
  // Decoding ended with the token that completed the stop string ("0" of "10").
  ASSERT_LE(cut.result.tokens.size(), plain.result.tokens.size());
  EXPECT_TRUE(std::equal(cut.result.tokens.begin(), cut.result.tokens.end(), plain.result.tokens.begin()));
  EXPECT_EQ(m.tokenizer().decode(cut.result.tokens).substr(at), stop);

  // A stop string whose first 4 characters do appear ("9, 1" of "9, 10") but which
  // never completes: the held-back text must be released, the output is the plain one.
  p.stop = {"9, 11"};
  ASSERT_EQ(plain.result.text.find("9, 11"), std::string::npos);
  const auto held = generate_streamed(tf, ids, p);
  EXPECT_EQ(held.result.finish_reason, "length");
  EXPECT_EQ(held.result.text, plain.result.text);
  expect_stream_is_final_text(held);
}

// Multibyte output: the model repeats "café naïve 日本語 ✓" from a raw completion
// prompt; its tokens split 日 (E6 97 A5) and ✓ (E2 9C 93) across byte tokens. Every
// streamed piece must be valid UTF-8 on its own, and they must add up to the text.
TEST(ModelGenerate, MultibyteOutputStreamsWholeCharacters) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  const std::string line = "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE2\x9C\x93\n";
  const auto ids = m.tokenizer().encode(line + line + line, false);
  SamplingParams p;
  p.max_tokens = 40;
  auto check = [&](const Streamed& s) {
    EXPECT_TRUE(valid_utf8(s.result.text));
    for (const auto& piece : s.pieces) EXPECT_TRUE(valid_utf8(piece)) << "piece of " << piece.size() << " bytes";
    expect_stream_is_final_text(s);
  };
  const auto plain = generate_streamed(tf, ids, p);
  check(plain);
  // The test is only meaningful if the output is multibyte and a token ends inside a
  // character (so the stream decoder has to hold bytes back).
  const std::string& text = plain.result.text;
  EXPECT_TRUE(std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }));
  EXPECT_NE(text.find("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"), std::string::npos) << text;  // 日本語
  EXPECT_TRUE(std::any_of(plain.result.tokens.begin(), plain.result.tokens.end(),
                          [&](int32_t id) { return !valid_utf8(m.tokenizer().token_bytes(id)); }));
  // A multibyte stop string over split tokens: "語 ✓" (E8 AA 9E 20 E2 9C 93).
  p.stop = {"\xE8\xAA\x9E \xE2\x9C\x93"};
  const size_t at = text.find(p.stop[0]);
  ASSERT_NE(at, std::string::npos);
  const auto cut = generate_streamed(tf, ids, p);
  EXPECT_EQ(cut.result.finish_reason, "stop");
  EXPECT_EQ(cut.result.text, text.substr(0, at));
  check(cut);
}

// DecodeSession on its own, fed logits that make one token the greedy choice.
TEST(ModelGenerate, DecodeSessionLengthContinueAndCancel) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  const auto& tok = m.tokenizer();
  const int64_t V = m.config().vocab;
  const auto hello = tok.encode("hello", false);
  ASSERT_EQ(hello.size(), 1u);
  const int32_t id = hello[0];
  std::vector<float> logits(static_cast<size_t>(V), 0.0f);
  logits[id] = 10.0f;

  {  // max_tokens: exactly that many tokens, the last step finishes "length"
    SamplingParams p;
    p.max_tokens = 3;
    DecodeSession s(tok, V, p);
    std::string streamed;
    for (int i = 0; i < 3; ++i) {
      ASSERT_FALSE(s.done());
      const auto st = s.step(logits.data(), true);
      streamed += st.text;
      EXPECT_EQ(st.done, i == 2) << i;
      EXPECT_EQ(st.token, i == 2 ? -1 : id) << i;
    }
    EXPECT_TRUE(s.done());
    EXPECT_EQ(s.finish_reason(), "length");
    EXPECT_EQ(s.tokens().size(), 3u);
    EXPECT_EQ(s.text(), "hellohellohello");
    EXPECT_EQ(streamed, s.text());
    const auto after = s.step(logits.data(), true);  // a finished session stays finished
    EXPECT_TRUE(after.done);
    EXPECT_EQ(after.token, -1);
    EXPECT_TRUE(after.text.empty());
    EXPECT_EQ(s.tokens().size(), 3u);
    s.cancel();  // cancelling a finished session changes nothing
    EXPECT_EQ(s.finish_reason(), "length");
  }
  {  // can_continue = false: the cache is full, this step is the last
    SamplingParams p;
    p.max_tokens = 100;
    DecodeSession s(tok, V, p);
    EXPECT_EQ(s.step(logits.data(), true).token, id);
    const auto st = s.step(logits.data(), false);
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.token, -1);
    EXPECT_EQ(st.text, "hello");
    EXPECT_EQ(s.finish_reason(), "length");
    EXPECT_EQ(s.tokens().size(), 2u);
  }
  {  // cancel: with "hello" held back (it may start the stop string "hellohellX"),
     // nothing more is released after cancel(), not even the held-back text.
    SamplingParams p;
    p.max_tokens = 100;
    p.stop = {"hellohellX"};
    DecodeSession s(tok, V, p);
    std::string streamed;
    streamed += s.step(logits.data(), true).text;
    streamed += s.step(logits.data(), true).text;
    EXPECT_EQ(streamed, "hello");  // the second "hello" is held back
    s.cancel();
    EXPECT_TRUE(s.done());
    EXPECT_EQ(s.finish_reason(), "cancelled");
    for (bool can_continue : {true, false}) {
      const auto st = s.step(logits.data(), can_continue);
      EXPECT_TRUE(st.done);
      EXPECT_EQ(st.token, -1);
      EXPECT_TRUE(st.text.empty()) << st.text;
    }
    EXPECT_EQ(s.tokens().size(), 2u);
    EXPECT_EQ(s.finish_reason(), "cancelled");
    EXPECT_EQ(s.text(), streamed);  // the final text is what was released
  }
}

TEST(ModelGenerate, RejectsPromptsLongerThanTheContext) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto cache = tf.make_cache(8);
  std::vector<int32_t> ids(9, 100);
  EXPECT_THROW(generate(tf, cache, ids, SamplingParams{}), std::length_error);
}

}  // namespace
}  // namespace bs
