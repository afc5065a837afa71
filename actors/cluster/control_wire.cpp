#include "actors/cluster/control_wire.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <stdexcept>

namespace bs {
namespace {

using json = nlohmann::json;

json keys_json(const std::vector<ChunkKey>& keys) {
  json a = json::array();
  for (const auto& k : keys) a.push_back(k.hex());
  return a;
}

// Throws std::invalid_argument on anything but an array of 32-hex-digit strings.
std::vector<ChunkKey> keys_from(const json& a) {
  if (!a.is_array()) throw std::invalid_argument("keys: not an array");
  std::vector<ChunkKey> out;
  out.reserve(a.size());
  for (const auto& v : a) {
    if (!v.is_string()) throw std::invalid_argument("keys: not a string");
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() != 32) throw std::invalid_argument("keys: not 32 hex digits");
    ChunkKey k;
    for (size_t i = 0; i < 32; ++i) {
      const char c = s[i];
      uint64_t d;
      if (c >= '0' && c <= '9') d = static_cast<uint64_t>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<uint64_t>(c - 'a' + 10);
      else throw std::invalid_argument("keys: not 32 hex digits");
      uint64_t& half = i < 16 ? k.hi : k.lo;
      half = half << 4 | d;
    }
    out.push_back(k);
  }
  return out;
}

template <class T>
T field(const json& o, const char* name) {
  const auto it = o.find(name);
  if (it == o.end()) throw std::invalid_argument(std::string("missing \"") + name + "\"");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) throw std::invalid_argument(std::string("\"") + name + "\" is not a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) throw std::invalid_argument(std::string("\"") + name + "\" is not a boolean");
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!it->is_number_unsigned()) throw std::invalid_argument(std::string("\"") + name + "\" is not a count");
  } else {
    if (!it->is_number_integer()) throw std::invalid_argument(std::string("\"") + name + "\" is not an integer");
  }
  return it->get<T>();
}

}  // namespace

std::string encode_control_request(const ControlRequest& r) {
  return json{{"from", r.from},
              {"to", r.to},
              {"unix_ms", r.unix_ms},
              {"proof", r.proof},
              {"holdings_epoch", r.holdings_epoch},
              {"holdings_base", r.holdings_base}}
      .dump();
}

std::optional<ControlRequest> decode_control_request(std::string_view bytes, std::string* why) {
  try {
    const json o = json::parse(bytes);
    if (!o.is_object()) throw std::invalid_argument("not an object");
    ControlRequest r;
    r.from = field<std::string>(o, "from");
    r.to = field<std::string>(o, "to");
    r.unix_ms = field<int64_t>(o, "unix_ms");
    r.proof = field<std::string>(o, "proof");
    r.holdings_epoch = field<uint64_t>(o, "holdings_epoch");
    r.holdings_base = field<uint64_t>(o, "holdings_base");
    return r;
  } catch (const std::exception& e) {  // json::exception, std::invalid_argument
    if (why) *why = std::string("malformed control request: ") + e.what();
    return std::nullopt;
  }
}

std::string encode_report_reply(const NodeReport& r) {
  json rep{{"node", r.node},
           {"role", r.role},
           {"in_flight", r.in_flight},
           {"queued", r.queued},
           {"max_requests", r.max_requests},
           {"max_queue", r.max_queue},
           {"fingerprint", r.fingerprint},
           {"prelude", r.prelude},
           {"uses_storage", r.uses_storage},
           {"chunks_held", r.chunks_held},
           {"store_bytes", r.store_bytes},
           {"store_entries", r.store_entries},
           {"store_budget", r.store_budget},
           {"holdings",
            {{"epoch", r.holdings.epoch},
             {"base", r.holdings.base},
             {"version", r.holdings.version},
             {"full", r.holdings.full},
             {"added", keys_json(r.holdings.added)},
             {"removed", keys_json(r.holdings.removed)}}}};
  return json{{"ok", true}, {"report", std::move(rep)}}.dump();
}

std::string encode_error_reply(const std::string& message) { return json{{"ok", false}, {"error", message}}.dump(); }

std::optional<NodeReport> decode_report_reply(std::string_view bytes, std::string* why) {
  try {
    const json o = json::parse(bytes);
    if (!o.is_object()) throw std::invalid_argument("not an object");
    if (!field<bool>(o, "ok")) {
      const std::string message = field<std::string>(o, "error");
      if (why) *why = message.empty() ? "the member answered an error without a message" : message;
      return std::nullopt;
    }
    const auto it = o.find("report");
    if (it == o.end() || !it->is_object()) throw std::invalid_argument("missing \"report\"");
    const json& p = *it;
    NodeReport r;
    r.node = field<std::string>(p, "node");
    r.role = field<std::string>(p, "role");
    r.in_flight = field<int64_t>(p, "in_flight");
    r.queued = field<int64_t>(p, "queued");
    r.max_requests = field<int64_t>(p, "max_requests");
    r.max_queue = field<int64_t>(p, "max_queue");
    r.fingerprint = field<uint64_t>(p, "fingerprint");
    const auto pre = p.find("prelude");
    if (pre == p.end() || !pre->is_array()) throw std::invalid_argument("missing \"prelude\"");
    for (const auto& t : *pre) {
      if (!t.is_number_integer()) throw std::invalid_argument("\"prelude\": not token ids");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v > INT32_MAX) throw std::invalid_argument("\"prelude\": token id out of range");
      r.prelude.push_back(static_cast<int32_t>(v));
    }
    r.uses_storage = field<bool>(p, "uses_storage");
    r.chunks_held = field<int64_t>(p, "chunks_held");
    r.store_bytes = field<int64_t>(p, "store_bytes");
    r.store_entries = field<int64_t>(p, "store_entries");
    r.store_budget = field<int64_t>(p, "store_budget");
    const auto h = p.find("holdings");
    if (h == p.end() || !h->is_object()) throw std::invalid_argument("missing \"holdings\"");
    r.holdings.epoch = field<uint64_t>(*h, "epoch");
    r.holdings.base = field<uint64_t>(*h, "base");
    r.holdings.version = field<uint64_t>(*h, "version");
    r.holdings.full = field<bool>(*h, "full");
    r.holdings.added = keys_from(h->at("added"));
    r.holdings.removed = keys_from(h->at("removed"));
    return r;
  } catch (const std::exception& e) {
    if (why) *why = std::string("malformed report: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace bs
