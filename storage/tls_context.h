// The Asio TLS contexts of a member's links (storage/tls.h says why TLS 1.3 with
// mutual authentication under a cluster CA): one context per server or client,
// loaded once from the member's files, shared by its connections. Apart from
// tls.h so that only the code that speaks TLS over Asio includes Boost.
#pragma once

#include <memory>
#include <string>
#include <vector>

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it (GCC 12, C++20).
#include <utility>
// clang-format off
#include <boost/asio/ssl.hpp>
// clang-format on

#include "storage/tls.h"

namespace bs::tls {

// A server's context: TLS 1.3 only, this member's certificate and key, and a peer
// must present a certificate the CA signed (no certificate, another CA's, expired:
// the handshake fails). With `allowed_peers` not empty the peer's certificate must
// also name one of them (its subjectAltName, as X509_check_host reads it). No
// session tickets: nothing is ever sent on a connection that was not asked for
// (a client's idle pooled connection must stay silent). Throws std::runtime_error
// naming the file and the cause.
std::shared_ptr<boost::asio::ssl::context> server_context(const Files& f,
                                                          std::vector<std::string> allowed_peers = {});

// A client's context: the same files and rules. The server's name is checked per
// connection: set_peer_name on the stream before its handshake.
std::shared_ptr<boost::asio::ssl::context> client_context(const Files& f);

// The stream's peer must present a certificate that names `name` (a node name, a
// host name or an address; Asio's host_name_verification).
template <class Stream>
void set_peer_name(Stream& stream, const std::string& name) {
  stream.set_verify_callback(boost::asio::ssl::host_name_verification(name));
}

}  // namespace bs::tls
