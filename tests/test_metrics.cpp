// Quality metrics (tools/eval/metrics.h): SQuAD/CacheBlend F1, Rouge-L, KL divergence.
#include "tools/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using bs::blend::first_line;
using bs::blend::kl_divergence;
using bs::blend::max_f1;
using bs::blend::normalize_answer;
using bs::blend::parse_generation;
using bs::blend::porter_stem;
using bs::blend::rouge_l;
using bs::blend::rouge_tokenize;
using bs::blend::token_f1;

// ---- normalize_answer ------------------------------------------------------------------

TEST(NormalizeAnswer, LowerPunctuationArticlesWhitespace) {
  EXPECT_EQ(normalize_answer("The Eiffel tower!"), "eiffel tower");
  EXPECT_EQ(normalize_answer("  The   Velmor\tBridge\n"), "velmor bridge");
  EXPECT_EQ(normalize_answer("An apple and THE theatre, a banana."), "apple and theatre banana");
  // Articles only as whole words; punctuation is deleted (not replaced by a space) first.
  EXPECT_EQ(normalize_answer("theater Anne another"), "theater anne another");
  EXPECT_EQ(normalize_answer("the's"), "thes");
  EXPECT_EQ(normalize_answer("a-an-the"), "aanthe");
  EXPECT_EQ(normalize_answer("A.B."), "ab");
  EXPECT_EQ(normalize_answer("well-known"), "wellknown");
  EXPECT_EQ(normalize_answer("48,200"), "48200");
  EXPECT_EQ(normalize_answer("a an the"), "");
  EXPECT_EQ(normalize_answer(""), "");
  EXPECT_EQ(normalize_answer("!?."), "");
  // All of string.punctuation goes.
  EXPECT_EQ(normalize_answer("x!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~y"), "xy");
}

TEST(NormalizeAnswer, FollowsPythonOnUtf8) {
  // Expected values from the Python function (python3.11).
  EXPECT_EQ(normalize_answer("\xC3\x89" "cole"), "\xC3\xA9" "cole");           // "École" -> "école"
  EXPECT_EQ(normalize_answer("caf\xC3\xA9 a"), "caf\xC3\xA9");              // "café a"
  EXPECT_EQ(normalize_answer("\xC3\xA9" "a"), "\xC3\xA9" "a");              // é is a word char
  EXPECT_EQ(normalize_answer("\xE2\x80\x99" "a"), "\xE2\x80\x99");          // ’ is not
  EXPECT_EQ(normalize_answer("x\xC2\xA0" "the\xE3\x80\x80y"), "x y");       // NBSP, U+3000
  EXPECT_EQ(normalize_answer("\xC4\xB0"), "i\xCC\x87");                     // U+0130
}

// ---- token_f1 --------------------------------------------------------------------------

TEST(TokenF1, ExactAfterNormalization) {
  EXPECT_DOUBLE_EQ(token_f1("The Eiffel tower!", "eiffel tower"), 1.0);
  EXPECT_DOUBLE_EQ(token_f1("the 1873.", "1873"), 1.0);
  EXPECT_DOUBLE_EQ(token_f1("48,200", "48200"), 1.0);
}

