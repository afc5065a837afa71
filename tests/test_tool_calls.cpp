// Tools through the chat template (model/chat_template.h: which real templates take
// them, and in which format their models answer) and the calls read back from an
// answer (model/tool_calls.h), in the formats the families' templates ask for.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/tool_calls.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using bs::ChatMessage;
using bs::ChatTemplate;
using bs::ToolCallFormat;

const fs::path kTemplates = fs::path(BLENDSERVE_LLAMACPP_MODELS) / "templates";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kTools =
    R"([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},)"
    R"( {"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object"}}}])";
const std::vector<std::string> kNames = {"get_weather", "get_time"};

ChatTemplate load(const std::string& name) { return ChatTemplate(slurp(kTemplates / name), name, "<s>", "</s>"); }

// Every real template: whether it writes the tools into the prompt, and which format its
// model's calls are read in. The families' formats by name; the rest counted.
TEST(ToolTemplates, WhichRealTemplatesTakeToolsAndHowTheirModelsCall) {
  ASSERT_TRUE(fs::is_directory(kTemplates)) << kTemplates << " (tools/setup.sh)";
  const std::map<std::string, ToolCallFormat> want = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::hermes},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::hermes},
      {"Qwen-QwQ-32B.jinja", ToolCallFormat::hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::hermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::llama3_json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::llama3_json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::llama3_json},
      // Takes tools; its [TOOL_CALLS] is a control token that ends the generation.
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::none},
  };
  int loaded = 0, take = 0, readable = 0;
  for (const auto& e : fs::directory_iterator(kTemplates)) {
    if (e.path().extension() != ".jinja") continue;
    const std::string name = e.path().filename().string();
    std::unique_ptr<ChatTemplate> t;
    try {
      t = std::make_unique<ChatTemplate>(load(name));
    } catch (const std::invalid_argument&) {
      continue;
    }
    ++loaded;
    take += t->takes_tools();
    readable += t->tool_call_format() != ToolCallFormat::none;
    if (auto w = want.find(name); w != want.end()) {
      EXPECT_TRUE(t->takes_tools()) << name;
      EXPECT_EQ(t->tool_call_format(), w->second) << name;
    }
    // A template the probe says takes tools writes them: their names are in the prompt.
    if (t->takes_tools()) {
      const std::string with = t->apply({{"user", "What is the weather in Paris?"}}, true, kTools);
      EXPECT_NE(with.find("get_weather"), std::string::npos) << name;
    }
  }
  // Gemma's and SmolLM2's (ChatML) take none.
  EXPECT_FALSE(load("google-gemma-2-2b-it.jinja").takes_tools());
  EXPECT_FALSE(ChatTemplate().takes_tools());
  std::printf("{\"templates_loaded\": %d, \"take_tools\": %d, \"calls_read_back\": %d}\n", loaded, take, readable);
  EXPECT_GE(take, 40);
}

// The prompt's cut with tools: the template's tools section is before the question (in
// the RAG prompt's prefix), and a tool's result can end the conversation, cut there as a
// question is.
TEST(ToolTemplates, ThePromptCarriesTheToolsAndACallsResult) {
  const ChatTemplate qwen = load("Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::vector<ChatMessage> asked = {{"user", "What is the weather in Paris?"}};
  const auto cut = qwen.cut_at_last_message(asked, kTools);
  EXPECT_NE(cut.before.find("<tools>"), std::string::npos) << cut.before;
  EXPECT_NE(cut.before.find("\"get_time\""), std::string::npos) << cut.before;
  const std::vector<ChatMessage> answered = {
      {"user", "What is the weather in Paris?"},
      {"assistant", "",
       R"([{"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}])"},
      {"tool", "{\"temperature\": 18}", "", "call_0"}};
  const std::string whole = qwen.apply(answered, true, kTools);
  // The call's arguments written as an object (a string arriving from the client is
  // parsed), the result in the tool's turn.
  EXPECT_NE(whole.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << whole;
  EXPECT_NE(whole.find("<tool_response>\n{\"temperature\": 18}\n</tool_response>"), std::string::npos) << whole;
  const auto c = qwen.cut_at_last_message(answered, kTools);
  EXPECT_EQ(c.before + answered.back().content + c.after, whole);
}

