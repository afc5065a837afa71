#include "model/byte_level.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <stdexcept>
#include <unordered_map>

namespace bs::byte_level {

// ---- UTF-8 -------------------------------------------------------------------------

U8 utf8_next(const unsigned char* p, size_t n, size_t* len, uint32_t* cp) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *len = 1;
    *cp = b0;
    return U8::Ok;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  uint32_t c;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *len = 1;
    return U8::Invalid;
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= n) {
      *len = n;
      return U8::Truncated;
    }
    const unsigned char b = p[i];
    if (b < lo || b > hi) {
      *len = static_cast<size_t>(i);
      return U8::Invalid;
    }
    lo = 0x80;
    hi = 0xBF;
    c = (c << 6) | (b & 0x3F);
  }
  *len = static_cast<size_t>(need) + 1;
  *cp = c;
  return U8::Ok;
}

void append_utf8(std::string& out, uint32_t cp) {
  char buf[U8_MAX_LENGTH];
  int32_t len = 0;
  U8_APPEND_UNSAFE(buf, len, cp);
  out.append(buf, static_cast<size_t>(len));
}


// ---- code point classes (llama.cpp's codepoint flags, reduced) ---------------------



uint8_t classify_slow(uint32_t cp) {
  if (cp >= kBadByte) return kOther;
  const UChar32 c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return kSpace;
  const uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return kLetter;
  if (mask & U_GC_N_MASK) return kNumber;
  return kOther;
}

const std::array<uint8_t, 128>& ascii_classes() {
  static const std::array<uint8_t, 128> table = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}


inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// ---- GPT-2 byte <-> unicode mapping ----------------------------------------------

ByteMap::ByteMap() {
    cp_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = direct ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
}

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

PreKind pre_kind_for(const std::string& pre) {
  static const std::unordered_map<std::string, PreKind> kinds = {
      {"default", PreKind::Gpt2},        {"gpt2", PreKind::Gpt2},
      {"gpt-2", PreKind::Gpt2},          {"mpt", PreKind::Gpt2},
      {"olmo", PreKind::Gpt2},           {"jais", PreKind::Gpt2},
      {"smollm", PreKind::DigitsGpt2},   {"starcoder", PreKind::DigitsGpt2},
      {"refact", PreKind::DigitsGpt2},   {"command-r", PreKind::DigitsGpt2},
      {"codeshell", PreKind::DigitsGpt2}, {"exaone", PreKind::DigitsGpt2},
      {"minerva-7b", PreKind::DigitsGpt2},
      {"llama3", PreKind::Llama3},       {"llama-v3", PreKind::Llama3},
      {"llama-bpe", PreKind::Llama3},    {"falcon3", PreKind::Llama3},
      {"dbrx", PreKind::Llama3},         {"smaug-bpe", PreKind::Llama3},
      {"qwen2", PreKind::Qwen2},         {"stablelm2", PreKind::Qwen2},
      {"deepseek-r1-qwen", PreKind::Qwen2}, {"megrez", PreKind::Qwen2},
  };
  auto it = kinds.find(pre);
  if (it == kinds.end()) {
    throw std::invalid_argument("tokenizer: unsupported pre-tokenizer '" + pre + "' (tokenizer.ggml.pre)");
  }
  return it->second;
}

namespace {

// Splits the code points [ini, end) into pre-tokens; emit(end_index) is called with
// the end of each piece (pieces are contiguous and start at ini).
class Splitter {
 public:
  Splitter(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls) : cps_(cps), cls_(cls) {}

  template <class Emit>
  void split(PreKind kind, size_t ini, size_t end, Emit&& emit) const {
    switch (kind) {
      case PreKind::Gpt2:
        gpt2(ini, end, emit);
        break;
      case PreKind::DigitsGpt2: {
        // "\p{N}" first: every number code point is a segment of its own.
        size_t seg = ini;
        for (size_t i = ini; i < end; ++i) {
          if (cls_[i] & kNumber) {
            if (seg < i) gpt2(seg, i, emit);
            emit(i + 1);
            seg = i + 1;
          }
        }
        if (seg < end) gpt2(seg, end, emit);
        break;
      }
      case PreKind::Llama3:
        llama3(ini, end, 3, emit);
        break;
      case PreKind::Qwen2:
        llama3(ini, end, 1, emit);
        break;
    }
  }

