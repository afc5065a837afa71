// Chat templates (model/chat_template.h): the model's own Jinja template, or ChatML for a
// file without one; checked at load; cut where the question stands for the RAG prompt
// (blend/rag_prompt.h). Real material: SmolLM2's own template, the 70 real templates of
// llama.cpp's models/templates (tools/setup.sh) and the real vocabularies that go with
// them (Llama 3's, Qwen 2's, Phi-3's, Gemma 3 270M's). That these templates render what
// Python's jinja2 renders is tests/test_jinja_template.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "blend/rag_prompt.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/jinja_template.h"
#include "model/tokenizer.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

const fs::path kLlamaCpp = BLENDSERVE_LLAMACPP_MODELS;
const fs::path kTemplates = kLlamaCpp / "templates";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A GGUF holding only `key` = `value` (a string), or nothing at all.
gguf::GgufFile gguf_with(const std::string& key, const std::string& value, std::vector<uint8_t>* keep) {
  GgufWriter w;
  w.str("general.name", "t");
  if (!key.empty()) w.str(key, value);
  *keep = w.bytes();
  return gguf::GgufFile::parse(keep->data(), keep->size());
}

struct Loaded {
  gguf::GgufFile file;
  Tokenizer tok;
};

// The tokenizer of a GGUF (a vocabulary-only one of llama.cpp's, or a model's).
std::unique_ptr<Loaded> load_vocab(const fs::path& path) {
  auto f = gguf::GgufFile::open(path.string());
  Tokenizer t = Tokenizer::from_gguf(f);
  return std::unique_ptr<Loaded>(new Loaded{std::move(f), std::move(t)});
}

// A byte-level vocabulary of the 256 bytes alone: a tokenizer with no special tokens.
Tokenizer bytes_only() {
  TokenizerSpec spec;
  spec.tokens = byte_level_alphabet();
  return Tokenizer(std::move(spec));
}

std::string text_of(const Tokenizer& tok, int32_t id) { return id >= 0 ? std::string(tok.token_bytes(id)) : std::string(); }

const std::vector<ChatMessage> kOne = {{"user", "How tall is the Eiffel Tower?"}};
const std::vector<ChatMessage> kWithSystem = {{"system", "You answer briefly."},
                                              {"user", "How tall is the Eiffel Tower?"},
                                              {"assistant", "It is 330 metres tall."},
                                              {"user", "And when was it built?\nPlease be exact."}};
const std::vector<ChatMessage> kTurns(kWithSystem.begin() + 1, kWithSystem.end());

// ---- the built-in ChatML and SmolLM2's own template ----------------------------------------

TEST(ChatTemplate, AFileWithoutATemplateGetsChatMl) {
  std::vector<uint8_t> keep;
  const ChatTemplate t = ChatTemplate::from_gguf(gguf_with("", "", &keep), bytes_only());
  EXPECT_TRUE(t.builtin());
  EXPECT_NE(t.origin().find("ChatML"), std::string::npos) << t.origin();
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_EQ(t.apply({{"user", "x"}}, true), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"system", "s"}, {"user", "u"}}, false),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n");
  const auto cut = t.cut_at_last_message(kWithSystem);
  EXPECT_EQ(cut.before + kWithSystem.back().content + cut.after, t.apply(kWithSystem, true));
  EXPECT_EQ(cut.after, "<|im_end|>\n<|im_start|>assistant\n");
}

const char* kSmolSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