TEST(TokenF1, PartialOverlap) {
  // pred {eiffel tower in paris}, gold {eiffel tower}: P = 2/4, R = 1 -> 2/3.
  EXPECT_DOUBLE_EQ(token_f1("Eiffel tower in Paris", "the Eiffel Tower"), 2.0 / 3.0);
  // "a" is an article: pred {b c}, gold {b c d}: P = 1, R = 2/3 -> 0.8.
  EXPECT_DOUBLE_EQ(token_f1("a b c", "b c d"), 0.8);
  // Multiset overlap: pred {paris x3}, gold {paris}: common 1, P = 1/3, R = 1 -> 0.5.
  EXPECT_DOUBLE_EQ(token_f1("paris paris paris", "Paris"), 0.5);
  // pred {1 2 2 3}, gold {2 2 4}: common 2, P = 1/2, R = 2/3 -> 4/7.
  EXPECT_DOUBLE_EQ(token_f1("1 2 2 3", "2 2 4"), 4.0 / 7.0);
  EXPECT_DOUBLE_EQ(token_f1("well-known", "well known"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("Orow", "Orow River"), 2.0 / 3.0);
}

TEST(TokenF1, EmptyIsZero) {
  // Official SQuAD v1.1: no common token -> 0, also when both are empty.
  EXPECT_DOUBLE_EQ(token_f1("", ""), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("the", "a"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("", "paris"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("paris", "..."), 0.0);
}

// ---- first_line / parse_generation / max_f1 (CacheBlend example/utils.py) ---------------

TEST(FirstLine, StripsLeadingNewlinesOnly) {
  EXPECT_EQ(first_line("\n\nParis\nThe capital of France."), "Paris");
  EXPECT_EQ(first_line("Paris"), "Paris");
  EXPECT_EQ(first_line("  Paris\n"), "  Paris");
  EXPECT_EQ(first_line("\n \nParis"), " ");  // s.lstrip('\n'): spaces are not stripped
  EXPECT_EQ(first_line("\r\nParis"), "\r");
  EXPECT_EQ(first_line(""), "");
  EXPECT_EQ(first_line("\n\n\n"), "");
}

TEST(ParseGeneration, YesNoMapping) {
  EXPECT_EQ(parse_generation("Yes, it was."), "Yes");
  EXPECT_EQ(parse_generation("yes"), "Yes");
  EXPECT_EQ(parse_generation("\nYesterday\n"), "Yes");  // startswith("Yes")
  EXPECT_EQ(parse_generation(" Yes"), " Yes");           // leading space: no match
  EXPECT_EQ(parse_generation("No, never"), "No");
  EXPECT_EQ(parse_generation("  nope"), "No");           // first split() word
  EXPECT_EQ(parse_generation("Norwood"), "No");          // the reference's quirk
  EXPECT_EQ(parse_generation("Answer: No"), "Answer: No");
  EXPECT_EQ(parse_generation("\n\n1873\nbecause"), "1873");
  EXPECT_EQ(parse_generation(""), "");                   // Python raises IndexError here
  EXPECT_EQ(parse_generation("   "), "   ");
}

TEST(MaxF1, FirstLineMaxOverGolds) {
  const std::vector<std::string> golds = {"Orow River", "Orow"};
  EXPECT_DOUBLE_EQ(max_f1("\nOrow River\nIt flows north.", golds), 1.0);
  EXPECT_DOUBLE_EQ(max_f1("Orow", golds), 1.0);
  EXPECT_DOUBLE_EQ(max_f1("Orow", {"Orow River"}), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(max_f1("The answer is 1873.", {"1873"}), 0.5);  // {answer is 1873}
  EXPECT_DOUBLE_EQ(max_f1("It is\n1873", {"1873"}), 0.0);          // only the first line counts
  EXPECT_DOUBLE_EQ(max_f1("anything", {}), 0.0);
  EXPECT_DOUBLE_EQ(max_f1("Norwood", {"Norwood"}), 0.0);  // parsed to "No" first
  EXPECT_DOUBLE_EQ(max_f1("no", {"No"}), 1.0);
}

// ---- Rouge-L (rouge_score 0.1.2) -------------------------------------------------------
//
// Reference values from the rouge_score package (0.1.2, nltk 3.10.4):
//   from rouge_score import rouge_scorer
//   for st in (False, True):
//       s = rouge_scorer.RougeScorer(['rougeL'], use_stemmer=st)
//       print(s.score(reference, prediction)['rougeL'].fmeasure)

TEST(RougeL, MatchesRougeScore) {
  struct Case {
    const char* pred;
    const char* ref;
    double plain, stemmed;
  };
  const Case cases[] = {
      {"The cat sat on the mat.", "the cat is on the mat", 0.8333333333333334,
       0.8333333333333334},
      {"In 1873, the Velmor-Bridge was completed!", "The Velmor Bridge was completed in 1873.",
       0.7142857142857143, 0.7142857142857143},
      {"The runners were running quickly to the stations",
       "A runner runs quickly; the station was near.", 0.25, 0.625},
      {"police killed the gunman", "the gunman kill police", 0.5, 0.5},
      {"Hello", "Goodbye world", 0.0, 0.0},
      {"!!! ...", "something", 0.0, 0.0},
      {"\xC3\x9Cn\xC3\xAF" "code caf\xC3\xA9 na\xC3\xAFve", "unicode cafe naive", 0.0, 0.0},
  };
  for (const Case& c : cases) {
    EXPECT_NEAR(rouge_l(c.pred, c.ref), c.plain, 1e-12) << c.pred << " | " << c.ref;
    EXPECT_NEAR(rouge_l(c.pred, c.ref, /*use_stemmer=*/true), c.stemmed, 1e-12)
        << c.pred << " | " << c.ref;
  }
}

TEST(RougeL, HandComputed) {
  EXPECT_DOUBLE_EQ(rouge_l("a b c d", "a b c d"), 1.0);
  // LCS("a c b d", "a b c d") = 3 -> P = R = 3/4.
  EXPECT_DOUBLE_EQ(rouge_l("a c b d", "a b c d"), 0.75);
  // pred 2 tokens, ref 4, LCS 2: P = 1, R = 1/2 -> 2/3.
  EXPECT_DOUBLE_EQ(rouge_l("b d", "a b c d"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(rouge_l("", "a"), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l("", ""), 0.0);
  // F-measure is symmetric in prediction/reference.
  EXPECT_DOUBLE_EQ(rouge_l("x b y d z", "a b c d"), rouge_l("a b c d", "x b y d z"));
}

TEST(RougeL, Tokenizer) {
  EXPECT_EQ(rouge_tokenize("Hello, World! It's 2024."),
            (std::vector<std::string>{"hello", "world", "it", "s", "2024"}));
  EXPECT_EQ(rouge_tokenize("under_score caf\xC3\xA9"),
            (std::vector<std::string>{"under", "score", "caf"}));
  EXPECT_EQ(rouge_tokenize("\xE2\x84\xAA" "elvin"),  // KELVIN SIGN lowercases to 'k'
            (std::vector<std::string>{"kelvin"}));
  // Only tokens longer than 3 characters are stemmed.
  EXPECT_EQ(rouge_tokenize("Running runs ran flies spy", true),
            (std::vector<std::string>{"run", "run", "ran", "fli", "spy"}));
}

TEST(PorterStem, MatchesNltk) {
  // nltk.stem.porter.PorterStemmer().stem(w), nltk 3.10.4.
  const std::pair<const char*, const char*> cases[] = {
      {"caresses", "caress"},   {"ponies", "poni"},          {"ties", "tie"},
      {"feed", "feed"},         {"agreed", "agre"},          {"plastered", "plaster"},
      {"bled", "bled"},         {"motoring", "motor"},       {"sing", "sing"},
      {"conflated", "conflat"}, {"troubled", "troubl"},      {"sized", "size"},
      {"hopping", "hop"},       {"tanned", "tan"},           {"falling", "fall"},
      {"hissing", "hiss"},      {"fizzed", "fizz"},          {"failing", "fail"},
      {"filing", "file"},       {"happy", "happi"},          {"skies", "sky"},
      {"relational", "relat"},  {"conditional", "condit"},   {"rational", "ration"},
      {"valenci", "valenc"},    {"hesitanci", "hesit"},      {"digitizer", "digit"},
      {"radicalli", "radic"},   {"differentli", "differ"},   {"vileli", "vile"},
      {"analogousli", "analog"}, {"vietnamization", "vietnam"}, {"predication", "predic"},
      {"operator", "oper"},     {"feudalism", "feudal"},     {"decisiveness", "decis"},
      {"hopefulness", "hope"},  {"callousness", "callous"},  {"formaliti", "formal"},
      {"sensitiviti", "sensit"}, {"sensibiliti", "sensibl"}, {"triplicate", "triplic"},
      {"formative", "form"},    {"formalize", "formal"},     {"electriciti", "electr"},
      {"electrical", "electr"}, {"goodness", "good"},        {"revival", "reviv"},
      {"allowance", "allow"},   {"inference", "infer"},      {"airliner", "airlin"},
      {"gyroscopic", "gyroscop"}, {"adjustable", "adjust"},  {"defensible", "defens"},
      {"irritant", "irrit"},    {"replacement", "replac"},   {"adjustment", "adjust"},
      {"dependent", "depend"},  {"adoption", "adopt"},       {"homologou", "homolog"},
      {"communism", "commun"},  {"activate", "activ"},       {"angulariti", "angular"},
      {"effective", "effect"},  {"bowdlerize", "bowdler"},   {"probate", "probat"},
      {"rate", "rate"},         {"cease", "ceas"},           {"controll", "control"},
      {"roll", "roll"},         {"dying", "die"},            {"lying", "lie"},
      {"news", "news"},         {"innings", "inning"},       {"generously", "gener"},
      {"quickly", "quickli"},   {"stations", "station"},     {"yyyy", "yyyi"},
      {"enjoy", "enjoy"},       {"tried", "tri"},            {"died", "die"},
      {"lies", "lie"},          {"anthropology", "anthropolog"}, {"biology", "biolog"},
  };
  for (const auto& [word, stem] : cases) EXPECT_EQ(porter_stem(word), stem) << word;
}

// ---- KL divergence ---------------------------------------------------------------------

TEST(KlDivergence, ZeroForIdentical) {
  const std::vector<float> p = {1.5f, -2.0f, 0.25f, 3.0f, -40.0f};
  EXPECT_EQ(kl_divergence(p.data(), p.data(), static_cast<int64_t>(p.size())), 0.0);
}

TEST(KlDivergence, InvariantToLogitShift) {
  // Dyadic logits so that the shifted float logits are exact.
  const std::vector<float> p = {1.0f, 2.0f, 3.0f, 0.5f, -4.25f};
  const std::vector<float> q = {0.375f, -1.0f, 2.0f, 2.0f, 1.125f};
  const double a = kl_divergence(p.data(), q.data(), 5);
  EXPECT_GT(a, 0.0);
  for (float shift_p : {7.0f, -3.0f, 1000.0f}) {
    for (float shift_q : {0.0f, 5.0f, -1000.0f}) {
      std::vector<float> p2 = p, q2 = q;
      for (auto& x : p2) x += shift_p;
      for (auto& x : q2) x += shift_q;
      EXPECT_NEAR(kl_divergence(p2.data(), q2.data(), 5), a, 1e-12) << shift_p << " " << shift_q;
    }
  }
}

TEST(KlDivergence, TwoWayByHand) {
  // P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3).
  const float p[2] = {0.0f, 0.0f};
  const float q[2] = {0.0f, static_cast<float>(std::log(3.0))};
  EXPECT_NEAR(kl_divergence(p, q, 2), 0.5 * std::log(4.0 / 3.0), 1e-7);
  // Not symmetric: KL(Q||P) = 1/4 ln(1/2) + 3/4 ln(3/2).
  EXPECT_NEAR(kl_divergence(q, p, 2), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  // P = softmax(2, 0), Q uniform: KL = ln 2 - H(P).
  const float p2[2] = {2.0f, 0.0f};
  const double a = std::exp(2.0) / (std::exp(2.0) + 1.0), b = 1.0 - a;
  EXPECT_NEAR(kl_divergence(p2, p, 2), std::log(2.0) + a * std::log(a) + b * std::log(b), 1e-12);
}

TEST(KlDivergence, ExtremeLogits) {
  // Q puts (almost) no mass where P has half of it: huge but finite, no overflow in exp.
  const float p[2] = {0.0f, 0.0f};
  const float q[2] = {0.0f, -1e30f};
  const double kl = kl_divergence(p, q, 2);
  EXPECT_TRUE(std::isfinite(kl));
  EXPECT_NEAR(kl / 5e29, 1.0, 1e-6);  // 1/2 (ln 1/2 - 0) + 1/2 (ln 1/2 + 1e30)
  const float q_lowest[2] = {0.0f, std::numeric_limits<float>::lowest()};
  EXPECT_TRUE(std::isfinite(kl_divergence(p, q_lowest, 2)));
  // Large logits: log-sum-exp keeps this stable.
  const float big_p[3] = {1000.0f, 999.0f, -1000.0f};
  const float big_q[3] = {1000.0f, 999.0f, -1000.0f};
  EXPECT_EQ(kl_divergence(big_p, big_q, 3), 0.0);
  // P with a -inf / very negative logit: that term contributes 0, KL = ln 2.
  const float p_inf[2] = {0.0f, -std::numeric_limits<float>::infinity()};
  const float p_neg[2] = {0.0f, -1e30f};
  EXPECT_NEAR(kl_divergence(p_inf, p, 2), std::log(2.0), 1e-12);
  EXPECT_NEAR(kl_divergence(p_neg, p, 2), std::log(2.0), 1e-12);
  // Q == 0 exactly where P > 0: infinite.
  const float q_inf[2] = {0.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_TRUE(std::isinf(kl_divergence(p, q_inf, 2)));
}

TEST(KlDivergence, MatchesDirectSumOnVocab) {
  constexpr int64_t V = 49152;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> p(V), q(V);
  for (int64_t i = 0; i < V; ++i) {
    p[i] = nd(rng);
    q[i] = p[i] + 0.3f * nd(rng);
  }
  long double zp = 0, zq = 0;
  for (int64_t i = 0; i < V; ++i) {
    zp += std::exp(static_cast<long double>(p[i]));
    zq += std::exp(static_cast<long double>(q[i]));
  }
  long double ref = 0;
  for (int64_t i = 0; i < V; ++i) {
    const long double pi = std::exp(static_cast<long double>(p[i])) / zp;
    const long double qi = std::exp(static_cast<long double>(q[i])) / zq;
    ref += pi * std::log(pi / qi);
  }
  const double kl = kl_divergence(p.data(), q.data(), V);
  EXPECT_GT(kl, 0.0);
  EXPECT_NEAR(kl, static_cast<double>(ref), 1e-9 * static_cast<double>(ref) + 1e-12);
}

TEST(KlDivergence, RejectsEmptyVocab) {
  const float x[1] = {0.0f};
  EXPECT_THROW(kl_divergence(x, x, 0), std::invalid_argument);
}

}  // namespace
