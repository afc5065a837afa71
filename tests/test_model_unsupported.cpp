// Model features this runtime does not implement fail loudly, never silently: a tiny
// synthetic Llama GGUF that loads and generates (the baseline), and copies of it that
// each change exactly one thing (YaRN RoPE scaling, an unsupported quant type, a Unigram
// tokenizer with SentencePiece's character map, an unknown architecture, an unknown pre-tokenizer, a key or tensor of a
// feature we do not compute). Each must fail
// through LlamaModel and through the `blendserve` CLI with an error naming the
// feature; the CLI exits non-zero by itself (not by a signal). Supported neighbours of
// the rejected features (linear RoPE scaling, a Q4_0/Q8_0 tensor) load, so the
// rejections are about the feature and nothing else.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/transformer.h"
#include "model/gguf_writer.h"
#include "tests/tiny_model.h"
#include "tests/model_fixture.h"

namespace {

namespace fs = std::filesystem;
using bs::GgufWriter;

// ---- temp dirs: the synthetic files and the CLI's data dir --------------------------

const fs::path& work_dir() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("bs_unsupported_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d / "data");
    return d;
  }();
  return dir;
}
struct RemoveWorkDir : ::testing::Environment {
  void TearDown() override { fs::remove_all(work_dir()); }
};
const auto* remove_work_dir = ::testing::AddGlobalTestEnvironment(new RemoveWorkDir);

// ---- the tiny model (tests/tiny_model.h) -------------------------------------------------

using bs::testing::bpe_vocab;
using bs::testing::kDim;
using bs::testing::kFf;
using bs::testing::kHeadDim;
using bs::testing::kKvHeads;
GgufWriter baseline_writer(const std::string& arch = "llama") { return bs::testing::tiny_llama_writer(arch); }

std::string write(const GgufWriter& w, const std::string& name) {
  const std::string path = (work_dir() / (name + ".gguf")).string();
  w.write(path);
  return path;
}

// blk.0.ffn_down.weight ([dim, ff], rows of ff elements) stored as ggml type `type`
// with `block_elements`/`block_bytes` geometry (all-zero blocks: scale 0).
GgufWriter with_ffn_down_type(uint32_t type, int block_elements, int block_bytes) {
  GgufWriter w = baseline_writer();
  const size_t bytes = static_cast<size_t>(kDim) * (kFf / block_elements) * block_bytes;
  w.tensor("blk.0.ffn_down.weight", {kFf, kDim}, type, std::vector<uint8_t>(bytes, 0));
  return w;
}

// ---- running things -----------------------------------------------------------------------

std::unique_ptr<bs::LlamaModel> load(const std::string& path) {
  return std::make_unique<bs::LlamaModel>(path, bs::testing::shared_backend(), bs::testing::fast_precision());
}

// LlamaModel(path) must throw, with every needle in the message.
void expect_model_refuses(const std::string& path, const std::vector<std::string>& needles) {
  try {
    auto m = load(path);
    ADD_FAILURE() << path << " loaded; expected an error naming '" << needles.front() << "'";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

struct Proc {
  bool exited = false;  // false: killed by a signal (or never started)
  int code = -1;        // exit status when exited
  int signal = 0;
  std::string out, err;
};

// Runs the built binary with `args` (no shell), stdout and stderr captured apart, its
// data (SSD tier, traces) in the test's temp dir.
Proc run_cli(const std::vector<std::string>& args) {
  static int counter = 0;
  const std::string bin = std::string(BLENDSERVE_BINARY_DIR) + "/blendserve";
  const std::string out_path = (work_dir() / ("cli" + std::to_string(counter) + ".out")).string();
  const std::string err_path = (work_dir() / ("cli" + std::to_string(counter++) + ".err")).string();
  const std::string data_dir = (work_dir() / "data").string();
  std::vector<std::string> argv_s{bin};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::setenv("BLENDSERVE_DATA_DIR", data_dir.c_str(), 1);
  Proc r;
  const pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return r;
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.out = bs::testing::read_file(out_path);
  r.err = bs::testing::read_file(err_path);
  return r;
}

Proc generate_cli(const std::string& model) {
  return run_cli({"--model", model, "generate", "--prompt", "hi", "--max-tokens", "1"});
}

// The CLI exits by itself with a non-zero status and its stderr names every needle.
void expect_cli_refuses(const std::string& path, const std::vector<std::string>& needles) {
  const Proc r = generate_cli(path);
  ASSERT_TRUE(r.exited) << "killed by signal " << r.signal << "\nstderr: " << r.err;
  EXPECT_NE(r.code, 0) << "stdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_NE(r.code, 127) << "could not run " << BLENDSERVE_BINARY_DIR "/blendserve";
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "'" << n << "' not in stderr: " << r.err;
}

// How many test failures `f` reports (intercepted: they do not fail the test).
size_t failures_of(const std::function<void()>& f) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    f();
  }
  return static_cast<size_t>(results.size());
}

