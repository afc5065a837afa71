// The control plane's messages on the wire: JSON objects (nlohmann-json), one per
// frame of storage/framed_link.h. Chunk keys are 32 hex digits (ChunkKey::hex).
// Every decoder takes untrusted bytes (a peer may lie or be broken): it returns
// nullopt with the reason for anything malformed, never throws, never trusts a
// size it did not count (fuzzed: tests/fuzz/fuzz_control_wire.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "actors/cluster/cluster_messages.h"

namespace bs {

std::string encode_control_request(const ControlRequest& r);
std::optional<ControlRequest> decode_control_request(std::string_view bytes, std::string* why);

// A member's reply: {"ok": true, "report": {...}} or {"ok": false, "error": "..."}.
std::string encode_report_reply(const NodeReport& r);
std::string encode_error_reply(const std::string& message);
// nullopt with *why: the member's error ("refused: ...") or what was malformed.
std::optional<NodeReport> decode_report_reply(std::string_view bytes, std::string* why);

}  // namespace bs
