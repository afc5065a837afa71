// blendctl eval: RAG quality of each mode on a JSON-lines QA set
// ({"id","documents":[...],"question","answers":[...]}), greedy decoding.
// Per case and mode: token F1 (SQuAD normalisation, first line, max over gold
// answers), first-token KL divergence from `full`, teacher-forced top-1
// agreement with `full` over the first gold answer, and TTFT. One JSON line per
// case and mode, then one summary line per mode.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "blend/blend_engine.h"
#include "storage/memory_store.h"
#include "tools/eval/metrics.h"
#include "model/generate.h"
#include "tools/bench.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;

struct Totals {
  double f1 = 0, kl = 0, agree = 0, ttft = 0, recomputed = 0;
  int cases = 0;
  int forced_cases = 0;  // cases whose answer has tokens (teacher-forced KL and agreement)
};

}  // namespace

int eval_rag(const EvalOptions& opt) {
  std::vector<BlendMode> modes;
  for (const auto& m : opt.modes) modes.push_back(parse_mode(m));
  std::ifstream in(opt.dataset);
  if (!in) throw std::runtime_error("cannot open dataset " + opt.dataset);

  auto backend = kernels::make_cpu_backend();
  const auto precision = kernels::choose_precision(opt.precision, *backend);
  LlamaModel model(opt.model_path, *backend, precision);
  Transformer tf(model);
  MemoryKvStore store(int64_t{16} << 30);
  BlendEngine engine(tf, store);
  const auto& tok = model.tokenizer();
  const int64_t V = model.config().vocab;
  std::map<BlendMode, Totals> totals;

  std::string line;
  int case_no = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (opt.max_cases > 0 && case_no >= opt.skip_cases + opt.max_cases) break;
    if (case_no++ < opt.skip_cases) continue;
    json c = json::parse(line);
    const auto docs = c.at("documents").get<std::vector<std::string>>();
    const auto answers = c.at("answers").get<std::vector<std::string>>();
    const std::string question = c.at("question").get<std::string>();
    if (answers.empty()) throw std::runtime_error("case " + c.value("id", "?") + " has no answers");
    // The CacheBlend evaluation's instructions (blend_musique.py): a fixed system
    // prompt (reused as the exact prefix) and the question after the passages.
    const RagPrompt prompt = assemble_rag_prompt(
        tok, model.chat_template(),
        {{"system", opt.system_prompt}, {"user", opt.question_prefix + question}}, docs);
    engine.warm(prompt);  // cached modes find every chunk in RAM

    // Teacher forcing: the first gold answer (all tokens but its last) appended to
    // the suffix; the last A rows' logits predict the answer's A tokens. An answer
    // that tokenizes to nothing has no teacher-forced fidelity (counted apart).
    RagPrompt forced = prompt;
    const auto answer_ids = tok.encode(answers[0], false);
    const int64_t A = static_cast<int64_t>(answer_ids.size());
    if (A > 0) forced.suffix.insert(forced.suffix.end(), answer_ids.begin(), answer_ids.end() - 1);
    BlendOptions ref_opt;
    ref_opt.mode = BlendMode::Full;
    // Only the logits are kept: the whole prefill result carries the prompt's KV cache.
    const std::vector<float> reference = A > 0 ? engine.prefill(forced, ref_opt, 0, A).logits : std::vector<float>{};

    for (BlendMode mode : modes) {
      BlendOptions o;
      o.mode = mode;
      o.ratio = opt.ratio;
      o.check_layers = opt.check_layers;
      o.schedule = opt.schedule;
      double kl = 0;
      int64_t agree = 0;
      if (A > 0) {
        const std::vector<float> forced_logits =
            mode == BlendMode::Full ? reference : engine.prefill(forced, o, 0, A).logits;
        kl = blend::kl_divergence(reference.data(), forced_logits.data(), V);
        for (int64_t r = 0; r < A; ++r)
          agree += argmax(&reference[r * V], V) == argmax(&forced_logits[r * V], V);
      }

      // TTFT without one-time set-up (a GEMM primitive for a prompt length not seen
      // before): steady-state compute, as in a warm server.
      const double setup0 = backend->setup_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      auto gen = engine.prefill(prompt, o, opt.max_tokens);
      const double setup = backend->setup_seconds() - setup0;
      const double ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - setup;
      SamplingParams sp;
      sp.max_tokens = opt.max_tokens;
      const auto out = decode_from(tf, gen.cache, gen.logits, sp);
      const double f1 = blend::max_f1(out.text, answers);

      auto& t = totals[mode];
      t.f1 += f1;
      if (A > 0) {
        t.kl += kl;
        t.agree += static_cast<double>(agree) / static_cast<double>(A);
        ++t.forced_cases;
      }
      t.ttft += ttft;
      t.recomputed += static_cast<double>(gen.stats.recomputed_tokens);
      ++t.cases;
      if (opt.print_cases) {
        std::printf("%s\n", json{{"id", c.value("id", std::to_string(case_no))},
                                 {"mode", mode_name(mode)},
                                 {"f1", f1},
                                 {"first_token_kl", A > 0 ? json(kl) : json(nullptr)},
                                 {"top1_agreement", A > 0 ? json(static_cast<double>(agree) / A) : json(nullptr)},
                                 {"ttft_s", ttft},
                                 {"setup_s_excluded", setup},
                                 {"prompt_tokens", gen.stats.prompt_tokens},
                                 {"recomputed_tokens", gen.stats.recomputed_tokens},
                                 {"output", out.text}}
                                .dump(-1, ' ', false, json::error_handler_t::replace)
                                .c_str());
        std::fflush(stdout);
      }
    }
  }
  for (BlendMode mode : modes) {
    const auto& t = totals[mode];
    if (t.cases == 0) continue;
    json s = {{"summary", true},
              {"isa", backend->kernel_id()},
              {"precision", kernels::precision_name(precision)},
              {"mode", mode_name(mode)},
              {"cases", t.cases},
              {"f1", t.f1 / t.cases},
              {"first_token_kl", t.forced_cases ? t.kl / t.forced_cases : 0.0},
              {"top1_agreement", t.forced_cases ? t.agree / t.forced_cases : 0.0},
              {"teacher_forced_cases", t.forced_cases},
              {"ttft_s", t.ttft / t.cases},
              {"recomputed_tokens", t.recomputed / t.cases}};
    if (mode == BlendMode::Blend) {
      s["ratio"] = opt.ratio;
      s["check_layers"] = opt.check_layers;
    }
    std::printf("%s\n", s.dump().c_str());
  }
  return 0;
}

}  // namespace bs::tools
