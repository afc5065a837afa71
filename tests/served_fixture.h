// A real HTTP server (http::Server over a Runtime) on a free loopback port,
// serving from its own thread, for the tests that talk to it with a real client.
#pragma once

#include <httplib.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "actors/runtime/runtime.h"
#include "actors/config/runtime_config.h"
#include "http/server.h"

namespace bs::testing {

class Served {
 public:
  Served(Runtime& runtime, const RuntimeConfig& config) : server_(runtime, config) {
    port_ = server_.bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_.serve(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200; ++i) {
      if (auto r = c.Get("/health"); r && (r->status == 200 || r->status == 503)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the server did not come up";
  }
  ~Served() {
    server_.stop();
    thread_.join();
  }
  httplib::Client client(int read_timeout_s = 300) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }
  http::Server& server() { return server_; }
  int port() const { return port_; }

 private:
  http::Server server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace bs::testing
