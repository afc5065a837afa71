// Answer-quality and fidelity metrics. See metrics.h for what each function mirrors.
//
// References (read, not copied):
//   SQuAD v1.1 evaluate script: normalize_answer, f1_score, metric_max_over_ground_truths.
//   CacheBlend example/utils.py and LMCache benchmarks/rag/utils.py: parse_generation,
//     normalize_answer, compute_f1 (max over answers in example/blend_musique.py),
//     compute_rl (rouge_score, rougeL, use_stemmer=True).
//   rouge_score 0.1.2: tokenize.py (tokenize), rouge_scorer.py (_score_lcs, _lcs_table),
//     scoring.py (fmeasure).
//   nltk 3.x nltk/stem/porter.py, PorterStemmer in NLTK_EXTENSIONS mode.
#include "tools/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include <unicode/utf8.h>

namespace bs::blend {
namespace {

// ---- UTF-8 helpers ---------------------------------------------------------------------

struct CodePoint {
  uint32_t cp;
  size_t len;
};

// Decodes the code point at s[i]. An invalid or truncated sequence yields one byte with
// code point kInvalid (kept as is by lower(), a word character for \b, not a space).
constexpr uint32_t kInvalid = 0xFFFD;

CodePoint decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  size_t len = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return {kInvalid, 1};
  }
  if (i + len > s.size()) return {kInvalid, 1};
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, 1};
  return {cp, len};
}

// Python's str.isspace() (what str.split() with no argument splits on).
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool ascii_alnum(uint32_t cp) {
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9');
}

// Python 3 re \w for str patterns: exact for ASCII, Latin-1, combining marks and the
// General Punctuation block; any other non-ASCII code point counts as a word character.
bool py_word(uint32_t cp) {
  if (cp < 0x80) return ascii_alnum(cp) || cp == '_';
  if (cp <= 0x9F) return false;
  if (cp <= 0xBF) {
    return cp == 0xAA || cp == 0xB2 || cp == 0xB3 || cp == 0xB5 || cp == 0xB9 ||
           cp == 0xBA || cp == 0xBC || cp == 0xBD || cp == 0xBE;
  }
  if (cp == 0xD7 || cp == 0xF7) return false;
  if (cp >= 0x300 && cp <= 0x36F) return false;
  if (cp >= 0x2000 && cp <= 0x206F) return false;
  return !py_space(cp);
}

void encode(uint32_t cp, std::string& out) {
  char buf[U8_MAX_LENGTH];
  int32_t len = 0;
  U8_APPEND_UNSAFE(buf, len, cp);
  out.append(buf, static_cast<size_t>(len));
}

// Python's str.lower() for one code point, exact for ASCII, Latin-1, Latin Extended-A,
// the Greek capitals U+0386..U+03AB and the Cyrillic capitals U+0400..U+04FF except
// U+04C0..U+04CD; any other code point is returned unchanged. (U+0130, whose lower case
// is two code points, is handled by lower().)
uint32_t lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 0x20;
  if (c < 0xC0) return c;
  if (c <= 0xDE) return c == 0xD7 ? c : c + 0x20;
  if (c >= 0x100 && c <= 0x137) return (c % 2 == 0 && c != 0x130) ? c + 1 : c;
  if (c >= 0x139 && c <= 0x148) return c % 2 == 1 ? c + 1 : c;
  if (c >= 0x14A && c <= 0x177) return c % 2 == 0 ? c + 1 : c;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return c % 2 == 1 ? c + 1 : c;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x391 && c <= 0x3AB) return c == 0x3A2 ? c : c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x4FF)) {
    return c % 2 == 0 ? c + 1 : c;
  }
  if (c == 0x212A) return 'k';  // KELVIN SIGN
  return c;
}

// Python's str.lower() (see lower_cp for its reach). Invalid UTF-8 bytes are copied.
std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode(s, i);
    if (c.cp < 0x80) {
      out.push_back(static_cast<char>(lower_cp(c.cp)));
    } else if (c.len == 1) {
      out.push_back(s[i]);  // invalid byte
    } else if (c.cp == 0x130) {
      out += "i\xCC\x87";  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + U+0307
    } else {
      encode(lower_cp(c.cp), out);
    }
    i += c.len;
  }
  return out;
}