void expect_refused(const std::string& path, const std::vector<std::string>& needles) {
  {
    SCOPED_TRACE("LlamaModel");
    expect_model_refuses(path, needles);
  }
  {
    SCOPED_TRACE("blendserve generate");
    expect_cli_refuses(path, needles);
  }
}

// ---- the baseline: every rejection below is against a file that otherwise works -------

TEST(ModelUnsupported, BaselineLoadsAndGeneratesThroughTheModelAndTheCli) {
  const std::string path = write(baseline_writer(), "baseline");
  std::unique_ptr<bs::LlamaModel> m;
  ASSERT_NO_THROW(m = load(path));
  const auto& cfg = m->config();
  EXPECT_EQ(cfg.architecture, "llama");
  EXPECT_EQ(cfg.n_layers, bs::testing::kDefaultLayers);
  EXPECT_EQ(cfg.dim, kDim);
  EXPECT_EQ(cfg.n_kv_heads, kKvHeads);
  EXPECT_EQ(cfg.vocab, static_cast<int>(bpe_vocab().tokens.size()));
  EXPECT_EQ(cfg.rope_scaling.type, "none");
  EXPECT_EQ(m->tokenizer().vocab_size(), cfg.vocab);
  // The merges are real: "hi" and " hello world" are whole tokens.
  EXPECT_EQ(m->tokenizer().encode("hi", false), std::vector<int32_t>{m->tokenizer().token_id("hi")});
  EXPECT_EQ(m->tokenizer().encode(" hello world", false).size(), 2u);
  EXPECT_EQ(m->tokenizer().eos_id(), bpe_vocab().eos);

  bs::Transformer tf(*m);
  const auto ids = m->tokenizer().encode("hi", false);
  auto cache = tf.make_cache(16);
  bs::SamplingParams p;
  p.max_tokens = 1;
  const auto r = bs::generate(tf, cache, ids, p);
  ASSERT_EQ(r.tokens.size(), 1u) << r.finish_reason;
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_FALSE(m->tokenizer().is_control(r.tokens[0]));

  const Proc c = generate_cli(path);
  ASSERT_TRUE(c.exited) << "killed by signal " << c.signal << "\nstderr: " << c.err;
  EXPECT_EQ(c.code, 0) << "stdout: " << c.out << "\nstderr: " << c.err;
  EXPECT_FALSE(c.out.empty());

  // The refusal checks below fail on this file: one that loads can never pass them.
  EXPECT_EQ(failures_of([&] { expect_model_refuses(path, {"yarn"}); }), 1u);
  EXPECT_GE(failures_of([&] { expect_cli_refuses(path, {"yarn"}); }), 2u);  // exit 0, stderr silent
}

// ---- RoPE scaling -------------------------------------------------------------------------

TEST(ModelUnsupported, YarnRopeScalingIsRefused) {
  GgufWriter w = baseline_writer();
  w.str("llama.rope.scaling.type", "yarn");
  w.f32("llama.rope.scaling.factor", 4.0f);
  w.u32("llama.rope.scaling.original_context_length", 512);
  w.f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
  w.boolean("llama.rope.scaling.finetuned", true);
  const std::string path = write(w, "yarn");
  ASSERT_NO_THROW(bs::gguf::GgufFile::open(path));  // a valid file: refused by the model
  expect_refused(path, {"'yarn'", "YaRN", "llama.rope.scaling.type"});
}

// A scaling type this code does not implement (llama.cpp's longrope, a typo) must
// not load as plain RoPE.
TEST(ModelUnsupported, UnknownRopeScalingIsRefused) {
  for (const char* type : {"longrope", "dynamic", "Linear"}) {
    GgufWriter w = baseline_writer();
    w.str("llama.rope.scaling.type", type);
    w.f32("llama.rope.scaling.factor", 2.0f);
    const std::string path = write(w, std::string("scaling_") + type);
    expect_refused(path, {std::string("'") + type + "'", "llama.rope.scaling.type"});
  }
}

