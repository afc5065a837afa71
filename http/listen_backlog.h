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
// this process's sockets are scanned (for_each_socket, http/connection_socket.h) for
// a listening one (SO_ACCEPTCONN) bound to the port. POSIX + Linux's /proc only; no
// httplib here.
#pragma once

#include <sys/socket.h>

#include "http/connection_socket.h"

namespace bs::http {

// Sets the backlog of every listening TCP socket of this process bound to `port`
// (any address) to `backlog`. Returns how many sockets it changed (0: none found,
// e.g. no /proc; the server then keeps httplib's backlog and works as before).
inline int raise_listen_backlog(int port, int backlog = SOMAXCONN) {
  if (port <= 0) return 0;
  int changed = 0;
  for_each_socket([&](int fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) return false;
    sockaddr_storage a{};
    socklen_t alen = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) != 0) return false;
    if (connection_detail::port_of(a) == port && listen(fd, backlog) == 0) ++changed;
    return false;  // every listener on the port
  });
  return changed;
}

}  // namespace bs::http
