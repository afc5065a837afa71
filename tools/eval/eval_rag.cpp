// blendctl eval: RAG quality of each mode on a JSON-lines QA set
// ({"id","documents":[...],"question","answers":[...]}), greedy decoding.
// Per case and mode: token F1 (SQuAD normalisation, first line, max over gold
// answers), first-token KL divergence from `full`, teacher-forced top-1
// agreement with `full` over the first gold answer, the same agreement along full's
// own greedy answer, whether the mode's greedy answer is full's token for token, and
// TTFT. One JSON line per case and mode, then one summary line per mode. The
// reference `full` always keeps K/V in fp32: with --kv-dtype f16/bf16 the metrics measure the half-precision cache
// too (`full` itself then has a KL and an agreement of its own).
//
// Two agreements: gold answers are 2-6 tokens the model would often not write itself,
// so their rows are where full's top two are close and any perturbation flips the
// argmax. Full's own greedy answer (the reference's decode after the prompt, up to
// --max-tokens, its end-of-turn token excluded) is what a user of the blend is shown
// instead: teacher-forced along it, a row agrees when the mode's argmax is the token
// full chose there. Case lines read back from a log written before this metric have
// none; summaries count the cases that have it (`full_answer_cases`).
//
// `full`'s teacher-forced logits are the reference of every mode. They cost a full
// prefill per case (most of a blend-only run's time on a CPU), so --reference-dir
// keeps what the metrics need of them (the first row, each row's argmax) in files
// named by the model fingerprint, precision, prompt and answer: a later run with
// other blend options reads them instead.
//
// --sweep-ratio R1,R2,... runs the blend at each ratio (the other blend options
// unchanged) beside `full`, on the same cases: per case, full's reference (computed
// once, or read from --reference-dir) and full's own run serve every ratio. A summary
// line per (mode, ratio), then one {"eval":"sweep","points":[...],"full":{...}} line;
// --plot F.svg draws the points (tools/eval/sweep_plot.h).
//
// --forced-rows F.jsonl says where the gold agreement is lost, row by row: per run made
// now and per teacher-forced row of the gold answer, the gold token, full's token and its
// lead over full's runner-up (logits), the mode's token and its deficit (the mode's
// largest logit minus its logit of full's token: 0 where they agree). Whether rows that
// flip are near-ties of full's, or rows where full itself leaves the gold answer, is
// then read off the file.
//
// --resume F.jsonl keeps every case line in F as it is made and, run again with the
// same settings, reads the finished ones back instead of recomputing them
// (tools/eval/case_log.h): the summaries come from the case lines either way.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "blend/blend_engine.h"
#include "blend/pasted_chunks.h"
#include "kernels/kv_view.h"
#include "blend/store_backed_blend.h"
#include "storage/memory_store.h"
#include "tools/eval/case_log.h"
#include "tools/eval/metrics.h"
#include "tools/eval/reference_cache.h"
#include "tools/eval/sweep_plot.h"
#include "model/generate.h"
#include "tools/bench/bench.h"
#include "tools/cli/progress.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;

struct Totals {
  double f1 = 0, kl = 0, agree = 0, ttft = 0, recomputed = 0, cached = 0;
  double full_answer_agree = 0, same_answer = 0;
  int cases = 0;
  int forced_cases = 0;  // cases whose answer has tokens (teacher-forced KL and agreement)
  int full_answer_cases = 0;  // cases with a non-empty greedy answer of full's (see the header)
};

// A ratio as given (0.1, not the float's 0.10000000149011612): six decimals.
double clean_ratio(float r) { return std::round(static_cast<double>(r) * 1e6) / 1e6; }

