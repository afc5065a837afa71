// libFuzzer target for what every request's text goes through first, with SmolLM2's
// real tokenizer and chat template (model/tokenizer.h): any bytes — invalid UTF-8,
// control tokens written in the text, NULs, inputs up to -max_len (16 KiB in
// tools/ci/fuzz_text_input.sh; -timeout catches a tokenizer that turns superlinear; two
// 256 KiB texts are checked once at start) —
// must tokenize to ids inside the vocabulary that decode back to the text less the
// bytes the vocabulary has no token for, the
// streaming decoder must release only valid UTF-8 (the same text when it is valid),
// and a conversation cut from the input at NUL bytes must render with
// every message's content in it and the generation prompt at its end. The same bytes
// through Gemma 3's SentencePiece vocabulary (byte tokens for every byte, no space
// prefix) give ids in the vocabulary, and valid UTF-8 comes back exactly, but for
// U+2581, which SentencePiece spells a space with. And through a tokenizer.json's
// SentencePiece BPE merged by its merge list (Llama 2's vocabulary in transformers'
// Metaspace layout, tests/fixtures/spm_tokenizer_json): valid UTF-8 comes back with the
// one space Metaspace puts in front (none before a space, none for a continuation).
// Never a crash or a throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "model/gguf.h"
#include "model/chat_template.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"

