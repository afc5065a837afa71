// HTTPS between cluster members (the frontend's forwards to the workers, and the
// tools that probe a worker): TLS 1.3 with mutual authentication under the
// cluster's CA (storage/tls.h says why), through cpp-httplib's OpenSSL support
// (Debian builds it in). With empty files both are plain HTTP: a plaintext cluster,
// or a server outside a cluster.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "storage/tls.h"

namespace bs::http {

// A server: plain HTTP when `tls` is empty; else HTTPS, TLS 1.3 only (AES-128-GCM
// first), this member's certificate, and a client certificate of the CA required
// that names one of `peers` (any the CA signed when empty). Throws
// std::runtime_error naming the file and the cause when the files do not load.
std::unique_ptr<httplib::Server> make_member_server(const tls::Files& tls, std::vector<std::string> peers = {});

// A client to a member at host:port: plain HTTP when `tls` is empty; else HTTPS,
// presenting this member's certificate and accepting only a server certificate of
// the CA that names `peer_name` (the member's node name, in its certificate's
// subjectAltName: the address it is reached at may be another than the file's —
// a Kubernetes DNS name, a Slurm job's machine) or, when that is empty, `host`.
std::unique_ptr<httplib::Client> make_member_client(const std::string& host, int port, const tls::Files& tls,
                                                    const std::string& peer_name = "");

}  // namespace bs::http
