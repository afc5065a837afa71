// Answer-quality and fidelity metrics for the RAG evals (tools/eval/eval_rag.cpp): token
// F1 and Rouge-L of an answer against the gold answers, and the KL divergence of a
// mode's logits from a reference's (`full`'s).
//
// F1 mirrors the evaluation code of the original CacheBlend repository
// (github.com/YaoJiayi/CacheBlend, example/utils.py) and its copy in LMCache
// (github.com/LMCache/LMCache, benchmarks/rag/utils.py): the generation is cut to its
// first line (`parse_generation`), both sides get the SQuAD v1.1 `normalize_answer`,
// and the score is the max over the gold answers. Two deliberate differences from
// that code, both towards the official SQuAD v1.1 evaluate script:
//   * tokens are the whitespace-separated words of the normalized text (SQuAD), not
//     the model's subword ids (CacheBlend runs tokenizer.encode() on the normalized
//     strings, so its F1 depends on the tokenizer of the model under test);
//   * F1 is 0 when either side is empty after normalization (SQuAD: no common token
//     -> 0); CacheBlend returns 1 when both are empty.
// Rouge-L mirrors the `rouge_score` package (0.1.2): its tokenizer and the LCS F-measure.
//
// Text handling follows Python 3 str semantics on UTF-8 input: str.lower() is exact for
// ASCII, Latin-1, Latin Extended-A, the Greek and basic Cyrillic capitals, U+0130 and
// U+212A (other code points are left as they are); str.split() whitespace is exact; the
// word characters of regex \b are exact for ASCII, Latin-1, combining marks (U+0300..
// U+036F) and General Punctuation (U+2000..U+206F), any other non-ASCII code point
// counts as a word character. Invalid UTF-8 bytes pass through as non-space word bytes.
// (Checked against the Python code on 7000 random strings/sentence pairs and against
// nltk's PorterStemmer on 8246 English words.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bs::blend {

// SQuAD v1.1 normalize_answer: lower case, drop ASCII punctuation (Python's
// string.punctuation), replace the whole words a|an|the by a space
// (re.sub(r"\b(a|an|the)\b", " ", ...)), collapse whitespace runs to one space, trim.
std::string normalize_answer(std::string_view s);

// SQuAD token F1 of normalize_answer(prediction) vs normalize_answer(gold), split on
// spaces, multiset (Counter) overlap. 0 when no token is shared (so also when either
// side is empty).
double token_f1(std::string_view prediction, std::string_view gold);

// CacheBlend's first line: s.lstrip('\n').split('\n')[0] -- only leading '\n' are
// stripped (not spaces or '\r'), then everything from the next '\n' is dropped.
std::string first_line(std::string_view generation);

// CacheBlend's parse_generation: first_line(), then a line that starts with "Yes" or
// "yes" becomes "Yes", and a line whose first whitespace-separated word starts with
// "No" or "no" becomes "No" (so "Norwood" -> "No": the reference quirk, kept). A blank
// line is returned as is (the Python raises IndexError there).
std::string parse_generation(std::string_view generation);

// CacheBlend's per-example score: max over golds of token_f1(parse_generation(prediction),
// gold). 0 when golds is empty.
double max_f1(std::string_view prediction, const std::vector<std::string>& golds);

// rouge_score's tokenizer: lower case, every run of characters outside [a-z0-9] becomes a
// separator, tokens longer than 3 characters are Porter-stemmed when use_stemmer.
std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer = false);

// NLTK's PorterStemmer (default NLTK_EXTENSIONS mode, nltk 3.x), the stemmer rouge_score
// uses; expects a lower-case ASCII word.
std::string porter_stem(std::string_view word);

// Rouge-L F-measure (beta = 1, LCS over rouge_tokenize tokens), as
// rouge_scorer.RougeScorer(["rougeL"], use_stemmer=...).score(reference, prediction)
// ["rougeL"].fmeasure. 0 when either side has no token. CacheBlend/LMCache's compute_rl
// uses use_stemmer=True.
double rouge_l(std::string_view prediction, std::string_view reference,
               bool use_stemmer = false);

// KL(P || Q) in nats, P = softmax(logits_p) (the reference, e.g. `full`), Q =
// softmax(logits_q). Computed in double with log-sum-exp; terms with P_i == 0 contribute
// 0; +inf when Q_i == 0 (logit -inf) where P_i > 0. Clamped at 0 from below.
// Throws std::invalid_argument when vocab <= 0.
double kl_divergence(const float* logits_p, const float* logits_q, int64_t vocab);

}  // namespace bs::blend
