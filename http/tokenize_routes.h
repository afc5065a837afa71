// POST /tokenize and POST /detokenize: the model's own tokenizer over HTTP, as vLLM
// and llama-server offer it, so a RAG framework can cut documents by the server's
// tokens. The request shapes of both are taken (vLLM's `prompt` and
// `add_special_tokens`, llama-server's `content` and `add_special`); the answers are
// vLLM's, with llama-server's field beside (`content` in /detokenize):
//   /tokenize   {"prompt": str, "add_special_tokens": bool = true}
//               -> {"tokens": [int], "count": int, "max_model_len": int}
//     Control tokens written in the text are read as tokens (as Hugging Face's
//     tokenizers do); add_special_tokens puts the BOS the model adds in front
//     (Tokenizer::bos_prefix), as a prompt to /v1/chat/completions gets it.
//   /detokenize {"tokens": [int]} -> {"prompt": str, "content": str}
// Every malformed field is an ApiError naming it (a 400), never an exception of
// another kind: the parsers are fuzzed with the chat request's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "http/api_error.h"
#include "model/tokenizer.h"

namespace bs::http {

struct TokenizeRequest {
  std::string text;
  bool add_special = true;
};
TokenizeRequest parse_tokenize_request(const std::string& body);

// Token ids, each in [0, vocab).
std::vector<int32_t> parse_detokenize_request(const std::string& body, int64_t vocab);

// The answers' bodies.
std::string tokenize_response(const Tokenizer& tok, const TokenizeRequest& req, int64_t max_model_len);
std::string detokenize_response(const Tokenizer& tok, const std::vector<int32_t>& ids);

}  // namespace bs::http
