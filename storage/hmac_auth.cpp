#include "storage/hmac_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <stdexcept>
#include <vector>

namespace bs::remote {

namespace {

Proof proof(std::string_view label, std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  if (secret.size() > INT_MAX) throw std::invalid_argument("cluster secret too long");
  std::vector<uint8_t> msg;
  msg.reserve(label.size() + 1 + 2 * kNonceBytes);
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(0);  // the label ends here, whatever it is
  msg.insert(msg.end(), server_nonce.begin(), server_nonce.end());
  msg.insert(msg.end(), client_nonce.begin(), client_nonce.end());
  Proof out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(), &len) ||
      len != out.size())
    throw std::runtime_error("HMAC-SHA256 failed");
  return out;
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("RAND_bytes failed");
  return n;
}

Proof client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("blendserve-remote-v1 client", secret, server_nonce, client_nonce);
}

Proof server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("blendserve-remote-v1 server", secret, server_nonce, client_nonce);
}

bool proofs_equal(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace bs::remote
