// The cluster secret at work outside the data plane (storage/hmac_auth.h has the
// data plane's handshake): the proof every control-plane request carries, and the
// API key the frontend presents to its workers. HMAC-SHA256 (OpenSSL libcrypto);
// plain C++, no CAF, so the cluster config can derive the workers' key too.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace bs {

// A control request older (or further in the future) than this is refused.
inline constexpr std::chrono::seconds kProofMaxAge{60};

// Hex HMAC-SHA256 of "blendserve-control|<from>|<to>|<unix_ms>" under `secret`: a
// proof names its receiver, so one seen on the way to a member opens no other.
// (Under TLS nobody else sees it; in plaintext a replay to the same member within
// kProofMaxAge gets that member's report: plaintext is for trusted networks.)
std::string control_proof(const std::string& secret, const std::string& from, const std::string& to, int64_t unix_ms);
// Whether `proof` is control_proof(secret, from, to, unix_ms) (constant time) and
// unix_ms is within kProofMaxAge of now.
bool control_proof_valid(const std::string& secret, const std::string& from, const std::string& to, int64_t unix_ms,
                         const std::string& proof);
int64_t unix_ms_now();
// The API key a cluster's frontend presents to its workers' OpenAI endpoints (and
// every worker accepts): hex HMAC-SHA256 of a fixed label under the secret, so no
// one without the secret can call a worker directly.
std::string worker_api_key(const std::string& secret);

}  // namespace bs
