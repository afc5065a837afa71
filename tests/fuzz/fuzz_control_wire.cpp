// libFuzzer target for the control plane's messages (actors/cluster/control_wire.h): any
// bytes, read as a member would read a request and as the frontend reads a reply,
// must decode into a value or be refused (nullopt with a reason) — never crash,
// hang or throw. Whatever decodes must encode and decode again to the same value,
// and a decoded report's holdings must apply to the frontend's set (or be refused)
// without breaking its order.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "actors/cluster/control_wire.h"

namespace {

bool same(const bs::NodeReport& a, const bs::NodeReport& b) {
  return a.node == b.node && a.role == b.role && a.in_flight == b.in_flight && a.queued == b.queued &&
         a.max_requests == b.max_requests && a.max_queue == b.max_queue && a.fingerprint == b.fingerprint &&
         a.prelude == b.prelude && a.uses_storage == b.uses_storage && a.chunks_held == b.chunks_held &&
         a.store_bytes == b.store_bytes && a.store_entries == b.store_entries && a.store_budget == b.store_budget &&
         a.holdings.epoch == b.holdings.epoch && a.holdings.base == b.holdings.base &&
         a.holdings.version == b.holdings.version && a.holdings.full == b.holdings.full &&
         a.holdings.added == b.holdings.added && a.holdings.removed == b.holdings.removed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string why;
  if (auto req = bs::decode_control_request(bytes, &why)) {
    auto again = bs::decode_control_request(bs::encode_control_request(*req), &why);
    if (!again || again->from != req->from || again->to != req->to || again->unix_ms != req->unix_ms ||
        again->proof != req->proof || again->holdings_epoch != req->holdings_epoch ||
        again->holdings_base != req->holdings_base)
      std::abort();
  } else if (why.empty()) {
    std::abort();  // a refusal says why
  }
  why.clear();
  if (auto rep = bs::decode_report_reply(bytes, &why)) {
    auto again = bs::decode_report_reply(bs::encode_report_reply(*rep), &why);
    if (!again || !same(*again, *rep)) std::abort();
    const bs::HeldKeys none;
    if (auto held = none.apply(rep->holdings)) {
      for (const auto& k : rep->holdings.added)
        if (!held->contains(k)) std::abort();
    }
  } else if (why.empty()) {
    std::abort();
  }
  return 0;
}
