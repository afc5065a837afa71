// The HTTP layer without a server: chat-completion bodies -> runtime requests
// (every refusal names its field and has the status the OpenAI SDKs expect), the
// response JSON (completion, stream chunks, usage), API-key comparison and the
// Prometheus text. No model: label "unit", also under ASan+UBSan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "http/api_access.h"
#include "http/api_error.h"
#include "http/metrics.h"
#include "http/openai_request.h"
#include "http/openai_response.h"
#include "http/server.h"

namespace bs::http {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

ChatCompletionRequest parse(const std::string& body) { return parse_chat_completion(body, 1000); }

// The ApiError a body is refused with.
ApiError refusal(const std::string& body) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

// The fields every response of one request shares (no tools offered).
CompletionMeta meta(std::string id, int64_t created, std::string model, std::string fingerprint, bool text = false) {
  CompletionMeta m;
  m.id = std::move(id);
  m.created = created;
  m.model = std::move(model);
  m.system_fingerprint = std::move(fingerprint);
  m.text = text;
  return m;
}

const std::string kMsg = R"("messages":[{"role":"user","content":"hi"}])";
std::string with(const std::string& fields) { return R"({"model":"m",)" + kMsg + (fields.empty() ? "" : "," + fields) + "}"; }

TEST(ChatRequest, MinimalBodyGetsTheDefaults) {
  const auto r = parse(with(""));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.request.messages.size(), 1u);
  EXPECT_EQ(r.request.messages[0].role, "user");
  EXPECT_EQ(r.request.messages[0].content, "hi");
  EXPECT_TRUE(r.request.documents.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_EQ(r.request.sampling.max_tokens, 1000);  // the default passed in
  EXPECT_EQ(r.request.sampling.temperature, 0.0f);
  EXPECT_FALSE(r.request.mode.has_value());
  EXPECT_FALSE(r.request.ratio.has_value());
}

TEST(ChatRequest, EveryFieldMapsOntoTheRuntimeRequest) {
  const auto r = parse(with(R"("stream":true,"stream_options":{"include_usage":true},"max_tokens":7,
      "temperature":0.7,"top_p":0.9,"top_k":40,"seed":-3,"stop":["a","bc"],"n":1,"presence_penalty":0,
      "frequency_penalty":0.0,"logprobs":false,"response_format":{"type":"text"},"user":"u","metadata":{"k":"v"},
      "documents":["d1","d2"],"mode":"full","ratio":0.3)"));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.max_tokens_given);
  const auto& s = r.request.sampling;
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(s.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.request.documents, (std::vector<std::string>{"d1", "d2"}));
  EXPECT_EQ(r.request.mode, BlendMode::Full);
  EXPECT_FLOAT_EQ(*r.request.ratio, 0.3f);
}

TEST(ChatRequest, MaxCompletionTokensWinsAndStopMayBeOneString) {
  const auto r = parse(with(R"("max_tokens":5,"max_completion_tokens":9,"stop":"END")"));
  EXPECT_EQ(r.request.sampling.max_tokens, 9);
  EXPECT_EQ(r.request.sampling.stop, (std::vector<std::string>{"END"}));
  EXPECT_EQ(parse(with(R"("max_tokens":12.0)")).request.sampling.max_tokens, 12);  // JSON has one number type
}

TEST(ChatRequest, NullMeansNotGiven) {
  const auto r = parse(with(R"("temperature":null,"stream":null,"stop":null,"max_tokens":null,"documents":null)"));
  EXPECT_EQ(r.request.sampling.temperature, 0.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.request.sampling.stop.empty());
  EXPECT_FALSE(r.max_tokens_given);
}

TEST(ChatRequest, TextPartsOfTheLastUserMessageAreDocuments) {
  const auto r = parse(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"early"},{"type":"text","text":" turn"}]},
      {"role":"assistant","content":"ok"},
      {"role":"user","content":[{"type":"text","text":"doc A"},{"type":"text","text":"doc B"},
                                {"type":"text","text":"question?"}]}]})");
  ASSERT_EQ(r.request.messages.size(), 4u);
  EXPECT_EQ(r.request.messages[0].role, "system");          // developer = system
  EXPECT_EQ(r.request.messages[1].content, "early turn");   // parts of earlier turns are joined
  EXPECT_EQ(r.request.messages[3].content, "question?");
  EXPECT_EQ(r.request.documents, (std::vector<std::string>{"doc A", "doc B"}));
}

