// Byte-level BPE tokenizer (tokenizer.ggml.model == "gpt2") with llama.cpp's
// pre-tokenizers, SentencePiece BPE ("llama": model/spm_merge.h, steps 1 and 4 below)
// and Unigram ("t5": step 5), special-token partitioning and UTF-8-safe streaming
// decode.
//
// Behaviour follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp), the runtime
// the GGUF files are converted for:
//   1. Special tokens: the text is split on exact occurrences of special-token
//      texts, one token at a time, longest text first (tokenizer_st_partition).
//      Control/unknown tokens only when parse_special; user-defined always
//      (model/special_partition.h).
//   2. Pre-tokenizer: hand-written state machines over code points equivalent to
//      the regexes llama.cpp uses for the "pre" type (its unicode_regex_split
//      fast paths; model/byte_level.h). \s is the Unicode White_Space property,
//      \p{L}/\p{N} are the general categories (from ICU). The rarer
//      pre-tokenizers that are sequences of regexes (DeepSeek, Falcon, Qwen 3.5)
//      run those regexes with ICU (model/pre_tokenizer_regex.h).
//   3. Each piece is mapped to bytes -> GPT-2 byte-level symbols and merged by
//      BPE rank (lowest rank first, leftmost first on ties); with the Llama 3
//      pre-tokenizers a piece that is a token as a whole is that token
//      (ignore_merges). A piece merged once is kept with its tokens
//      (model/word_cache.h): most of a prompt's pieces are met again.
//   4. SentencePiece BPE instead of 2 and 3 (also Gemma 4's "gemma4" BPE, which is
//      one by its merge list): each text fragment gets a leading " "
//      where add_space_prefix says (the input's start, after a special token), its
//      spaces become U+2581, and it is merged by score (llama.cpp's SPM branch of
//      tokenize_impl). Decoding turns U+2581 back into spaces and <0xAB> tokens into
//      their byte. A tokenizer.json's SentencePiece BPE (Hugging Face's BPE with
//      byte_fallback, model/hf_checkpoint.cpp) is merged by its merge list instead,
//      and where a Metaspace pre-tokenizer says so gets the space as Hugging Face's
//      tokenizers put it (TokenizerSpec::space_prefix_first_only, _unless_space).
//   5. SentencePiece Unigram ("t5", model/unigram.h) instead of 2 and 3: spaces and
//      the space prefix as in 4 (a GGUF's as llama.cpp's UGM normalizer puts them),
//      then the pieces of the best segmentation by score.
// Invalid UTF-8 in the input never throws: each offending byte is its own code
// point of the "other" class and is byte-encoded like any other byte. Bytes with
// no token of their own in the vocabulary are dropped, as in llama.cpp.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "model/byte_level.h"
#include "model/gguf.h"
#include "model/pre_tokenizer_regex.h"
#include "model/special_partition.h"
#include "model/spm_merge.h"
#include "model/token_index.h"
#include "model/unigram.h"
#include "model/word_cache.h"