namespace {

struct Shared {
  bs::gguf::GgufFile file;
  bs::Tokenizer tok;
  bs::ChatTemplate tmpl;
  bool has_byte[256] = {};  // the vocabulary has a token for this byte alone
};
Shared* shared = nullptr;
bs::Tokenizer* spm = nullptr;  // Gemma 3's
bs::Tokenizer* by_rank = nullptr;  // a tokenizer.json's SentencePiece BPE (Llama 2's vocabulary)

// RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// What a SentencePiece vocabulary gives back for `text`: U+2581 as a space.
std::string spm_round_trip(std::string text) {
  for (size_t at = text.find("\xE2\x96\x81"); at != std::string::npos; at = text.find("\xE2\x96\x81", at + 1))
    text.replace(at, 3, " ");
  return text;
}

// Valid UTF-8 comes back exactly (U+2581 as a space). Invalid UTF-8 still gives ids in
// the vocabulary, but not always its bytes back: as llama.cpp, a lead byte takes the
// bytes after it into its character whatever they are, and may cut an escaped space
// (U+2581) in two, whose bytes then come back as byte tokens.
void check_spm(const std::string& text) {
  const auto ids = spm->encode(text, false);
  for (int32_t id : ids)
    if (id < 0 || id >= spm->vocab_size()) std::abort();
  if (ids.size() > 3 * text.size()) std::abort();  // a byte, or an escaped space's three
  const std::string back = spm->decode(ids);
  if (valid_utf8(text) && back != spm_round_trip(text)) std::abort();
  for (int32_t id : spm->encode(text, true))
    if (id < 0 || id >= spm->vocab_size()) std::abort();
}

// The tokenizer.json SentencePiece: ids in the vocabulary (which has a byte token for
// every byte), valid UTF-8 back with Metaspace's one leading space.
void check_by_rank(const std::string& text) {
  for (bool start : {true, false}) {
    const auto ids = start ? by_rank->encode(text, false) : by_rank->encode_continuation(text, false);
    for (int32_t id : ids)
      if (id < 0 || id >= by_rank->vocab_size()) std::abort();
    if (!valid_utf8(text)) continue;
    const bool prefix = start && !text.empty() && text.front() != ' ';
    if (by_rank->decode(ids) != (prefix ? " " : "") + spm_round_trip(text)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string path = BLENDSERVE_DEFAULT_MODEL;
  if (!std::filesystem::exists(path)) std::abort();  // run tools/setup.sh first
  auto f = bs::gguf::GgufFile::open(path);
  auto tok = bs::Tokenizer::from_gguf(f);
  auto tmpl = bs::ChatTemplate::from_gguf(f, tok);
  shared = new Shared{std::move(f), std::move(tok), std::move(tmpl)};
  for (int b = 0; b < 256; ++b) shared->has_byte[b] = shared->tok.token_id(std::string(1, static_cast<char>(b))) >= 0;
  if (!std::filesystem::exists(BLENDSERVE_GEMMA3_MODEL)) std::abort();  // tools/setup.sh installs it
  spm = new bs::Tokenizer(bs::Tokenizer::from_gguf(bs::gguf::GgufFile::open(BLENDSERVE_GEMMA3_MODEL)));
  {
    const std::filesystem::path fixture = std::filesystem::path(BLENDSERVE_FIXTURES) / "spm_tokenizer_json" / "llama2-metaspace";
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("bs_fuzz_tokenizer_json_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(fixture / "tokenizer_config.json", dir / "tokenizer_config.json");
    const std::string cmd =
        "gzip -dc '" + (fixture / "tokenizer.json.gz").string() + "' > '" + (dir / "tokenizer.json").string() + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    by_rank = new bs::Tokenizer(bs::Tokenizer::from_gguf(bs::open_hf_tokenizer(dir.string())));
    std::filesystem::remove_all(dir);
  }
  // Huge inputs, once per run (the fuzzed ones stay under -max_len for speed): 256 KiB
  // of one letter (the longest pre-tokenizer piece, the merge loop's worst case) and of
  // every byte in turn must encode and come back (less the bytes without a token).
  std::string run(256 << 10, 'a'), bytes;
  for (size_t i = 0; i < (256u << 10); ++i) bytes.push_back(static_cast<char>(i * 131 % 256));
  for (const std::string* t : {&run, &bytes}) {
    std::string kept;
    for (unsigned char b : *t)
      if (shared->has_byte[b]) kept.push_back(static_cast<char>(b));
    if (shared->tok.decode(shared->tok.encode(*t, false)) != kept) std::abort();
    check_spm(*t);
    check_by_rank(*t);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bs::Tokenizer& tok = shared->tok;
  const int32_t vocab = tok.vocab_size();

  const std::vector<int32_t> ids = tok.encode(text, false);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) std::abort();
  if (ids.size() > text.size()) std::abort();  // at most one token per byte
  // Byte-level BPE loses nothing but the bytes the vocabulary has no token for, as
  // llama.cpp: SmolLM2 has none for 0xC0, 0xC1, 0xF5..0xFF (never in valid UTF-8), but
  // none either for six control characters (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D) and the
  // lead bytes 0xF1, 0xF2 (planes 4-11, unassigned in Unicode 15), so even valid text
  // loses those (found by this target).
  std::string kept;
  for (unsigned char b : text)
    if (shared->has_byte[b]) kept.push_back(static_cast<char>(b));
  const std::string back = tok.decode(ids);
  if (back != kept) std::abort();
  // The bound the intake refuses far-too-long prompts by, before encoding, holds for
  // the bytes that are kept (a text of dropped bytes counts them too: refused sooner).
  if (ids.size() < (kept.size() + tok.max_token_bytes() - 1) / tok.max_token_bytes()) std::abort();

  // Streaming: only complete UTF-8 sequences are released (what is not valid becomes
  // U+FFFD), and valid text is released whole.
  bs::StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    if (!valid_utf8(piece)) std::abort();
    streamed += piece;
  }
  const std::string tail = stream.flush();
  if (!valid_utf8(tail)) std::abort();
  streamed += tail;
  if (valid_utf8(back) && streamed != back) std::abort();

  check_spm(text);
  check_by_rank(text);

  // Control tokens written in the text parse to ids in the vocabulary too.
  for (int32_t id : tok.encode(text, true))
    if (id < 0 || id >= vocab) std::abort();

  // A conversation: messages cut at NUL bytes, roles system / user / assistant in
  // turn, the last one the user's.
  std::vector<bs::ChatMessage> messages;
  size_t start = 0;
  static const char* const kRoles[] = {"system", "user", "assistant"};
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == '\0') {
      messages.push_back({kRoles[messages.size() % 3], text.substr(start, i - start)});
      start = i + 1;
    }
  messages.back().role = "user";
  if (!valid_utf8(text)) {  // the template renders valid UTF-8 only: refused, never rendered
    try {
      (void)shared->tmpl.apply(messages, true);
      std::abort();
    } catch (const std::invalid_argument&) {
    }
    return 0;
  }
  const std::string rendered = shared->tmpl.apply(messages, true);
  // The RAG prompt's cut (blend/rag_prompt.h) around the question is the same text.
  const auto cut = shared->tmpl.cut_at_last_message(messages);
  if (cut.before + messages.back().content + cut.after != rendered) std::abort();
  size_t at = 0;
  for (const auto& m : messages) {  // every content, in order
    const size_t found = rendered.find(m.content, at);
    if (found == std::string::npos) std::abort();
    at = found + m.content.size();
  }
  for (int32_t id : tok.encode(rendered, true))
    if (id < 0 || id >= vocab) std::abort();
  return 0;
}
