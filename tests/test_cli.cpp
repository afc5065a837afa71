// The binaries as people run them: real processes, real model, real output.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <csignal>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "kernels/cpu/isa.h"
#include "model/gguf.h"
#include "tests/model_fixture.h"
#include "tests/process_fixture.h"

namespace {

namespace fs = std::filesystem;

// Every process these tests start keeps its SSD tier and traces in a fresh
// directory, never in the user's cache.
const fs::path& data_dir() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("bs_cli_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    ::setenv("BLENDSERVE_DATA_DIR", d.c_str(), 1);
    return d;
  }();
  return dir;
}
// Set before any test starts a process (static initialisation of this file),
// and removed at exit rather than in a gtest Environment's TearDown: ctest's
// test discovery runs this binary with --gtest_list_tests, which never reaches
// TearDown and left one directory behind per build. Registered after data_dir()
// has returned, so it runs before the path's own destructor.
void remove_data_dir() {
  std::error_code ignored;
  fs::remove_all(data_dir(), ignored);
}
const bool data_dir_set = [] {
  const bool made = !data_dir().empty();
  std::atexit(remove_data_dir);
  return made;
}();

using Run = bs::testing::CommandResult;

// A binary of the build with its arguments; stdout and stderr together.
Run run(const std::string& args) {
  return bs::testing::run_command(std::string(BLENDSERVE_BINARY_DIR) + "/" + args + " 2>&1");
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

// The first `cases` cases of the shipped set with only their first `documents`
// documents each, each cut to its first kWordsPerDocument words, written under
// data_dir(): the eval tests check what eval prints, not the answers' quality, and a
// case's full six documents (~2,300 tokens) made each full prefill ~6 s on 2 AVX2 cores
// (two whole documents: ~820 tokens, 1.6 s on 2 AVX-512 cores, and these tests took
// 150 s of the model tests' time).
constexpr size_t kWordsPerDocument = 90;

std::string first_words(const std::string& text, size_t n) {
  size_t at = 0;
  for (size_t w = 0; w < n && at != std::string::npos; ++w) {
    at = text.find_first_not_of(' ', at);
    if (at != std::string::npos) at = text.find(' ', at);
  }
  return at == std::string::npos ? text : text.substr(0, at);
}

std::string shortened_cases(const std::string& name, size_t cases, size_t documents) {
  const std::string source = std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl";
  std::ifstream in(source);
  if (!in) throw std::runtime_error("cannot read " + source);
  const auto path = data_dir() / name;
  std::ofstream out(path);
  std::string line;
  for (size_t i = 0; i < cases && std::getline(in, line); ++i) {
    auto c = nlohmann::json::parse(line);
    auto& docs = c.at("documents");
    docs.erase(docs.begin() + static_cast<std::ptrdiff_t>(std::min(documents, docs.size())), docs.end());
    for (auto& d : docs) d = first_words(d.get<std::string>(), kWordsPerDocument);
    out << c.dump() << "\n";
  }
  return path.string();
}

TEST(Cli, GenerateAnswersAChatQuestion) {
  REQUIRE_MODEL();
  auto r = run("blendserve generate --chat --prompt 'What is the capital of France?' --max-tokens 32");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
}

// --chat-template FILE renders chats instead of the model's own template: SmolLM2's own
// adds its default system prompt, a plain ChatML file does not, so the same question is a
// shorter prompt; a file that is missing or does not parse stops the command before it
// answers, naming the key and the file.
TEST(Cli, ChatTemplateFromTheCommandLine) {
  REQUIRE_MODEL();
  const auto prompt_tokens = [](const std::string& out) {
    const size_t at = out.find("; prompt ");
    return at == std::string::npos ? -1 : std::stoi(out.substr(at + 9));
  };
  const std::string ask = " generate --chat --prompt 'What is the capital of France?' --max-tokens 4 --stats";
  auto own = run("blendserve" + ask);
  ASSERT_EQ(own.code, 0) << own.out;
  const fs::path plain = data_dir() / "plain_chatml.jinja";
  std::ofstream(plain) << "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                          "{% endif %}";
  auto given = run("blendserve --chat-template " + plain.string() + ask);
  ASSERT_EQ(given.code, 0) << given.out;
  ASSERT_GT(prompt_tokens(own.out), 0) << own.out;
  // SmolLM2's default system turn: "<|im_start|>system\nYou are a helpful AI assistant
  // named SmolLM, trained by Hugging Face<|im_end|>\n".
  EXPECT_GE(prompt_tokens(own.out) - prompt_tokens(given.out), 15) << own.out << given.out;

  auto r = run("blendserve --chat-template /nonexistent/chat.jinja" + ask);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.chat_template"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/chat.jinja"), std::string::npos) << r.out;
  const fs::path broken = data_dir() / "broken.jinja";
  std::ofstream(broken) << "{% for m in messages %}{{ m['content'] }}";
  r = run("blendserve --chat-template " + broken.string() + ask);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(broken.string()), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("first token"), std::string::npos) << r.out;  // nothing answered
}

