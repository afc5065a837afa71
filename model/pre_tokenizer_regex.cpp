#include "model/pre_tokenizer_regex.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <array>
#include <stdexcept>
#include <unordered_map>

namespace bs {

namespace {

// The pre-tokenizers of the Hugging Face tokenizer.json files these vocabularies were
// converted from, step by step: the patterns llama.cpp's src/llama-vocab.cpp lists for
// them (Qwen 3.5's as Hugging Face writes it, where llama.cpp spells out (?i:...)), in
// Hugging Face's steps where llama.cpp's differ (Falcon's, below).
const std::unordered_map<std::string_view, std::vector<RegexSplit>>& kinds() {
  static const std::unordered_map<std::string_view, std::vector<RegexSplit>> table = {
      // DeepSeek LLM: line breaks alone, Latin/Greek/Cyrillic/... letter runs with one
      // leading space, ASCII and full-width punctuation runs, trailing whitespace, CJK
      // runs, digit runs; then ByteLevel without its regex.
      {"deepseek-llm",
       {{R"([\r\n])"},
        {R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
         R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
         R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
         R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
         R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
         R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
         R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
         R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
         R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
         R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
         R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
         R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
         R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)"},
        {R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)"},
        {R"(\s+$)"},
        {R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)"},
        {R"(\p{N}+)"}}},
      // DeepSeek Coder: line breaks alone, letter runs and punctuation runs with one
      // leading whitespace, CJK runs, each digit alone; then ByteLevel without its regex.
      {"deepseek-coder",
       {{R"([\r\n])"},
        {R"(\s?\p{L}+)"},
        {R"(\s?\p{P}+)"},
        {R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)"},
        {R"(\p{N})"}}},
      // Falcon: Punctuation (Contiguous: runs of Unicode punctuation and ASCII
      // punctuation), ByteLevel with GPT-2's regex, then, in ByteLevel's alphabet,
      // Digits (runs of numeric characters) and runs of three ASCII digits. llama.cpp
      // runs the last two on the text instead: llama.cpp's test input "ied 4 ½ months"
      // tells the two apart (½ is the byte-level "Â½", whose "½" is numeric).
      {"falcon",
       {{R"([\p{P}!-/:-@\[-`{-~]+)"},
        {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
        {R"(\p{N}+)", true},
        {R"([0-9][0-9][0-9])", true}}},
      // Qwen 3.5: Qwen2's regex with combining marks joined to letters.
      {"qwen35",
       {{R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
         R"(|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
  };
  return table;
}

// \s and \S as Unicode White_Space (see the header); every other escape as written.
std::string white_space_as_unicode(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char c = pattern[++i];
      if (c == 's')
        out += "\\p{White_Space}";
      else if (c == 'S')
        out += "\\P{White_Space}";
      else
        (out += '\\') += c;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// GPT-2's byte alphabet: byte b's character (model/tokenizer.h byte_level_alphabet()).
const std::array<UChar, 256>& byte_chars() {
  static const std::array<UChar, 256> table = [] {
    std::array<UChar, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(b)] = static_cast<UChar>(direct ? b : 256 + n++);
    }
    return t;
  }();
  return table;
}

}  // namespace

struct RegexPreTokenizer::Step {
  std::unique_ptr<icu::RegexPattern> pattern;
  bool byte_level;
};

const std::vector<RegexSplit>* regex_pre_tokenizer_splits(std::string_view pre) {
  const auto it = kinds().find(pre);
  return it == kinds().end() ? nullptr : &it->second;
}

RegexPreTokenizer::RegexPreTokenizer(const std::vector<RegexSplit>& splits) {
  bool byte_level = false;
  for (const RegexSplit& s : splits) {
    if (byte_level && !s.byte_level)
      throw std::invalid_argument("pre-tokenizer: a text split after a byte-level one: " + s.pattern);
    byte_level = s.byte_level;
    UErrorCode status = U_ZERO_ERROR;
    UParseError where{};
    auto step = std::make_unique<Step>();
    step->pattern.reset(icu::RegexPattern::compile(
        icu::UnicodeString::fromUTF8(white_space_as_unicode(s.pattern)), 0, where, status));
    if (U_FAILURE(status) || !step->pattern)
      throw std::invalid_argument("pre-tokenizer: bad pattern at offset " + std::to_string(where.offset) + " (" +
                                  u_errorName(status) + "): " + s.pattern);
    step->byte_level = s.byte_level;
    steps_.push_back(std::move(step));
  }
}

RegexPreTokenizer::~RegexPreTokenizer() = default;

void RegexPreTokenizer::split(std::string_view text, std::vector<uint32_t>& ends) const {
  ends.clear();
  if (text.empty()) return;
  const auto n = static_cast<int32_t>(text.size());
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());

  // The text as the patterns see it (UTF-16), and where its units are in the bytes.
  thread_local std::vector<UChar> units;
  thread_local std::vector<uint32_t> byte_of_unit;  // [units + 1]
  thread_local std::vector<int32_t> unit_of_byte;   // [n + 1], at character starts
  units.resize(static_cast<size_t>(n) + 1);          // at most one unit a byte
  byte_of_unit.resize(static_cast<size_t>(n) + 1);
  unit_of_byte.resize(static_cast<size_t>(n) + 1);
  int32_t len = 0;
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0) {  // one invalid byte, one U+FFFD
      c = 0xFFFD;
      i = start + 1;
    }
    unit_of_byte[static_cast<size_t>(start)] = len;
    const int32_t at = len;
    U16_APPEND_UNSAFE(units.data(), len, c);
    for (int32_t k = at; k < len; ++k) byte_of_unit[static_cast<size_t>(k)] = static_cast<uint32_t>(start);
  }
  unit_of_byte[static_cast<size_t>(n)] = len;
  byte_of_unit[static_cast<size_t>(len)] = static_cast<uint32_t>(n);
  const icu::UnicodeString u16(false, units.data(), len);  // read-only alias

