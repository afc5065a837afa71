#include "http/cluster_tls.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <stdexcept>

namespace bs::http {

namespace {

// The names a server's clients must carry, kept with its SSL_CTX (ex_data: the
// verify callback is a plain function) and freed with it.
void free_peers(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<std::vector<std::string>*>(ptr);
}
int peers_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, free_peers);
  return index;
}

int verify_member(int preverified, X509_STORE_CTX* store) {
  if (!preverified) return 0;                               // not the CA's, expired, ...
  if (X509_STORE_CTX_get_error_depth(store) > 0) return 1;  // the CA itself
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const auto* peers =
      ssl ? static_cast<const std::vector<std::string>*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), peers_index()))
          : nullptr;
  if (!peers || peers->empty()) return 1;
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  for (const auto& p : *peers)
    if (X509_check_host(cert, p.data(), p.size(), 0, nullptr) == 1) return 1;
  return 0;
}

}  // namespace

std::unique_ptr<httplib::Server> make_member_server(const tls::Files& tls, std::vector<std::string> peers) {
  if (!tls.enabled()) return std::make_unique<httplib::Server>();
  tls::check_files(tls);  // clear messages for missing, mismatched or unsigned files
  // Owned by the server's context once set there (free_peers), else freed here.
  auto names = std::make_unique<std::vector<std::string>>(std::move(peers));
  std::string failure;
  auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
    if (SSL_CTX_set_min_proto_version(&ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_ciphersuites(&ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384") !=
            1 ||
        SSL_CTX_use_certificate_chain_file(&ctx, tls.cert.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(&ctx, tls.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_load_verify_locations(&ctx, tls.ca.c_str(), nullptr) != 1) {
      failure = "cannot set up HTTPS with " + tls.cert + " / " + tls.key + " / " + tls.ca;
      return false;
    }
    if (SSL_CTX_set_ex_data(&ctx, peers_index(), names.get()) != 1) {
      failure = "cannot keep the peers' names";
      return false;
    }
    names.release();
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_member);
    SSL_CTX_set_num_tickets(&ctx, 0);
    return true;
  });
  if (!server->is_valid()) throw std::runtime_error("tls: " + (failure.empty() ? "cannot set up HTTPS" : failure));
  return server;
}

std::unique_ptr<httplib::Client> make_member_client(const std::string& host, int port, const tls::Files& tls,
                                                    const std::string& peer_name) {
  if (!tls.enabled()) return std::make_unique<httplib::Client>(host, port);
  const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  auto c = std::make_unique<httplib::Client>("https://" + where, tls.cert, tls.key);
  if (peer_name.empty()) {
    c->set_ca_cert_path(tls.ca);
    c->enable_server_certificate_verification(true);
    return c;
  }
  // By name: OpenSSL checks the chain and the name during the handshake (a mismatch
  // fails it); httplib's own check, which compares the address, is off.
  // A CA that does not load or a name not set leaves nothing trusted: every
  // handshake fails, which the caller sees as a failed connection.
  SSL_CTX* ctx = c->ssl_context();
  if (!ctx) {  // no context to set: httplib's check by the address, which fails closed
    c->set_ca_cert_path(tls.ca);
    c->enable_server_certificate_verification(true);
    return c;
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (X509_VERIFY_PARAM_set1_host(SSL_CTX_get0_param(ctx), peer_name.c_str(), peer_name.size()) == 1)
    SSL_CTX_load_verify_locations(ctx, tls.ca.c_str(), nullptr);
  c->enable_server_certificate_verification(false);
  return c;
}

}  // namespace bs::http