namespace bs {

using namespace byte_level;

namespace {

struct MergeInfo {
  int32_t rank;
  int32_t result;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct PairHash {
  size_t operator()(uint64_t k) const noexcept {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
};

// Scratch buffers for one encode() call.
struct Work {
  struct Sym {
    int32_t id;  // token id; -1: byte without a token; -2: merged away
    int32_t prev, next;
  };
  struct Cand {
    int32_t rank, left, right, lid, rid, result;
  };
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::vector<uint32_t> cps;
  std::vector<uint8_t> cls;
  std::vector<uint32_t> offs;  // byte offset of each code point (+ end)
  std::vector<uint32_t> ends;  // the pre-tokens' ends (code point indices)
};

}  // namespace

// ---- Tokenizer -----------------------------------------------------------------------

struct Tokenizer::Impl {
  TokenizerSpec spec;
  PreKind pre_kind = PreKind::Gpt2;
  TokenTexts texts;                                      // the vocabulary's texts (spec.tokens, then dropped)
  TokenTexts bytes;                                      // raw bytes per token
  std::vector<uint8_t> types;                            // token type per token
  TokenIndex text_to_id;                                 // vocabulary text (texts) -> id
  std::array<int32_t, 256> byte_token{};                 // byte -> token of its byte-level char
  std::unordered_map<uint64_t, MergeInfo, PairHash> merges;
  SpecialPartition specials;                             // control/user-defined/unknown tokens' texts
  size_t max_bytes = 1;                                  // the longest entry of `bytes`
  bool spm = false;                                      // SentencePiece BPE (spec.model "llama")
  std::unique_ptr<UnigramModel> unigram;                 // SentencePiece Unigram (spec.model "t5"), else null
  SpmPairRanks spm_ranks;                                // spec.spm_merge_by_rank: the merges' ranks
  // SentencePiece: the tokens across a word boundary, where few enough to merge word by
  // word (model/spm_merge.h); else the text merges whole.
  std::vector<std::string> spm_boundary;
  bool spm_by_word = false;
  // Pieces merged before (BPE: pre-tokens; SentencePiece: words), kept across calls.
  std::unique_ptr<WordCache> words = std::make_unique<WordCache>();  // a mutex: not movable
  // A pre-token that is a vocabulary entry as a whole is that token, merges or not
  // (Hugging Face's BPE ignore_merges; llama.cpp's for the Llama 3 pre-tokenizers).
  bool ignore_merges = false;
  // The pre-tokenizers written as regex sequences (model/pre_tokenizer_regex.h); null:
  // pre_kind's state machine.
  std::unique_ptr<RegexPreTokenizer> regex_pre;

  bool parse_always(int32_t id) const { return types[id] == 4; }  // user-defined

  void bpe(const unsigned char* s, size_t n, std::vector<int32_t>& out, Work& w) const;
  void encode_fragment(std::string_view text, std::vector<int32_t>& out, Work& w) const;
  void encode_fragment_regex(std::string_view text, std::vector<int32_t>& out, Work& w) const;
  // One pre-token's tokens: from the word cache, as a whole token (ignore_merges), or merged.
  void encode_piece(const unsigned char* s, size_t n, std::vector<int32_t>& out, Work& w, std::string& word) const;
  // encode(); at_start: the text starts the input (Tokenizer::encode_continuation).
  std::vector<int32_t> encode(std::string_view text, bool parse_special, bool at_start) const;
  // SentencePiece BPE of one raw fragment; prefix_space: a " " goes before it.
  void encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  // SentencePiece Unigram of one raw fragment, the same.
  void encode_unigram(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  // Spaces are U+2581 in the vocabulary's texts (SentencePiece BPE and Unigram).
  bool sentencepiece() const { return spm || unigram; }
};

namespace {

std::string decode_token_text(const std::string& text) {
  const ByteMap& bm = byte_map();
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    uint32_t cp;
    if (utf8_next(p + i, text.size() - i, &len, &cp) == U8::Ok) {
      if (cp < bm.cp_to_byte.size() && bm.cp_to_byte[cp] >= 0) {
        out.push_back(static_cast<char>(bm.cp_to_byte[cp]));
      } else {
        out.append(text, i, len);  // not a byte-level symbol: keep as is
      }
      i += len;
    } else {
      out.push_back(text[i]);
      ++i;
    }
  }
  return out;
}

// "<0xAB>" -> 0xAB, for BYTE-type tokens; -1 otherwise.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

}  // namespace

Tokenizer::Tokenizer(TokenizerSpec spec) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (spec.model == "gemma4") {
    // Gemma 4: BPE over the raw UTF-8 text with U+2581 for its spaces and <0xAB> byte
    // tokens, merged by its merge list (llama.cpp's "gemma4"; Hugging Face's BPE with
    // byte_fallback): a SentencePiece BPE by rank, without a space prefix.
    spec.model = "llama";
    spec.spm_merge_by_rank = true;
    spec.add_space_prefix = false;
  }
  if (spec.model != "gpt2" && spec.model != "llama" && spec.model != "t5") {
    // llama.cpp's tokenizer.ggml.model values, named by what they are.
    static const std::unordered_map<std::string, const char*> kinds = {
        {"bert", "WordPiece"}, {"rwkv", "RWKV greedy"},
        {"plamo2", "PLaMo-2 Aho-Corasick"}, {"no_vocab", "no vocabulary"},
    };
    const auto kind = kinds.find(spec.model);
    throw std::invalid_argument("tokenizer: unsupported tokenizer.ggml.model '" + spec.model + "'" +
                                (kind != kinds.end() ? std::string(" (") + kind->second + ")" : std::string()) +
                                "; implemented: byte-level BPE ('gpt2'), SentencePiece BPE ('llama', 'gemma4'), "
                                "SentencePiece Unigram ('t5')");
  }
  m.spm = spec.model == "llama";
  const bool unigram = spec.model == "t5";
  if (unigram && spec.precompiled_charsmap)
    throw std::invalid_argument("tokenizer: SentencePiece's Precompiled normalizer (tokenizer.ggml.precompiled_charsmap, "
                                "a character map: NFKC and more) is not implemented");
  if (m.spm && spec.spm_merge_by_rank) spec.scores.assign(spec.tokens.size(), 0.0);  // unused
  if ((m.spm || unigram) && spec.scores.size() != spec.tokens.size())
    throw std::invalid_argument("tokenizer: a SentencePiece vocabulary needs tokenizer.ggml.scores for every token (" +
                                std::to_string(spec.scores.size()) + " for " + std::to_string(spec.tokens.size()) + ")");
  if (spec.tokens.empty()) throw std::invalid_argument("tokenizer: empty vocabulary");
  if (spec.tokens.size() > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("tokenizer: vocabulary too large");
  if (!spec.token_types.empty() && spec.token_types.size() != spec.tokens.size()) {
    throw std::invalid_argument("tokenizer: token_type has " + std::to_string(spec.token_types.size()) +
                                " entries for " + std::to_string(spec.tokens.size()) + " tokens");
  }
  const auto n = static_cast<int32_t>(spec.tokens.size());
  for (int32_t* id : {&spec.bos_id, &spec.eos_id, &spec.unk_id, &spec.pad_id}) {
    if (*id < -1 || *id >= n) *id = -1;  // out of range ids are treated as absent
  }
  if (!m.spm && !unigram) {
    if (const auto* splits = regex_pre_tokenizer_splits(spec.pre))
      m.regex_pre = std::make_unique<RegexPreTokenizer>(*splits);
    else
      m.pre_kind = pre_kind_for(spec.pre);
  }
  m.ignore_merges = !m.spm && !unigram && (spec.pre == "llama3" || spec.pre == "llama-v3" || spec.pre == "llama-bpe" ||
                               spec.pre == "falcon3");

  m.types.resize(spec.tokens.size());
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const int64_t t = spec.token_types.empty() ? 1 : spec.token_types[i];
    m.types[i] = (t >= 0 && t <= 6) ? static_cast<uint8_t>(t) : 1;
  }

