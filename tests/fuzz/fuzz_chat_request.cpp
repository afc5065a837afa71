// libFuzzer target for the chat- and text-completion body parsers (http/openai_request.cpp), the
// document body's and /tokenize's and /detokenize's (http/tokenize_routes.cpp):
// any bytes must either parse into a request whose fields hold the documented
// ranges or be refused with an ApiError of status 400 — never crash, hang or throw
// anything else. The error body must always dump as JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "http/api_error.h"
#include "http/openai_request.h"
#include "http/tokenize_routes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const auto r = bs::http::parse_chat_completion(body, 512);
    const auto& s = r.request.sampling;
    if (r.request.messages.empty() || r.request.messages.back().role != "user") std::abort();
    if (s.max_tokens < 1 || !(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p > 0 && s.top_p <= 1) ||
        s.top_k < 0 || s.stop.size() > 4)
      std::abort();
    if (r.request.ratio && !(*r.request.ratio >= 0 && *r.request.ratio <= 1)) std::abort();
    // Documents from the `documents` array are never empty (text parts may be:
    // split_text_parts drops the empty ones).
    for (const auto& d : r.request.documents)
      if (d.empty()) std::abort();
    if (r.include_usage && !r.stream) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
    if (bs::http::error_body(e).empty()) std::abort();
  }
  try {
    (void)bs::http::parse_document_body(body);
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    const auto t = bs::http::parse_text_completion(body, 512);
    if (!t.request.raw || t.request.sampling.max_tokens < 1) std::abort();
    if (t.prompt_is_ids ? t.prompt_ids.empty() : (t.prompt_text.empty() && t.request.documents.empty())) std::abort();
    for (int32_t id : t.prompt_ids)
      if (id < 0) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    (void)bs::http::parse_tokenize_request(std::string(body));
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    for (int32_t id : bs::http::parse_detokenize_request(std::string(body), 49152))
      if (id < 0 || id >= 49152) std::abort();
  } catch (const bs::http::ApiError& e) {
    if (e.status != 400) std::abort();
  }
  return 0;
}