  // The bytes in GPT-2's alphabet, one unit each (unit index = byte offset), made when
  // a byte-level step first needs them.
  thread_local std::vector<UChar> byte_units;
  icu::UnicodeString bytes;

  thread_local std::vector<uint32_t> next;
  ends.push_back(static_cast<uint32_t>(n));
  for (const auto& step : steps_) {
    UErrorCode status = U_ZERO_ERROR;
    if (step->byte_level && bytes.isEmpty()) {
      byte_units.resize(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) byte_units[static_cast<size_t>(i)] = byte_chars()[p[i]];
      bytes.setTo(false, byte_units.data(), n);  // read-only alias
    }
    const icu::UnicodeString& input = step->byte_level ? bytes : u16;
    std::unique_ptr<icu::RegexMatcher> m(step->pattern->matcher(input, status));
    if (U_FAILURE(status)) throw std::runtime_error(std::string("pre-tokenizer: ") + u_errorName(status));
    auto unit = [&](uint32_t byte) { return step->byte_level ? static_cast<int32_t>(byte) : unit_of_byte[byte]; };
    auto byte = [&](int32_t u) { return step->byte_level ? static_cast<uint32_t>(u) : byte_of_unit[static_cast<size_t>(u)]; };
    next.clear();
    uint32_t from = 0;
    for (const uint32_t to : ends) {
      // The piece alone: opaque, anchoring bounds (ICU's defaults), as Hugging Face
      // matches a piece's own string.
      m->region(unit(from), unit(to), status);
      uint32_t at = from;
      while (m->find(status) && U_SUCCESS(status)) {
        const uint32_t s = byte(m->start(status)), e = byte(m->end(status));
        if (s > at) next.push_back(s);
        if (e > s) next.push_back(e);
        at = e;
      }
      if (U_FAILURE(status)) throw std::runtime_error(std::string("pre-tokenizer: ") + u_errorName(status));
      if (to > at) next.push_back(to);
      from = to;
    }
    ends.swap(next);
  }
}

}  // namespace bs