  m.texts = TokenTexts(spec.tokens);
  m.text_to_id.build(m.texts);  // a duplicate text maps to its last id, as in llama.cpp
  auto id_of = [&](std::string_view text) { return m.text_to_id.find(m.texts, text); };
  {
    std::vector<std::string> bytes(spec.tokens.size());
    for (int32_t i = 0; i < n; ++i) {
      const std::string& t = spec.tokens[i];
      const uint8_t ty = m.types[i];
      if (ty == 2 || ty == 3 || ty == 4) {  // unknown, control, user-defined: their text
        bytes[i] = t;
      } else if (ty == 6 && parse_byte_token(t) >= 0) {
        bytes[i] = std::string(1, static_cast<char>(parse_byte_token(t)));
      } else if (m.spm || unigram) {  // U+2581 (3 bytes) stands for a space
        std::string text = t;
        for (size_t at = text.find(kSpmSpace); at != std::string::npos; at = text.find(kSpmSpace, at + 1))
          text.replace(at, 3, " ");
        bytes[i] = std::move(text);
      } else {
        bytes[i] = decode_token_text(t);
      }
      m.max_bytes = std::max(m.max_bytes, bytes[i].size());
    }
    m.bytes = TokenTexts(bytes);
  }

  const ByteMap& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    if (m.spm || unigram) {  // "<0xAB>", else (BPE) the byte itself (llama.cpp's byte_to_token)
      static const char* hex = "0123456789ABCDEF";
      s = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      if (id_of(s) < 0 && m.spm) s = std::string(1, static_cast<char>(b));
    } else {
      append_utf8(s, bm.byte_to_cp[b]);
    }
    m.byte_token[b] = id_of(s);
  }

