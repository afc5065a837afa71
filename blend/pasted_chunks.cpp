#include "blend/pasted_chunks.h"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>

namespace bs {
namespace {

// Rabin-Karp over token ids, modulo 2^64: h(t[0..W)) = sum (t[k] + 1) * B^(W-1-k).
constexpr uint64_t kBase = 0x100000001b3ULL;

uint64_t whole_hash(std::span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
}

}  // namespace

PastedChunkIndex::PastedChunkIndex(int window, int64_t max_tokens) : window_(window), max_tokens_(max_tokens) {
  if (window < 1) throw std::invalid_argument("pasted chunk index: window must be >= 1");
  if (max_tokens < window) throw std::invalid_argument("pasted chunk index: max_tokens must be >= the window");
  for (int k = 1; k < window; ++k) power_ *= kBase;
}

uint64_t PastedChunkIndex::window_hash(const int32_t* t) const {
  uint64_t h = 0;
  for (int k = 0; k < window_; ++k) h = h * kBase + static_cast<uint64_t>(static_cast<uint32_t>(t[k])) + 1;
  return h;
}

void PastedChunkIndex::add(std::span<const int32_t> tokens) {
  const int64_t m = static_cast<int64_t>(tokens.size());
  if (m < window_ || m > max_tokens_) return;  // never findable, or never fits
  const uint64_t whole = whole_hash(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = whole_.find(whole); it != whole_.end() && it->second >= first_serial_) {
    const auto& known = chunks_[it->second - first_serial_];
    if (std::equal(known.begin(), known.end(), tokens.begin(), tokens.end())) return;
  }
  while (held_ + m > max_tokens_) {
    // Forget the oldest: its windows and its whole-hash entry are dropped with it,
    // so the maps stay bounded too.
    const auto& old = chunks_.front();
    held_ -= static_cast<int64_t>(old.size());
    for (size_t o = 0; o + window_ <= old.size(); o += static_cast<size_t>(window_)) {
      auto [b, e] = windows_.equal_range(window_hash(old.data() + o));
      for (auto it = b; it != e;) it = it->second.chunk == first_serial_ ? windows_.erase(it) : std::next(it);
    }
    if (auto it = whole_.find(whole_hash(old)); it != whole_.end() && it->second == first_serial_) whole_.erase(it);
    chunks_.pop_front();
    ++first_serial_;
  }
  const uint32_t serial = first_serial_ + static_cast<uint32_t>(chunks_.size());
  chunks_.emplace_back(tokens.begin(), tokens.end());
  held_ += m;
  const auto& c = chunks_.back();
  for (size_t o = 0; o + window_ <= c.size(); o += static_cast<size_t>(window_))
    windows_.emplace(window_hash(c.data() + o), Place{serial, static_cast<uint32_t>(o)});
  whole_[whole] = serial;
}

size_t PastedChunkIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}
int64_t PastedChunkIndex::tokens_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

