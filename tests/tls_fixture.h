// What the TLS tests share: a cluster CA and members' certificates in a temp dir
// (made by storage/tls.h as `blendctl cluster init` makes them, plus an unrelated
// CA), and a loopback proxy that flips one byte on the wire.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "storage/tls.h"
#include "tests/temp_dir.h"

namespace bs::testing {

// Whether `pred` holds within `seconds` (polled every 10 ms): for what another
// thread counts (a server's refusals).
template <class Pred>
bool eventually_true(double seconds, Pred&& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A cluster's CA and members' files in a temp dir; `other` is a second, unrelated CA.
struct Pki {
  Pki() {
    tls::make_ca("demo-ca", path("ca.pem"), path("ca.key"));
    tls::make_ca("other-ca", path("other-ca.pem"), path("other-ca.key"));
  }
  std::string path(const std::string& f) const { return (dir.path() / f).string(); }
  // `name`'s files signed by the cluster's CA (or the other one).
  tls::Files member(const std::string& name, std::vector<std::string> hosts = {"127.0.0.1"}, bool other = false) {
    const std::string ca = other ? "other-ca" : "ca";
    const std::string stem = name + (other ? ".other" : "");
    tls::issue_member(path(ca + ".pem"), path(ca + ".key"), name, hosts, path(stem + ".pem"), path(stem + ".key"));
    return {path(ca + ".pem"), path(stem + ".pem"), path(stem + ".key")};
  }
  // `name`'s files signed by the other CA, trusting both CAs (a bundle): such a peer
  // accepts the cluster's members, so only their refusal of it ends the handshake.
  tls::Files stranger(const std::string& name, std::vector<std::string> hosts = {"127.0.0.1"}) {
    tls::Files f = member(name, std::move(hosts), /*other=*/true);
    const std::string bundle = path("both-cas.pem");
    std::ofstream(bundle) << std::ifstream(path("ca.pem")).rdbuf() << std::ifstream(path("other-ca.pem")).rdbuf();
    f.ca = bundle;
    return f;
  }
  TempDir dir{"bs_tls"};
};

// A loopback TCP proxy to `port` that flips the byte at offset `at` of what the
// server there sends (once, on the first connection), passing everything else
// through: what an on-path attacker or a bad link does to a member's link.
class FlippingProxy {
 public:
  FlippingProxy(int port, int64_t at) : port_(port), at_(at) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_, 8) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("proxy: cannot listen");
    proxy_port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FlippingProxy() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  int port() const { return proxy_port_; }
  bool flipped() const { return flipped_; }
  // Bytes the server sent through the proxy so far (to place a flip past a handshake).
  int64_t bytes_from_server() const { return from_server_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept(listen_, nullptr, nullptr);
      if (client < 0) continue;
      const int node = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port_));
      if (::connect(node, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) relay(client, node);
      ::close(node);
      ::close(client);
    }
  }
  // Both ways until either side closes; the node's byte at `at_` flipped once.
  void relay(int client, int node) {
    std::array<char, 65536> buf{};
    int64_t from_node = 0;
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {node, POLLIN, 0}};
      if (::poll(p, 2, 50) < 0) return;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(p[i].fd, buf.data(), buf.size());
        if (n <= 0) return;
        if (i == 1) {
          if (!flipped_ && at_ >= from_node && at_ < from_node + n) {
            buf[static_cast<size_t>(at_ - from_node)] ^= 0x20;
            flipped_ = true;
          }
          from_node += n;
          from_server_ += n;
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = ::write(p[1 - i].fd, buf.data() + off, static_cast<size_t>(n - off));
          if (w <= 0) return;
          off += w;
        }
      }
    }
  }

  int port_;
  int64_t at_;
  int listen_ = -1;
  int proxy_port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> flipped_{false};
  std::atomic<int64_t> from_server_{0};
  std::thread thread_;
};

}  // namespace bs::testing
