// Which socket an HTTP request came in on, and whether its client has hung up.
//
// A chat completion sends nothing before its first token (so a request that fails
// in its prefill still gets a proper error status), and a closed TCP connection
// only shows when something is read from or written to it. So that a client that
// leaves while its request is queued or in a long prefill is noticed at once (and
// the request cancelled), the waiting handler peeks at its socket (peer_closed).
//
// How the handler gets the socket: cpp-httplib 0.11.4 (Debian 12) hands a handler
// no socket (Request::is_connection_closed arrived in 0.18.5: use it when
// upgrading). Overriding Server's private virtual process_and_close_socket to
// record the socket in a thread_local would work in the header-only build, but
// Debian ships httplib split (header + libcpp-httplib.so) and its header declares
// neither detail::process_server_socket nor SocketStream: the override would have
// to re-implement httplib's keep-alive loop and socket stream, on the path of
// every request. Instead the socket is found from what 0.11.4 does give a handler,
// the connection's two endpoints (Request::local_addr/local_port and
// remote_addr/remote_port, which httplib takes from getsockname/getpeername and
// formats with getnameinfo(NI_NUMERICHOST), as endpoint_is does here). A TCP
// connection's address pair is unique, and its socket stays open while its handler
// runs, so the match is exact. It costs one scan of /proc/self/fd per request that
// waits (a few syscalls per open descriptor); where it finds nothing (no /proc, a
// non-TCP listener) the caller falls back to noticing the client at its first write.
//
// POSIX + Linux's /proc only; no httplib here (server.cpp binds them), so nothing
// here depends on httplib's version.
#pragma once

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace bs::http {

namespace connection_detail {

// The port of a socket address (AF_INET/AF_INET6), -1 otherwise.
inline int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

// True when the socket's local (peer = false) or remote (peer = true) endpoint is
// ip:port, the ip written as httplib writes it.
inline bool endpoint_is(int fd, bool peer, const std::string& ip, int port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  if (port_of(a) != port) return false;
  char host[NI_MAXHOST] = {};
  if (getnameinfo(sa, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return false;
  return ip == host;
}

}  // namespace connection_detail

// Calls f(fd) for each socket this process has open (/proc/self/fd) until f returns
// true. False when /proc/self/fd cannot be read.
template <class F>
bool for_each_socket(F f) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return false;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (f(static_cast<int>(fd))) break;
  }
  closedir(dir);
  return true;
}

// The descriptor of this process's TCP connection whose local end is
// local_addr:local_port and whose remote end is remote_addr:remote_port, or -1.
inline int connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                             int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  int found = -1;
  for_each_socket([&](int fd) {
    if (connection_detail::endpoint_is(fd, false, local_addr, local_port) &&
        connection_detail::endpoint_is(fd, true, remote_addr, remote_port))
      found = fd;
    return found >= 0;
  });
  return found;
}

// True when the peer of a connected socket is gone: it closed its end (a read
// would return 0) or the connection failed (reset). Never blocks and consumes
// nothing. As to httplib's own write path (is_socket_alive): a client that only
// shut down its sending side looks gone, and one that sent bytes after its
// request (a pipelined next request) looks present.
inline bool peer_closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace bs::http