TEST(ChatTemplate, SmolLM2sOwnTemplateWithItsDefaultSystemPrompt) {
  if (!fs::exists(BLENDSERVE_DEFAULT_MODEL)) FAIL() << "no " << BLENDSERVE_DEFAULT_MODEL << " (tools/setup.sh)";
  const auto m = load_vocab(BLENDSERVE_DEFAULT_MODEL);
  const ChatTemplate t = ChatTemplate::from_gguf(m->file, m->tok);
  EXPECT_FALSE(t.builtin());
  EXPECT_NE(t.origin().find("tokenizer.chat_template"), std::string::npos) << t.origin();
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_EQ(t.apply({{"user", "What is 2+2?"}}, true),
            std::string("<|im_start|>system\n") + kSmolSystem +
                "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> conv = {{"system", "Be brief."}, {"user", "Capital of France?"}, {"assistant", "Paris."}};
  EXPECT_EQ(t.apply(conv, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
            "<|im_start|>assistant\nParis.<|im_end|>\n");
  // Every turn is <|im_start|> ... <|im_end|> once tokenized with control tokens read.
  const auto ids = m->tok.encode(t.apply(conv, true), true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), m->tok.token_id("<|im_start|>")), 4);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), m->tok.token_id("<|im_end|>")), 3);

  // The RAG prompt: the documents in front of the question, in the user's turn.
  const auto p = assemble_rag_prompt(m->tok, t, {{"user", "Who?"}}, {"Doc one.", "Doc two."});
  EXPECT_EQ(m->tok.decode(p.prefix),
            std::string("<|im_start|>system\n") + kSmolSystem + "<|im_end|>\n<|im_start|>user\n");
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(m->tok.decode(p.chunks[1]), "Doc two.\n\n");
  EXPECT_EQ(m->tok.decode(p.suffix), "Who?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(m->tok.decode(p.concatenated()), t.apply({{"user", "Doc one.\n\nDoc two.\n\nWho?"}}, true));

  // The cut's placeholder written in the conversation itself (the fuzzer found it in
  // the binary): another stands in, and the cut is still the rendering's.
  const std::string pasted = "@@blendserve:message:7f3a9c@@ and @@blendserve:message:7f3a9c@@0@@";
  for (const std::vector<ChatMessage>& c : {std::vector<ChatMessage>{{"user", pasted}, {"assistant", "Ok."}, {"user", "Hm?"}},
                                            std::vector<ChatMessage>{{"user", pasted}}}) {
    const auto cut = t.cut_at_last_message(c);
    EXPECT_EQ(cut.before + c.back().content + cut.after, t.apply(c, true));
  }
}

// ---- every real template ---------------------------------------------------------------------

// The templates llama.cpp's engine cannot run, and why (model/README.md, "Chat templates",
// lists them).
// Anything else that fails to load is a regression.
const std::map<std::string, std::string> kRefused = {};

TEST(ChatTemplate, EveryRealTemplateLoadsAndIsCutWhereTheQuestionStands) {
  ASSERT_TRUE(fs::is_directory(kTemplates)) << kTemplates << " (tools/setup.sh)";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kTemplates))
    if (e.path().extension() == ".jinja") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 60u);
  int loaded = 0, cuts = 0, refusals = 0;
  std::map<std::string, std::string> refused;
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    SCOPED_TRACE(name);
    std::unique_ptr<ChatTemplate> t;
    try {
      t = std::make_unique<ChatTemplate>(slurp(f), name, "<s>", "</s>");
    } catch (const std::invalid_argument& e) {
      refused[name] = e.what();
      continue;
    }
    ++loaded;
    for (const auto* conv : {&kOne, &kWithSystem, &kTurns}) {
      std::string whole;
      try {
        whole = t->apply(*conv, true);
      } catch (const TemplateRaised&) {
        // The template refuses this conversation (no system role): so does the cut.
        EXPECT_THROW(t->cut_at_last_message(*conv), TemplateRaised);
        EXPECT_NE(conv, &kOne) << "a template that refuses one user message must not load";
        ++refusals;
        continue;
      }
      const auto cut = t->cut_at_last_message(*conv);
      EXPECT_EQ(cut.before + conv->back().content + cut.after, whole);
      ++cuts;
    }
  }
  for (const auto& [name, why] : refused) {
    std::printf("refused: %s: %s\n", name.c_str(), why.substr(0, 300).c_str());
    EXPECT_TRUE(kRefused.count(name)) << name << " refused: " << why;
  }
  std::printf("{\"templates\": %zu, \"loaded\": %d, \"refused\": %zu, \"cuts_equal_to_the_whole\": %d, "
              "\"conversations_the_template_refuses\": %d}\n",
              files.size(), loaded, refused.size(), cuts, refusals);
}