// Linear scaling is implemented: it loads, every frequency divided by the factor.
TEST(ModelUnsupported, LinearRopeScalingLoads) {
  GgufWriter w = baseline_writer();
  w.str("llama.rope.scaling.type", "linear");
  w.f32("llama.rope.scaling.factor", 4.0f);
  std::unique_ptr<bs::LlamaModel> scaled, plain;
  ASSERT_NO_THROW(scaled = load(write(w, "linear")));
  ASSERT_NO_THROW(plain = load(write(baseline_writer(), "baseline_for_linear")));
  EXPECT_EQ(scaled->config().rope_scaling.type, "linear");
  const auto& a = scaled->rope().table.inv_freq;
  const auto& b = plain->rope().table.inv_freq;
  ASSERT_EQ(a.size(), static_cast<size_t>(kHeadDim / 2));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i] / 4.0f, 1e-6f * b[i]) << i;
  EXPECT_NE(scaled->fingerprint(), plain->fingerprint());
}

// ---- tensor types -------------------------------------------------------------------------

// The block types we do not read (Q2_K, Q3_K, Q8_K and the IQ types; right block
// geometry for each) are refused by the GGUF reader already, naming the tensor, the
// type and what is supported.
TEST(ModelUnsupported, UnsupportedQuantTypesAreRefusedByName) {
  struct Case {
    const char* name;
    uint32_t type;
    int block_bytes;
  };
  for (const Case& c : {Case{"Q2_K", 10, 84}, Case{"Q3_K", 11, 110}, Case{"IQ4_XS", 23, 136}}) {
    SCOPED_TRACE(c.name);
    const std::string path = write(with_ffn_down_type(c.type, 256, c.block_bytes), c.name);
    const std::vector<std::string> needles = {"'blk.0.ffn_down.weight'",
                                              "unsupported tensor type " + std::to_string(c.type) + " (" + c.name + ")",
                                              "supported types: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, "
                                              "Q6_K, BF16"};
    try {
      bs::gguf::GgufFile::open(path);
      ADD_FAILURE() << "the GGUF reader accepted a " << c.name << " tensor";
    } catch (const bs::gguf::GgufError& e) {
      const std::string msg = e.what();
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
    }
    expect_refused(path, needles);
  }
}

// The same tensor in every block type we read loads (the types of Q4_K_M, Q5_K_M and
// Q6_K files among them): the refusals above are the types'.
TEST(ModelUnsupported, SupportedQuantTypesInTheSamePlaceLoad) {
  EXPECT_NO_THROW(load(write(with_ffn_down_type(2, 32, 18), "q4_0")));    // Q4_0
  EXPECT_NO_THROW(load(write(with_ffn_down_type(6, 32, 22), "q5_0")));    // Q5_0
  EXPECT_NO_THROW(load(write(with_ffn_down_type(7, 32, 24), "q5_1")));    // Q5_1
  EXPECT_NO_THROW(load(write(with_ffn_down_type(8, 32, 34), "q8_0")));    // Q8_0
  EXPECT_NO_THROW(load(write(with_ffn_down_type(12, 256, 144), "q4_k")));  // Q4_K
  EXPECT_NO_THROW(load(write(with_ffn_down_type(13, 256, 176), "q5_k")));  // Q5_K
  EXPECT_NO_THROW(load(write(with_ffn_down_type(14, 256, 210), "q6_k")));  // Q6_K
}

// ---- features of other architectures (model/architecture.h) --------------------------------