struct Bad {
  const char* body;
  const char* param;  // "" = none
  const char* in_message;
};

TEST(ChatRequest, BadBodiesAreRefusedWith400NamingTheField) {
  const std::vector<Bad> cases = {
      {R"({"model":"m", "messages": [)", "", "not valid JSON"},
      {"", "", "not valid JSON"},
      {"[1,2]", "", "must be a JSON object"},
      {R"({"messages":[{"role":"user","content":"hi"}]})", "model", "model parameter"},
      {R"({"model":7,"messages":[{"role":"user","content":"hi"}]})", "model", "must be a string"},
      {R"({"model":"m"})", "messages", "required"},
      {R"({"model":"m","messages":[]})", "messages", "must not be empty"},
      {R"({"model":"m","messages":"hi"})", "messages", "must be an array"},
      {R"({"model":"m","messages":[5]})", "messages[0]", "must be an object"},
      {R"({"model":"m","messages":[{"content":"hi"}]})", "messages[0].role", "required"},
      {R"({"model":"m","messages":[{"role":"wizard","content":"hi"}]})", "messages[0].role", "unknown role 'wizard'"},
      {R"({"model":"m","messages":[{"role":"tool","content":"hi"}]})", "messages[0].tool_call_id", "required"},
      {R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content", "required"},
      {R"({"model":"m","messages":[{"role":"user","content":null}]})", "messages[0].content", "required"},
      {R"({"model":"m","messages":[{"role":"user","content":42}]})", "messages[0].content", "must be a string or"},
      {R"({"model":"m","messages":[{"role":"user","content":[]}]})", "messages[0].content", "empty array"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0].type", "only 'text'"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text",
       "required"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi","tool_calls":[]}]})", "messages[0].tool_calls",
       "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}]})",
       "messages[1].role", "last message must be the user's or a tool's"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"d"},{"type":"text","text":"q"}]}],
          "documents":["x"]})",
       "documents", "not both"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"documents":"x"})", "documents", "array"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"q"}]}]})",
       "messages[0].content[0].text", "is a document and must not be empty"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[""]})", "documents[0]", "empty"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[3]})", "documents[0]", "string"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"})", "stream", "boolean"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}})",
       "stream_options", "only allowed when 'stream' is true"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"x":1}})",
       "stream_options.x", "unknown"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0})", "max_tokens", "[1, "},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-5})", "max_tokens", "[1, "},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1.5})", "max_tokens", "integer"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":99999999999})", "max_tokens",
       "at most"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"10"})", "max_tokens", "integer"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0})",
       "max_completion_tokens", "[1, "},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":2.5})", "temperature", "[0, 2]"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":-0.1})", "temperature", "[0, 2]"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":"hot"})", "temperature", "number"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"top_p":0})", "top_p", "(0, 1]"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"top_p":1.1})", "top_p", "(0, 1]"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"top_k":-1})", "top_k", "[0, "},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":"s"})", "seed", "integer"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["a","b","c","d","e"]})", "stop",
       "at most 4"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":[""]})", "stop", "must not be empty"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":5})", "stop", "string or an array"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":2})", "n", "only n = 1"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":0})", "n", "[1, "},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"presence_penalty":0.5})", "presence_penalty",
       "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true})", "logprobs", "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})",
       "response_format", "only response_format"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":{}})", "tools", "must be an array"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})",
       "tools[0].function", "required"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"retrieval","function":{"name":"a"}}]})",
       "tools[0].type", "must be \"function\""},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name", "1 to 64"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a"}},
          {"type":"function","function":{"name":"a"}}]})",
       "tools[1].function.name", "two tools"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a",
          "parameters":"x"}}]})",
       "tools[0].function.parameters", "must be an object"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a",
          "examples":[]}}]})",
       "tools[0].function.examples", "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})", "tool_choice",
       "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"function","function":{"name":"a"}}})",
       "tool_choice", "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":5})", "tool_choice", "must be"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"parallel_tool_calls":"no"})",
       "parallel_tool_calls", "boolean"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,
          "tool_calls":[{"type":"function","function":{"name":"a","arguments":"{}"}}]},
          {"role":"tool","tool_call_id":"c","content":"1"}]})",
       "messages[1].tool_calls[0].id", "required"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,
          "tool_calls":[{"id":"c","type":"function","function":{"name":"a","arguments":{}}}]},
          {"role":"tool","tool_call_id":"c","content":"1"}]})",
       "messages[1].tool_calls[0].function.arguments", "must be a string"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null}]})",
       "messages[1].content", "required"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temprature":0.5})", "temprature",
       "unrecognized request argument supplied: temprature"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"mode":"fast"})", "mode", "unknown mode 'fast'"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"ratio":1.5})", "ratio", "[0, 1]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = refusal(c.body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param);
    EXPECT_THAT(e.what(), HasSubstr(c.in_message));
  }
}