std::vector<PastedChunkIndex::Found> PastedChunkIndex::find(const Tokenizer& tok, std::string_view text,
                                                           std::span<const int32_t> ids) const {
  std::vector<Found> out;
  const int64_t n = static_cast<int64_t>(ids.size()), W = window_;
  if (n < W) return out;
  // Byte offset of each token in the text. A tokenizer whose tokens do not spell the
  // text byte for byte (not expected of byte-level BPE) finds nothing: no guessing.
  std::vector<size_t> off(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) off[i + 1] = off[i] + tok.token_bytes(ids[i]).size();
  if (off[n] != text.size()) return out;

  std::lock_guard<std::mutex> lock(mu_);
  if (chunks_.empty()) return out;
  size_t taken = 0;  // bytes of the text before the end of the last chunk found
  int64_t i = 0;
  uint64_t h = window_hash(ids.data());
  while (i + W <= n) {
    bool found = false;
    if (off[i] >= taken) {
      auto [b, e] = windows_.equal_range(h);
      for (auto it = b; it != e && !found; ++it) {
        const Place place = it->second;
        if (place.chunk < first_serial_) continue;
        const auto& c = chunks_[place.chunk - first_serial_];
        if (!std::equal(ids.begin() + i, ids.begin() + i + W, c.begin() + place.offset)) continue;  // collision
        // Back to where the tokens part (the chunk's first token, or an edge that
        // tokenized differently), then onto the text: where the chunk's text must start.
        int64_t a = place.offset, p = i;
        while (a > 0 && p > 0 && ids[p - 1] == c[a - 1]) --a, --p;
        size_t chunk_before = 0, chunk_bytes = 0;
        for (int64_t k = 0; k < static_cast<int64_t>(c.size()); ++k) {
          const size_t len = tok.token_bytes(c[k]).size();
          if (k < a) chunk_before += len;
          chunk_bytes += len;
        }
        if (off[p] < chunk_before) continue;
        const size_t begin = off[p] - chunk_before;
        if (begin < taken || begin + chunk_bytes > text.size()) continue;
        bool same = true;
        for (size_t k = 0, at = begin; k < c.size() && same; ++k) {
          const std::string_view piece = tok.token_bytes(c[k]);
          same = text.compare(at, piece.size(), piece) == 0;
          at += piece.size();
        }
        if (!same) continue;
        out.push_back({begin, begin + chunk_bytes, c});
        taken = begin + chunk_bytes;
        found = true;
      }
    }
    if (found) {
      // On to the first token that starts after the chunk.
      while (i < n && off[i] < taken) ++i;
      if (i + W <= n) h = window_hash(ids.data() + i);
      continue;
    }
    if (i + W < n)
      h = (h - (static_cast<uint64_t>(static_cast<uint32_t>(ids[i])) + 1) * power_) * kBase +
          static_cast<uint64_t>(static_cast<uint32_t>(ids[i + W])) + 1;
    ++i;
  }
  return out;
}

RagPrompt assemble_pasted_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, const PastedChunkIndex& index,
                                 PastedMatch* match, const std::string& tools) {
  if (messages.empty() || (messages.back().role != "user" && messages.back().role != "tool"))
    throw std::invalid_argument("the last message must be the user's question or a tool's result");
  // The prefix and the turn's close as a request with an empty message gets them.
  std::vector<ChatMessage> head = messages;
  const std::string content = std::move(head.back().content);
  head.back().content.clear();
  RagPrompt p = assemble_rag_prompt(tok, tmpl, head, {}, tools);
  const std::vector<int32_t> close = std::move(p.suffix);
  const std::vector<int32_t> ids = tok.encode_continuation(content, false);  // it follows the prefix
  const auto found = index.find(tok, content, ids);
  if (match) {
    *match = PastedMatch{};
    match->message_tokens = static_cast<int64_t>(ids.size());
  }
  if (found.empty()) {
    p.suffix = ids;
  } else {
    size_t cursor = 0;
    for (const auto& f : found) {
      if (f.begin > cursor) p.chunks.push_back(tok.encode_continuation(content.substr(cursor, f.begin - cursor), false));
      p.chunks.push_back(f.tokens);
      cursor = f.end;
      if (match) {
        ++match->chunks_found;
        match->chunk_tokens += static_cast<int64_t>(f.tokens.size());
      }
    }
    p.suffix = tok.encode_continuation(content.substr(cursor), false);
  }
  p.suffix.insert(p.suffix.end(), close.begin(), close.end());
  return p;
}

std::vector<std::string> blank_line_paragraphs(std::string_view text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t cut = text.find("\n\n", at);
    const size_t end = cut == std::string_view::npos ? text.size() : cut;
    if (end > at) out.emplace_back(text.substr(at, end - at));
    if (cut == std::string_view::npos) break;
    at = cut + 2;
  }
  return out;
}

}  // namespace bs
