// The byte-level pieces of the tokenizers (model/tokenizer.cpp): UTF-8 decoding that
// never throws, the code point classes llama.cpp's pre-tokenizers use (\p{L}, \p{N},
// \s from ICU), GPT-2's byte <-> code point mapping, and the hand-written
// pre-tokenizers: state machines equivalent to the regexes llama.cpp uses for the
// common "pre" types (its unicode_regex_split fast paths). The rarer pre-tokenizers
// run their regexes with ICU (model/pre_tokenizer_regex.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bs::byte_level {

// ---- UTF-8 -------------------------------------------------------------------------

enum class U8 { Ok, Truncated, Invalid };

// Examines the sequence starting at p[0] (n >= 1 bytes available).
// Ok: *len bytes form a valid scalar value *cp. Truncated: all n bytes are a valid
// but incomplete prefix. Invalid: *len (>= 1) bytes form the maximal ill-formed
// subpart (Unicode "best practice" for U+FFFD substitution).
U8 utf8_next(const unsigned char* p, size_t n, size_t* len, uint32_t* cp);
void append_utf8(std::string& out, uint32_t cp);

inline constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
inline constexpr char kSpmSpace[] = "\xE2\x96\x81";     // U+2581, SentencePiece's space

// ---- code point classes (llama.cpp's codepoint flags, reduced) ---------------------

// 0 is reserved for "outside the current segment".
enum : uint8_t {
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 4,   // \s = White_Space
  kOther = 8,   // everything else (punctuation, symbols, marks, controls, unassigned, bad bytes)
};

inline constexpr uint32_t kBadByte = 0x110000;  // cps >= this stand for one invalid input byte

uint8_t classify_slow(uint32_t cp);
const std::array<uint8_t, 128>& ascii_classes();
inline uint8_t classify(uint32_t cp) { return cp < 128 ? ascii_classes()[cp] : classify_slow(cp); }

// ---- GPT-2 byte <-> unicode mapping ----------------------------------------------

struct ByteMap {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 512> cp_to_byte{};  // all mapped cps are < 0x144
  ByteMap();
};
const ByteMap& byte_map();

// ---- pre-tokenizers ------------------------------------------------------------------

enum class PreKind { Gpt2, DigitsGpt2, Llama3, Qwen2 };

// The hand-written pre-tokenizer of a tokenizer.ggml.pre name; throws
// std::invalid_argument naming it when there is none.
PreKind pre_kind_for(const std::string& pre);

// Splits the code points `cps` (with their classes `cls`, [n] each) into pre-tokens:
// `ends` gets the end (a code point index) of each piece, in order; the pieces are
// contiguous and start at 0.
void split(PreKind kind, const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls,
           std::vector<uint32_t>& ends);

}  // namespace bs::byte_level