  if (m.spm && !spec.spm_merge_by_rank) spec.merges.clear();  // merged by score instead
  if (spec.merges.size() > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("tokenizer: too many merges");
  m.merges.reserve(spec.merges.size() * 2);
  int32_t rank = 0;
  for (const std::string& mg : spec.merges) {
    const int32_t r = rank++;
    const size_t sp = mg.find(' ', 1);
    if (sp == std::string::npos) continue;
    const std::string_view left = std::string_view(mg).substr(0, sp), right = std::string_view(mg).substr(sp + 1);
    const int32_t a = id_of(left), b = id_of(right);
    if (a < 0 || b < 0) continue;
    const int32_t res = id_of(std::string(left) + std::string(right));
    if (res < 0) continue;
    m.merges.emplace(pair_key(a, b), MergeInfo{r, res});  // first rank wins
  }

  if (unigram) {  // model/unigram.h: the pieces as the vocabulary's texts, with their scores and types
    std::vector<UnigramModel::Piece> pieces(spec.tokens.size());
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = {m.texts[i], spec.scores[i], m.types[i]};
    m.unigram = std::make_unique<UnigramModel>(
        pieces, spec.unk_id, spec.unigram_hf ? UnigramModel::Rules::HuggingFace : UnigramModel::Rules::LlamaCpp,
        spec.byte_fallback, m.byte_token, m.text_to_id, m.texts);
    spec.scores.clear();  // the model keeps what it needs
    spec.scores.shrink_to_fit();
  }
  if (m.spm) {
    m.spm_boundary = spm_boundary_tokens(spec.tokens);
    m.spm_by_word = m.spm_boundary.size() <= 64;
  }
  if (m.spm) {  // SentencePiece by the merge list: the pairs' ranks and results (model/spm_merge.h)
    m.spm_ranks.reserve(m.merges.size());
    for (const auto& [key, info] : m.merges) m.spm_ranks.emplace(key, SpmMerge{info.rank, info.result});
    m.merges.clear();
  }

  std::vector<int32_t> specials;  // control/user-defined/unknown, longest first (llama.cpp's order)
  for (int32_t i = 0; i < n; ++i) {
    const uint8_t ty = m.types[i];
    if ((ty == 2 || ty == 3 || ty == 4) && !spec.tokens[i].empty()) specials.push_back(i);
  }
  std::stable_sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
    return spec.tokens[a].size() > spec.tokens[b].size();
  });
  std::vector<SpecialPartition::Special> cut;
  for (int32_t id : specials) cut.push_back({spec.tokens[id], id, m.parse_always(id)});
  m.specials = SpecialPartition(std::move(cut));

