// `blendctl eval` as people run it: real processes, the real model, its JSON lines
// (cases, summaries, along full's answer, forced rows, pasted passages, sweeps).
#include "tests/cli_test_helpers.h"

namespace {

using namespace bs::cli_test;

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

}  // namespace
