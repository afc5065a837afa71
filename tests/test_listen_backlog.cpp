// raise_listen_backlog (http/listen_backlog.h): a listening socket bound the way
// cpp-httplib 0.11.4 binds (backlog 5) holds only a handful of connections nobody has
// accepted yet; after the raise it holds a whole burst. Real sockets on loopback, and
// cpp-httplib's own Server for the "finds httplib's socket" case.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "http/listen_backlog.h"

namespace {

constexpr int kBurst = 32;

// A loopback listener on an ephemeral port with `backlog`; returns {fd, port}.
std::pair<int, int> listener(int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, backlog) != 0) return {-1, 0};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return {fd, ntohs(a.sin_port)};
}

// kBurst non-blocking connects to the port at once (nobody accepts meanwhile); the
// sockets are returned so that they stay open.
std::vector<int> burst_connect(int port) {
  std::vector<int> fds;
  for (int i = 0; i < kBurst; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));  // EINPROGRESS
    fds.push_back(fd);
  }
  return fds;
}

// How many connections the listener's accept queue holds: accepted (the listener
// made non-blocking) until none is left. Loopback handshakes complete within microseconds; the wait
// before only lets every SYN be answered (the count is what it is after it).
int drain_accept_queue(int listen_fd) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);  // accept never waits
  int n = 0;
  while (true) {
    const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) break;
    ::close(c);
    ++n;
  }
  return n;
}

void close_all(const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
}

}  // namespace

TEST(ListenBacklog, HttplibsBacklogHoldsOnlyAFewOfABurst) {
  // The control: what a backlog of 5 does to a burst (why the raise exists). Linux
  // queues backlog + 1; the others are dropped or left with SYN cookies.
  const auto [fd, port] = listener(5);
  ASSERT_GE(fd, 0);
  const auto clients = burst_connect(port);
  const int queued = drain_accept_queue(fd);
  EXPECT_LT(queued, kBurst);
  EXPECT_LE(queued, 8);
  close_all(clients);
  ::close(fd);
}

TEST(ListenBacklog, RaisedTheWholeBurstIsQueued) {
  const auto [fd, port] = listener(5);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(bs::http::raise_listen_backlog(port), 1);
  const auto clients = burst_connect(port);
  EXPECT_EQ(drain_accept_queue(fd), kBurst);
  close_all(clients);
  ::close(fd);
}

TEST(ListenBacklog, NoListenerOnThePortChangesNothing) {
  const auto [fd, port] = listener(5);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(bs::http::raise_listen_backlog(port), 0);
  EXPECT_EQ(bs::http::raise_listen_backlog(0), 0);
  // A connected (not listening) socket on another port is not touched either.
  const auto [fd2, port2] = listener(5);
  ASSERT_GE(fd2, 0);
  const auto clients = burst_connect(port2);
  int client_port = 0;
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(clients[0], reinterpret_cast<sockaddr*>(&a), &len), 0);
  client_port = ntohs(a.sin_port);
  EXPECT_EQ(bs::http::raise_listen_backlog(client_port), 0);
  close_all(clients);
  ::close(fd2);
}

TEST(ListenBacklog, FindsCppHttplibsOwnSocketAndItServesTheBurst) {
  httplib::Server svr;
  svr.new_task_queue = [] { return new httplib::ThreadPool(kBurst + 4); };
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
  const int port = svr.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  EXPECT_EQ(bs::http::raise_listen_backlog(port), 1);
  // The burst arrives before the server accepts anything: all of it waits in the queue
  // and every request is answered once it does.
  const auto clients = burst_connect(port);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  for (int fd : clients) ASSERT_EQ(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  std::thread serving([&] { svr.listen_after_bind(); });
  int ok = 0;
  for (int fd : clients) {
    std::string got;
    char buf[512];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    if (got.rfind("HTTP/1.1 200", 0) == 0) ++ok;
  }
  EXPECT_EQ(ok, kBurst);
  svr.stop();
  serving.join();
  close_all(clients);
}
