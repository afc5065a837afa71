// blendctl eval: RAG quality of each mode on a JSON-lines QA set
// ({"id","documents":[...],"question","answers":[...]}), greedy decoding.
// Per case and mode: token F1 (SQuAD normalisation, first line, max over gold
// answers), first-token KL divergence from `full`, teacher-forced top-1
// agreement with `full` over the first gold answer, and TTFT. One JSON line per
// case and mode, then one summary line per mode. The reference `full` always keeps
// K/V in fp32: with --kv-dtype f16/bf16 the metrics measure the half-precision cache
// too (`full` itself then has a KL and an agreement of its own).
//
// `full`'s teacher-forced logits are the reference of every mode. They cost a full
// prefill per case (most of a blend-only run's time on a CPU), so --reference-dir
// keeps what the metrics need of them (the first row, each row's argmax) in files
// named by the model fingerprint, precision, prompt and answer: a later run with
// other blend options reads them instead.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "blend/blend_engine.h"
#include "kernels/kv_view.h"
#include "blend/store_backed_blend.h"
#include "storage/memory_store.h"
#include "tools/eval/metrics.h"
#include "model/generate.h"
#include "tools/bench.h"
#include "tools/progress.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;

struct Totals {
  double f1 = 0, kl = 0, agree = 0, ttft = 0, recomputed = 0;
  int cases = 0;
  int forced_cases = 0;  // cases whose answer has tokens (teacher-forced KL and agreement)
};

// What the metrics need of full's teacher-forced logits: the first row (KL) and
// every row's argmax (agreement).
struct Reference {
  std::vector<float> first;     // [vocab]
  std::vector<int64_t> argmax;  // [answer tokens]
};

int64_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// The reference file of one case: named by everything that determines its content.
std::filesystem::path reference_file(const std::string& dir, uint64_t fingerprint, const std::string& precision,
                                     const std::vector<int32_t>& tokens, int64_t answer_rows) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int32_t t : tokens)
    for (int b = 0; b < 4; ++b) h = (h ^ ((static_cast<uint32_t>(t) >> (8 * b)) & 0xffu)) * 1099511628211ull;
  char name[96];
  std::snprintf(name, sizeof name, "%016llx-%s-%016llx-%lld.ref", static_cast<unsigned long long>(fingerprint),
                precision.c_str(), static_cast<unsigned long long>(h), static_cast<long long>(answer_rows));
  return std::filesystem::path(dir) / name;
}

// Reads a reference file; false if it is missing or does not have the expected size.
bool read_reference(const std::filesystem::path& file, int64_t V, int64_t A, Reference& ref) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return false;
  ref.first.resize(static_cast<size_t>(V));
  ref.argmax.resize(static_cast<size_t>(A));
  f.read(reinterpret_cast<char*>(ref.first.data()), static_cast<std::streamsize>(V * sizeof(float)));
  f.read(reinterpret_cast<char*>(ref.argmax.data()), static_cast<std::streamsize>(A * sizeof(int64_t)));
  return static_cast<bool>(f) && f.peek() == std::ifstream::traits_type::eof();
}

void write_reference(const std::filesystem::path& file, int64_t V, const Reference& ref) {
  std::filesystem::create_directories(file.parent_path());
  const auto tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(ref.first.data()), static_cast<std::streamsize>(V * sizeof(float)));
    f.write(reinterpret_cast<const char*>(ref.argmax.data()),
            static_cast<std::streamsize>(ref.argmax.size() * sizeof(int64_t)));
    if (!f) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, file);  // whole or absent
}

}  // namespace