// Python's str.split(): maximal runs of non-whitespace code points.
std::vector<std::string_view> py_split(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = std::string_view::npos;
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode(s, i);
    if (py_space(c.cp)) {
      if (start != std::string_view::npos) out.push_back(s.substr(start, i - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = i;
    }
    i += c.len;
  }
  if (start != std::string_view::npos) out.push_back(s.substr(start));
  return out;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// ---- Porter stemmer (nltk PorterStemmer, NLTK_EXTENSIONS) ------------------------------

bool is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// consonant[i] == nltk _is_consonant(word, i): 'y' is a consonant iff it starts the word
// or follows a vowel.
std::vector<bool> consonant_flags(std::string_view w) {
  std::vector<bool> f(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (is_vowel(w[i])) {
      f[i] = false;
    } else if (w[i] == 'y') {
      f[i] = (i == 0) ? true : !f[i - 1];
    } else {
      f[i] = true;
    }
  }
  return f;
}

bool is_consonant(std::string_view w, size_t i) { return consonant_flags(w.substr(0, i + 1))[i]; }

int measure(std::string_view stem) {
  const auto f = consonant_flags(stem);
  int m = 0;
  for (size_t i = 0; i + 1 < f.size(); ++i) m += (!f[i] && f[i + 1]) ? 1 : 0;
  return m;
}

bool contains_vowel(std::string_view stem) {
  const auto f = consonant_flags(stem);
  return std::find(f.begin(), f.end(), false) != f.end();
}

bool ends_double_consonant(std::string_view w) {
  return w.size() >= 2 && w[w.size() - 1] == w[w.size() - 2] && is_consonant(w, w.size() - 1);
}

bool ends_cvc(std::string_view w) {
  const size_t n = w.size();
  if (n >= 3 && is_consonant(w, n - 3) && !is_consonant(w, n - 2) && is_consonant(w, n - 1) &&
      w[n - 1] != 'w' && w[n - 1] != 'x' && w[n - 1] != 'y') {
    return true;
  }
  return n == 2 && !is_consonant(w, 0) && is_consonant(w, 1);
}

using Cond = std::function<bool(std::string_view)>;
struct Rule {
  std::string_view suffix;  // "*d": the word ends in a double consonant
  std::string replacement;
  Cond cond;                // empty: unconditional
};

// nltk _apply_rule_list: the first rule whose suffix matches decides; if its condition
// fails the word is returned unchanged.
std::string apply_rules(const std::string& word, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    if (r.suffix == "*d" && ends_double_consonant(word)) {
      const std::string stem = word.substr(0, word.size() - 2);
      return (!r.cond || r.cond(stem)) ? stem + r.replacement : word;
    }
    if (ends_with(word, r.suffix)) {
      const std::string stem = word.substr(0, word.size() - r.suffix.size());
      return (!r.cond || r.cond(stem)) ? stem + r.replacement : word;
    }
  }
  return word;
}

std::string replace_suffix(const std::string& w, std::string_view suffix, std::string_view rep) {
  return w.substr(0, w.size() - suffix.size()) + std::string(rep);
}

bool positive_measure(std::string_view s) { return measure(s) > 0; }
bool measure_gt1(std::string_view s) { return measure(s) > 1; }

std::string step1a(const std::string& w) {
  if (ends_with(w, "ies") && w.size() == 4) return replace_suffix(w, "ies", "ie");
  return apply_rules(w, {{"sses", "ss", {}}, {"ies", "i", {}}, {"ss", "ss", {}}, {"s", "", {}}});
}

std::string step1b(const std::string& w) {
  if (ends_with(w, "ied")) return replace_suffix(w, "ied", w.size() == 4 ? "ie" : "i");
  if (ends_with(w, "eed")) {
    const std::string stem = replace_suffix(w, "eed", "");
    return measure(stem) > 0 ? stem + "ee" : w;
  }
  std::string inter;
  bool ok = false;
  for (std::string_view suf : {std::string_view("ed"), std::string_view("ing")}) {
    if (ends_with(w, suf)) {
      inter = replace_suffix(w, suf, "");
      if (contains_vowel(inter)) {
        ok = true;
        break;
      }
    }
  }
  if (!ok) return w;
  const char last = inter.back();
  return apply_rules(inter, {
      {"at", "ate", {}},
      {"bl", "ble", {}},
      {"iz", "ize", {}},
      {"*d", std::string(1, last),
       [last](std::string_view) { return last != 'l' && last != 's' && last != 'z'; }},
      {"", "e", [](std::string_view s) { return measure(s) == 1 && ends_cvc(s); }},
  });
}

std::string step1c(const std::string& w) {
  return apply_rules(w, {{"y", "i", [](std::string_view s) {
                            return s.size() > 1 && is_consonant(s, s.size() - 1);
                          }}});
}

std::string step2(const std::string& w) {
  if (ends_with(w, "alli") && positive_measure(replace_suffix(w, "alli", ""))) {
    return step2(replace_suffix(w, "alli", "al"));
  }
  const Cond pm = positive_measure;
  const std::string word = w;
  return apply_rules(w, {
      {"ational", "ate", pm}, {"tional", "tion", pm}, {"enci", "ence", pm},
      {"anci", "ance", pm},   {"izer", "ize", pm},    {"bli", "ble", pm},
      {"alli", "al", pm},     {"entli", "ent", pm},   {"eli", "e", pm},
      {"ousli", "ous", pm},   {"ization", "ize", pm}, {"ation", "ate", pm},
      {"ator", "ate", pm},    {"alism", "al", pm},    {"iveness", "ive", pm},
      {"fulness", "ful", pm}, {"ousness", "ous", pm}, {"aliti", "al", pm},
      {"iviti", "ive", pm},   {"biliti", "ble", pm},  {"fulli", "ful", pm},
      {"logi", "log",
       [word](std::string_view) {
         return positive_measure(std::string_view(word).substr(0, word.size() - 3));
       }},
  });
}

std::string step3(const std::string& w) {
  const Cond pm = positive_measure;
  return apply_rules(w, {{"icate", "ic", pm}, {"ative", "", pm}, {"alize", "al", pm},
                         {"iciti", "ic", pm}, {"ical", "ic", pm}, {"ful", "", pm},
                         {"ness", "", pm}});
}

std::string step4(const std::string& w) {
  const Cond g1 = measure_gt1;
  return apply_rules(w, {
      {"al", "", g1},   {"ance", "", g1}, {"ence", "", g1}, {"er", "", g1},
      {"ic", "", g1},   {"able", "", g1}, {"ible", "", g1}, {"ant", "", g1},
      {"ement", "", g1}, {"ment", "", g1}, {"ent", "", g1},
      {"ion", "",
       [](std::string_view s) {
         return measure(s) > 1 && (s.back() == 's' || s.back() == 't');
       }},
      {"ou", "", g1},   {"ism", "", g1},  {"ate", "", g1},  {"iti", "", g1},
      {"ous", "", g1},  {"ive", "", g1},  {"ize", "", g1},
  });
}

std::string step5a(const std::string& w) {
  if (ends_with(w, "e")) {
    const std::string stem = replace_suffix(w, "e", "");
    const int m = measure(stem);
    if (m > 1) return stem;
    if (m == 1 && !ends_cvc(stem)) return stem;
  }
  return w;
}

std::string step5b(const std::string& w) {
  const std::string word = w;
  return apply_rules(w, {{"ll", "l", [word](std::string_view) {
                            return measure(std::string_view(word).substr(0, word.size() - 1)) > 1;
                          }}});
}

}  // namespace

