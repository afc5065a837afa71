#include "storage/tls.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace bs::tls {

namespace {

struct Free {
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(ASN1_OCTET_STRING* p) const { ASN1_OCTET_STRING_free(p); }
};
template <class T>
using Owned = std::unique_ptr<T, Free>;

// The newest OpenSSL error, for messages ("" if none).
std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

[[noreturn]] void fail(const std::string& what) {
  const std::string why = openssl_error();
  throw std::runtime_error("tls: " + what + (why.empty() ? "" : ": " + why));
}

Owned<X509> read_cert(const std::string& path) {
  Owned<BIO> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) fail("cannot open the certificate " + path);
  Owned<X509> x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!x) fail(path + " is not a PEM certificate");
  return x;
}

// Every certificate of a PEM file (a CA bundle: the cluster's CA, or during a CA
// change the old and the new one).
std::vector<Owned<X509>> read_certs(const std::string& path) {
  Owned<BIO> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) fail("cannot open the certificate " + path);
  std::vector<Owned<X509>> out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the end of the file reads as an error
  if (out.empty()) fail(path + " is not a PEM certificate");
  return out;
}

Owned<EVP_PKEY> read_key(const std::string& path) {
  Owned<BIO> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) fail("cannot open the private key " + path);
  Owned<EVP_PKEY> k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!k) fail(path + " is not a PEM private key");
  return k;
}

// Written whole or not at all: a temp file beside `path`, renamed over it.
template <class Write>
void write_file(const std::string& path, mode_t mode, Write&& write) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("tls: cannot write " + tmp + ": " + std::strerror(errno));
  ::fchmod(fd, mode);  // an existing temp file keeps its mode otherwise
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    throw std::runtime_error("tls: cannot write " + tmp + ": " + std::strerror(errno));
  }
  const bool ok = write(f) == 1;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write " + path);
  }
}

void write_cert(const std::string& path, X509* x) {
  write_file(path, 0644, [x](FILE* f) { return PEM_write_X509(f, x); });
}

void write_key(const std::string& path, EVP_PKEY* k) {
  write_file(path, 0600,
             [k](FILE* f) { return PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr); });
}

Owned<EVP_PKEY> new_key() {
  Owned<EVP_PKEY> k(EVP_EC_gen("P-256"));
  if (!k) fail("cannot make an EC P-256 key");
  return k;
}

// A v3 certificate for `key` named `cn`: a random 128-bit serial, valid from an hour
// ago (members' clocks differ a little) for `days`.
Owned<X509> new_cert(EVP_PKEY* key, const std::string& cn, int days) {
  Owned<X509> x(X509_new());
  if (!x || X509_set_version(x.get(), 2) != 1) fail("cannot make a certificate");
  Owned<BIGNUM> serial(BN_new());
  if (!serial || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(x.get())))
    fail("cannot make a serial number");
  if (!X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600) ||
      !X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(days) * 86400) ||
      X509_set_pubkey(x.get(), key) != 1)
    fail("cannot set the certificate's validity or key");
  X509_NAME* name = X509_get_subject_name(x.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                 -1, 0) != 1)
    fail("cannot name the certificate " + cn);
  return x;
}

void add_ext(X509* x, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, x, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(x, ext.get(), -1) != 1) fail(std::string("cannot add ") + OBJ_nid2sn(nid) + " " + value);
}

void check_days(int days) {
  if (days < 1 || days > 36500) throw std::invalid_argument("tls: validity out of range: " + std::to_string(days));
}

}  // namespace

void check_files(const Files& f) {
  if (f.ca.empty() || f.cert.empty() || f.key.empty())
    throw std::runtime_error("tls: the CA certificate, the member's certificate and its key are all needed (" +
                             std::string(f.ca.empty() ? "ca" : f.cert.empty() ? "cert" : "key") + " is not set)");
  const auto cas = read_certs(f.ca);
  auto cert = read_cert(f.cert);
  auto key = read_key(f.key);
  if (X509_check_private_key(cert.get(), key.get()) != 1) fail(f.key + " is not the key of " + f.cert);
  Owned<X509_STORE> store(X509_STORE_new());
  Owned<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (!store || !ctx) fail("cannot check " + f.cert);
  for (const auto& ca : cas)
    if (X509_STORE_add_cert(store.get(), ca.get()) != 1) fail("cannot check " + f.cert);
  if (X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1) fail("cannot check " + f.cert);
  if (X509_verify_cert(ctx.get()) != 1)
    throw std::runtime_error("tls: " + f.cert + " does not verify against the CA " + f.ca + ": " +
                             X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
}

void make_ca(const std::string& name, const std::string& cert_path, const std::string& key_path, int days) {
  check_days(days);
  auto key = new_key();
  auto x = new_cert(key.get(), name, days);
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(x.get())) != 1) fail("cannot set the CA's issuer");
  add_ext(x.get(), x.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_ext(x.get(), x.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_ext(x.get(), x.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(x.get(), key.get(), EVP_sha256()) <= 0) fail("cannot sign the CA certificate");
  write_key(key_path, key.get());
  write_cert(cert_path, x.get());
}

void issue_member(const std::string& ca_cert_path, const std::string& ca_key_path, const std::string& name,
                  const std::vector<std::string>& hosts, const std::string& cert_path, const std::string& key_path,
                  int days) {
  check_days(days);
  auto ca = read_cert(ca_cert_path);
  auto ca_key = read_key(ca_key_path);
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) fail(ca_key_path + " is not the key of " + ca_cert_path);
  auto key = new_key();
  auto x = new_cert(key.get(), name, days);
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(ca.get())) != 1) fail("cannot set the issuer");
  std::string san = "DNS:" + name;
  for (const auto& h : hosts) {
    if (h.empty() || h == name) continue;
    Owned<ASN1_OCTET_STRING> ip(a2i_IPADDRESS(h.c_str()));
    ERR_clear_error();  // not an address: a name
    san += (ip ? ",IP:" : ",DNS:") + h;
  }
  add_ext(x.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_ext(x.get(), ca.get(), NID_key_usage, "critical,digitalSignature");
  add_ext(x.get(), ca.get(), NID_ext_key_usage, "serverAuth,clientAuth");
  add_ext(x.get(), ca.get(), NID_subject_alt_name, san);
  add_ext(x.get(), ca.get(), NID_subject_key_identifier, "hash");
  add_ext(x.get(), ca.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(x.get(), ca_key.get(), EVP_sha256()) <= 0) fail("cannot sign the certificate of " + name);
  write_key(key_path, key.get());
  write_cert(cert_path, x.get());
}

std::string common_name(const std::string& cert_path) {
  Owned<BIO> bio(BIO_new_file(cert_path.c_str(), "r"));
  Owned<X509> x(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!x) return "";
  char buf[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(x.get()), NID_commonName, buf, sizeof buf) < 0) return "";
  return buf;
}

}  // namespace bs::tls
