// Mutual authentication of a storage node and a worker that share the cluster
// secret: HMAC-SHA256 challenge-response (OpenSSL libcrypto).
//
// The node sends a fresh random nonce (HELLO); the worker answers with its own
// nonce and client_proof(); the node checks it and answers with server_proof(),
// which the worker checks before it trusts any data. Why this shape:
// - Both nonces in both proofs: neither side can replay a proof recorded from an
//   earlier connection, since the other side's fresh nonce is in it.
// - A distinct label per direction: a node's proof is never a valid worker proof
//   (a reflection attack gets nothing), and the protocol version is in the label.
// - Only proofs cross the wire, never the secret; comparisons are constant-time.
// It authenticates the connection's start only; the data that follows is not
// encrypted or MACed (checksums guard against corruption, not an active attacker
// on the path): run the cluster on a trusted network, or under a TLS tunnel.
#pragma once

#include <string_view>

#include "storage/remote_protocol.h"

namespace bs::remote {

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes); throws std::runtime_error if it fails.
Nonce random_nonce();
// HMAC-SHA256(secret, label || server_nonce || client_nonce), label
// "blendserve-remote-v1 client" (what the worker proves) ...
Proof client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
// ... and "blendserve-remote-v1 server" (what the node proves).
Proof server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
// Constant-time equality (CRYPTO_memcmp).
bool proofs_equal(const Proof& a, const Proof& b);

}  // namespace bs::remote