// ---- SQuAD / CacheBlend F1 -------------------------------------------------------------

std::string normalize_answer(std::string_view s) {
  // lower
  const std::string lowered = lower(s);
  // remove_punc: Python's string.punctuation (ASCII only)
  static constexpr std::string_view kPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  std::string no_punc;
  no_punc.reserve(lowered.size());
  for (char c : lowered) {
    if (kPunct.find(c) == std::string_view::npos) no_punc.push_back(c);
  }
  // remove_articles: \b(a|an|the)\b -> " ", i.e. a maximal run of word characters that
  // equals one of the articles.
  std::string no_art;
  no_art.reserve(no_punc.size());
  const std::string_view np = no_punc;
  for (size_t i = 0; i < np.size();) {
    CodePoint c = decode(np, i);
    if (!py_word(c.cp)) {
      no_art.append(np.substr(i, c.len));
      i += c.len;
      continue;
    }
    size_t j = i;
    while (j < np.size()) {
      c = decode(np, j);
      if (!py_word(c.cp)) break;
      j += c.len;
    }
    const std::string_view word = np.substr(i, j - i);
    if (word == "a" || word == "an" || word == "the") {
      no_art.push_back(' ');
    } else {
      no_art.append(word);
    }
    i = j;
  }
  // white_space_fix
  std::string out;
  for (std::string_view w : py_split(no_art)) {
    if (!out.empty()) out.push_back(' ');
    out.append(w);
  }
  return out;
}