TEST(ToolCalls, HermesBlocksAfterAnyText) {
  const auto one = bs::parse_tool_calls(
      "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      ToolCallFormat::hermes, kNames);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.content, "I will look.");
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(one.calls[0].arguments), json({{"city", "Paris"}}));
  // Two calls; the last one unclosed (the model's turn ended there); arguments given as
  // a JSON string.
  const auto two = bs::parse_tool_calls(
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n",
      ToolCallFormat::hermes, kNames);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.content, "");
  EXPECT_EQ(two.calls[0].name, "get_time");
  EXPECT_EQ(json::parse(two.calls[1].arguments), json({{"city", "Oslo"}}));
  // Not calls: the answer stays text, whole.
  for (const std::string& text : {
           std::string("No tools needed: it is sunny."),
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"),  // cut short
           std::string("<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {}}\n</tool_call>"),  // not offered
           std::string("<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>"),   // not an object
           std::string("<tool_call>{\"name\": \"get_time\"}</tool_call> and then some text"),
       }) {
    const auto a = bs::parse_tool_calls(text, ToolCallFormat::hermes, kNames);
    EXPECT_TRUE(a.calls.empty()) << text;
    EXPECT_EQ(a.content, text);
  }
}

TEST(ToolCalls, Llama3JsonIsTheWholeAnswer) {
  const auto one = bs::parse_tool_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                                        ToolCallFormat::llama3_json, kNames);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(json::parse(one.calls[0].arguments), json({{"city", "Paris"}}));
  const auto tagged = bs::parse_tool_calls("<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}",
                                           ToolCallFormat::llama3_json, kNames);
  ASSERT_EQ(tagged.calls.size(), 1u);
  EXPECT_EQ(tagged.calls[0].name, "get_time");
  const auto two = bs::parse_tool_calls(
      "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"arguments\": {\"city\": \"a;b\"}}",
      ToolCallFormat::llama3_json, kNames);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(json::parse(two.calls[1].arguments), json({{"city", "a;b"}}));
  for (const std::string& text : {std::string("It is sunny in Paris."),
                                 std::string("{\"name\": \"get_weather\", \"parameters\": {\"city\": "),
                                 std::string("{\"answer\": 42}")}) {
    const auto a = bs::parse_tool_calls(text, ToolCallFormat::llama3_json, kNames);
    EXPECT_TRUE(a.calls.empty()) << text;
    EXPECT_EQ(a.content, text);
  }
}

// While streaming, text that may start a call is held; everything else goes out.
TEST(ToolCalls, TheStreamHoldsOnlyWhatACallMayStart) {
  using bs::tool_call_free_prefix;
  EXPECT_EQ(tool_call_free_prefix("Let me check", ToolCallFormat::hermes), 12u);
  EXPECT_EQ(tool_call_free_prefix("Let me check <tool_", ToolCallFormat::hermes), 13u);
  EXPECT_EQ(tool_call_free_prefix("Let me check <tool_call>{\"na", ToolCallFormat::hermes), 13u);
  EXPECT_EQ(tool_call_free_prefix("a < b", ToolCallFormat::hermes), 5u);
  EXPECT_EQ(tool_call_free_prefix("  ", ToolCallFormat::llama3_json), 0u);
  EXPECT_EQ(tool_call_free_prefix(" {\"name\"", ToolCallFormat::llama3_json), 0u);
  EXPECT_EQ(tool_call_free_prefix("<|python", ToolCallFormat::llama3_json), 0u);
  EXPECT_EQ(tool_call_free_prefix(" It is sunny", ToolCallFormat::llama3_json), 12u);
  EXPECT_EQ(tool_call_free_prefix("<tool_call>", ToolCallFormat::none), 11u);
}

}  // namespace