  m.spec = std::move(spec);
  m.spec.tokens.clear();  // held as m.texts
  m.spec.tokens.shrink_to_fit();
  m.spec.merges.clear();  // folded into m.merges
  m.spec.merges.shrink_to_fit();
  m.spec.token_types.clear();  // folded into m.types
  m.spec.token_types.shrink_to_fit();
}

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& file) {
  TokenizerSpec s;
  if (auto v = file.get_string("tokenizer.ggml.model")) {
    s.model = *v;
  } else {
    throw gguf::GgufError("missing tokenizer.ggml.model");
  }
  if (auto v = file.get_string("tokenizer.ggml.pre")) s.pre = *v;
  const auto* tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) throw gguf::GgufError("missing tokenizer.ggml.tokens");
  s.tokens = *tokens;
  if (const auto* types = file.get_int_array("tokenizer.ggml.token_type")) s.token_types = *types;
  if (const auto* merges = file.get_string_array("tokenizer.ggml.merges")) s.merges = *merges;
  if (const auto* scores = file.get_float_array("tokenizer.ggml.scores"))
    s.scores.assign(scores->begin(), scores->end());
  s.add_space_prefix = s.model != "t5";  // llama.cpp's default: SentencePiece BPE yes, its UGM no
  if (auto v = file.get_bool("tokenizer.ggml.add_space_prefix")) s.add_space_prefix = *v;
  if (auto v = file.get_bool("tokenizer.ggml.remove_extra_whitespaces")) s.remove_extra_whitespaces = *v;
  if (file.has("tokenizer.ggml.precompiled_charsmap")) {
    const auto* map = file.get_int_array("tokenizer.ggml.precompiled_charsmap");
    s.precompiled_charsmap = !map || !map->empty();
  }
  // A tokenizer.json's SentencePiece BPE (model/hf_checkpoint.cpp writes these).
  if (auto v = file.get_bool("blendserve.tokenizer.spm_merge_by_rank")) s.spm_merge_by_rank = *v;
  if (auto v = file.get_bool("blendserve.tokenizer.space_prefix_first_only")) s.space_prefix_first_only = *v;
  if (auto v = file.get_bool("blendserve.tokenizer.space_prefix_unless_space")) s.space_prefix_unless_space = *v;
  // A tokenizer.json's Unigram (model/hf_checkpoint.cpp writes these).
  if (auto v = file.get_bool("blendserve.tokenizer.unigram_hf")) s.unigram_hf = *v;
  if (auto v = file.get_bool("blendserve.tokenizer.byte_fallback")) s.byte_fallback = *v;
  if (auto v = file.get_bool("blendserve.tokenizer.metaspace_split")) s.metaspace_split = *v;
  auto id = [&](const char* key) -> int32_t {
    auto v = file.get_int(key);
    return (v && *v >= 0 && *v <= INT32_MAX) ? static_cast<int32_t>(*v) : -1;
  };
  s.bos_id = id("tokenizer.ggml.bos_token_id");
  s.eos_id = id("tokenizer.ggml.eos_token_id");
  s.unk_id = id("tokenizer.ggml.unknown_token_id");
  s.pad_id = id("tokenizer.ggml.padding_token_id");
  if (s.model == "t5") {  // llama.cpp's defaults for a UGM vocabulary without these keys
    if (!file.has("tokenizer.ggml.eos_token_id")) s.eos_id = 1;
    if (!file.has("tokenizer.ggml.unknown_token_id")) s.unk_id = 2;
    if (!file.has("tokenizer.ggml.padding_token_id")) s.pad_id = 0;
  }
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (const int32_t e = id(key); e >= 0) s.end_ids.push_back(e);
  if (const auto* ends = file.get_int_array("blendserve.eos_token_ids"))
    for (int64_t e : *ends)
      if (e >= 0 && e <= INT32_MAX) s.end_ids.push_back(static_cast<int32_t>(e));
  // llama.cpp's default where the file does not say: SentencePiece and the Llama 3
  // pre-tokenizers add BOS.
  s.add_bos = s.model == "llama" || s.model == "gemma4" || s.pre == "llama3" || s.pre == "llama-v3" ||
              s.pre == "llama-bpe" || s.pre == "falcon3";
  if (auto v = file.get_bool("tokenizer.ggml.add_bos_token")) s.add_bos = *v;
  if (s.model == "gemma4") s.add_bos = true;  // llama.cpp overrides a file's false: Gemma 4 needs its BOS
  return Tokenizer(std::move(s));
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::Impl::bpe(const unsigned char* s, size_t n, std::vector<int32_t>& out, Work& w) const {
  if (n == 1) {
    if (byte_token[s[0]] >= 0) out.push_back(byte_token[s[0]]);
    return;
  }
  auto& syms = w.syms;
  auto& heap = w.heap;
  syms.resize(n);
  for (size_t i = 0; i < n; ++i) {
    syms[i] = {byte_token[s[i]], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  // Min-heap on (rank, left position).
  auto later = [](const Work::Cand& a, const Work::Cand& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  heap.clear();
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t a = syms[l].id, b = syms[r].id;
    if (a < 0 || b < 0) return;
    auto it = merges.find(pair_key(a, b));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, l, r, a, b, it->second.result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 1; i < n; ++i) try_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Work::Cand c = heap.back();
    heap.pop_back();
    Work::Sym& L = syms[c.left];
    if (L.id != c.lid || L.next != c.right || syms[c.right].id != c.rid) continue;  // stale
    Work::Sym& R = syms[c.right];
    L.id = c.result;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.left;
    R.id = -2;
    try_pair(L.prev, c.left);
    try_pair(c.left, L.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) out.push_back(syms[i].id);
  }
}

inline void Tokenizer::Impl::encode_piece(const unsigned char* s, size_t n, std::vector<int32_t>& out, Work& w,
                                          std::string& word) const {
  const std::string_view piece(reinterpret_cast<const char*>(s), n);
  if (n > 1 && words->find(piece, out)) return;
  const size_t at = out.size();
  word.clear();
  if (ignore_merges) {
    for (size_t i = 0; i < n; ++i) append_utf8(word, byte_map().byte_to_cp[s[i]]);
    if (const int32_t id = text_to_id.find(texts, word); id >= 0) out.push_back(id);
  }
  if (out.size() == at) bpe(s, n, out, w);
  if (n > 1) words->add(piece, out.data() + at, out.size() - at);
}

void Tokenizer::Impl::encode_fragment(std::string_view text, std::vector<int32_t>& out, Work& w) const {
  if (text.empty()) return;
  if (regex_pre) {
    encode_fragment_regex(text, out, w);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  w.cps.clear();
  w.cls.clear();
  w.offs.clear();
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp;
    if (utf8_next(p + i, text.size() - i, &len, &cp) != U8::Ok) {
      cp = kBadByte + p[i];
      len = 1;
    }
    w.cps.push_back(cp);
    w.cls.push_back(classify(cp));
    w.offs.push_back(static_cast<uint32_t>(i));
    i += len;
  }
  w.offs.push_back(static_cast<uint32_t>(text.size()));
  split(pre_kind, w.cps, w.cls, w.ends);
  size_t prev = 0;
  std::string word;
  for (const uint32_t end : w.ends) {
    if (end <= prev) continue;
    const unsigned char* s = p + w.offs[prev];
    const size_t n = w.offs[end] - w.offs[prev];
    prev = end;
    encode_piece(s, n, out, w, word);
  }
}

void Tokenizer::Impl::encode_fragment_regex(std::string_view text, std::vector<int32_t>& out, Work& w) const {
  thread_local std::vector<uint32_t> ends;
  regex_pre->split(text, ends);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::string word;
  uint32_t from = 0;
  for (const uint32_t to : ends) {
    encode_piece(p + from, to - from, out, w, word);
    from = to;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  return impl_->encode(text, parse_special, /*at_start=*/true);
}

std::vector<int32_t> Tokenizer::encode_continuation(std::string_view text, bool parse_special) const {
  return impl_->encode(text, parse_special, /*at_start=*/false);
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text, bool parse_special, bool at_start) const {
  std::vector<int32_t> out;
  if (text.empty()) return out;
  if (text.size() > UINT32_MAX) throw std::length_error("tokenizer: text too long");
  out.reserve(text.size() / 3 + 4);
  std::vector<std::pair<size_t, int32_t>> frags;
  specials.split(text, parse_special, frags);
  Work w;
  size_t start = 0;
  bool prev_special = at_start;  // SPM: the text's first fragment gets the space prefix too
  for (const auto& [end, id] : frags) {
    if (id >= 0) {
      out.push_back(id);
      prev_special = true;
    } else if (sentencepiece()) {
      const std::string_view frag = text.substr(start, end - start);
      // llama.cpp: at the input's start and after every special token; a Metaspace
      // pre-tokenizer: only at the input's start ("first"), and not before a space
      // (nor before a U+2581 written in the text: Hugging Face looks after the Replace).
      bool prefix = spec.add_space_prefix && (spec.space_prefix_first_only ? at_start && start == 0 : prev_special);
      if (spec.space_prefix_unless_space && (frag.starts_with(' ') || frag.starts_with(kSpmSpace))) prefix = false;
      if (unigram)
        encode_unigram(frag, prefix, out);
      else
        encode_spm(frag, prefix, out);
      prev_special = false;
    } else {
      encode_fragment(text.substr(start, end - start), out, w);
    }
    start = end;
  }
  return out;
}

// SentencePiece's escaping: every space as U+2581, with one in front for `prefix_space`.
static std::string metaspace_escaped(std::string_view text, bool prefix_space) {
  std::string escaped;
  escaped.reserve(text.size() + text.size() / 2 + 3);
  if (prefix_space) escaped += kSpmSpace;
  for (char c : text) {
    if (c == ' ')
      escaped += kSpmSpace;
    else
      escaped.push_back(c);
  }
  return escaped;
}

void Tokenizer::Impl::encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
  const std::string escaped = metaspace_escaped(text, prefix_space);
  spm_tokenize(escaped, SpmVocab{&text_to_id, &texts, &spec.scores, &byte_token,
                                 spec.spm_merge_by_rank ? &spm_ranks : nullptr, spm_by_word ? &spm_boundary : nullptr,
                                 words.get()},
               out);
}

void Tokenizer::Impl::encode_unigram(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
  std::string escaped;
  if (!spec.unigram_hf) {  // llama.cpp: its normalizer, then the whole fragment
    unigram_normalize_llamacpp(text, prefix_space, spec.remove_extra_whitespaces, escaped);
    unigram->encode(escaped, out);
    return;
  }
  // Hugging Face's Metaspace: spaces as U+2581, the prefix; with split, each word (a
  // U+2581 and what follows it up to the next) alone, as its MergedWithNext split
  // makes them, a word met before looked up (model/word_cache.h).
  escaped = metaspace_escaped(text, prefix_space);
  if (!spec.metaspace_split) {
    unigram->encode(escaped, out);
    return;
  }
  const std::string_view all = escaped;
  for (size_t from = 0; from < all.size();) {
    const size_t to = std::min(all.find(kSpmSpace, from + 1), all.size());
    const std::string_view word = all.substr(from, to - from);
    from = to;
    if (word.size() > 3 && words->find(word, out)) continue;  // 3 bytes: one character
    const size_t at = out.size();
    unigram->encode(word, out);
    if (word.size() > 3) words->add(word, out.data() + at, out.size() - at);
  }
}

size_t Tokenizer::max_token_bytes() const { return impl_->max_bytes; }

size_t Tokenizer::cached_words() const { return impl_->words->size(); }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->bytes.size()) {
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) + " out of range");
  }
  return impl_->bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes.size()); }

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->types.size() && impl_->types[id] == 3;
}