// The families RAG teams serve, each with its own real vocabulary: the RAG prompt's parts,
// decoded, are the template's rendering of the conversation with the documents in front
// of the question; the model's BOS is there once; a document is the same chunk tokens
// wherever it stands.
TEST(ChatTemplate, RagPromptsOfRealTemplatesWithTheirVocabularies) {
  struct Case {
    const char* tmpl;
    fs::path vocab;
    const char* turn_open;  // the control token each turn starts with
  };
  const std::vector<Case> cases = {
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", kLlamaCpp / "ggml-vocab-llama-bpe.gguf", "<|start_header_id|>"},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", kLlamaCpp / "ggml-vocab-llama-bpe.gguf", "<|start_header_id|>"},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", kLlamaCpp / "ggml-vocab-llama-bpe.gguf", "<|start_header_id|>"},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", kLlamaCpp / "ggml-vocab-qwen2.gguf", "<|im_start|>"},
      {"Qwen-Qwen3-0.6B.jinja", kLlamaCpp / "ggml-vocab-qwen2.gguf", "<|im_start|>"},
      {"microsoft-Phi-3.5-mini-instruct.jinja", kLlamaCpp / "ggml-vocab-phi-3.gguf", "<|user|>"},
      {"google-gemma-2-2b-it.jinja", BLENDSERVE_GEMMA3_MODEL, "<start_of_turn>"},
  };
  const std::vector<std::string> docs = {"The Eiffel Tower was built from 1887 to 1889.",
                                         "It is 330 metres tall, the tallest structure in Paris until 1930."};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tmpl);
    ASSERT_TRUE(fs::exists(c.vocab)) << c.vocab << " (tools/setup.sh)";
    const auto v = load_vocab(c.vocab);
    const Tokenizer& tok = v->tok;
    const ChatTemplate t(slurp(kTemplates / c.tmpl), c.tmpl, text_of(tok, tok.bos_id()), text_of(tok, tok.eos_id()));
    std::vector<ChatMessage> conv = kWithSystem;
    try {
      t.apply(conv, true);
    } catch (const TemplateRaised&) {
      conv = kTurns;  // no system role (Gemma 2)
    }
    const auto p = assemble_rag_prompt(tok, t, conv, docs);
    std::vector<ChatMessage> written = conv;
    written.back().content = docs[0] + "\n\n" + docs[1] + "\n\n" + conv.back().content;
    const std::string whole = t.apply(written, true);
    // The parts read as the whole rendering tokenized at once (BOS where the model adds
    // it): the text itself for byte-level BPE; for SentencePiece with a space prefix
    // (Phi-3) also the " " llama.cpp puts after each special token, and no other.
    const auto whole_ids = with_bos(tok, tok.encode(whole, true));
    EXPECT_EQ(tok.decode(p.concatenated()), tok.decode(whole_ids));
    const auto all = p.concatenated();
    if (tok.add_bos() && tok.bos_id() >= 0) {
      EXPECT_EQ(all.front(), tok.bos_id());
      EXPECT_EQ(std::count(all.begin(), all.end(), tok.bos_id()), 1);
    }
    // The markup is control tokens, never text: the turn's opening token is there, as one
    // token per turn in the prefix.
    const int32_t open = tok.token_id(c.turn_open);
    ASSERT_GE(open, 0) << c.turn_open;
    EXPECT_GE(std::count(p.prefix.begin(), p.prefix.end(), open), 2) << c.turn_open;
    ASSERT_EQ(p.chunks.size(), 2u);
    const auto reversed = assemble_rag_prompt(tok, t, conv, {docs[1], docs[0]});
    EXPECT_EQ(reversed.chunks[0], p.chunks[1]);
    EXPECT_EQ(reversed.chunks[1], p.chunks[0]);
    EXPECT_EQ(reversed.prefix, p.prefix);
  }
}

// ---- refused at load, refused per request ----------------------------------------------------

void expect_refused(const std::string& source, const std::string& words) {
  try {
    ChatTemplate t(source, "test template", "<s>", "</s>");
    ADD_FAILURE() << "loaded: " << source;
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(words), std::string::npos) << source << " -> " << what;
    EXPECT_NE(what.find("test template"), std::string::npos) << what;
    EXPECT_NE(what.find("--chat-template"), std::string::npos) << what;
  }
}