// The chosen kernels and precision are printed; bf16 where the CPU has no native bf16
// is a clear error, and BLENDSERVE_CPU_ISA with an unknown name is one too.
TEST(Cli, StatsNameTheKernelsAndPrecisionFollowsTheHardware) {
  REQUIRE_MODEL();
  auto& backend = bs::testing::shared_backend();
  auto r = run("blendserve generate --prompt hi --max-tokens 2 --stats");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kernels " + backend.kernel_id() + ", precision " +
                       bs::kernels::precision_name(backend.default_precision())),
            std::string::npos)
      << r.out;
  r = run("blendserve generate --prompt hi --max-tokens 2 --precision bf16");
  if (backend.supports(bs::kernels::Precision::BF16)) {
    EXPECT_EQ(r.code, 0) << r.out;
  } else {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("bf16 needs AVX512-BF16"), std::string::npos) << r.out;
  }
  const std::string bin = std::string(BLENDSERVE_BINARY_DIR) + "/blendserve";
  FILE* p = popen(("BLENDSERVE_CPU_ISA=avx1024 " + bin + " generate --prompt hi --max-tokens 2 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out(4096, '\0');
  out.resize(fread(out.data(), 1, out.size(), p));
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_NE(out.find("avx1024"), std::string::npos) << out;
  // The int8 decode path (kernels::DecodeActivations) is named in the kernel id where
  // it runs (every variant but the scalar one), and an unknown value is a clear error.
  p = popen(("BLENDSERVE_DECODE_ACTIVATIONS=int8 " + bin + " generate --prompt hi --max-tokens 2 --stats 2>&1").c_str(),
            "r");
  ASSERT_NE(p, nullptr);
  out.assign(4096, '\0');
  out.resize(fread(out.data(), 1, out.size(), p));
  EXPECT_EQ(pclose(p), 0) << out;
  const bool int8_runs = bs::kernels::cpu::selected_cpu_isa() != bs::kernels::cpu::CpuIsa::Scalar;
  EXPECT_NE(out.find("kernels " + backend.kernel_id() + (int8_runs ? "+int8" : "") + ","), std::string::npos) << out;
  p = popen(("BLENDSERVE_DECODE_ACTIVATIONS=int4 " + bin + " generate --prompt hi --max-tokens 2 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  out.assign(4096, '\0');
  out.resize(fread(out.data(), 1, out.size(), p));
  const int bad = pclose(p);
  EXPECT_TRUE(WIFEXITED(bad) && WEXITSTATUS(bad) == 1) << out;
  EXPECT_NE(out.find("BLENDSERVE_DECODE_ACTIVATIONS='int4' is not exact or int8"), std::string::npos) << out;
}

TEST(Cli, BadArgumentsAndBadModelsGiveClearErrors) {
  auto r = run("blendserve generate --prompt hi --precision fp8");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("precision"), std::string::npos) << r.out;
  r = run("blendserve generate");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--prompt"), std::string::npos) << r.out;
  r = run("blendserve --model /nonexistent/model.gguf generate --prompt hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
  // NCCL joins GPU ranks: on cpu, the runtime behind a command says so (the benchmark's
  // --communicator too), before a model is read.
  for (const std::string cmd : {"blendserve --communicator nccl generate --prompt hi",
                                "blendctl bench ttft --tier ram --communicator nccl --requests 1 --chunks 2"}) {
    r = run(cmd);
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("device.communicator: nccl joins GPU ranks, and device.kind is cpu"), std::string::npos)
        << cmd << ": " << r.out;
  }
  // a truncated model file: a clear error, no crash
  REQUIRE_MODEL();
  const auto tmp = std::filesystem::temp_directory_path() / "blendserve_truncated.gguf";
  {
    std::ifstream in(bs::testing::model_path(), std::ios::binary);
    std::string head(1 << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(tmp, std::ios::binary).write(head.data(), static_cast<std::streamsize>(head.size()));
  }
  r = run("blendserve --model " + tmp.string() + " generate --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: gguf"), std::string::npos) << r.out;
  std::filesystem::remove(tmp);
}

TEST(Cli, EvalPrintsCasesAndASummaryPerMode) {
  REQUIRE_MODEL();
  auto r = run("blendctl eval --dataset " + shortened_cases("modes.jsonl", 1, 3) +
               " --mode full,reuse,blend --max-tokens 8 --kv-dtype f32");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;  // 3 cases lines + 3 summaries
  for (int i = 3; i < 6; ++i) {
    EXPECT_TRUE(lines[i].at("summary").get<bool>());
    for (const char* key : {"f1", "first_token_kl", "top1_agreement", "ttft_s"}) EXPECT_TRUE(lines[i].contains(key));
  }
  EXPECT_EQ(lines[3].at("first_token_kl").get<double>(), 0.0);  // full vs itself (fp32 K/V, as the reference)
  EXPECT_GT(lines[4].at("first_token_kl").get<double>(), 0.0);  // reuse differs
  r = run("blendctl eval --dataset /nonexistent.jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent.jsonl"), std::string::npos) << r.out;
}

// Full's own greedy answer as a second reference (tools/eval/eval_rag.cpp): full (fp32 K/V,
// its own reference) gives that answer and agrees along it; another mode's
// same_answer_as_full is whether its output is full's. --reference-dir keeps the
// teacher-forced reference and the answer per case: a second run reads both and prints
// the same lines; a damaged answer file is recomputed and rewritten.
TEST(Cli, EvalAgreesAlongFullsOwnAnswerAndKeepsItsReferences) {
  REQUIRE_MODEL();
  const auto refs = data_dir() / "refs";
  const std::string cmd = "blendctl eval --dataset " + shortened_cases("refs.jsonl", 1, 3) +
                          " --mode full,reuse --max-tokens 8 --kv-dtype f32 --reference-dir " + refs.string();
  auto r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto first = json_lines(r.out);
  ASSERT_EQ(first.size(), 4u) << r.out;  // 2 case lines + 2 summaries
  const auto& full = first[0];
  const auto& reuse = first[1];
  const int64_t G = full.at("full_answer_tokens").get<int64_t>();
  EXPECT_GT(G, 0);
  EXPECT_LE(G, 8);
  EXPECT_TRUE(full.at("same_answer_as_full").get<bool>()) << full.dump();
  // Teacher-forced rows against the decode's steps: the same model and cache.
  EXPECT_GE(full.at("full_answer_agreement").get<double>(), 1.0 - 1.0 / static_cast<double>(G)) << full.dump();
  EXPECT_EQ(reuse.at("full_answer_tokens").get<int64_t>(), G);
  EXPECT_EQ(reuse.at("same_answer_as_full").get<bool>(), reuse.at("output") == full.at("output")) << reuse.dump();
  const double a = reuse.at("full_answer_agreement").get<double>();
  EXPECT_TRUE(a >= 0 && a <= 1) << reuse.dump();
  EXPECT_DOUBLE_EQ(a * static_cast<double>(G), std::round(a * static_cast<double>(G)));  // whole rows
  for (size_t i : {2u, 3u}) {
    EXPECT_EQ(first[i].at("full_answer_cases"), 1) << first[i].dump();
    EXPECT_EQ(first[i].at("reference_cases_read"), 0);
  }
  EXPECT_EQ(first[2].at("same_answer_as_full").get<double>(), 1.0);
  fs::path answer_file;
  int ref_files = 0, answer_files = 0;
  for (const auto& e : fs::directory_iterator(refs)) {
    ref_files += e.path().extension() == ".ref";
    if (e.path().extension() == ".answer") {
      ++answer_files;
      answer_file = e.path();
    }
  }
  EXPECT_EQ(ref_files, 1);
  ASSERT_EQ(answer_files, 1);
  EXPECT_EQ(fs::file_size(answer_file), static_cast<uintmax_t>(4 * G));

  const auto same_lines = [&](const std::vector<nlohmann::json>& again) {
    ASSERT_EQ(again.size(), first.size());
    for (size_t i = 0; i < 2; ++i) {
      auto x = first[i], y = again[i];
      for (auto* j : {&x, &y})
        for (const char* k : {"ttft_s", "setup_s_excluded"}) j->erase(k);
      EXPECT_EQ(x, y) << i;
    }
  };
  r = run(cmd);  // both references read back
  ASSERT_EQ(r.code, 0) << r.out;
  auto again = json_lines(r.out);
  same_lines(again);
  EXPECT_EQ(again[2].at("reference_cases_read"), 1) << again[2].dump();
  // Damaged: not whole tokens; whole but not token ids (-1). Each is recomputed, never
  // fed to the model.
  for (const std::string& damaged : {std::string("abc"), std::string(static_cast<size_t>(4 * G), '\xff')}) {
    std::ofstream(answer_file, std::ios::binary | std::ios::trunc) << damaged;
    r = run(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    same_lines(json_lines(r.out));
    EXPECT_EQ(fs::file_size(answer_file), static_cast<uintmax_t>(4 * G));
    std::ifstream in(answer_file, std::ios::binary);
    const std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(now, damaged);
  }
}

// --forced-rows (tools/eval/eval_rag.cpp): one line per gold-answer row and run. Full with
// fp32 K/V is the reference itself (its token is full's on every row, deficit 0); every
// mode has the same rows, gold and full tokens and leads; the rows where a mode's token
// is full's give its top1_agreement; the gold texts spell the answer. With --resume the
// file is appended to and a run read back writes nothing; without, it starts empty; the
// leads are computed even where --reference-dir holds the case's reference.
TEST(Cli, EvalForcedRowsSayWhichRowsAgreeAndByHowMuch) {
  REQUIRE_MODEL();
  const std::string data = shortened_cases("rows.jsonl", 1, 3);
  const auto rows_path = data_dir() / "rows_out.jsonl";
  const auto log_path = data_dir() / "rows_log.jsonl";
  const auto read_rows = [&] {
    std::ifstream in(rows_path);
    std::stringstream text;
    text << in.rdbuf();
    return json_lines(text.str());
  };
  const std::string cmd = "blendctl eval --dataset " + data + " --mode full,reuse,blend --max-tokens 2 --kv-dtype f32" +
                          " --forced-rows " + rows_path.string();
  auto r = run(cmd + " --resume " + log_path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;  // 3 case lines + 3 summaries
  auto rows = read_rows();
  ASSERT_EQ(rows.size() % 3, 0u);
  const size_t A = rows.size() / 3;
  ASSERT_GT(A, 0u);
  std::ifstream case_in(data);
  std::string case_text;
  std::getline(case_in, case_text);
  const std::string answer = nlohmann::json::parse(case_text).at("answers").at(0);
  for (size_t m = 0; m < 3; ++m) {
    const auto& case_line = lines[m];
    int agree = 0;
    std::string gold;
    for (size_t i = 0; i < A; ++i) {
      const auto& row = rows[m * A + i];
      EXPECT_EQ(row.at("mode"), case_line.at("mode")) << row.dump();
      EXPECT_EQ(row.at("id"), case_line.at("id"));
      EXPECT_EQ(row.at("row"), i);
      EXPECT_EQ(row.at("answer_tokens"), A);
      EXPECT_EQ(row.contains("ratio"), case_line.at("mode") == "blend") << row.dump();
      for (const char* k : {"gold_token", "gold_text", "full_token", "full_text", "full_lead"})
        EXPECT_EQ(row.at(k), rows[i].at(k)) << k << " " << row.dump();  // as in full's rows
      EXPECT_GE(row.at("full_lead").get<double>(), 0.0) << row.dump();
      const double deficit = row.at("deficit").get<double>();
      EXPECT_GE(deficit, 0.0) << row.dump();
      if (row.at("token") == row.at("full_token")) {
        ++agree;
        EXPECT_EQ(deficit, 0.0) << row.dump();
        EXPECT_EQ(row.at("text"), row.at("full_text"));
      }
      gold += row.at("gold_text").get<std::string>();
    }
    EXPECT_EQ(gold, answer);
    EXPECT_DOUBLE_EQ(case_line.at("top1_agreement").get<double>(), static_cast<double>(agree) / static_cast<double>(A))
        << case_line.dump();
    if (m == 0) {
      EXPECT_EQ(agree, static_cast<int>(A));  // full is the reference
    }
  }
  // Resumed with nothing left to run: the file keeps its rows, none added.
  r = run(cmd + " --resume " + log_path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 of these 3 runs read back, 0 to go"), std::string::npos) << r.out;
  EXPECT_EQ(read_rows(), rows);
  // Without --resume the file starts empty; a kept reference does not hold the leads.
  const std::string reuse_only = "blendctl eval --dataset " + data + " --mode reuse --max-tokens 4 --kv-dtype f32" +
                                 " --forced-rows " + rows_path.string() + " --reference-dir " +
                                 (data_dir() / "rows_refs").string();
  for (int pass = 0; pass < 2; ++pass) {
    r = run(reuse_only);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto again = read_rows();
    ASSERT_EQ(again.size(), A) << pass;
    for (size_t i = 0; i < A; ++i) EXPECT_EQ(again[i], rows[A + i]) << pass << " " << i;  // reuse's rows as before
    const auto summary = json_lines(r.out).back();
    EXPECT_EQ(summary.at("reference_cases_read"), 0) << summary.dump();
  }
  r = run("blendctl eval --dataset " + data + " --forced-rows /nonexistent/dir/rows.jsonl");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--forced-rows: cannot write /nonexistent/dir/rows.jsonl"), std::string::npos) << r.out;
}

// --pasted: each case's documents pasted into the message (no documents field) are
// all found by the pasted-chunk index; with no lead-in the prompt is the documents
// request's token for token, with one the lead-in is a part of its own. --match-only
// runs no model pass. With the model's runs, the case lines carry what was found and
// the blend cached every passage.
TEST(Cli, EvalPastedFindsEveryStoredPassageInThePlainMessage) {
  REQUIRE_MODEL();
  const std::string data = shortened_cases("pasted.jsonl", 4, 3);
  for (const std::string& lead : {std::string(""), std::string("Context: ")}) {
    SCOPED_TRACE("lead '" + lead + "'");
    auto r = run("blendctl eval --dataset " + data + " --pasted --match-only --paste-lead '" + lead + "'");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 5u) << r.out;  // 4 cases + the summary
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(lines[i].at("pasted_found").get<double>(), 1.0) << lines[i].dump();
      EXPECT_EQ(lines[i].at("pasted_chunks_found"), 3);
      EXPECT_EQ(lines[i].at("pasted_as_documents").get<bool>(), lead.empty());
    }
    const auto& s = lines[4];
    EXPECT_EQ(s.at("eval"), "pasted");
    EXPECT_EQ(s.at("found_fraction").get<double>(), 1.0);
    EXPECT_EQ(s.at("as_documents_cases"), lead.empty() ? 4 : 0);
    EXPECT_GT(s.at("stored_tokens").get<int64_t>(), 100);
  }
  auto r = run("blendctl eval --dataset " + shortened_cases("pasted1.jsonl", 1, 3) +
               " --pasted --paste-lead 'Context: ' --mode reuse --max-tokens 4");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_GE(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0].at("mode"), "reuse");
  EXPECT_EQ(lines[0].at("pasted_found").get<double>(), 1.0);
  EXPECT_GT(lines[0].at("cached_tokens").get<int64_t>(), 100) << "the passages and the lead-in come from the store";
  r = run("blendctl eval --dataset " + data + " --match-only");
  EXPECT_NE(r.code, 0) << "--match-only needs --pasted";
}

TEST(Cli, TtftBenchRunsAllFourModes) {
  REQUIRE_MODEL();
  auto r = run("blendctl bench ttft --chunks 2 --chunk-tokens 64 --requests 1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  std::vector<std::string> modes;
  for (int i = 0; i < 4; ++i) modes.push_back(lines[i].at("mode"));
  EXPECT_EQ(modes, (std::vector<std::string>{"full", "prefix", "reuse", "blend"}));
  EXPECT_DOUBLE_EQ(lines[0].at("ratio_to_full").get<double>(), 1.0);
  EXPECT_EQ(lines[4].at("bench"), "ttft_summary");
}

// `bench gemv` needs no model: a row per (type, shape, tokens, activations), the
// activations' kernel named in each, and a clear refusal of what is not a block type
// or a shape.
TEST(Cli, GemvBenchTimesEachTypeWithBothActivations) {
  auto r = run("blendctl bench gemv --types q4_0 Q8_0 q4_k --shapes 16x256 --tokens 1 3 --repeats 1");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 12u) << r.out;  // 3 types x 2 activations x 2 token counts
  std::set<std::string> seen;
  for (const auto& l : lines) {
    EXPECT_EQ(l.at("bench"), "gemv");
    EXPECT_EQ(l.at("rows"), 16);
    EXPECT_EQ(l.at("in"), 256);
    EXPECT_GT(l.at("us").get<double>(), 0.0);
    EXPECT_GT(l.at("weight_gb_s").get<double>(), 0.0);
    const std::string kernel = l.at("kernel");
    EXPECT_EQ(kernel.rfind("cpu/", 0), 0u) << kernel;
    seen.insert(l.at("type").get<std::string>() + "/" + l.at("activations").get<std::string>() + "/" +
                std::to_string(l.at("tokens").get<int>()));
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_TRUE(seen.count("Q8_0/int8/3")) << "the type as given";
  r = run("blendctl bench gemv --types bf16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("'bf16' is not a block type"), std::string::npos) << r.out;
  r = run("blendctl bench gemv --shapes 12x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("is not ROWSxIN"), std::string::npos) << r.out;
}

// `bench ttft --tier` runs the blend by the rule asked for (it dropped --selection,
// so an A/B of two rules measured the default twice): the rows name the rule each
// measured run blended by (the runtime's from its trace; the engine's runs what the
// runtime ran), beside the one asked for.
TEST(Cli, TtftTierBenchBlendsByTheSelectionAskedFor) {
  REQUIRE_MODEL();
  for (const std::string selection : {"deviation", "query-first"}) {
    SCOPED_TRACE(selection);
    auto r = run("blendctl bench ttft --tier ram --chunks 2 --chunk-tokens 64 --requests 1 --selection " + selection);
    ASSERT_EQ(r.code, 0) << r.out;
    int blend_rows = 0;
    for (const auto& line : json_lines(r.out)) {
      if (line.value("bench", "") != "ttft_runtime" || line.value("mode", "") != "blend") continue;
      ++blend_rows;
      EXPECT_EQ(line.at("selection_asked"), selection) << line.dump();
      EXPECT_EQ(line.at("selection"), selection) << line.dump();
    }
    EXPECT_EQ(blend_rows, 2) << r.out;  // the runtime's and the engine's
  }
}

}  // namespace

namespace {

TEST(Cli, GenerateWithDocumentsStoresThemForTheNextRunAndTraceShowsIt) {
  REQUIRE_MODEL();
  const std::string cmd =
      "blendserve generate --prompt 'Who invented the Sarura compass?' "
      "--document 'Teodor Brandlam invented the Sarura compass in 1802 while working in Luddale.' "
      "--document 'Amalia Ullam was a mathematician born in Luddale in 1791.' --max-tokens 8 --stats";
  auto first = run(cmd);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("chunks: 0 ram, 0 ssd, 2 missed"), std::string::npos) << first.out;
  // A new process: RAM is empty, the documents come from the SSD tier.
  auto second = run(cmd);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("chunks: 0 ram, 2 ssd, 0 missed"), std::string::npos) << second.out;
  auto trace = run("blendctl trace --last");
  ASSERT_EQ(trace.code, 0) << trace.out;
  EXPECT_NE(trace.out.find("ssd ssd"), std::string::npos) << trace.out;
  EXPECT_NE(trace.out.find("loader-ssd load"), std::string::npos) << trace.out;
  EXPECT_NE(trace.out.find("of the load time hidden"), std::string::npos) << trace.out;
  auto raw = run("blendctl trace --last --json");
  ASSERT_EQ(raw.code, 0);
  const auto j = nlohmann::json::parse(raw.out);
  EXPECT_EQ(j.at("chunk_tiers"), nlohmann::json({"ssd", "ssd"}));
  EXPECT_EQ(run("blendctl trace --file /nonexistent.json").code, 1);
}

TEST(Cli, SigintCancelsTheRequestAndExitsCleanly) {
  REQUIRE_MODEL();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    const std::string bin = std::string(BLENDSERVE_BINARY_DIR) + "/blendserve";
    execl(bin.c_str(), bin.c_str(), "generate", "--chat", "--prompt", "Write a very long story about the sea.",
          "--document", "The sea covers most of the Earth.", "--max-tokens", "4000", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  // Wait for the first text, then interrupt.
  std::string text;
  char buf[256];
  pollfd pfd{out[0], POLLIN, 0};
  while (text.size() < 20 && poll(&pfd, 1, 60000) > 0) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ASSERT_GE(text.size(), 20u) << text;
  kill(pid, SIGINT);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    while (read(out[0], buf, sizeof buf) > 0) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (done == 0) kill(pid, SIGKILL);
  close(out[0]);
  ASSERT_EQ(done, pid) << "blendserve did not exit within 60 s of SIGINT";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  // Nothing half-written is left in the SSD tier.
  for (const auto& e : fs::directory_iterator(data_dir() / "kv"))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(Cli, EvalHandlesAnAnswerThatTokenizesToNothing) {
  REQUIRE_MODEL();
  const auto path = data_dir() / "empty_answer.jsonl";
  std::ofstream(path) << R"({"id": "e1", "question": "Who built it?", "answers": [""], )"
                      << R"("documents": ["The bridge was built by Ada Lin in 1901.", "Rivers flow to the sea."]})" << "\n";
  auto r = run("blendctl eval --dataset " + path.string() + " --mode blend --max-tokens 4");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_FALSE(lines.empty()) << r.out;
  const auto& summary = lines.back();
  EXPECT_TRUE(summary.at("summary").get<bool>());
  EXPECT_EQ(summary.at("cases").get<int>(), 1);
  EXPECT_EQ(summary.at("teacher_forced_cases").get<int>(), 0);
  EXPECT_TRUE(lines.front().at("first_token_kl").is_null()) << lines.front().dump();
  EXPECT_GE(lines.front().at("setup_s_excluded").get<double>(), 0.0);
}

// --sweep-ratio: full once per case, the blend at each ratio (sorted); a summary per
// (mode, ratio), one sweep line, and --plot's chart naming both ratios. f32 K/V: full is
// its own reference (one model, the quickest run), on two shortened cases.
TEST(Cli, EvalSweepsTheRatioAndPlotsTheTradeOff) {
  REQUIRE_MODEL();
  const auto svg_path = data_dir() / "sweep.svg";
  auto r = run("blendctl eval --dataset " + shortened_cases("sweep.jsonl", 2, 2) +
               " --max-tokens 4 --kv-dtype f32 --sweep-ratio 0.5,0.1 --plot " + svg_path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 2u * 3u + 3u + 1u) << r.out;  // case lines, summaries, the sweep
  std::map<double, int> blend_cases;
  for (size_t i = 0; i < 6; ++i)
    if (lines[i].at("mode") == "blend") ++blend_cases[lines[i].at("ratio").get<double>()];
  EXPECT_EQ(blend_cases, (std::map<double, int>{{0.1, 2}, {0.5, 2}})) << r.out;
  const auto& full = lines[6];
  const auto& low = lines[7];
  const auto& high = lines[8];
  ASSERT_TRUE(full.at("summary").get<bool>() && low.at("summary").get<bool>() && high.at("summary").get<bool>());
  EXPECT_EQ(full.at("mode"), "full");
  EXPECT_EQ(low.at("mode"), "blend");
  EXPECT_EQ(high.at("mode"), "blend");
  EXPECT_EQ(low.at("ratio").get<double>(), 0.1);
  EXPECT_EQ(high.at("ratio").get<double>(), 0.5);
  for (const auto* s : {&full, &low, &high}) EXPECT_EQ(s->at("cases").get<int>(), 2);
  // A higher ratio recomputes more of the cached tokens: about the ratio of them.
  EXPECT_GT(high.at("recomputed_tokens").get<double>(), low.at("recomputed_tokens").get<double>());
  EXPECT_NEAR(low.at("recomputed_fraction").get<double>(), 0.1, 0.02);
  EXPECT_NEAR(high.at("recomputed_fraction").get<double>(), 0.5, 0.02);

  const auto& sweep = lines[9];
  ASSERT_EQ(sweep.at("eval"), "sweep") << sweep.dump();
  EXPECT_EQ(sweep.at("cases").get<int>(), 2);
  const auto& points = sweep.at("points");
  ASSERT_EQ(points.size(), 2u);
  const double full_ttft = sweep.at("full").at("ttft_s").get<double>();
  EXPECT_GT(full_ttft, 0);
  EXPECT_DOUBLE_EQ(full_ttft, full.at("ttft_s").get<double>());
  EXPECT_DOUBLE_EQ(sweep.at("full").at("f1").get<double>(), full.at("f1").get<double>());
  for (size_t i = 0; i < 2; ++i) {
    const auto& p = points[i];
    const auto& s = i == 0 ? low : high;
    EXPECT_EQ(p.at("ratio").get<double>(), s.at("ratio").get<double>());
    EXPECT_DOUBLE_EQ(p.at("f1").get<double>(), s.at("f1").get<double>());
    EXPECT_DOUBLE_EQ(p.at("kl").get<double>(), s.at("first_token_kl").get<double>());
    EXPECT_DOUBLE_EQ(p.at("agreement").get<double>(), s.at("top1_agreement").get<double>());
    EXPECT_DOUBLE_EQ(p.at("ttft_s").get<double>(), s.at("ttft_s").get<double>());
    EXPECT_NEAR(p.at("ttft_vs_full").get<double>(), p.at("ttft_s").get<double>() / full_ttft, 1e-12);
    EXPECT_DOUBLE_EQ(p.at("recomputed_fraction").get<double>(), s.at("recomputed_fraction").get<double>());
  }
  EXPECT_NE(r.out.find("eval runs: 6/6"), std::string::npos) << r.out;  // progress on stderr

  std::ifstream in(svg_path);
  ASSERT_TRUE(in) << svg_path;
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find(">0.1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">0.5</text>"), std::string::npos);
  EXPECT_NE(svg.find("sweep.jsonl, 2 cases"), std::string::npos);
  EXPECT_NE(svg.find("SmolLM2"), std::string::npos);

  // --resume: a run stopped after the first case, resumed, prints the summaries of the
  // uninterrupted run above (up to timing) and recomputes only the second case.
  const auto log_path = (data_dir() / "sweep_log.jsonl").string();
  const std::string resumable = "blendctl eval --dataset " + (data_dir() / "sweep.jsonl").string() +
                                " --kv-dtype f32 --sweep-ratio 0.5,0.1 --resume " + log_path;
  r = run(resumable + " --max-tokens 4 --max-cases 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 of these 3 runs read back, 3 to go"), std::string::npos) << r.out;
  r = run(resumable + " --max-tokens 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 of these 6 runs read back, 3 to go"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval runs: 6/6"), std::string::npos) << r.out;
  const auto resumed = json_lines(r.out);
  ASSERT_EQ(resumed.size(), lines.size()) << r.out;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto a = lines[i], b = resumed[i];
    for (auto* j : {&a, &b})  // timing is measured again; everything else is the same
      for (const char* k : {"ttft_s", "ttft_vs_full", "setup_s_excluded"}) j->erase(k);
    for (auto* j : {&a, &b}) {
      if (j->contains("points"))
        for (auto& p : j->at("points"))
          for (const char* k : {"ttft_s", "ttft_vs_full"}) p.erase(k);
      if (j->contains("full")) j->at("full").erase("ttft_s");
    }
    EXPECT_EQ(a, b) << i;
  }
  std::ifstream log_in(log_path);
  std::string log_line;
  int log_lines = 0;
  while (std::getline(log_in, log_line)) ++log_lines;
  EXPECT_EQ(log_lines, 1 + 6);  // the settings, each (case, run) once
  // Other settings are refused before any work, naming what differs.
  r = run(resumable + " --max-tokens 5");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("\"max_tokens\" is 4 there and 5 here"), std::string::npos) << r.out;

  // Bad sweeps are clear CLI errors, before any work.
  r = run("blendctl eval --dataset x.jsonl --sweep-ratio 0.1,0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("ratio '0' is not a number in (0,1]"), std::string::npos) << r.out;
  r = run("blendctl eval --dataset x.jsonl --sweep-ratio 0.1,1.5");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("'1.5'"), std::string::npos) << r.out;
  r = run("blendctl eval --dataset x.jsonl --sweep-ratio 0.1 --ratio 0.2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("excludes"), std::string::npos) << r.out;
  r = run("blendctl eval --dataset x.jsonl --plot /nonexistent/dir/p.svg");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/dir"), std::string::npos) << r.out;
}

TEST(Cli, ABadConfigIsAClearErrorNamingTheKey) {
  const auto path = data_dir() / "bad.yaml";
  std::ofstream(path) << "tiers:\n  ram:\n    budgte: 1GiB\n";
  auto r = run("blendserve --config " + path.string() + " generate --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("tiers.ram.budgte"), std::string::npos) << r.out;
}

}  // namespace

// ------------------------------------------------------------ trace export
namespace {

// `blendctl trace --format chrome` against what the runtime wrote: a structure
// Perfetto and chrome://tracing load (every event ph/ts/pid/tid, complete events
// with dur >= 0, times non-negative and in order, one process_name per pid, a
// thread_name for every tid used), one complete event per trace event (its actor's
// thread, what + " L<layer>"), the layer worker's compute of every layer the model
// has, the first token as an instant.
void expect_chrome_export_of(const nlohmann::json& chrome, const nlohmann::json& trace, int layers) {
  ASSERT_TRUE(chrome.contains("traceEvents") && chrome.at("traceEvents").is_array()) << chrome.dump();
  EXPECT_EQ(chrome.at("displayTimeUnit"), "ms");
  EXPECT_EQ(chrome.at("otherData").at("id"), trace.at("id"));
  EXPECT_EQ(chrome.at("otherData").at("mode"), trace.at("mode"));
  std::map<int, int> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  std::set<std::pair<int, int>> used;
  std::multiset<std::pair<std::string, std::string>> got, want;
  std::set<std::string> worker_compute;
  int instants = 0;
  double last_ts = 0;
  for (const auto& e : chrome.at("traceEvents")) {
    for (const char* key : {"ph", "ts", "pid", "tid", "name"}) ASSERT_TRUE(e.contains(key)) << key << ": " << e.dump();
    const double ts = e.at("ts").get<double>();
    EXPECT_GE(ts, 0.0) << e.dump();
    EXPECT_GE(ts, last_ts) << e.dump();
    last_ts = ts;
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    const std::string ph = e.at("ph");
    if (ph == "M") {
      if (e.at("name") == "process_name") ++process_names[thread.first];
      if (e.at("name") == "thread_name") {
        EXPECT_EQ(thread_names.count(thread), 0u) << e.dump();
        thread_names[thread] = e.at("args").at("name");
      }
      continue;
    }
    used.insert(thread);
    if (ph == "i") {
      ++instants;
      EXPECT_EQ(e.at("name"), "first token");
      EXPECT_NEAR(ts, 1e6 * trace.at("first_token_s").get<double>(), 0.01);
      continue;
    }
    ASSERT_EQ(ph, "X") << e.dump();
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    ASSERT_EQ(thread_names.count(thread), 1u) << "no thread_name before " << e.dump();
    got.insert({thread_names.at(thread), e.at("name")});
    if (e.at("cat") == "layer-worker" && e.at("name").get<std::string>().rfind("compute L", 0) == 0)
      worker_compute.insert(e.at("name"));
  }
  for (const auto& t : used) {
    EXPECT_EQ(process_names[t.first], 1) << "pid " << t.first;
    EXPECT_EQ(thread_names.count(t), 1u) << "pid " << t.first << " tid " << t.second;
  }
  for (const auto& e : trace.at("events")) {
    std::string name = e.at("what");
    if (e.contains("layer")) name += " L" + std::to_string(e.at("layer").get<int>());
    want.insert({e.at("actor"), name});
  }
  EXPECT_EQ(got, want);
  for (int l = 0; l < layers; ++l)
    EXPECT_EQ(worker_compute.count("compute L" + std::to_string(l)), 1u) << "layer " << l;
  EXPECT_EQ(instants, trace.contains("first_token_s") ? 1 : 0);
}

int model_layers() {
  const auto g = bs::gguf::GgufFile::open(bs::testing::model_path());
  return static_cast<int>(g.get_int(g.get_string("general.architecture").value() + ".block_count").value());
}

using bs::testing::free_port;

// Two requests through `blendserve serve` (one process, so ids 1 and 2), then their
// traces by id and the last one, from the data dir and from the server, as Chrome
// trace-event JSON; the errors: a missing id, no key (401), nothing listening, a
// server that never answers.
TEST(Cli, TraceExportsChromeTraceEventsByIdFromFilesAndFromTheServer) {
  REQUIRE_MODEL();
  const std::string key = "trace-export-key-1";
  const auto config = data_dir() / "trace_export.yaml";
  std::ofstream(config) << "server:\n  api_keys: [\"" << key << "\"]\n";
  const int port = free_port();
  ASSERT_GT(port, 0);
  bs::testing::ServeProcess server(config, port, data_dir() / "trace_export_server.log");
  ASSERT_TRUE(server.up());
  httplib::Client http("127.0.0.1", port);
  http.set_bearer_token_auth(key);
  http.set_read_timeout(300);
  auto models = http.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = nlohmann::json::parse(models->body).at("data").at(0).at("id");
  // The documents stored ahead (no request of their own): both requests load them.
  const nlohmann::json documents = {"Teodor Brandlam invented the Sarura compass in 1802.",
                                    "Amalia Ullam was born in 1791."};
  for (const auto& d : documents) {
    auto r = http.Post("/v1/documents", nlohmann::json{{"text", d}}.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  }
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json body = {{"model", model},
                                 {"max_tokens", 4},
                                 {"documents", documents},
                                 {"messages", {{{"role", "user"}, {"content", "Who invented the Sarura compass?"}}}}};
    auto r = http.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200) << r->body;
  }
  // The inspector writes a trace once the request has ended; the answer can be first.
  const auto traces = data_dir() / "traces";
  for (int i = 0; i < 200 && !fs::exists(traces / "2.json"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(traces / "1.json") && fs::exists(traces / "2.json"));
  const auto first = nlohmann::json::parse(bs::testing::read_file((traces / "1.json").string()));
  const auto second = nlohmann::json::parse(bs::testing::read_file((traces / "2.json").string()));
  ASSERT_EQ(first.at("id"), 1);
  ASSERT_EQ(second.at("id"), 2);
  const int layers = model_layers();

  // From the data dir: by id on stdout, the last to a file.
  ::unsetenv("BLENDSERVE_API_KEY");
  auto r = run("blendctl trace 1 --format chrome");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto chrome1 = nlohmann::json::parse(r.out);
  expect_chrome_export_of(chrome1, first, layers);
  const auto out = data_dir() / "last_chrome.json";
  r = run("blendctl trace --last --format chrome --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  const auto chrome2 = nlohmann::json::parse(bs::testing::read_file(out.string()));
  expect_chrome_export_of(chrome2, second, layers);
  EXPECT_EQ(chrome2.at("otherData").at("chunk_tiers"), nlohmann::json({"ram", "ram"}));
  r = run("blendctl trace 2");  // the text timeline, by id
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("request 2:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loader-ram load"), std::string::npos) << r.out;
  r = run("blendctl trace 99 --format chrome");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no trace of request 99"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ids there: 1 2"), std::string::npos) << r.out;

  // From the server: the same traces, the same export.
  const std::string url = " --url http://127.0.0.1:" + std::to_string(port);
  r = run("blendctl trace 1 --format chrome --api-key " + key + url);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out), chrome1);
  r = run("blendctl trace --last --json --api-key " + key + url);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out), second);
  r = run("blendctl trace 99 --api-key " + key + url);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no trace of request 99 on http://127.0.0.1:"), std::string::npos) << r.out;
  r = run("blendctl trace 1 --format chrome" + url);  // no key
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("401"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--api-key"), std::string::npos) << r.out;
  r = run("blendctl trace 1 --api-key wrong-key-123" + url);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("Incorrect API key"), std::string::npos) << r.out;

  // Nothing listening; a server that accepts but never answers (the timeout).
  r = run("blendctl trace --last --url http://127.0.0.1:" + std::to_string(free_port()));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot reach blendserve"), std::string::npos) << r.out;
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(silent, 4), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const auto t0 = std::chrono::steady_clock::now();
  r = run("blendctl trace --last --timeout 1 --url http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(silent);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("timed out"), std::string::npos) << r.out;
  EXPECT_LT(waited, 30.0);

  // A file that is not a trace.
  const auto bad = data_dir() / "not_a_trace.json";
  std::ofstream(bad) << R"({"id": 1, "events": [{"actor": "worker"}]})";
  r = run("blendctl trace --file " + bad.string() + " --format chrome");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a request trace: event 0"), std::string::npos) << r.out;
}

}  // namespace
