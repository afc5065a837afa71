// libFuzzer target for the remote-disk tier's frame codec (storage/remote_protocol.h):
// any bytes, read as a stream of frames the way a node or a worker takes them off a
// socket, must decode into values whose fields hold their documented ranges or be
// refused (nullopt) — never crash, hang, overflow or allocate more than the frame
// holds. Whatever decodes must encode back to exactly the same payload (ERROR text
// aside, whose unprintable bytes are replaced on purpose).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "storage/remote_protocol.h"

namespace {

using namespace bs::remote;

void same_payload(const Bytes& frame, std::span<const uint8_t> payload) {
  if (frame.size() != kFrameHeaderBytes + payload.size() ||
      !std::equal(payload.begin(), payload.end(), frame.begin() + kFrameHeaderBytes))
    std::abort();
}

void one_frame(MsgType type, std::span<const uint8_t> p) {
  switch (type) {
    case MsgType::Hello:
      if (auto m = decode_hello(p)) same_payload(encode_hello(*m), p);
      break;
    case MsgType::Auth:
      if (auto m = decode_auth(p)) same_payload(encode_auth(*m), p);
      break;
    case MsgType::AuthOk:
      if (auto m = decode_auth_ok(p)) {
        if (m->budget < 0) std::abort();
        same_payload(encode_auth_ok(*m), p);
      }
      break;
    case MsgType::Open:
    case MsgType::Contains:
    case MsgType::Erase:
      if (auto k = decode_key_msg(p)) same_payload(encode_key_msg(type, *k), p);
      break;
    case MsgType::Entry:
      if (auto m = decode_entry(p)) {
        if (m->n_layers < 1 || m->kv_heads < 1 || m->head_dim < 1 || m->layer_sums.size() != size_t(m->n_layers) ||
            m->layer_bytes() < 0)
          std::abort();
        same_payload(encode_entry(*m), p);
      }
      break;
    case MsgType::Read:
      if (auto m = decode_read(p)) same_payload(encode_read(*m), p);
      break;
    case MsgType::Slice: {
      // The receiver knows the layer size from ENTRY: try the size the length implies
      // and its neighbours.
      const int64_t lb = p.size() >= kSliceHeadBytes ? int64_t(p.size() - kSliceHeadBytes) / 2 : 0;
      for (int64_t n : {lb - 1, lb, lb + 1})
        if (auto s = decode_slice(p, n))
          if (s->k.size() != size_t(n) || s->v.size() != size_t(n) || s->k.data() + n != s->v.data()) std::abort();
      break;
    }
    case MsgType::Close:
      if (auto h = decode_close(p)) same_payload(encode_close(*h), p);
      break;
    case MsgType::Result:
      if (auto r = decode_result(p)) same_payload(encode_result(*r), p);
      break;
    case MsgType::Put:
      if (auto m = decode_put(p)) {
        if (!m->kv || !m->kv->consistent()) std::abort();
        auto again = encode_put(m->key, *m->kv, int64_t{1} << 32);
        if (!again) std::abort();
        same_payload(*again, p);
      }
      break;
    case MsgType::StatsReply:
      if (auto m = decode_stats_reply(p)) same_payload(encode_stats_reply(*m), p);
      break;
    case MsgType::Error:
      if (auto e = decode_error(p)) {
        if (e->size() != p.size()) std::abort();
        for (char c : *e)
          if (c < 0x20 || c > 0x7e) std::abort();
      }
      break;
    case MsgType::NotFound:
    case MsgType::Stats:
    case MsgType::Ping:
    case MsgType::Pong:
      if (decode_empty(p)) same_payload(encode_empty(type), p);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  // Both bounds a reader uses: before authentication and after.
  if (!in.empty() && in[0] == 0xff) (void)decode_frame_header(in.subspan(1), kPreAuthMaxPayload);
  while (in.size() >= kFrameHeaderBytes) {
    const auto h = decode_frame_header(in, int64_t{1} << 24);
    if (!h) break;
    in = in.subspan(kFrameHeaderBytes);
    if (h->length > in.size()) break;
    one_frame(h->type, in.first(h->length));
    in = in.subspan(h->length);
  }
  return 0;
}