// Tools as the chat template reads them: the array as given, its names in order; an
// assistant's calls (content null) and a tool's result, which may end the conversation.
TEST(ChatRequest, ToolsAndTheirCallsMapOntoTheTemplatesVariables) {
  const std::string body = R"({"model":"m","messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_0","content":"18 C"}],
    "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
      "parameters":{"type":"object"},"strict":true}},{"type":"function","function":{"name":"get_time"}}],
    "tool_choice":"auto","parallel_tool_calls":false})";
  const auto r = parse_chat_completion(body, 64);
  EXPECT_EQ(r.tool_names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(json::parse(r.request.tools).size(), 2u);
  ASSERT_EQ(r.request.messages.size(), 3u);
  EXPECT_EQ(r.request.messages[1].role, "assistant");
  EXPECT_EQ(r.request.messages[1].content, "");
  EXPECT_EQ(json::parse(r.request.messages[1].tool_calls)[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.request.messages[2].role, "tool");
  EXPECT_EQ(r.request.messages[2].tool_call_id, "call_0");
  EXPECT_EQ(r.request.messages[2].content, "18 C");
  // tool_choice none: the tools are not offered.
  json none = json::parse(body);
  none["tool_choice"] = "none";
  const auto n = parse_chat_completion(none.dump(), 64);
  EXPECT_TRUE(n.request.tools.empty());
  EXPECT_TRUE(n.tool_names.empty());
}

TEST(ChatRequest, ErrorBodyHasTheOpenAIShapeEvenForInvalidUtf8) {
  const ApiError e = refusal(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"x\u00e9":1})");
  const json body = json::parse(error_body(e));
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "xé");
  EXPECT_EQ(body["error"]["code"], "unsupported_parameter");
  // A message quoting invalid UTF-8 still dumps (the bytes are replaced).
  const json odd = json::parse(error_body(bad_request(std::string("bad \xff\xfe byte"))));
  EXPECT_THAT(odd["error"]["message"].get<std::string>(), HasSubstr("bad "));
  EXPECT_TRUE(odd["error"]["param"].is_null());
  EXPECT_TRUE(odd["error"]["code"].is_null());
}

TEST(DocumentBody, TextIsRequired) {
  EXPECT_EQ(parse_document_body(R"({"text":"some document"})"), "some document");
  for (const char* bad : {R"({})", R"({"text":""})", R"({"text":3})", R"({"text":"a","extra":1})", "nope"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_document_body(bad), ApiError);
  }
}

