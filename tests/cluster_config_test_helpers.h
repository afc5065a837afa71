// What the cluster config's suites share (test_cluster_config*.cpp): the example file,
// a secret, environment variables set for one test, a small valid cluster to edit
// line by line, and the error a text raises with the line it names.
#pragma once

#include "actors/config/cluster_config.h"
#include "actors/config/cluster_secret.h"
#include "kernels/backend_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bs::cluster_config_test {

using ::testing::HasSubstr;

inline const std::string kExample = std::string(BLENDSERVE_FIXTURES) + "/../../configs/cluster.example.yaml";
inline const std::string kSecret = "0123456789abcdef0123";  // 20 characters

// Sets or unsets environment variables for one test and restores them after.
class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::string> names) {
    for (auto& n : names) {
      const char* v = std::getenv(n.c_str());
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
    }
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved_) {
      if (v) ::setenv(n.c_str(), v->c_str(), 1);
      else ::unsetenv(n.c_str());
    }
  }
  void set(const std::string& n, const std::string& v) { ::setenv(n.c_str(), v.c_str(), 1); }
  void unset(const std::string& n) { ::unsetenv(n.c_str()); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// The 1-based line of the first line of `text` containing `marker` (a test failure
// if none does): where an error about that line must point.
inline int line_of(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no '" << marker << "' in\n" << text;
    return 0;
  }
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
}
inline std::string at_line(const std::string& text, const std::string& marker) {
  return "(line " + std::to_string(line_of(text, marker)) + ", column";
}

// The message of the ConfigError the text raises; a test failure if it parses.
inline std::string error_of(const std::string& yaml) {
  try {
    parse_cluster_config(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without an error:\n" << yaml;
  return "";
}

inline std::string runtime_error_of(const std::string& yaml) {
  try {
    parse_runtime_config(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without an error:\n" << yaml;
  return "";
}

// A small valid cluster, one node per line so that a test can replace one.
inline const std::string kCluster = R"(cluster:
  name: test
  secret: 0123456789abcdef0123
  data_dir: /srv/bs
defaults:
  device: {threads: 1}
  tiers: {ram: {budget: 1GiB}}
nodes:
  - {name: front, role: frontend, host: 127.0.0.1, port: 7100, http_port: 8000}
  - {name: w1, role: worker, host: 127.0.0.1, port: 7101, http_port: 8101, tiers: {remote: {enabled: true}}}
  - {name: w2, role: worker, host: 127.0.0.1, port: 7102, http_port: 8102, blend: {ratio: 0.3}}
  - {name: store, role: storage, host: 127.0.0.3, port: 7103, data_port: 7203, tiers: {ssd: {budget: 20GiB}}}
)";

// kCluster with the line holding `marker` replaced by `line` (or dropped if empty).
inline std::string with_line(const std::string& marker, const std::string& line) {
  std::string out;
  size_t start = 0;
  bool found = false;
  while (start < kCluster.size()) {
    const size_t end = kCluster.find('\n', start);
    const std::string l = kCluster.substr(start, end - start);
    if (!found && l.find(marker) != std::string::npos) {
      found = true;
      if (!line.empty()) out += line + "\n";
    } else {
      out += l + "\n";
    }
    start = end + 1;
  }
  EXPECT_TRUE(found) << marker;
  return out;
}
// kCluster with `line` added to the nodes.
inline std::string with_node(const std::string& line) { return kCluster + line + "\n"; }


}  // namespace bs::cluster_config_test
