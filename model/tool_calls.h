// Tool calls in a model's answer: the text a chat template tells the model to write
// when it calls one of the request's tools, read back into OpenAI's tool_calls. Each
// family writes its own format, and its template says which (as llama.cpp's chat
// parsers and vLLM's tool parsers pick theirs per model):
//   hermes       Qwen 2.5 / 3, Hermes, SmolLM3: `<tool_call>\n{"name": ..., "arguments":
//                {...}}\n</tool_call>`, one block per call, after any text
//   llama3_json  Llama 3.1 / 3.2 / 3.3: the whole answer is `{"name": ..., "parameters":
//                {...}}` (optionally after <|python_tag|>), or several separated by ";"
// A template that takes tools in another format (Mistral's [TOOL_CALLS] is a control
// token that ends the generation before its calls are written) has format `none`:
// requests with tools are refused for it by name (http/server.cpp).
//
// An answer that does not parse as calls (cut by max_tokens, malformed JSON, a call of
// a tool the request did not offer) is returned as text, never as a half call.
// Plain C++ over nlohmann::json; fuzzed (tests/fuzz/fuzz_chat_request.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

enum class ToolCallFormat { none, hermes, llama3_json };
const char* tool_call_format_name(ToolCallFormat f);

// The format of the calls a template's model writes, from the template's source.
ToolCallFormat tool_call_format_of(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments)
};

struct ParsedAnswer {
  std::string content;          // the text before the calls (all of it when there are none)
  std::vector<ToolCall> calls;  // empty: the answer is text
};

// `text`, the whole answer, read as `f` writes calls. `tool_names`: the request's tools;
// a call of any other name makes the answer text.
ParsedAnswer parse_tool_calls(std::string_view text, ToolCallFormat f, const std::vector<std::string>& tool_names);

// While the answer streams: how many bytes of `text` (the answer so far) are content
// that no call can start within, so a stream can send them now. The rest is held until
// more text or the end decides (hermes: from "<tool_call>" or a partial one at the end;
// llama3_json: all of an answer that starts with "{" or <|python_tag|>).
size_t tool_call_free_prefix(std::string_view text, ToolCallFormat f);

}  // namespace bs