RequestResult result() {
  RequestResult r;
  r.text = "Paris.";
  r.tokens = {1, 2, 3};
  r.finish_reason = "length";
  r.prompt_tokens = 100;
  r.cached_tokens = 80;
  r.recomputed_tokens = 12;
  r.chunks = 2;
  r.chunks_by_tier = {{"ram", 1}, {"ssd", 1}};
  return r;
}

TEST(ChatResponse, CompletionAndUsage) {
  const CompletionMeta m = meta("chatcmpl-abc", 1700000000, "model-x", "fp");
  const json j = json::parse(completion_json(m, result()));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-abc");
  EXPECT_EQ(j["model"], "model-x");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 100);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 103);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 80);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["recomputed_tokens"], 12);
  EXPECT_EQ(client_finish_reason("stop"), "stop");
  EXPECT_EQ(client_finish_reason("length"), "length");
}

TEST(ChatResponse, StreamChunks) {
  const CompletionMeta m = meta("chatcmpl-abc", 1, "model-x", "fp");
  const json first = json::parse(chunk_json(m, "", true, "", false));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const json text = json::parse(chunk_json(m, "Par", false, "", true));
  EXPECT_FALSE(text["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "Par");
  EXPECT_TRUE(text["usage"].is_null());
  const json last = json::parse(chunk_json(m, "", false, "stop", false));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json usage = json::parse(usage_chunk_json(m, result()));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["id"], "chatcmpl-abc");
}

// A chat answer read for the offered tools' calls: the message's tool_calls, its content
// the text before them, finish_reason tool_calls; streamed as one tool-calls chunk.
TEST(ChatResponse, ToolCallsInTheAnswer) {
  CompletionMeta m = meta("chatcmpl-abc", 1, "model-x", "fp");
  m.tools.format = bs::ToolCallFormat::hermes;
  m.tools.names = {"get_weather"};
  RequestResult r = result();
  r.text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const json j = json::parse(completion_json(m, r));
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["content"], "Checking.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_abc_0");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  const json chunk = json::parse(tool_calls_chunk_json(m, read_answer(m, r.text).calls, false));
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["id"], "call_abc_0");
  // Without tools offered the same text is the content.
  const CompletionMeta plain = meta("chatcmpl-abc", 1, "model-x", "fp");
  const json t = json::parse(completion_json(plain, r));
  EXPECT_EQ(t["choices"][0]["message"]["content"], r.text);
  EXPECT_FALSE(t["choices"][0]["message"].contains("tool_calls"));
}

// POST /v1/completions: a prompt string or token ids (a one-element batch of either),
// the fields chat has, and the legacy API's own fields refused unless harmless.
TEST(TextCompletionRequest, PromptAsTextOrIdsAndTheSharedFields) {
  auto parse_text = [](const std::string& body) { return parse_text_completion(body, 1000); };
  auto r = parse_text(R"({"model":"m","prompt":"Once upon","max_tokens":5,"temperature":0,"stop":"\n",)"
                      R"("stream":true,"stream_options":{"include_usage":true},"documents":["d1"],"mode":"blend",)"
                      R"("ratio":0.3,"logprobs":null,"echo":false,"best_of":1,"suffix":""})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Once upon");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_TRUE(r.request.raw);
  EXPECT_TRUE(r.stream && r.include_usage && r.max_tokens_given);
  EXPECT_EQ(r.request.sampling.max_tokens, 5);
  EXPECT_EQ(r.request.sampling.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.request.documents, std::vector<std::string>{"d1"});
  ASSERT_TRUE(r.request.ratio);
  EXPECT_FLOAT_EQ(*r.request.ratio, 0.3f);
  EXPECT_EQ(parse_text(R"({"model":"m","prompt":["one"]})").prompt_text, "one");
  const auto ids = parse_text(R"({"model":"m","prompt":[1,2,3]})");
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_text(R"({"model":"m","prompt":[[4,5]]})").prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse_text(R"({"model":"m","prompt":"x"})").request.sampling.max_tokens, 1000);

  struct Bad { std::string body; const char* param; };
  const Bad bad[] = {{R"({"model":"m"})", "prompt"},
                     {R"({"prompt":"x"})", "model"},
                     {R"({"model":"m","prompt":""})", "prompt"},
                     {R"({"model":"m","prompt":[]})", "prompt"},
                     {R"({"model":"m","prompt":7})", "prompt"},
                     {R"({"model":"m","prompt":["a","b"]})", "prompt"},
                     {R"({"model":"m","prompt":[1,-2]})", "prompt[1]"},
                     {R"({"model":"m","prompt":[1,"a"]})", "prompt[1]"},
                     {R"({"model":"m","prompt":"x","logprobs":2})", "logprobs"},
                     {R"({"model":"m","prompt":"x","echo":true})", "echo"},
                     {R"({"model":"m","prompt":"x","suffix":"end"})", "suffix"},
                     {R"({"model":"m","prompt":"x","best_of":2})", "best_of"},
                     {R"({"model":"m","prompt":"x","n":2})", "n"},
                     {R"({"model":"m","prompt":"x","messages":[]})", "messages"},
                     {R"({"model":"m","prompt":"x","documents":[""]})", "documents[0]"}};
  for (const auto& b : bad) {
    try {
      parse_text(b.body);
      ADD_FAILURE() << "accepted: " << b.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << b.body;
      EXPECT_EQ(e.param, b.param) << b.body;
    }
  }
}