// Each key that changes the math and that we do not compute is refused, naming it.
TEST(ModelUnsupported, KeysOfUncomputedFeaturesAreRefusedByName) {
  struct Case {
    const char* name;
    std::function<void(GgufWriter&)> set;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"softcap_attn", [](GgufWriter& w) { w.f32("llama.attn_logit_softcapping", 50.0f); },
       {"llama.attn_logit_softcapping", "soft-capping"}},
      {"softcap_final", [](GgufWriter& w) { w.f32("llama.final_logit_softcapping", 30.0f); },
       {"llama.final_logit_softcapping", "soft-capping"}},
      {"partial_rotary", [](GgufWriter& w) { w.u32("llama.rope.dimension_count", kHeadDim / 2); },
       {"llama.rope.dimension_count", "partial rotary"}},
      {"sliding_window", [](GgufWriter& w) { w.u32("llama.attention.sliding_window", 8); },
       {"llama.attention.sliding_window", "sliding-window"}},
      {"experts", [](GgufWriter& w) { w.u32("llama.expert_count", 8); }, {"llama.expert_count", "mixture-of-experts"}},
      {"value_length", [](GgufWriter& w) { w.u32("llama.attention.value_length", kHeadDim * 2); },
       {"llama.attention.value_length"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GgufWriter w = baseline_writer();
    c.set(w);
    expect_refused(write(w, c.name), c.needles);
  }
  // Their harmless values load: soft-capping 0, full rotary, a window no shorter than
  // the context, no experts.
  GgufWriter w = baseline_writer();
  w.f32("llama.attn_logit_softcapping", 0.0f).u32("llama.rope.dimension_count", kHeadDim);
  w.u32("llama.attention.sliding_window", 1u << 20).u32("llama.expert_count", 0);
  EXPECT_NO_THROW(load(write(w, "harmless_keys")));
}

// A tensor the loader does not read would change the math unseen: refused by name,
// inside a block (a norm of another architecture, expert weights) or outside one.
TEST(ModelUnsupported, TensorsTheLoaderDoesNotReadAreRefusedByName) {
  const std::vector<float> norm(static_cast<size_t>(kHeadDim), 1.0f);
  struct Case {
    const char* name;
    std::string tensor;
    std::vector<uint64_t> dims;
    std::vector<std::string> needles;
  };
  for (const Case& c : {Case{"q_norm_in_llama", "blk.0.attn_q_norm.weight", {kHeadDim}, {"'blk.0.attn_q_norm.weight'"}},
                        Case{"post_norm", "blk.1.post_attention_norm.weight", {kDim}, {"'blk.1.post_attention_norm.weight'"}},
                        Case{"experts", "blk.0.ffn_gate_exps.weight", {kDim}, {"'blk.0.ffn_gate_exps.weight'", "mixture-of-experts"}},
                        Case{"router", "blk.0.ffn_gate_inp.weight", {kDim}, {"'blk.0.ffn_gate_inp.weight'", "mixture-of-experts"}},
                        Case{"no_block", "blk.99.attn_norm.weight", {kDim}, {"'blk.99.attn_norm.weight'"}},
                        Case{"top_level", "cls.weight", {kDim}, {"'cls.weight'"}}}) {
    SCOPED_TRACE(c.name);
    GgufWriter w = baseline_writer();
    w.tensor(c.tensor, c.dims, 0, GgufWriter::f32_bytes(std::vector<float>(static_cast<size_t>(c.dims[0]), 1.0f)));
    expect_refused(write(w, c.name), c.needles);
  }
}

// Qwen3 normalizes q and k per head: a qwen3 file loads with its norms and is refused,
// naming the tensor, without them; the norms change the logits (they are computed).
TEST(ModelUnsupported, Qwen3NeedsItsPerHeadNorms) {
  GgufWriter without = baseline_writer("qwen3");
  expect_refused(write(without, "qwen3_no_norms"), {"blk.0.attn_q_norm.weight", "qwen3"});
  auto with_norms = [&](float q_scale) {
    GgufWriter w = baseline_writer("qwen3");
    for (int l = 0; l < bs::testing::kDefaultLayers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      std::vector<float> q(static_cast<size_t>(kHeadDim)), k(static_cast<size_t>(kHeadDim));
      for (int i = 0; i < kHeadDim; ++i) q[i] = q_scale * (0.5f + 0.03f * i), k[i] = 1.5f - 0.02f * i;
      w.tensor(p + "attn_q_norm.weight", {kHeadDim}, 0, GgufWriter::f32_bytes(q));
      w.tensor(p + "attn_k_norm.weight", {kHeadDim}, 0, GgufWriter::f32_bytes(k));
    }
    return w;
  };
  std::unique_ptr<bs::LlamaModel> a, b;
  ASSERT_NO_THROW(a = load(write(with_norms(1.0f), "qwen3_a")));
  ASSERT_NO_THROW(b = load(write(with_norms(3.0f), "qwen3_b")));
  EXPECT_TRUE(a->config().qk_norm);
  EXPECT_EQ(a->config().rope_style, bs::kernels::RopeStyle::HalfSplit);
  bs::Transformer ta(*a), tb(*b);
  auto ca = ta.make_cache(8), cb = tb.make_cache(8);
  const std::vector<int32_t> ids = {1, 2, 3};
  EXPECT_NE(ta.forward(ids, ca), tb.forward(ids, cb)) << "the q norm's weights changed nothing";
}

// The file's own pre-scaling context for llama3 scaling, not a built-in 8192.
TEST(ModelUnsupported, Llama3ScalingReadsTheFilesOriginalContext) {
  auto scaled = [&](uint32_t original) {
    GgufWriter w = baseline_writer();
    w.str("llama.rope.scaling.type", "llama3");
    w.f32("llama.rope.scaling.factor", 8.0f);
    if (original) w.u32("llama.rope.scaling.original_context_length", original);
    return load(write(w, "llama3_" + std::to_string(original)));
  };
  const auto def = scaled(0), short_ctx = scaled(64);
  EXPECT_EQ(def->config().rope_scaling.original_context, 8192);
  EXPECT_EQ(short_ctx->config().rope_scaling.original_context, 64);
  EXPECT_NE(def->rope().table.inv_freq, short_ctx->rope().table.inv_freq);
  EXPECT_NE(def->fingerprint(), short_ctx->fingerprint());
}

// ---- tokenizers -------------------------------------------------------------------------

// A llama.cpp SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, "▁" pieces
// with scores, no merges. It loads (SentencePiece BPE: tests/test_tokenizer_vocabs.cpp
// checks real ones token for token); without its scores it is refused by name. As a
// Unigram vocabulary ("t5", llama.cpp's UGM) it loads too, and with SentencePiece's
// character map (precompiled_charsmap, which we do not implement) it is refused.
TEST(ModelUnsupported, SentencePieceAndUnigramTokenizersLoadAndACharacterMapOrMissingScoresAreRefused) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    types.push_back(6);
  }
  const std::string space = "\xE2\x96\x81";  // ▁
  // Pieces up to the baseline's vocabulary size, so token_embd still fits.
  const size_t n_vocab = bpe_vocab().tokens.size();
  for (const char* piece : {"", "h", "i", "e", "l", "o", "t", "w", "r", "d", "n", "a", "s", "hi", "he", "ll", "llo",
                            "hello", "the", "wor", "world", "an", "and", "is", "on", "in", "it", "at", "or"}) {
    for (const std::string& t : {space + piece, std::string(piece)}) {
      if (t.empty() || tokens.size() == n_vocab) continue;
      tokens.push_back(t);
      types.push_back(1);
    }
  }
  ASSERT_EQ(tokens.size(), n_vocab);
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t i = 259; i < scores.size(); ++i) scores[i] = -static_cast<float>(i - 258);

  GgufWriter w = baseline_writer();
  w.str("tokenizer.ggml.model", "llama");
  w.erase("tokenizer.ggml.pre");
  w.erase("tokenizer.ggml.merges");
  w.str_array("tokenizer.ggml.tokens", tokens);
  w.f32_array("tokenizer.ggml.scores", scores);
  w.i32_array("tokenizer.ggml.token_type", types);
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.u32("tokenizer.ggml.unknown_token_id", 0);
  w.boolean("tokenizer.ggml.add_bos_token", true);
  const std::string path = write(w, "sentencepiece");
  std::unique_ptr<bs::LlamaModel> m;
  ASSERT_NO_THROW(m = load(path));
  const auto& tok = m->tokenizer();
  // Merged pair by pair while the pair is a piece: "▁hello" is reached (▁h, he, ll, llo,
  // hello...); "▁world" is not ("wo" and "or" are no pieces here), so "▁w" and the rest.
  EXPECT_EQ(tok.encode("hello", false), std::vector<int32_t>{tok.token_id(space + "hello")});
  EXPECT_EQ(tok.encode("hello world", false),
            (std::vector<int32_t>{tok.token_id(space + "hello"), tok.token_id(space + "w"), tok.token_id("o"),
                                  tok.token_id("r"), tok.token_id("l"), tok.token_id("d")}));
  EXPECT_EQ(tok.decode(tok.encode("hello world", false)), " hello world");
  GgufWriter no_scores = w;
  no_scores.erase("tokenizer.ggml.scores");
  expect_refused(write(no_scores, "sentencepiece_no_scores"), {"tokenizer.ggml.scores"});
  GgufWriter unigram = w;
  unigram.str("tokenizer.ggml.model", "t5");
  unigram.boolean("tokenizer.ggml.add_space_prefix", true);  // llama.cpp's UGM default is false
  std::unique_ptr<bs::LlamaModel> u;
  ASSERT_NO_THROW(u = load(write(unigram, "unigram")));
  // The best segmentation by score: "▁hello" and "▁world" are pieces.
  const auto& ut = u->tokenizer();
  EXPECT_EQ(ut.encode("hello world", false),
            (std::vector<int32_t>{ut.token_id(space + "hello"), ut.token_id(space + "world")}));
  GgufWriter charsmap = unigram;
  charsmap.i32_array("tokenizer.ggml.precompiled_charsmap", {1, 2, 3, 4});
  expect_refused(write(charsmap, "unigram_charsmap"), {"Precompiled", "tokenizer.ggml.precompiled_charsmap"});
}

