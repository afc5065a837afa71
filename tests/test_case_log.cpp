// The case log of `blendctl eval --resume` (tools/eval/case_log.h) on real files: lines
// survive a reopen, other settings are refused by name, a line cut short by a kill is
// dropped, and a damaged or doubled line is an error that rewrites nothing. No model.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/eval/case_log.h"

namespace {

using bs::tools::CaseLog;
using json = nlohmann::json;

class CaseLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("bs_case_log_" + std::to_string(getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "log.jsonl").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string contents() const {
    std::ifstream in(path_, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void write(const std::string& text) const { std::ofstream(path_, std::ios::binary | std::ios::trunc) << text; }

  static json settings(const std::string& isa = "cpu/avx2") {
    return {{"isa", isa}, {"max_tokens", 32}, {"check_layers", {1, 2, 3}}};
  }
  static json line(int case_no, const std::string& mode, double ratio = -1) {
    json l = {{"id", "rag-" + std::to_string(case_no)}, {"case", case_no}, {"mode", mode}, {"f1", 0.5}};
    if (ratio >= 0) l["ratio"] = ratio;
    return l;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(CaseLogTest, LinesWrittenAreFoundAfterAReopen) {
  {
    CaseLog log(path_, settings());
    EXPECT_EQ(log.lines_read(), 0);
    EXPECT_EQ(log.find(0, "full", 0.1), nullptr);
    log.append(line(0, "full"));
    log.append(line(0, "blend", 0.1));
    log.append(line(0, "blend", 0.25));
    // Appended lines are on disk at once (flushed), not at close.
    const std::string text = contents();
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);
  }
  const json first = json::parse(contents().substr(0, contents().find('\n')));
  EXPECT_EQ(first.at("eval"), "settings");
  EXPECT_EQ(first.at("isa"), "cpu/avx2");

  CaseLog log(path_, settings());
  EXPECT_EQ(log.lines_read(), 3);
  ASSERT_NE(log.find(0, "full", 0.5), nullptr);  // full's ratio does not matter
  EXPECT_EQ(log.find(0, "full", 0.5)->at("id"), "rag-0");
  ASSERT_NE(log.find(0, "blend", 0.1), nullptr);
  EXPECT_EQ(log.find(0, "blend", 0.1)->at("ratio").get<double>(), 0.1);
  // A ratio as eval computes it from a float (0.25 exactly, 0.1 to six decimals).
  EXPECT_NE(log.find(0, "blend", 0.1000000001), nullptr);
  EXPECT_EQ(log.find(0, "blend", 0.15), nullptr);
  EXPECT_EQ(log.find(1, "full", 0), nullptr);
  EXPECT_EQ(log.find(0, "no-cache", 0), nullptr);
}

TEST_F(CaseLogTest, OtherSettingsAreRefusedNamingTheKeyAndTheFileIsKept) {
  {
    CaseLog log(path_, settings());
    log.append(line(0, "full"));
  }
  const std::string before = contents();
  try {
    CaseLog log(path_, settings("cpu/avx512bf16"));
    FAIL() << "resumed under another ISA";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"isa\" is \"cpu/avx2\" there and \"cpu/avx512bf16\" here"), std::string::npos) << what;
    EXPECT_NE(what.find(path_), std::string::npos) << what;
  }
  json more = settings();
  more["chunk_prelude"] = "x";
  try {
    CaseLog log(path_, more);
    FAIL() << "resumed with a setting the file does not have";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"chunk_prelude\" is absent there"), std::string::npos) << e.what();
  }
  EXPECT_EQ(contents(), before);
}

TEST_F(CaseLogTest, ALastLineCutShortIsDroppedAndTheRestKept) {
  {
    CaseLog log(path_, settings());
    log.append(line(0, "full"));
    log.append(line(0, "blend", 0.1));
  }
  const std::string whole = contents();
  write(whole + R"({"id":"rag-1","case":1,"mode":"fu)");  // killed mid-write
  CaseLog log(path_, settings());
  EXPECT_EQ(log.lines_read(), 2);
  EXPECT_EQ(log.find(1, "full", 0), nullptr);
  EXPECT_EQ(contents(), whole);  // truncated to the complete lines
  log.append(line(1, "full"));
  CaseLog again(path_, settings());
  EXPECT_EQ(again.lines_read(), 3);
}

TEST_F(CaseLogTest, ASettingsLineCutShortStartsTheFileAfresh) {
  write(R"({"eval":"settings","isa":"cpu/av)");
  CaseLog log(path_, settings());
  EXPECT_EQ(log.lines_read(), 0);
  EXPECT_EQ(json::parse(contents().substr(0, contents().find('\n'))).at("isa"), "cpu/avx2");
}

TEST_F(CaseLogTest, DamagedDoubledOrForeignLinesAreErrorsThatRewriteNothing) {
  {
    CaseLog log(path_, settings());
    log.append(line(0, "full"));
  }
  const std::string good = contents();
  const auto refused = [&](const std::string& text, const std::string& expected) {
    write(text);
    try {
      CaseLog log(path_, settings());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(contents(), text);
  };
  refused(good + "not json\n" + line(1, "full").dump() + "\n", "line 3 is not a case line");
  refused(good + json{{"case", 1}, {"mode", "blend"}}.dump() + "\n", "line 3 is not a case line");  // no ratio
  refused(good + json{{"case", "1"}, {"mode", "full"}}.dump() + "\n", "line 3 is not a case line");
  refused(good + line(0, "full").dump() + "\n", "line 3 repeats the run 0/full");
  refused(line(0, "full").dump() + "\n", "is not a case log of blendctl eval");
}

TEST_F(CaseLogTest, AnUnwritablePlaceIsAClearError) {
  try {
    CaseLog log((dir_ / "missing-dir" / "log.jsonl").string(), settings());
    FAIL() << "opened a log in a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write"), std::string::npos) << e.what();
  }
}

}  // namespace
