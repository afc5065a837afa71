// blendserve: the inference runtime's command line.
//   blendserve generate --prompt TEXT [--chat] [--max-tokens N] ...
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "kernels/backend.h"
#include "model/generate.h"
#include "model/llama_model.h"
#include "model/transformer.h"

namespace {

std::string default_model_path() {
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

int run_generate(const std::string& model_path, const std::string& prompt, bool chat, const std::string& system,
                 const std::string& precision, bs::SamplingParams params, bool show_stats) {
  auto backend = bs::kernels::make_cpu_backend();
  const auto prec = bs::kernels::choose_precision(precision, *backend);
  bs::LlamaModel model(model_path, *backend, prec);
  bs::Transformer tf(model);
  std::vector<int32_t> ids;
  if (chat) {
    std::vector<bs::ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", prompt});
    ids = model.tokenizer().encode(model.chat_template().apply(msgs, true), true);
    for (const auto& s : model.chat_template().stop_strings()) params.stop.push_back(s);
  } else {
    ids = model.tokenizer().encode(prompt, false);
  }
  if (ids.empty()) {
    std::cerr << "error: the prompt is empty\n";
    return 2;
  }
  const int64_t ctx = model.config().context_length;
  if (static_cast<int64_t>(ids.size()) >= ctx) {
    std::cerr << "error: the prompt has " << ids.size() << " tokens; the model's context is " << ctx << "\n";
    return 2;
  }
  auto cache = tf.make_cache(std::min<int64_t>(ctx, static_cast<int64_t>(ids.size()) + params.max_tokens));
  auto r = bs::generate(tf, cache, ids, params, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (show_stats)
    std::fprintf(stderr,
                 "kernels %s, precision %s, %d threads; prompt %lld tokens, prefill %.3f s; %zu tokens in %.3f s "
                 "(%.1f tok/s); finish: %s\n",
                 backend->kernel_id().c_str(), bs::kernels::precision_name(prec), bs::kernels::cpu_compute_threads(),
                 static_cast<long long>(r.prompt_tokens), r.prefill_seconds, r.tokens.size(), r.decode_seconds,
                 r.tokens.size() / std::max(r.decode_seconds, 1e-9), r.finish_reason.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"blendserve: RAG inference runtime with CacheBlend KV reuse"};
  app.require_subcommand(1);
  std::string model_path = default_model_path();
  app.add_option("--model", model_path, "GGUF model file (default: $BLENDSERVE_MODEL or the embedded default)");

  auto* gen = app.add_subcommand("generate", "Answer one prompt, streaming the text to stdout");
  std::string prompt, system, precision = "auto";
  bool chat = false, stats = false;
  bs::SamplingParams params;
  gen->add_option("--prompt", prompt, "Prompt text")->required();
  gen->add_flag("--chat", chat, "Apply the model's chat template (user turn + assistant header)");
  gen->add_option("--system", system, "System prompt for --chat (default: the template's own)");
  gen->add_option("--max-tokens", params.max_tokens, "Maximum new tokens")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--temperature", params.temperature, "0 = greedy")->check(CLI::Range(0.0, 10.0));
  gen->add_option("--top-p", params.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  gen->add_option("--top-k", params.top_k, "Sample among the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", params.seed, "Sampling seed");
  gen->add_option("--stop", params.stop, "Stop string (repeatable)");
  gen->add_option("--precision", precision, "GEMM/attention precision: auto (bf16 where the CPU has native bf16), bf16, f32")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  gen->add_flag("--stats", stats, "Print timing to stderr");

  CLI11_PARSE(app, argc, argv);
  try {
    if (gen->parsed()) return run_generate(model_path, prompt, chat, system, precision, params, stats);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
