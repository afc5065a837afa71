// libFuzzer target for the pasted-passage search (blend/pasted_chunks.cpp), with
// SmolLM2's real tokenizer and chat template: any message text, with stored passages
// spliced in where the input has a 0x01 byte, must give a prompt that spells the plain
// request's prompt byte for byte (nothing lost, added or reordered; for valid UTF-8
// that is the rendered conversation — the tokenizer drops bytes it has no token for,
// and then the tokens no longer spell the text and nothing is searched), whose found chunks are stored chunks, with the turn's
// close at the end — never a crash or a throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blend/pasted_chunks.h"
#include "blend/rag_prompt.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

const std::vector<std::string> kDocs = {
    "hannibal and scipio is a caroline era stage play, a classical tragedy written by thomas nabbes.",
    "thomas nabbes ( 1605 - 1641 ) was an english dramatist, educated at exeter college, oxford.",
    "the battle of the upper baetis was fought in 211 bc in spain.\n\nit ended the scipios' campaign.",
};

struct Shared {
  bs::gguf::GgufFile file;
  bs::Tokenizer tok;
  bs::ChatTemplate tmpl;
  bs::PastedChunkIndex index{8};
  std::vector<std::vector<int32_t>> stored;
};
Shared* shared = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string path = BLENDSERVE_DEFAULT_MODEL;
  if (!std::filesystem::exists(path)) std::abort();  // run tools/setup.sh first
  auto f = bs::gguf::GgufFile::open(path);
  auto tok = bs::Tokenizer::from_gguf(f);
  auto tmpl = bs::ChatTemplate::from_gguf(f, tok);
  shared = new Shared{std::move(f), std::move(tok), std::move(tmpl), bs::PastedChunkIndex(8), {}};
  for (const auto& d : kDocs) {
    shared->stored.push_back(bs::document_chunk_tokens(shared->tok, d));
    shared->index.add(shared->stored.back());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // long inputs add time, not paths
  std::string message;
  size_t spliced = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0x01) {
      message += kDocs[spliced++ % kDocs.size()] + "\n\n";
    } else {
      message += static_cast<char>(data[i]);
    }
  }
  const std::vector<bs::ChatMessage> messages = {{"user", message}};
  bs::PastedMatch m;
  const bs::RagPrompt p = bs::assemble_pasted_prompt(shared->tok, shared->tmpl, messages, shared->index, &m);
  const std::string spelled = shared->tok.decode(p.concatenated());
  const bs::RagPrompt plain = bs::assemble_rag_prompt(shared->tok, shared->tmpl, messages, {});
  if (spelled != shared->tok.decode(plain.concatenated())) std::abort();
  const bool valid = shared->tok.decode(shared->tok.encode(message, false)) == message;
  // The template renders valid UTF-8 only (model/chat_template.h); the cut above, which
  // never renders the question itself, takes any bytes.
  bool utf8 = true;
  try {
    (void)nlohmann::json(message).dump();
  } catch (const nlohmann::json::type_error&) {
    utf8 = false;
  }
  if (!utf8) {
    try {
      (void)shared->tmpl.apply(messages, true);
      std::abort();
    } catch (const std::invalid_argument&) {
    }
  } else if (valid && spelled != shared->tmpl.apply(messages, true)) {
    std::abort();
  }
  if (!valid && m.chunks_found != 0) std::abort();
  int found = 0;
  for (const auto& c : p.chunks) {
    if (c.empty()) std::abort();
    for (const auto& s : shared->stored) found += c == s;
  }
  if (found < m.chunks_found) std::abort();  // every found chunk is a stored one
  if (p.suffix.empty()) std::abort();        // the turn's close at least
  return 0;
}
