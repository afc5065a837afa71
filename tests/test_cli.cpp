// The binaries as people run them: real processes, real model, real output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "kernels/cpu/isa.h"
#include "tests/model_fixture.h"

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
// Set before any test starts a process (static initialisation of this file).
const bool data_dir_set = !data_dir().empty();
struct RemoveDataDir : ::testing::Environment {
  void TearDown() override { fs::remove_all(data_dir()); }
};
const auto* remove_data_dir = ::testing::AddGlobalTestEnvironment(new RemoveDataDir);

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr together
};

Run run(const std::string& args) {
  const std::string cmd = std::string(BLENDSERVE_BINARY_DIR) + "/" + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Cli, GenerateAnswersAChatQuestion) {
  REQUIRE_MODEL();
  auto r = run("blendserve generate --chat --prompt 'What is the capital of France?' --max-tokens 32");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
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
  // it runs (AVX2 kernels), and an unknown value is a clear error.
  p = popen(("BLENDSERVE_DECODE_ACTIVATIONS=int8 " + bin + " generate --prompt hi --max-tokens 2 --stats 2>&1").c_str(),
            "r");
  ASSERT_NE(p, nullptr);
  out.assign(4096, '\0');
  out.resize(fread(out.data(), 1, out.size(), p));
  EXPECT_EQ(pclose(p), 0) << out;
  const bool int8_runs = bs::kernels::cpu::selected_cpu_isa() == bs::kernels::cpu::CpuIsa::Avx2;
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
  auto r = run("blendctl eval --dataset " + std::string(BLENDSERVE_FIXTURES) +
               "/../data/rag_qa_small.jsonl --mode full,reuse,blend --max-cases 1 --max-tokens 8 --kv-dtype f32");
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

TEST(Cli, ABadConfigIsAClearErrorNamingTheKey) {
  const auto path = data_dir() / "bad.yaml";
  std::ofstream(path) << "tiers:\n  ram:\n    budgte: 1GiB\n";
  auto r = run("blendserve --config " + path.string() + " generate --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("tiers.ram.budgte"), std::string::npos) << r.out;
}

}  // namespace
