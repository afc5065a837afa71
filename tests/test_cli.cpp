// The binaries as people run them: real processes, real model, real output (the
// eval subcommand's tests are in test_cli_eval.cpp).
#include "tests/cli_test_helpers.h"

namespace {

using namespace bs::cli_test;

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