 private:
  static constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  template <class Emit>
  void gpt2(size_t ini, size_t end, Emit& emit) const {
    auto cls = [&](size_t p) -> uint8_t { return p < end ? cls_[p] : 0; };
    size_t pos = ini;
    while (pos < end) {
      const uint32_t c = cps_[pos];
      const uint8_t f = cls_[pos];
      if (c == '\'' && pos + 1 < end) {
        const uint32_t n1 = cps_[pos + 1];
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
          pos += 2;
          emit(pos);
          continue;
        }
        if (pos + 2 < end) {
          const uint32_t n2 = cps_[pos + 2];
          if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
            pos += 3;
            emit(pos);
            continue;
          }
        }
      }
      const uint8_t f2 = (c == ' ') ? cls(pos + 1) : f;
      if (f2 & (kLetter | kNumber | kOther)) {  // <space>?\p{L}+ | <space>?\p{N}+ | <space>?[^\s\p{L}\p{N}]+
        pos += (c == ' ');
        while (cls(pos) & f2) ++pos;
        emit(pos);
        continue;
      }
      size_t nws = 0;
      while (cls(pos + nws) & kSpace) ++nws;
      if (nws > 1 && pos + nws < end) {  // \s+(?!\S)
        pos += nws - 1;
        emit(pos);
        continue;
      }
      if (nws > 0) {  // \s+
        pos += nws;
        emit(pos);
        continue;
      }
      emit(++pos);  // unreachable: every in-range code point has a class
    }
  }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  template <class Emit>
  void llama3(size_t ini, size_t end, size_t max_digits, Emit& emit) const {
    auto cls = [&](size_t p) -> uint8_t { return p < end ? cls_[p] : 0; };
    auto cpt = [&](size_t p) -> uint32_t { return p < end ? cps_[p] : kOutOfRange; };
    size_t pos = ini;
    while (pos < end) {
      const uint32_t c = cps_[pos];
      const uint8_t f = cls_[pos];
      if (c == '\'' && pos + 1 < end) {
        const uint32_t n1 = ascii_lower(cps_[pos + 1]);
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
          pos += 2;
          emit(pos);
          continue;
        }
        if (pos + 2 < end) {
          const uint32_t n2 = ascii_lower(cps_[pos + 2]);
          if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
            pos += 3;
            emit(pos);
            continue;
          }
        }
      }
      if (!(c == '\r' || c == '\n' || (f & kNumber))) {
        if ((f & kLetter) || (cls(pos + 1) & kLetter)) {
          ++pos;
          while (cls(pos) & kLetter) ++pos;
          emit(pos);
          continue;
        }
      }
      if (f & kNumber) {
        size_t start = pos;
        while (cls(pos) & kNumber) {
          if (++pos - start >= max_digits) {
            emit(pos);
            start = pos;
          }
        }
        if (pos > start) emit(pos);
        continue;
      }
      const uint8_t f2 = (c == ' ') ? cls(pos + 1) : f;
      if (!(f2 & (kSpace | kLetter | kNumber))) {
        pos += (c == ' ');
        while (cls(pos) & kOther) ++pos;
        while (cpt(pos) == '\r' || cpt(pos) == '\n') ++pos;
        emit(pos);
        continue;
      }
      size_t nws = 0, last_rn = 0;
      while (cls(pos + nws) & kSpace) {
        const uint32_t c2 = cps_[pos + nws];
        if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
        ++nws;
      }
      if (last_rn > 0) {  // \s*[\r\n]+
        pos = last_rn;
        emit(pos);
        continue;
      }
      if (nws > 1 && pos + nws < end) {  // \s+(?!\S)
        pos += nws - 1;
        emit(pos);
        continue;
      }
      if (nws > 0) {
        pos += nws;
        emit(pos);
        continue;
      }
      emit(++pos);
    }
  }

  const std::vector<uint32_t>& cps_;
  const std::vector<uint8_t>& cls_;
};

}  // namespace

void split(PreKind kind, const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls,
           std::vector<uint32_t>& ends) {
  ends.clear();
  Splitter(cps, cls).split(kind, 0, cps.size(), [&](size_t end) { ends.push_back(static_cast<uint32_t>(end)); });
}

}  // namespace bs::byte_level
