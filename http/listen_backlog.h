// The listen backlog of an HTTP server's socket, raised after cpp-httplib binds it.
//
// Why: cpp-httplib 0.11.4 (Debian 12) listens with a backlog of 5
// (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's libcpp-httplib.so, so defining
// it here changes nothing). A burst of clients that connect at once overflows that
// queue; Linux then answers with SYN cookies, and when a cookie's ACK arrives while
// the accept queue is still full the kernel drops it, later fails the cookie
// (TcpExt SyncookiesFailed) and resets the connection: the client sees its request
// die with a read error, no status at all. That was seen in CI: 4 of a burst of 16
// chat completions on a fast AVX-512 machine (ServerKvPages burst test). Calling
// listen() again on a listening socket changes its backlog (POSIX allows it, Linux
// does it), so once httplib has bound the socket we find it and raise the queue to
// SOMAXCONN (the kernel caps it at net.core.somaxconn), what nginx and Go do too.
//
// How the socket is found: 0.11.4 gives no access to its listening descriptor, so
// this process's descriptors are scanned (/proc/self/fd) for a listening TCP socket
// (SO_ACCEPTCONN) bound to the port. POSIX + Linux's /proc only; no httplib here.
#pragma once

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

#include "http/connection_socket.h"

namespace bs::http {

// Sets the backlog of every listening TCP socket of this process bound to `port`
// (any address) to `backlog`. Returns how many sockets it changed (0: none found,
// e.g. no /proc; the server then keeps httplib's backlog and works as before).
inline int raise_listen_backlog(int port, int backlog = SOMAXCONN) {
  if (port <= 0) return 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return 0;
  const int own = dirfd(dir);
  int changed = 0;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage a{};
    socklen_t alen = sizeof(a);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &alen) != 0) continue;
    if (connection_detail::port_of(a) != port) continue;
    if (listen(static_cast<int>(fd), backlog) == 0) ++changed;
  }
  closedir(dir);
  return changed;
}

}  // namespace bs::http
