// The binaries as people run them: real processes, real model, real output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "tests/model_fixture.h"

namespace {

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
               "/../data/rag_qa_small.jsonl --mode full,reuse,blend --max-cases 1 --max-tokens 8");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;  // 3 cases lines + 3 summaries
  for (int i = 3; i < 6; ++i) {
    EXPECT_TRUE(lines[i].at("summary").get<bool>());
    for (const char* key : {"f1", "first_token_kl", "top1_agreement", "ttft_s"}) EXPECT_TRUE(lines[i].contains(key));
  }
  EXPECT_EQ(lines[3].at("first_token_kl").get<double>(), 0.0);  // full vs itself
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