int eval_rag(const EvalOptions& opt) {
  std::vector<BlendMode> modes;
  for (const auto& m : opt.modes) modes.push_back(parse_mode(m));
  std::ifstream in(opt.dataset);
  if (!in) throw std::runtime_error("cannot open dataset " + opt.dataset);

  auto backend = kernels::make_cpu_backend();
  const auto precision = kernels::choose_precision(opt.precision, *backend);
  kernels::TensorType kv_dtype;
  if (!kernels::kv_dtype_from_name(opt.kv_dtype, kv_dtype))
    throw std::invalid_argument("unknown KV dtype '" + opt.kv_dtype + "' (f32, f16, bf16)");
  LlamaModel model(opt.model_path, *backend, precision, kv_dtype);
  Transformer tf(model);
  MemoryKvStore store(int64_t{16} << 30);
  BlendEngine engine(tf, model.tokenizer().encode(opt.chunk_prelude, true));
  StoreBackedBlend from_store(engine, store);
  // The reference: full prefill with fp32 K/V (the same model and engine when the
  // cache is fp32 already).
  const bool fp32_kv = kv_dtype == kernels::TensorType::F32;
  std::unique_ptr<LlamaModel> ref_model;
  std::unique_ptr<Transformer> ref_tf;
  std::unique_ptr<BlendEngine> ref_engine;
  std::unique_ptr<StoreBackedBlend> ref_blend;
  if (!fp32_kv) {
    ref_model = std::make_unique<LlamaModel>(opt.model_path, *backend, precision, kernels::TensorType::F32);
    ref_tf = std::make_unique<Transformer>(*ref_model);
    ref_engine = std::make_unique<BlendEngine>(*ref_tf, ref_model->tokenizer().encode(opt.chunk_prelude, true));
    ref_blend = std::make_unique<StoreBackedBlend>(*ref_engine, store);
  }
  const LlamaModel& reference_model = fp32_kv ? model : *ref_model;
  StoreBackedBlend& reference_blend = fp32_kv ? from_store : *ref_blend;
  const auto& tok = model.tokenizer();
  const int64_t V = model.config().vocab;
  std::map<BlendMode, Totals> totals;

  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  const int first = std::min<int>(opt.skip_cases, static_cast<int>(lines.size()));
  const int last = opt.max_cases > 0 ? std::min<int>(first + opt.max_cases, static_cast<int>(lines.size()))
                                     : static_cast<int>(lines.size());
  Progress progress("eval cases", last - first);
  BlendOptions blend_opt;
  blend_opt.ratio = opt.ratio;
  blend_opt.check_layers = opt.check_layers;
  blend_opt.schedule = opt.schedule;
  blend_opt.deviation = parse_deviation(opt.deviation);
  blend_opt.quota = parse_quota(opt.quota);
  blend_opt.filtering = parse_filtering(opt.filtering);
  blend_opt.sink_tokens = opt.sink_tokens;
  int reference_hits = 0;

  for (int case_no = first; case_no < last; ++case_no) {
    const std::string& line = lines[static_cast<size_t>(case_no)];
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
    from_store.warm(prompt);  // cached modes find every chunk in RAM

    // Teacher forcing: the first gold answer (all tokens but its last) appended to
    // the suffix; the last A rows' logits predict the answer's A tokens. An answer
    // that tokenizes to nothing has no teacher-forced fidelity (counted apart).
    RagPrompt forced = prompt;
    const auto answer_ids = tok.encode(answers[0], false);
    const int64_t A = static_cast<int64_t>(answer_ids.size());
    if (A > 0) forced.suffix.insert(forced.suffix.end(), answer_ids.begin(), answer_ids.end() - 1);
    BlendOptions ref_opt;
    ref_opt.mode = BlendMode::Full;
    Reference reference;
    if (A > 0) {
      std::filesystem::path file;
      if (!opt.reference_dir.empty())
        file = reference_file(opt.reference_dir, reference_model.fingerprint(), kernels::precision_name(precision),
                              forced.concatenated(), A);
      if (!file.empty() && read_reference(file, V, A, reference)) {
        ++reference_hits;
      } else {
        // Only the logits are kept: the whole prefill result carries the prompt's KV cache.
        const std::vector<float> logits = reference_blend.prefill(forced, ref_opt, 0, A).logits;
        reference.first.assign(logits.begin(), logits.begin() + V);
        reference.argmax.resize(static_cast<size_t>(A));
        for (int64_t r = 0; r < A; ++r) reference.argmax[r] = argmax_row(&logits[r * V], V);
        if (!file.empty()) write_reference(file, V, reference);
      }
    }

    for (BlendMode mode : modes) {
      BlendOptions o = blend_opt;
      o.mode = mode;
      double kl = 0;
      int64_t agree = 0;
      if (A > 0 && mode == BlendMode::Full && fp32_kv) {
        agree = A;  // the reference itself (the forward pass is deterministic)
      } else if (A > 0) {
        const std::vector<float> forced_logits = from_store.prefill(forced, o, 0, A).logits;
        kl = blend::kl_divergence(reference.first.data(), forced_logits.data(), V);
        for (int64_t r = 0; r < A; ++r) agree += reference.argmax[r] == argmax_row(&forced_logits[r * V], V);
      }

      // TTFT without one-time set-up (a GEMM primitive for a prompt length not seen
      // before): steady-state compute, as in a warm server.
      const double setup0 = backend->setup_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      auto gen = from_store.prefill(prompt, o, opt.max_tokens);
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
    progress.tick();
  }
  for (BlendMode mode : modes) {
    const auto& t = totals[mode];
    if (t.cases == 0) continue;
    json s = {{"summary", true},
              {"isa", backend->kernel_id()},
              {"precision", kernels::precision_name(precision)},
              {"kv_dtype", kernels::kv_dtype_name(kv_dtype)},
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
      if (!opt.schedule.empty()) s["schedule"] = opt.schedule;
      s["filtering"] = filtering_name(blend_opt.filtering);
      s["quota"] = quota_name(blend_opt.quota);
      s["deviation"] = deviation_name(blend_opt.deviation);
      s["sink_tokens"] = blend_opt.sink_tokens;
      s["chunk_prelude"] = opt.chunk_prelude;
    }
    if (!opt.reference_dir.empty()) s["reference_cases_read"] = reference_hits;
    std::printf("%s\n", s.dump().c_str());
  }
  return 0;
}

}  // namespace bs::tools
