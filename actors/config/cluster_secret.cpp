#include "actors/config/cluster_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace bs {

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

std::string hmac_hex(const std::string& secret, const std::string& data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[mac[i] >> 4]);
    hex.push_back(kHex[mac[i] & 15]);
  }
  return hex;
}

}  // namespace

std::string control_proof(const std::string& secret, const std::string& from, const std::string& to, int64_t unix_ms) {
  return hmac_hex(secret, "blendserve-control|" + from + "|" + to + "|" + std::to_string(unix_ms));
}

std::string worker_api_key(const std::string& secret) { return hmac_hex(secret, "blendserve-worker-api-key"); }

bool control_proof_valid(const std::string& secret, const std::string& from, const std::string& to, int64_t unix_ms,
                         const std::string& proof) {
  const int64_t age = unix_ms_now() - unix_ms;
  const int64_t max_age = std::chrono::duration_cast<std::chrono::milliseconds>(kProofMaxAge).count();
  if (age > max_age || age < -max_age) return false;
  const std::string want = control_proof(secret, from, to, unix_ms);
  return proof.size() == want.size() && CRYPTO_memcmp(proof.data(), want.data(), want.size()) == 0;
}

}  // namespace bs