TEST(TextCompletionResponse, TextCompletionObjectsCarryText) {
  const CompletionMeta m = meta("cmpl-abc", 1, "model-x", "fp", true);
  const json whole = json::parse(completion_json(m, result()));
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["choices"][0]["text"], "Paris.");
  EXPECT_FALSE(whole["choices"][0].contains("message"));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 80);
  const json piece = json::parse(chunk_json(m, "Par", false, "", true));
  EXPECT_EQ(piece["object"], "text_completion");
  EXPECT_EQ(piece["choices"][0]["text"], "Par");
  EXPECT_TRUE(piece["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(piece["usage"].is_null());
  const json last = json::parse(chunk_json(m, "", false, "stop", false));
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(json::parse(usage_chunk_json(m, result()))["object"], "text_completion");
}

TEST(ApiKeys, ConstantTimeEqualIsEquality) {
  EXPECT_TRUE(constant_time_equal("sk-abcdefgh", "sk-abcdefgh"));
  EXPECT_FALSE(constant_time_equal("sk-abcdefgh", "sk-abcdefgi"));
  EXPECT_FALSE(constant_time_equal("sk-abcdefgh", "sk-abcdefg"));
  EXPECT_FALSE(constant_time_equal("sk-abcdefg", "sk-abcdefgh"));
  EXPECT_FALSE(constant_time_equal("", "sk-abcdefgh"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(label_escape("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(label_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(Metrics, PrometheusTextWithCumulativeBuckets) {
  ServerMetrics m;
  m.count_response("/v1/chat/completions", 200);
  m.count_response("/v1/chat/completions", 200);
  m.count_response("/v1/chat/completions", 400);
  RequestResult r = result();
  r.ttft_seconds = 0.2;
  r.total_seconds = 0.7;
  r.ratio = 0.15f;
  m.observe_completion(r);
  r.ttft_seconds = 3;
  m.observe_completion(r);
  m.count_disconnect();
  const std::string text = m.render({{"blendserve_queue_depth", "Queued.", "", 4}});
  EXPECT_THAT(text, HasSubstr("blendserve_http_responses_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_http_responses_total{route=\"/v1/chat/completions\",status=\"400\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_bucket{le=\"2.5\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_time_to_first_token_seconds_sum 3.2000000000000002\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_completion_tokens_total 6\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_cached_prompt_tokens_total 160\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_chunks_total{tier=\"ssd\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("blendserve_client_disconnects_total 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE blendserve_queue_depth gauge\nblendserve_queue_depth 4\n"));
}

}  // namespace
}  // namespace bs::http