int32_t Tokenizer::bos_id() const { return impl_->spec.bos_id; }
bool Tokenizer::add_bos() const { return impl_->spec.add_bos; }
std::vector<int32_t> Tokenizer::bos_prefix() const {
  if (impl_->spec.add_bos && impl_->spec.bos_id >= 0) return {impl_->spec.bos_id};
  return {};
}
int32_t Tokenizer::eos_id() const { return impl_->spec.eos_id; }
bool Tokenizer::ends_generation(int32_t id) const {
  const auto& ends = impl_->spec.end_ids;
  return id == impl_->spec.eos_id || is_control(id) || std::find(ends.begin(), ends.end(), id) != ends.end();
}

int32_t Tokenizer::token_id(std::string_view text) const {
  if (const int32_t id = impl_->text_to_id.find(impl_->texts, text); id >= 0) return id;
  // Not a vocabulary string: try the vocabulary's form of the raw text (" the" ->
  // "Ġthe", SentencePiece: "▁the").
  std::string encoded;
  for (unsigned char b : text) {
    if (impl_->sentencepiece())
      encoded += b == ' ' ? std::string(kSpmSpace) : std::string(1, static_cast<char>(b));
    else
      append_utf8(encoded, byte_map().byte_to_cp[b]);
  }
  return impl_->text_to_id.find(impl_->texts, encoded);
}

// ---- StreamDecoder -----------------------------------------------------------------

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0, run = 0;  // [run, i) is valid text not yet copied
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    const U8 r = utf8_next(p + i, n - i, &len, &cp);
    if (r == U8::Ok) {
      i += len;
    } else if (r == U8::Truncated) {
      break;  // may complete with the next token
    } else {
      out.append(pending_, run, i - run);
      out += kReplacement;
      i += len;
      run = i;
    }
  }
  out.append(pending_, run, i - run);
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!pending_.empty()) out = kReplacement;  // only an incomplete sequence can be left
  pending_.clear();
  return out;
}

std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) append_utf8(out[static_cast<size_t>(b)], byte_map().byte_to_cp[b]);
  return out;
}

}  // namespace bs
