// blendctl bench text: what a request costs before any layer runs. Encoding a MuSiQue
// prompt (every document of a --dataset case, then its question: MuSiQue half A's
// first is 6.2k tokens with SmolLM2's vocabulary, 5.7k with Gemma 3's), rendering the chat template around its question (the cut the
// RAG prompt is assembled from, model/chat_template.h) and assembling the whole RAG
// prompt (blend/rag_prompt.h: the template, then every part tokenized). Issue 58's
// targets: encoding at most 2 ms, rendering at most 1 ms. Only the model's tokenizer and
// template are read (no weights); --model may also be a directory holding only a
// tokenizer.json (and its tokenizer_config.json). The median and the fastest of
// --repeats runs; one JSON object on stdout. Encoding is timed three ways: the same prompt again (--repeats;
// its words known), the first prompt of a freshly loaded tokenizer (cold), and the next
// 20 cases' prompts once each (new documents, common words known): the tokenizer keeps
// the pieces it has merged (model/word_cache.h), as Hugging Face's BPE does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blend/rag_prompt.h"
#include "model/chat_template.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"
#include "tools/bench/bench.h"

namespace bs::tools {
namespace {

using json = nlohmann::json;

struct Timing {
  double median_ms = 0, min_ms = 0;
};

// `fn` run `repeats` times after one warm-up run.
Timing time_it(int repeats, const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

json as_json(const Timing& t) { return {{"median_ms", t.median_ms}, {"min_ms", t.min_ms}}; }

// A case's prompt as bench text encodes it: its documents, each followed by a blank
// line, then its question.
std::string prompt_of(const json& c) {
  std::string prompt;
  for (const auto& d : c.at("documents")) prompt += d.get<std::string>() + "\n\n";
  return prompt + c.at("question").get<std::string>();
}

}  // namespace

int bench_text(const TextBenchOptions& opt) {
  std::ifstream in(opt.dataset);
  std::vector<json> cases;
  for (std::string line; std::getline(in, line) && cases.size() < 21;)
    if (!line.empty()) cases.push_back(json::parse(line));
  if (cases.empty()) throw std::invalid_argument("bench text: cannot read a case from " + opt.dataset);
  const json& c = cases[0];
  const auto documents = c.at("documents").get<std::vector<std::string>>();
  const std::string question = c.at("question").get<std::string>();

  // A directory with a tokenizer.json and no config.json: that tokenizer alone.
  std::error_code ec;
  const bool tokenizer_only = std::filesystem::is_directory(opt.model_path, ec) && !is_hf_checkpoint(opt.model_path);
  const auto file = tokenizer_only ? open_hf_tokenizer(opt.model_path) : open_model_file(opt.model_path);
  // Cold: the first prompt a freshly loaded tokenizer encodes (a tokenizer keeps the
  // pieces it merged: model/word_cache.h), three loads' median.
  std::vector<double> cold_ms;
  for (int i = 0; i < 3; ++i) {
    const Tokenizer fresh = Tokenizer::from_gguf(file);
    const std::string p = prompt_of(c);
    const auto t0 = std::chrono::steady_clock::now();
    (void)fresh.encode(p, false);
    cold_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(cold_ms.begin(), cold_ms.end());
  const Tokenizer tok = Tokenizer::from_gguf(file);
  const ChatTemplate tmpl = opt.chat_template.empty() ? ChatTemplate::from_gguf(file, tok)
                                                      : ChatTemplate::from_operator(opt.chat_template, tok);

  const std::string prompt = prompt_of(c);
  size_t tokens = 0;
  const Timing encode = time_it(opt.repeats, [&] { tokens = tok.encode(prompt, false).size(); });
  // The next cases' prompts, each once, after this one: new documents, with the words
  // the tokenizer has met in the earlier ones.
  std::vector<double> next_ms;
  for (size_t i = 1; i < cases.size(); ++i) {
    const std::string p = prompt_of(cases[i]);
    const auto t0 = std::chrono::steady_clock::now();
    (void)tok.encode(p, false);
    next_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(next_ms.begin(), next_ms.end());
  // A conversation as chat clients send it: a system prompt, a turn before, the question.
  const std::vector<ChatMessage> chat = {{"system", "Answer from the documents, briefly."},
                                         {"user", "Which documents do you have?"},
                                         {"assistant", "Ten passages from Wikipedia."},
                                         {"user", question}};
  std::vector<ChatMessage> conversation = chat;
  try {
    tmpl.apply(conversation, true);
  } catch (const TemplateRaised&) {
    conversation.erase(conversation.begin());  // a template without a system role
  }
  const Timing render = time_it(opt.repeats, [&] { (void)tmpl.cut_at_last_message(conversation); });
  int64_t rag_tokens = 0;
  const Timing assemble = time_it(opt.repeats, [&] {
    rag_tokens = assemble_rag_prompt(tok, tmpl, conversation, documents).size();
  });
  const json out = {{"bench", "text"},
                    {"model", opt.model_path},
                    {"chat_template", tmpl.origin()},
                    {"dataset", opt.dataset},
                    {"prompt_bytes", prompt.size()},
                    {"prompt_tokens", tokens},
                    {"repeats", opt.repeats},
                    {"encode", as_json(encode)},
                    {"encode_cold_ms", cold_ms[1]},
                    {"encode_next_cases", {{"cases", next_ms.size()},
                                           {"median_ms", next_ms.empty() ? 0.0 : next_ms[next_ms.size() / 2]}}},
                    {"encode_tokens_per_s", tokens / (encode.median_ms / 1e3)},
                    {"render_chat_template", as_json(render)},
                    {"assemble_rag_prompt", as_json(assemble)},
                    {"rag_prompt_tokens", rag_tokens},
                    {"targets", {{"encode_ms", 2.0}, {"render_ms", 1.0}}},
                    // New documents (the next cases), the case a server meets.
                    {"encode_within_target", !next_ms.empty() && next_ms[next_ms.size() / 2] <= 2.0},
                    {"render_within_target", render.median_ms <= 1.0}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace bs::tools
