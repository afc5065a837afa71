// `blendctl top` as people run it: a real `blendserve serve` process with an API
// key, the real `blendctl top` in a real 80x30 terminal (tmux: send-keys,
// capture-pane). It shows the actors, sorts and filters on keys, fits 80
// columns, says so when the server goes away and keeps going, picks the server
// up again when it comes back on the same port, and quits on `q`. `--once --json`
// prints one snapshot (exit 1 with the reason when refused or unreachable).
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>


#include "tests/model_fixture.h"
#include "tests/process_fixture.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kKey = "sk-top-test-0815";

using bs::testing::free_port;

// A shell command; stdout and stderr together.
bs::testing::CommandResult sh(const std::string& cmd) { return bs::testing::run_command(cmd + " 2>&1"); }

// `blendserve serve` on `port` with the key, its data and log in `dir`.
std::unique_ptr<bs::testing::ServeProcess> start_server(const fs::path& dir, int port) {
  const auto config = dir / "top.yaml";
  std::ofstream(config) << "server:\n  api_keys: [\"" << kKey << "\"]\n";
  return std::make_unique<bs::testing::ServeProcess>(config, port, dir / "server.log", dir);
}

// A tmux server of its own (its socket named after this process).
struct Tmux {
  std::string socket = "bs_top_" + std::to_string(::getpid());
  std::string cmd(const std::string& args) const { return "tmux -L " + socket + " " + args; }
  ~Tmux() { sh(cmd("kill-server")); }
  std::string capture() const { return sh(cmd("capture-pane -p -t top")).out; }
  void keys(const std::string& k) const { sh(cmd("send-keys -t top " + k)); }
  bool alive() const { return sh(cmd("has-session -t top")).code == 0; }
  // Waits (bounded) until the screen satisfies `ok`; returns the last screen.
  std::string wait_for(const std::function<bool(const std::string&)>& ok, int seconds = 20) const {
    std::string screen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      screen = capture();
      if (ok(screen)) return screen;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return screen;
  }
};

bool has(const std::string& s, const std::string& x) { return s.find(x) != std::string::npos; }

TEST(CliTop, LiveViewSortsFiltersFitsEightyColumnsAndSurvivesTheServerGoingAway) {
  if (!bs::testing::model_available()) GTEST_SKIP() << "model not found";
  if (sh("command -v tmux").code != 0) GTEST_SKIP() << "no tmux (tools/setup.sh installs it)";
  bs::testing::TempDir dir;
  const int port = free_port();
  ASSERT_GT(port, 0);
  auto server = start_server(dir.path(), port);
  ASSERT_TRUE(server->up());
  {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    json body = {{"model", "SmolLM2-135M-Instruct"},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", 4},
                 {"documents", {"The Eiffel Tower is 330 metres tall."}}};
    auto r = c.Post("/v1/chat/completions", {{"Authorization", std::string("Bearer ") + kKey}}, body.dump(),
                    "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const std::string blendctl = std::string(BLENDSERVE_BINARY_DIR) + "/blendctl";

  // One snapshot as JSON; refused without the key; unreachable elsewhere.
  auto once = sh(blendctl + " top --once --json --url " + url + " --api-key " + kKey);
  ASSERT_EQ(once.code, 0) << once.out;
  const json snap = json::parse(once.out);
  ASSERT_EQ(snap.at("nodes").size(), 1u);
  EXPECT_GE(snap.at("nodes")[0].at("actors").size(), 10u);
  auto refused = sh("env -u BLENDSERVE_API_KEY " + blendctl + " top --once --json --url " + url);
  EXPECT_EQ(refused.code, 1);
  EXPECT_TRUE(has(refused.out, "401")) << refused.out;
  auto nowhere = sh(blendctl + " top --once --timeout 1 --url http://127.0.0.1:" + std::to_string(free_port()));
  EXPECT_EQ(nowhere.code, 1);
  EXPECT_TRUE(has(nowhere.out, "cannot reach")) << nowhere.out;

  Tmux tmux;
  ASSERT_EQ(sh(tmux.cmd("new-session -d -s top -x 80 -y 30 '" + blendctl + " top --url " + url + " --api-key " + kKey +
                        "'")).code,
            0);
  std::string screen = tmux.wait_for([](const std::string& s) { return has(s, "layer-worker") && has(s, "updated"); });
  ASSERT_TRUE(has(screen, "layer-worker")) << screen;
  EXPECT_TRUE(has(screen, "ACTORS (sort: busy)")) << screen;
  EXPECT_TRUE(has(screen, "compute-thread")) << screen;
  EXPECT_TRUE(has(screen, "node local")) << screen;
  std::istringstream lines(screen);
  for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 80u) << l;

  tmux.keys("s");
  screen = tmux.wait_for([](const std::string& s) { return has(s, "sort: mailbox"); }, 5);
  EXPECT_TRUE(has(screen, "sort: mailbox")) << screen;
  tmux.keys("/ l o a d e r Enter");
  screen = tmux.wait_for([](const std::string& s) { return has(s, "filter: loader)"); }, 5);
  EXPECT_TRUE(has(screen, "loader-ram-0")) << screen;
  EXPECT_FALSE(has(screen, "layer-worker")) << "filtered out: " << screen;
  tmux.keys("/ Enter");  // an empty filter clears it
  screen = tmux.wait_for([](const std::string& s) { return has(s, "layer-worker"); }, 5);
  EXPECT_TRUE(has(screen, "layer-worker")) << screen;

  // The server goes away: top says so and keeps running.
  server->kill();
  screen = tmux.wait_for([](const std::string& s) { return has(s, "server gone"); }, 10);
  EXPECT_TRUE(has(screen, "server gone")) << screen;
  EXPECT_TRUE(has(screen, "retrying")) << screen;
  EXPECT_TRUE(tmux.alive());
  // It comes back on the same port: top picks it up.
  server = start_server(dir.path(), port);
  ASSERT_TRUE(server->up());
  screen = tmux.wait_for([](const std::string& s) { return has(s, "updated") && !has(s, "server gone"); }, 30);
  EXPECT_TRUE(has(screen, "updated")) << screen;
  EXPECT_TRUE(has(screen, "layer-worker")) << screen;

  tmux.keys("q");
  for (int i = 0; i < 50 && tmux.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(tmux.alive()) << "q quits";
}

}  // namespace
