#include "http/tokenize_routes.h"

#include <nlohmann/json.hpp>

namespace bs::http {
namespace {

using json = nlohmann::json;

json parse_object(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e309)
    throw bad_request(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad_request("the body must be a JSON object");
  return j;
}

// The boolean under `key` or `alias`, `fallback` when neither is there.
bool flag(const json& j, const char* key, const char* alias, bool fallback) {
  for (const char* k : {key, alias}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_boolean()) throw bad_request(std::string("'") + k + "' must be a boolean", k);
    return j[k].get<bool>();
  }
  return fallback;
}

}  // namespace

TokenizeRequest parse_tokenize_request(const std::string& body) {
  const json j = parse_object(body);
  TokenizeRequest r;
  const char* key = j.contains("prompt") ? "prompt" : j.contains("content") ? "content" : nullptr;
  if (!key) throw bad_request("'prompt' is required (the text to tokenize)", "prompt");
  if (!j[key].is_string()) throw bad_request(std::string("'") + key + "' must be a string", key);
  r.text = j[key].get<std::string>();
  r.add_special = flag(j, "add_special_tokens", "add_special", true);
  return r;
}

std::vector<int32_t> parse_detokenize_request(const std::string& body, int64_t vocab) {
  const json j = parse_object(body);
  if (!j.contains("tokens")) throw bad_request("'tokens' is required (the token ids to turn into text)", "tokens");
  const json& t = j["tokens"];
  if (!t.is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  ids.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string param = "tokens[" + std::to_string(i) + "]";
    if (!t[i].is_number_integer()) throw bad_request("'" + param + "' must be an integer token id", param);
    const int64_t id = t[i].get<int64_t>();
    if (id < 0 || id >= vocab)
      throw bad_request("'" + param + "' = " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ")",
                        param);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::string tokenize_response(const Tokenizer& tok, const TokenizeRequest& req, int64_t max_model_len) {
  std::vector<int32_t> ids = req.add_special ? tok.bos_prefix() : std::vector<int32_t>{};
  const auto text = tok.encode(req.text, /*parse_special=*/true);
  ids.insert(ids.end(), text.begin(), text.end());
  return json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_model_len}}.dump();
}

std::string detokenize_response(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  const std::string text = tok.decode(ids);
  // Invalid UTF-8 (a token sequence cut inside a character) is replaced, not an error.
  return json{{"prompt", text}, {"content", text}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace bs::http