// A byte-level BPE vocabulary with a pre-tokenizer this code has no splitter for
// (Mistral's Tekken: neither a state machine nor a regex sequence here).
TEST(ModelUnsupported, UnknownPreTokenizerIsRefused) {
  GgufWriter w = baseline_writer();
  w.str("tokenizer.ggml.pre", "tekken");
  expect_refused(write(w, "pre"), {"pre-tokenizer", "'tekken'", "tokenizer.ggml.pre"});
}

// ---- architectures -------------------------------------------------------------------------

// The same tensors and hyper-parameters under another architecture name (keys under
// that name too, as a converter writes them).
TEST(ModelUnsupported, UnknownArchitecturesAreRefused) {
  for (const char* arch : {"gpt2", "phi3", "gemma2"}) {
    SCOPED_TRACE(arch);
    const std::string path = write(baseline_writer(arch), std::string("arch_") + arch);
    ASSERT_NO_THROW(bs::gguf::GgufFile::open(path));
    expect_refused(path, {"architecture '" + std::string(arch) + "'", "general.architecture"});
  }
}

// A Gemma 3 file: the tiny model with the per-head q/k norms and the post norms it
// needs and a window of 4 loads, its layers local but for every 6th (llama.cpp's
// default; none here has 6); a missing post norm, a pattern of the wrong length and
// soft-capping are each refused by name. (Its arithmetic: test_model_arch against
// transformers.)
TEST(ModelUnsupported, Gemma3NeedsItsNormsAndAValidLayerPattern) {
  auto gemma = [] {
    GgufWriter w = baseline_writer("gemma3");
    const auto ones = [&](const std::string& name, int n) {
      w.tensor(name, {static_cast<uint64_t>(n)}, 0, GgufWriter::f32_bytes(std::vector<float>(n, 1.0f)));
    };
    for (int l = 0; l < bs::testing::kDefaultLayers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      ones(p + "attn_q_norm.weight", kHeadDim);
      ones(p + "attn_k_norm.weight", kHeadDim);
      ones(p + "post_attention_norm.weight", kDim);
      ones(p + "post_ffw_norm.weight", kDim);
    }
    w.u32("gemma3.attention.sliding_window", 4);
    return w;
  };
  std::unique_ptr<bs::LlamaModel> m;
  ASSERT_NO_THROW(m = load(write(gemma(), "gemma3")));
  EXPECT_EQ(m->config().local_layers, std::vector<bool>(bs::testing::kDefaultLayers, true));
  EXPECT_EQ(m->window(1), 4);
  {
    GgufWriter w = gemma();
    w.bool_array("gemma3.attention.sliding_window_pattern", {true, false});
    ASSERT_NO_THROW(m = load(write(w, "gemma3_pattern")));
    EXPECT_EQ(m->window(0), 4);
    EXPECT_EQ(m->window(1), 0);
  }
  {
    GgufWriter w = gemma();
    w.bool_array("gemma3.attention.sliding_window_pattern", {true, false, true});
    expect_model_refuses(write(w, "gemma3_bad_pattern"), {"sliding_window_pattern", "3 entries for 2 layers"});
  }
  {
    GgufWriter w = gemma();
    w.drop_tensor("blk.1.post_ffw_norm.weight");
    expect_model_refuses(write(w, "gemma3_no_post_norm"), {"blk.1.post_ffw_norm.weight"});
  }
  {
    GgufWriter w = gemma();
    w.f32("gemma3.final_logit_softcapping", 30.0f);
    expect_model_refuses(write(w, "gemma3_softcap"), {"final_logit_softcapping", "soft-capping"});
  }
}

// Mistral files are Llama files under another name: the writer's arch prefix is right.
TEST(ModelUnsupported, AKnownArchitectureUnderItsOwnPrefixLoads) {
  std::unique_ptr<bs::LlamaModel> m;
  ASSERT_NO_THROW(m = load(write(baseline_writer("mistral"), "arch_mistral")));
  EXPECT_EQ(m->config().architecture, "mistral");
  EXPECT_EQ(m->config().n_layers, bs::testing::kDefaultLayers);
}

}  // namespace
