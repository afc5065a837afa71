// What the HTTP server suites share (test_server.cpp, test_server_load.cpp): the
// runtime config they serve, request bodies, a raw loopback connection, the SSE
// stream's events, the KV pool back to full, a /metrics value.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <regex>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "http/connection_socket.h"
#include "http/server.h"
#include "kernels/kv_view.h"
#include "model_fixture.h"
#include "rag_runtime_fixture.h"
#include "served_fixture.h"
#include "temp_dir.h"

namespace bs::server_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

inline const char* kModel = "SmolLM2-135M-Instruct";
inline const std::vector<std::string> kDocs = {
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 and is 330 metres "
    "tall. It was designed by the engineering company of Gustave Eiffel.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak, Uhuru, is 5895 metres above sea level, the "
    "highest point in Africa.",
    "The Great Barrier Reef off the coast of Queensland, Australia, is the largest coral reef system in the world, "
    "with over 2900 individual reefs."};

using testing::Served;
using testing::TempDir;

inline RuntimeConfig config_in(const fs::path& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.max_requests = 4;
  c.max_prompt_tokens = 1024;
  c.max_body_bytes = 256 << 10;
  return c;
}


inline json chat_body(const std::string& question, const std::vector<std::string>& docs, int max_tokens,
               const std::string& mode = "") {
  json b = {{"model", kModel}, {"messages", {{{"role", "user"}, {"content", question}}}}, {"max_tokens", max_tokens},
            {"temperature", 0}};
  if (!docs.empty()) b["documents"] = docs;
  if (!mode.empty()) b["mode"] = mode;
  return b;
}

inline RuntimeRequest runtime_request(const std::string& question, const std::vector<std::string>& docs, int max_tokens,
                               std::optional<BlendMode> mode = std::nullopt) {
  RuntimeRequest r;
  r.messages = {{"user", question}};
  r.documents = docs;
  r.sampling.max_tokens = max_tokens;
  r.mode = mode;
  return r;
}

inline httplib::Result post(httplib::Client& c, const std::string& path, const std::string& body,
                     const httplib::Headers& headers = {}) {
  return c.Post(path.c_str(), headers, body, "application/json");
}

// A raw TCP connection to 127.0.0.1:port (-1 if it cannot connect).
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct SseEvent {
  std::string data;
};

// The raw stream, split into `data:` payloads; comment lines (": ...") are
// counted separately. Fails the test on any line that is neither.
inline std::vector<std::string> sse_payloads(const std::string& raw, int* comments = nullptr) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t end = raw.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated event: " << raw.substr(pos);
      break;
    }
    const std::string ev = raw.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(": ", 0) == 0) {
      if (comments) ++*comments;
      continue;
    }
    if (ev.rfind("data: ", 0) != 0 || ev.find('\n') != std::string::npos) {
      ADD_FAILURE() << "not a single data line: " << ev;
      continue;
    }
    out.push_back(ev.substr(6));
  }
  return out;
}

// The KV page pool once nothing runs: no page held by a cache, none promised. The
// last cache goes a moment after the request ends (the worker drops it).
inline bool kv_pool_back_to_full(Runtime& rt, std::chrono::seconds deadline = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    const auto kv = rt.kv_pages();
    if (kv.used == 0 && kv.reserved == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto kv = rt.kv_pages();
  ADD_FAILURE() << "KV pages still used " << kv.used << ", reserved " << kv.reserved << " of " << kv.total;
  return false;
}

inline int64_t metric(const std::string& text, const std::string& name) {
  const auto pos = text.find("\n" + name + " ");
  if (pos == std::string::npos) return -1;
  return std::stoll(text.substr(pos + name.size() + 2));
}

}  // namespace bs::server_test