// The sweep's ratios: each in (0, 1], sorted, duplicates dropped.
std::vector<double> checked_ratios(const std::vector<double>& given) {
  std::vector<double> r;
  for (double x : given) {
    if (!(x > 0 && x <= 1)) {
      char v[32];
      std::snprintf(v, sizeof v, "%g", x);
      throw std::invalid_argument(std::string("--sweep-ratio: ") + v + " is not in (0, 1]");
    }
    r.push_back(x);
  }
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// One mode's run on every case: the blend once per ratio, the other modes once.
struct RunSpec {
  BlendMode mode;
  double ratio;  // the blend's recompute ratio (the other modes ignore it)
};

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Adds one case line to its run's totals: the summaries are made of the lines, whether
// computed now or read back by --resume.
void add_case_line(Totals& t, const json& line) {
  t.f1 += line.at("f1").get<double>();
  if (!line.at("first_token_kl").is_null()) {  // an answer with tokens: teacher-forced
    t.kl += line.at("first_token_kl").get<double>();
    t.agree += line.at("top1_agreement").get<double>();
    ++t.forced_cases;
  }
  if (line.contains("full_answer_agreement") && !line.at("full_answer_agreement").is_null()) {
    t.full_answer_agree += line.at("full_answer_agreement").get<double>();
    t.same_answer += line.at("same_answer_as_full").get<bool>() ? 1 : 0;
    ++t.full_answer_cases;
  }
  t.ttft += line.at("ttft_s").get<double>();
  t.recomputed += line.at("recomputed_tokens").get<double>();
  t.cached += line.at("cached_tokens").get<double>();
  ++t.cases;
}

// A 64-bit value as 16 hex digits (JSON numbers lose integers above 2^53).
std::string hex64(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace

int eval_rag(const EvalOptions& opt) {
  std::vector<BlendMode> modes;
  for (const auto& m : opt.modes)
    if (const BlendMode b = parse_mode(m); std::find(modes.begin(), modes.end(), b) == modes.end()) modes.push_back(b);
  // A sweep (or a plot) compares the blend with full: both always run.
  const bool sweep = !opt.sweep_ratios.empty() || !opt.plot_path.empty();
  if (sweep && std::find(modes.begin(), modes.end(), BlendMode::Full) == modes.end())
    modes.insert(modes.begin(), BlendMode::Full);
  if (sweep && std::find(modes.begin(), modes.end(), BlendMode::Blend) == modes.end()) modes.push_back(BlendMode::Blend);
  const std::vector<double> ratios =
      opt.sweep_ratios.empty() ? std::vector<double>{clean_ratio(opt.ratio)} : checked_ratios(opt.sweep_ratios);
  std::vector<RunSpec> runs;
  for (BlendMode m : modes) {
    if (m == BlendMode::Blend)
      for (double r : ratios) runs.push_back({m, r});
    else
      runs.push_back({m, clean_ratio(opt.ratio)});
  }
  if (!opt.plot_path.empty()) {  // a typo in the path fails now, not after the run
    const auto dir = std::filesystem::absolute(opt.plot_path).parent_path();
    if (!std::filesystem::is_directory(dir))
      throw std::runtime_error("--plot: directory " + dir.string() + " does not exist");
  }
  std::ifstream in(opt.dataset);
  if (!in) throw std::runtime_error("cannot open dataset " + opt.dataset);
  // --forced-rows: a run's rows are written once its case line is kept, so with --resume
  // (append: the runs read back wrote theirs before) a run cut short writes none and is
  // made again; without --resume the file starts empty.
  std::unique_ptr<std::ofstream> rows_file;
  if (!opt.forced_rows_path.empty()) {
    rows_file = std::make_unique<std::ofstream>(opt.forced_rows_path,
                                                opt.resume_path.empty() ? std::ios::trunc : std::ios::app);
    if (!*rows_file) throw std::runtime_error("--forced-rows: cannot write " + opt.forced_rows_path);
  }
  std::ofstream* const rows_out = rows_file.get();

  auto backend = kernels::make_cpu_backend();
  const auto precision = kernels::choose_precision(opt.precision, *backend);
  kernels::TensorType kv_dtype;
  if (!kernels::kv_dtype_from_name(opt.kv_dtype, kv_dtype))
    throw std::invalid_argument("unknown KV dtype '" + opt.kv_dtype + "' (f32, f16, bf16)");
  LlamaModel model(opt.model_path, *backend, precision, kv_dtype);
  if (!opt.chat_template.empty()) model.set_chat_template(ChatTemplate::from_operator(opt.chat_template, model.tokenizer()));
  Transformer tf(model);
  MemoryKvStore store(int64_t{16} << 30);
  BlendEngine engine(tf, chunk_prelude_tokens(model.tokenizer(), opt.chunk_prelude));
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
    ref_model->set_chat_template(model.chat_template());
    ref_tf = std::make_unique<Transformer>(*ref_model);
    ref_engine = std::make_unique<BlendEngine>(*ref_tf, chunk_prelude_tokens(ref_model->tokenizer(), opt.chunk_prelude));
    ref_blend = std::make_unique<StoreBackedBlend>(*ref_engine, store);
  }
  const LlamaModel& reference_model = fp32_kv ? model : *ref_model;
  StoreBackedBlend& reference_blend = fp32_kv ? from_store : *ref_blend;
  const auto& tok = model.tokenizer();
  // Whether the chat template takes the system prompt (Gemma's refuses a system role).
  bool system_role = !opt.system_prompt.empty();
  if (system_role) {
    try {
      model.chat_template().apply({{"system", opt.system_prompt}, {"user", "?"}}, true);
    } catch (const TemplateRaised& e) {
      std::fprintf(stderr, "eval: the chat template refuses a system prompt (%s): the question goes alone\n", e.what());
      system_role = false;
    }
  }
  const int64_t V = model.config().vocab;
  std::vector<Totals> totals(runs.size());

  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  const int first = std::min<int>(opt.skip_cases, static_cast<int>(lines.size()));
  const int last = opt.max_cases > 0 ? std::min<int>(first + opt.max_cases, static_cast<int>(lines.size()))
                                     : static_cast<int>(lines.size());
  // What decides a case line's values: a --resume file written under other settings is
  // refused (tools/eval/case_log.h).
  std::unique_ptr<CaseLog> log;
  if (!opt.resume_path.empty()) {
    std::string all;
    for (const auto& l : lines) all += l + '\n';
    json settings{{"dataset_xxh3", hex64(XXH3_64bits(all.data(), all.size()))},
             {"model_fingerprint", hex64(model.fingerprint())},
             {"cpu", cpu_model_name()},
             {"isa", backend->kernel_id()},
             {"precision", kernels::precision_name(precision)},
             {"kv_dtype", kernels::kv_dtype_name(kv_dtype)},
             {"max_tokens", opt.max_tokens},
             {"check_layers", opt.check_layers},
             {"schedule", opt.schedule},
             {"deviation", opt.deviation},
             {"quota", opt.quota},
             {"filtering", opt.filtering},
             {"sink_tokens", opt.sink_tokens},
             {"chunk_prelude", opt.chunk_prelude},
             {"system_prompt", system_role ? opt.system_prompt : std::string()},
             {"chat_template", model.chat_template().origin()},
             {"chat_template_renders", model.chat_template().apply({{"user", "Q?"}}, true)},
             {"question_prefix", opt.question_prefix}};
    // Only when not the default: the logs of runs from before the rule existed resume.
    if (opt.selection != "deviation") settings["selection"] = opt.selection;
    // Likewise: logs of query-first runs over every layer (0) resume.
    if (opt.selection == "query-first" && opt.query_first_from_layer != 0)
      settings["query_first_from_layer"] = opt.query_first_from_layer;
    if (opt.reverse_documents) settings["reverse_documents"] = true;
    if (opt.stored_in_context) settings["stored_in_context"] = true;
    log = std::make_unique<CaseLog>(opt.resume_path, settings);
    int found = 0;
    for (int case_no = first; case_no < last; ++case_no)
      for (const auto& r : runs) found += log->find(case_no, mode_name(r.mode), r.ratio) != nullptr;
    std::fprintf(stderr, "--resume: %s: %d of these %d runs read back, %d to go\n", opt.resume_path.c_str(), found,
                 (last - first) * static_cast<int>(runs.size()), (last - first) * static_cast<int>(runs.size()) - found);
  }
  // One tick per case and run (mode, and ratio for the blend).
  Progress progress("eval runs", (last - first) * static_cast<int>(runs.size()));
  BlendOptions blend_opt;
  blend_opt.ratio = opt.ratio;
  blend_opt.check_layers = opt.check_layers;
  blend_opt.schedule = opt.schedule;
  blend_opt.deviation = parse_deviation(opt.deviation);
  blend_opt.quota = parse_quota(opt.quota);
  blend_opt.filtering = parse_filtering(opt.filtering);
  blend_opt.selection = parse_selection(opt.selection);
  blend_opt.sink_tokens = opt.sink_tokens;
  blend_opt.query_first_from_layer = opt.query_first_from_layer;
  int reference_hits = 0;
  // --pasted: what the index found, over the cases (token-weighted).
  struct {
    int cases = 0, same = 0;
    int64_t stored = 0, found = 0;
    double match_s = 0, plain_s = 0;  // assemble_pasted_prompt, and assemble_rag_prompt of the same message
  } pasted_sum;

  // A finished run's line: into its totals, and printed.
  const auto record = [&](size_t run_no, const json& line) {
    add_case_line(totals[run_no], line);
    if (opt.print_cases) {
      std::printf("%s\n", line.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    }
  };

  for (int case_no = first; case_no < last; ++case_no) {
    // The runs of this case an earlier --resume run finished; none left: nothing to set up.
    std::vector<const json*> done(runs.size(), nullptr);
    bool all_done = log != nullptr;
    for (size_t run_no = 0; log && run_no < runs.size(); ++run_no) {
      done[run_no] = log->find(case_no, mode_name(runs[run_no].mode), runs[run_no].ratio);
      all_done = all_done && done[run_no];
    }
    if (all_done) {
      for (size_t run_no = 0; run_no < runs.size(); ++run_no) record(run_no, *done[run_no]);
      progress.resumed(static_cast<int>(runs.size()));
      continue;
    }
    const std::string& line = lines[static_cast<size_t>(case_no)];
    json c = json::parse(line);
    auto docs = c.at("documents").get<std::vector<std::string>>();
    const auto answers = c.at("answers").get<std::vector<std::string>>();
    const std::string question = c.at("question").get<std::string>();
    if (answers.empty()) throw std::runtime_error("case " + c.value("id", "?") + " has no answers");
    // The CacheBlend evaluation's instructions (blend_musique.py): a fixed system
    // prompt (reused as the exact prefix) and the question after the passages. A template
    // without a system role (Gemma's) gets the question alone: its prefix says the same.
    const auto chat_of = [&](const std::string& user) {
      std::vector<ChatMessage> chat;
      if (system_role) chat.push_back(ChatMessage{"system", opt.system_prompt});
      chat.push_back(ChatMessage{"user", user});
      return chat;
    };
    RagPrompt prompt = assemble_rag_prompt(tok, model.chat_template(), chat_of(opt.question_prefix + question), docs);
    if (opt.stored_in_context && !opt.match_only) {
      // The chunks as the request that sent them first left them (a runtime's
      // provisional entries): its full prefill's rows of each, K rotated back.
      BlendOptions full_opt;
      full_opt.mode = BlendMode::Full;
      const auto first = from_store.prefill(prompt, full_opt);
      for (size_t i = 0; i < prompt.chunks.size(); ++i)
        if (!prompt.chunks[i].empty())
          store.put(engine.chunk_key(prompt.chunks[i]),
                    engine.chunk_in_context(first.cache, prompt.chunk_offset(i), prompt.chunks[i]));
    }
    if (opt.reverse_documents) {  // also the order they are pasted in (--pasted)
      std::reverse(docs.begin(), docs.end());
      prompt = assemble_rag_prompt(tok, model.chat_template(), chat_of(opt.question_prefix + question), docs);
    }
    if (!opt.match_only) from_store.warm(prompt);  // cached modes find every chunk in RAM
    json pasted_facts;
    if (opt.pasted) {
      // The same request as a framework pastes it: the stored passages found in the
      // message by the index (as a server's write-back left them) become its chunks.
      PastedChunkIndex index;
      int64_t stored = 0;
      for (const auto& chunk : prompt.chunks) {
        index.add(chunk);
        stored += static_cast<int64_t>(chunk.size());
      }
      std::string message = opt.paste_lead;
      for (const auto& d : docs) message += d + "\n\n";
      message += opt.question_prefix + question;
      PastedMatch m;
      const std::vector<ChatMessage> pasted_chat = chat_of(message);
      // What the search costs beside the plain assembly of the same message (a hit
      // checks the text too, so a miss costs less).
      const auto m0 = std::chrono::steady_clock::now();
      RagPrompt as_pasted = assemble_pasted_prompt(tok, model.chat_template(), pasted_chat, index, &m);
      const auto m1 = std::chrono::steady_clock::now();
      const RagPrompt plain = assemble_rag_prompt(tok, model.chat_template(), pasted_chat, {});
      const auto m2 = std::chrono::steady_clock::now();
      pasted_sum.match_s += std::chrono::duration<double>(m1 - m0).count();
      pasted_sum.plain_s += std::chrono::duration<double>(m2 - m1).count();
      static_cast<void>(plain);  // timed only
      const bool same = as_pasted.concatenated() == prompt.concatenated();
      pasted_facts = {{"pasted_found", stored > 0 ? static_cast<double>(m.chunk_tokens) / stored : 0.0},
                      {"pasted_chunks_found", m.chunks_found},
                      {"documents", static_cast<int>(prompt.chunks.size())},
                      {"pasted_as_documents", same}};
      pasted_sum.cases += 1;
      pasted_sum.stored += stored;
      pasted_sum.found += m.chunk_tokens;
      pasted_sum.same += same ? 1 : 0;
      if (opt.match_only) {
        json line = {{"id", c.value("id", std::to_string(case_no))}, {"case", case_no}};
        line.update(pasted_facts);
        if (opt.print_cases) std::printf("%s\n", line.dump().c_str());
        progress.resumed(static_cast<int>(runs.size()));
        continue;
      }
      prompt = std::move(as_pasted);
      from_store.warm(prompt);  // a lead-in of its own is a part too, stored as write-back would
    }

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
      // --forced-rows needs the leads, which the file does not hold: computed anew.
      if (rows_out == nullptr && !file.empty() && read_reference(file, V, A, reference)) {
        ++reference_hits;
      } else {
        // Only the logits are kept: the whole prefill result carries the prompt's KV cache.
        const std::vector<float> logits = reference_blend.prefill(forced, ref_opt, 0, A).logits;
        reference.first.assign(logits.begin(), logits.begin() + V);
        reference.argmax.resize(static_cast<size_t>(A));
        for (int64_t r = 0; r < A; ++r) reference.argmax[r] = argmax_row(&logits[r * V], V);
        if (rows_out != nullptr)
          for (int64_t r = 0; r < A; ++r)
            reference.lead.push_back(lead_over_runner_up(&logits[r * V], V, reference.argmax[r]));
        if (!file.empty()) write_reference(file, V, reference);
      }
    }

    // Full's own greedy answer (the header): decoded once per case by the reference,
    // or read from --reference-dir.
    std::vector<int32_t> full_answer;
    {
      std::filesystem::path file;
      if (!opt.reference_dir.empty())
        file = full_answer_file(opt.reference_dir, reference_model.fingerprint(), kernels::precision_name(precision),
                                prompt.concatenated(), opt.max_tokens);
      if (file.empty() || !read_full_answer(file, opt.max_tokens, V, full_answer)) {
        auto gen = reference_blend.prefill(prompt, ref_opt, opt.max_tokens);
        SamplingParams sp;
        sp.max_tokens = opt.max_tokens;
        full_answer = decode_from(fp32_kv ? tf : *ref_tf, gen.cache, gen.logits, sp).tokens;
        if (!file.empty()) write_full_answer(file, full_answer);
      }
    }
    const int64_t G = static_cast<int64_t>(full_answer.size());
    RagPrompt along_full = prompt;  // teacher forcing along it: all of it but its last token
    if (G > 0) along_full.suffix.insert(along_full.suffix.end(), full_answer.begin(), full_answer.end() - 1);

    // --forced-rows: one run's rows into `forced_rows`; `logits` [A, vocab] are the
    // mode's (empty: the reference's own run, which agrees on every row).
    std::string forced_rows;
    // (Each run clears it first, so a run without an answer writes no rows.)
    const auto collect_forced_rows = [&](size_t run_no, const std::vector<float>& logits) {
      if (rows_out == nullptr) return;
      const auto text = [&](int64_t id) { return tok.decode(std::vector<int32_t>{static_cast<int32_t>(id)}); };
      for (int64_t r = 0; r < A; ++r) {
        const int64_t full_token = reference.argmax[r];
        const int64_t token = logits.empty() ? full_token : argmax_row(&logits[r * V], V);
        const double deficit = logits.empty() ? 0.0 : logits[r * V + token] - logits[r * V + full_token];
        json line = {{"id", c.value("id", std::to_string(case_no))},
                     {"case", case_no},
                     {"mode", mode_name(runs[run_no].mode)}};
        if (runs[run_no].mode == BlendMode::Blend) line["ratio"] = runs[run_no].ratio;
        line.update({{"row", r},
                     {"answer_tokens", A},
                     {"gold_token", answer_ids[r]},
                     {"gold_text", text(answer_ids[r])},
                     {"full_token", full_token},
                     {"full_text", text(full_token)},
                     {"full_lead", reference.lead[r]},
                     {"token", token},
                     {"text", text(token)},
                     {"deficit", deficit}});
        forced_rows += line.dump(-1, ' ', false, json::error_handler_t::replace) + '\n';
      }
    };

    for (size_t run_no = 0; run_no < runs.size(); ++run_no) {
      if (done[run_no]) {
        record(run_no, *done[run_no]);
        progress.resumed(1);
        continue;
      }
      const BlendMode mode = runs[run_no].mode;
      BlendOptions o = blend_opt;
      o.mode = mode;
      // The sweep's ratio; without a sweep --ratio as given (runs' copy is for printing).
      if (mode == BlendMode::Blend && !opt.sweep_ratios.empty()) o.ratio = static_cast<float>(runs[run_no].ratio);
      forced_rows.clear();
      double kl = 0;
      int64_t agree = 0;
      if (A > 0 && mode == BlendMode::Full && fp32_kv) {
        agree = A;  // the reference itself (the forward pass is deterministic)
        collect_forced_rows(run_no, {});
      } else if (A > 0) {
        const std::vector<float> forced_logits = from_store.prefill(forced, o, 0, A).logits;
        kl = blend::kl_divergence(reference.first.data(), forced_logits.data(), V);
        for (int64_t r = 0; r < A; ++r) agree += reference.argmax[r] == argmax_row(&forced_logits[r * V], V);
        collect_forced_rows(run_no, forced_logits);
      }

      int64_t agree_full_answer = 0;
      if (G > 0) {
        const std::vector<float> along = from_store.prefill(along_full, o, 0, G).logits;
        for (int64_t r = 0; r < G; ++r) agree_full_answer += full_answer[r] == argmax_row(&along[r * V], V);
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

      json case_line = {{"id", c.value("id", std::to_string(case_no))},
                        {"case", case_no},
                        {"mode", mode_name(mode)},
                        {"f1", f1},
                        {"first_token_kl", A > 0 ? json(kl) : json(nullptr)},
                        {"top1_agreement", A > 0 ? json(static_cast<double>(agree) / static_cast<double>(A)) : json(nullptr)},
                        {"full_answer_agreement",
                         G > 0 ? json(static_cast<double>(agree_full_answer) / static_cast<double>(G)) : json(nullptr)},
                        {"full_answer_tokens", G},
                        {"same_answer_as_full", out.tokens == full_answer},
                        {"ttft_s", ttft},
                        {"setup_s_excluded", setup},
                        {"prompt_tokens", gen.stats.prompt_tokens},
                        {"recomputed_tokens", gen.stats.recomputed_tokens},
                        {"cached_tokens", gen.stats.cached_tokens},
                        {"output", out.text}};
      if (mode == BlendMode::Blend) case_line["ratio"] = runs[run_no].ratio;
      if (!pasted_facts.is_null()) case_line.update(pasted_facts);
      if (log) log->append(case_line);  // kept before it counts: a kill after this loses nothing
      if (rows_out != nullptr && !forced_rows.empty()) {
        *rows_out << forced_rows << std::flush;
        if (!*rows_out) throw std::runtime_error("--forced-rows: cannot write " + opt.forced_rows_path);
      }
      record(run_no, case_line);
      progress.tick();
    }
  }
  // full's mean TTFT and F1 (NaN without a full run): the blend's TTFT is also given
  // as a multiple of it.
  double full_ttft = std::nan(""), full_f1 = std::nan("");
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].mode == BlendMode::Full && totals[i].cases > 0) {
      full_ttft = totals[i].ttft / totals[i].cases;
      full_f1 = totals[i].f1 / totals[i].cases;
    }
  std::vector<SweepPoint> points;
  for (size_t run_no = 0; run_no < runs.size(); ++run_no) {
    const BlendMode mode = runs[run_no].mode;
    const auto& t = totals[run_no];
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
              {"full_answer_agreement", t.full_answer_cases ? json(t.full_answer_agree / t.full_answer_cases) : json(nullptr)},
              {"same_answer_as_full", t.full_answer_cases ? json(t.same_answer / t.full_answer_cases) : json(nullptr)},
              {"full_answer_cases", t.full_answer_cases},
              {"ttft_s", t.ttft / t.cases},
              {"recomputed_tokens", t.recomputed / t.cases}};
    if (mode == BlendMode::Blend) {
      SweepPoint p;
      p.ratio = runs[run_no].ratio;
      p.f1 = t.f1 / t.cases;
      if (t.forced_cases) {
        p.kl = t.kl / t.forced_cases;
        p.agreement = t.agree / t.forced_cases;
      }
      p.ttft_s = t.ttft / t.cases;
      if (full_ttft > 0) p.ttft_vs_full = p.ttft_s / full_ttft;
      if (t.cached > 0) p.recomputed_fraction = t.recomputed / t.cached;
      points.push_back(p);
      s["ratio"] = p.ratio;
      s["recomputed_fraction"] = number_or_null(p.recomputed_fraction);
      if (std::isfinite(p.ttft_vs_full)) s["ttft_vs_full"] = p.ttft_vs_full;
      s["check_layers"] = opt.check_layers;
      if (!opt.schedule.empty()) s["schedule"] = opt.schedule;
      s["filtering"] = filtering_name(blend_opt.filtering);
      s["selection"] = selection_name(blend_opt.selection);
      if (blend_opt.selection == Selection::QueryFirst) s["query_first_from_layer"] = blend_opt.query_first_from_layer;
      s["quota"] = quota_name(blend_opt.quota);
      s["deviation"] = deviation_name(blend_opt.deviation);
      s["sink_tokens"] = blend_opt.sink_tokens;
      s["chunk_prelude"] = opt.chunk_prelude;
    }
    if (!opt.reference_dir.empty()) s["reference_cases_read"] = reference_hits;
    std::printf("%s\n", s.dump().c_str());
  }
  if (opt.pasted) {
    // The stored passages' tokens found, over all cases; cases whose pasted prompt is
    // token for token the documents request's.
    const json p = {{"eval", "pasted"},
                    {"cases", pasted_sum.cases},
                    {"paste_lead", opt.paste_lead},
                    {"found_fraction", pasted_sum.stored > 0 ? static_cast<double>(pasted_sum.found) /
                                                                   static_cast<double>(pasted_sum.stored)
                                                             : 0.0},
                    {"stored_tokens", pasted_sum.stored},
                    {"found_tokens", pasted_sum.found},
                    {"as_documents_cases", pasted_sum.same},
                    {"assemble_pasted_ms", pasted_sum.cases ? 1e3 * pasted_sum.match_s / pasted_sum.cases : 0.0},
                    {"assemble_plain_ms", pasted_sum.cases ? 1e3 * pasted_sum.plain_s / pasted_sum.cases : 0.0}};
    std::printf("%s\n", p.dump().c_str());
  }
  if (!sweep) return 0;

  const int cases = last - first;
  const std::string model_name = std::filesystem::path(opt.model_path).filename().string();
  const std::string dataset_name = std::filesystem::path(opt.dataset).filename().string();
  const std::string cpu = cpu_model_name();
  json jp = json::array();
  for (const auto& p : points)
    jp.push_back({{"ratio", p.ratio},
                  {"f1", p.f1},
                  {"kl", number_or_null(p.kl)},
                  {"agreement", number_or_null(p.agreement)},
                  {"ttft_s", p.ttft_s},
                  {"ttft_vs_full", number_or_null(p.ttft_vs_full)},
                  {"recomputed_fraction", number_or_null(p.recomputed_fraction)}});
  std::printf("%s\n", json{{"eval", "sweep"},
                           {"model", model_name},
                           {"dataset", dataset_name},
                           {"cases", cases},
                           {"cpu", cpu},
                           {"isa", backend->kernel_id()},
                           {"precision", kernels::precision_name(precision)},
                           {"kv_dtype", kernels::kv_dtype_name(kv_dtype)},
                           {"points", jp},
                           {"full", {{"f1", number_or_null(full_f1)}, {"ttft_s", number_or_null(full_ttft)}}}}
                          .dump(-1, ' ', false, json::error_handler_t::replace)
                          .c_str());
  std::fflush(stdout);

  if (!opt.plot_path.empty()) {
    SweepChart chart;
    chart.title = "Blend ratio trade-off: " + model_name + " on " + dataset_name + ", " + std::to_string(cases) +
                  (cases == 1 ? " case, " : " cases, ") + cpu;
    std::string layers;
    for (int l : opt.check_layers) {
      if (!layers.empty()) layers += ',';
      layers += std::to_string(l);
    }
    chart.subtitle = "blend: check layers " + layers + ", " + filtering_name(blend_opt.filtering) + " filtering, " +
                     quota_name(blend_opt.quota) + " quota, " + deviation_name(blend_opt.deviation) +
                     " deviation, selection " + selection_name(blend_opt.selection) + "\nkernels " + backend->kernel_id() + ", precision " + kernels::precision_name(precision) +
                     ", KV " + kernels::kv_dtype_name(kv_dtype) + "; greedy, up to " +
                     std::to_string(opt.max_tokens) + " tokens; means over cases";
    chart.points = points;
    chart.full_f1 = full_f1;
    chart.full_ttft_s = full_ttft;
    const std::string svg = sweep_svg(chart);
    std::ofstream f(opt.plot_path, std::ios::binary | std::ios::trunc);
    f << svg;
    if (!f) throw std::runtime_error("cannot write " + opt.plot_path);
    std::fprintf(stderr, "plot: %s\n", opt.plot_path.c_str());
  }
  return 0;
}

}  // namespace bs::tools
