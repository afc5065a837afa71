// TLS 1.3 with mutual authentication for the links between cluster members: every
// member holds a certificate signed by the cluster's own CA that names it (its node
// name, and its host), and a link is set up only between two such certificates. Why
// this shape:
// - A private CA per cluster, not the system's trust store: a member is whoever the
//   cluster's CA signed, so a certificate from any other CA (a public one included)
//   gets nothing.
// - The client checks the name it meant to reach (the node's name in the cluster
//   file) against the server's certificate; the server checks the client's
//   certificate against its CA and, where it is given the members' names, that the
//   certificate names one of them. The cluster secret's HMAC handshakes stay on top.
// - TLS 1.3 only (OpenSSL 3): authenticated encryption on every record, so a byte
//   changed on the wire fails the record's MAC — an error, never a wrong answer.
// - Certificates are made here with OpenSSL's libcrypto (EC P-256 keys, SHA-256
//   signatures) by `blendctl cluster init` / `cluster up` (tools/cluster/cluster_ctl.cpp);
//   `openssl verify` accepts them (tests/test_remote_tls.cpp runs it on the ones
//   tests/tls_fixture.h makes as `blendctl cluster init` does, tests/test_cli_cluster.cpp
//   on the ones blendctl itself made).
// The Asio contexts built from these files are in storage/tls_context.h (kept apart
// so that this header does not pull in Boost).
#pragma once

#include <string>
#include <vector>

namespace bs::tls {

// A member's TLS files (PEM paths). All empty: plaintext, which a config must ask for
// by name; partly set is an error (check_files).
struct Files {
  std::string ca;    // the cluster CA's certificate (or a bundle of CAs): a peer must be signed by one
  std::string cert;  // this member's certificate (signed by the CA, naming the member)
  std::string key;   // this member's private key (0600)
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
  bool operator==(const Files&) const = default;
};

// Throws std::runtime_error naming the file and the cause unless all three are set,
// readable and parse, the key is the certificate's, and the CA signed the
// certificate and it is valid now.
void check_files(const Files& f);

// A new CA: an EC P-256 key and a self-signed certificate (CN `name`, CA:TRUE, key
// usage keyCertSign and cRLSign) valid for `days`. The key file is written 0600.
// Throws std::runtime_error if OpenSSL or a file write fails.
void make_ca(const std::string& name, const std::string& cert_path, const std::string& key_path, int days = 3650);

// A member's key and certificate signed by the CA: subject CN `name`; subjectAltName
// DNS:`name` and, for each of `hosts`, IP:host (an address) or DNS:host (a name);
// key usage digitalSignature, extended key usage serverAuth and clientAuth (a member
// is both). The key file is written 0600. Throws std::runtime_error.
void issue_member(const std::string& ca_cert_path, const std::string& ca_key_path, const std::string& name,
                  const std::vector<std::string>& hosts, const std::string& cert_path, const std::string& key_path,
                  int days = 825);

// The subject common name of the PEM certificate at `path` ("" if unreadable): for
// messages and tests.
std::string common_name(const std::string& cert_path);

}  // namespace bs::tls