double token_f1(std::string_view prediction, std::string_view gold) {
  const std::string p = normalize_answer(prediction);
  const std::string g = normalize_answer(gold);
  // The normalized strings are single-space separated, so str.split() == split(' ').
  const auto pt = py_split(p);
  const auto gt = py_split(g);
  std::map<std::string_view, int> counts;
  for (auto t : gt) ++counts[t];
  int same = 0;
  for (auto t : pt) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / static_cast<double>(pt.size());
  const double recall = static_cast<double>(same) / static_cast<double>(gt.size());
  return (2.0 * precision * recall) / (precision + recall);
}

std::string first_line(std::string_view generation) {
  size_t start = 0;
  while (start < generation.size() && generation[start] == '\n') ++start;
  const std::string_view rest = generation.substr(start);
  return std::string(rest.substr(0, rest.find('\n')));
}

std::string parse_generation(std::string_view generation) {
  std::string s = first_line(generation);
  if (starts_with(s, "Yes") || starts_with(s, "yes")) return "Yes";
  const auto words = py_split(s);
  if (!words.empty() && (starts_with(words[0], "No") || starts_with(words[0], "no"))) {
    return "No";
  }
  return s;
}

double max_f1(std::string_view prediction, const std::vector<std::string>& golds) {
  const std::string pred = parse_generation(prediction);
  double best = 0.0;
  for (const auto& g : golds) best = std::max(best, token_f1(pred, g));
  return best;
}

// ---- Rouge-L ---------------------------------------------------------------------------

std::string porter_stem(std::string_view word_in) {
  std::string w = lower(word_in);
  static const std::map<std::string_view, std::string_view> kPool = {
      {"sky", "sky"},          {"skies", "sky"},       {"dying", "die"},
      {"lying", "lie"},        {"tying", "tie"},       {"news", "news"},
      {"innings", "inning"},   {"inning", "inning"},   {"outings", "outing"},
      {"outing", "outing"},    {"cannings", "canning"}, {"canning", "canning"},
      {"howe", "howe"},        {"proceed", "proceed"}, {"exceed", "exceed"},
      {"succeed", "succeed"},
  };
  if (auto it = kPool.find(w); it != kPool.end()) return std::string(it->second);
  if (word_in.size() <= 2) return w;
  w = step1a(w);
  w = step1b(w);
  w = step1c(w);
  w = step2(w);
  w = step3(w);
  w = step4(w);
  w = step5a(w);
  w = step5b(w);
  return w;
}

std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer) {
  const std::string low = lower(text);
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    if (use_stemmer && cur.size() > 3) cur = porter_stem(cur);
    if (!cur.empty()) tokens.push_back(std::move(cur));
    cur.clear();
  };
  for (char c : low) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      cur.push_back(c);
    } else {
      flush();
    }
  }
  flush();
  return tokens;
}

double rouge_l(std::string_view prediction, std::string_view reference, bool use_stemmer) {
  const auto pred = rouge_tokenize(prediction, use_stemmer);
  const auto ref = rouge_tokenize(reference, use_stemmer);
  if (pred.empty() || ref.empty()) return 0.0;
  // LCS length, two-row dynamic programme.
  std::vector<int> prev(pred.size() + 1, 0), cur(pred.size() + 1, 0);
  for (size_t i = 1; i <= ref.size(); ++i) {
    for (size_t j = 1; j <= pred.size(); ++j) {
      cur[j] = (ref[i - 1] == pred[j - 1]) ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    }
    std::swap(prev, cur);
  }
  const double lcs = prev[pred.size()];
  const double precision = lcs / static_cast<double>(pred.size());
  const double recall = lcs / static_cast<double>(ref.size());
  return precision + recall > 0 ? 2.0 * precision * recall / (precision + recall) : 0.0;
}

// ---- KL divergence ---------------------------------------------------------------------

double kl_divergence(const float* logits_p, const float* logits_q, int64_t vocab) {
  if (vocab <= 0) throw std::invalid_argument("kl_divergence: vocab must be positive");
  auto lse = [vocab](const float* x) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(x[i]));
    if (!std::isfinite(m)) return m;
    double s = 0.0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(x[i]) - m);
    return m + std::log(s);
  };
  const double lp = lse(logits_p);
  const double lq = lse(logits_q);
  if (!std::isfinite(lp) || !std::isfinite(lq)) return std::numeric_limits<double>::quiet_NaN();
  double kl = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double log_p = static_cast<double>(logits_p[i]) - lp;
    const double p = std::exp(log_p);
    if (p == 0.0) continue;
    const double log_q = static_cast<double>(logits_q[i]) - lq;
    kl += p * (log_p - log_q);
  }
  return std::max(kl, 0.0);
}

}  // namespace bs::blend
