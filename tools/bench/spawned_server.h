// `blendserve serve` started by `blendctl bench serve --spawn`
// (tools/bench/bench_serve.cpp): on a free loopback port with a data dir of its own,
// waited for until /health answers, stopped and cleaned up with its owner.
#pragma once

#include <sys/types.h>

#include <string>

namespace bs::tools::serve {

// `blendserve serve` on a free loopback port with a temporary data dir; stopped
// (SIGTERM, then SIGKILL) and its data dir removed when this goes out of scope.
class SpawnedServer {
 public:
  // config: a YAML config for the server ("" for its default); timeout_s: how long
  // it may take to answer /health; api_key: the bearer key /health is asked with.
  // Throws with the server's log tail when it exits or does not answer in time.
  SpawnedServer(const std::string& config, double timeout_s, const std::string& api_key);
  ~SpawnedServer();
  SpawnedServer(const SpawnedServer&) = delete;
  SpawnedServer& operator=(const SpawnedServer&) = delete;

  const std::string& url() const { return url_; }
  void stop();

 private:
  void start(const std::string& bin, const std::string& config, double timeout_s, const std::string& api_key);
  std::string log_tail() const;
  void wait_healthy(double timeout_s, const std::string& api_key);

  std::string dir_, log_, url_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace bs::tools::serve