TEST(ChatTemplate, ATemplateThatCannotServeIsRefusedAtLoadSayingWhy) {
  // A tag the engine does not know (an extension's).
  expect_refused("{% include 'system.jinja' %}{% for m in messages %}{{ m['content'] }}{% endfor %}", "include");
  // A method it does not implement on the path every request takes.
  expect_refused("{% for m in messages %}{{ m['content'].expandtabs(4) }}{% endfor %}", "expandtabs");
  // A template that never writes the message (Mistral-like, reading a variable no
  // request sets): a chat would silently lose its question.
  expect_refused("{{ bos_token }}[INST] {{ m }} [/INST]", "does not write the last message");
  // One that refuses even a single question.
  expect_refused("{{ raise_exception('Only tool calls') }}", "Only tool calls");
  // A syntax error.
  expect_refused("{% for m in messages %}{{ m['content'] }}", "test template");
  // The operator's file that is not there.
  try {
    ChatTemplate::from_operator("/nonexistent/chat.jinja", bytes_only());
    ADD_FAILURE() << "loaded a missing file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/chat.jinja"), std::string::npos) << e.what();
  }
  // A template in the model's file that fails names the file's key.
  std::vector<uint8_t> keep;
  try {
    ChatTemplate::from_gguf(gguf_with("tokenizer.chat_template", "{{ bos_token }}[INST] {{ m }} [/INST]", &keep),
                            bytes_only());
    ADD_FAILURE() << "loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, AConversationTheTemplateRefusesGetsItsOwnMessage) {
  ASSERT_TRUE(fs::is_directory(kTemplates)) << kTemplates << " (tools/setup.sh)";
  const ChatTemplate gemma(slurp(kTemplates / "google-gemma-2-2b-it.jinja"), "gemma 2", "<bos>", "<eos>");
  try {
    gemma.cut_at_last_message(kWithSystem);
    ADD_FAILURE() << "rendered a system turn";
  } catch (const TemplateRaised& e) {
    EXPECT_STREQ(e.what(), "System role not supported");
  }
  try {
    gemma.apply({{"user", "a"}, {"user", "b"}}, true);
    ADD_FAILURE() << "rendered two user turns in a row";
  } catch (const TemplateRaised& e) {
    EXPECT_NE(std::string(e.what()).find("alternate"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gemma.apply(kOne, true),
            "<bos><start_of_turn>user\nHow tall is the Eiffel Tower?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma.stop_strings(), (std::vector<std::string>{"<end_of_turn>"}));
  // Text a template's variables cannot hold is refused, not rendered with stand-ins
  // (found by fuzz_text_input); the cut never renders the question, so it takes any bytes.
  EXPECT_THROW(gemma.apply({{"user", "caf\xE9"}}, true), std::invalid_argument);
  EXPECT_THROW(gemma.cut_at_last_message({{"user", "caf\xE9"}, {"assistant", "ok"}, {"user", "q"}}),
               std::invalid_argument);
  EXPECT_NO_THROW(gemma.cut_at_last_message({{"user", "caf\xE9"}}));
}

TEST(ChatTemplate, InlineOrFromAFile) {
  const Tokenizer none = bytes_only();
  const ChatTemplate inline_t =
      ChatTemplate::from_operator("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}", none);
  EXPECT_EQ(inline_t.apply({{"user", "hi"}}, true), "[user] hi\n");
  EXPECT_NE(inline_t.origin().find("inline"), std::string::npos) << inline_t.origin();
  const fs::path gemma = kTemplates / "google-gemma-2-2b-it.jinja";
  const ChatTemplate from_file = ChatTemplate::from_operator(gemma.string(), none);
  EXPECT_NE(from_file.origin().find(gemma.string()), std::string::npos) << from_file.origin();
  EXPECT_EQ(from_file.apply(kOne, false), "<start_of_turn>user\nHow tall is the Eiffel Tower?<end_of_turn>\n");
}

}  // namespace
}  // namespace bs
