// Chat templates rendered by blendserve (model/jinja_template.h: llama.cpp's Jinja
// engine) byte for byte as Python's jinja2 renders them with transformers'
// apply_chat_template settings (tools/fixtures/render_chat_template.py, run with the system
// python3 and Debian's python3-jinja2): every one of the real templates in llama.cpp's
// models/templates (tools/setup.sh puts them in models/llama.cpp/templates), each with
// a one-turn chat, a system prompt and several turns, a conversation that ends with
// the assistant's turn (no generation prompt), a question with tools offered, and a
// tool's call and result.
//
// A template both accept must render the same bytes, and one that raises in Python
// (raise_exception: a system message it forbids, roles that do not alternate) must be
// refused here too. Templates Python's jinja2 cannot compile (an extension tag such as
// {% generation %}) are not compared; templates our engine refuses at parse are listed
// with the reason (model/README.md, "Chat templates", names them). One difference is known
// and asserted:
// a variable no chat request gives, used in an expression, is an error in Python and
// empty here (FireFunction v2's `functions`).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/jinja_template.h"
#include "tests/temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kTemplates = fs::path(BLENDSERVE_LLAMACPP_MODELS) / "templates";
const fs::path kRenderer = fs::path(BLENDSERVE_FIXTURES) / ".." / ".." / "tools" / "fixtures" / "render_chat_template.py";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The variables of each case (what apply_chat_template passes).
std::vector<json> contexts() {
  const json user = {{"role", "user"}, {"content", "How tall is the Eiffel Tower?"}};
  const json system = {{"role", "system"}, {"content", "You answer briefly."}};
  const json assistant = {{"role", "assistant"}, {"content", "It is 330 metres tall."}};
  const json again = {{"role", "user"}, {"content", "And when was it built?\nPlease be exact."}};
  auto with = [](json messages, bool gen) {
    return json{{"messages", std::move(messages)}, {"add_generation_prompt", gen},
                {"bos_token", "<s>"},              {"eos_token", "</s>"}};
  };
  // Tools: offered with a question, then a call of one and its result (the shapes
  // model/chat_template.cpp passes: OpenAI's tools, the call's arguments as an object).
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const json weather = {{"role", "user"}, {"content", "What is the weather in Paris?"}};
  const json call = {{"role", "assistant"},
                     {"content", ""},
                     {"tool_calls", json::parse(R"([{"id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])")}};
  const json result = {{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", "{\"temperature\": 18}"}};
  json offered = with(json::array({weather}), true);
  offered["tools"] = tools;
  json called = with(json::array({weather, call, result}), true);
  called["tools"] = tools;
  return {with(json::array({user}), true), with(json::array({system, user, assistant, again}), true),
          with(json::array({user, assistant}), false), offered, called};
}

TEST(JinjaTemplate, RealTemplatesRenderAsPythonsJinja2Does) {
  if (!fs::is_directory(kTemplates)) GTEST_SKIP() << "no " << kTemplates << " (tools/setup.sh)";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kTemplates))
    if (e.path().extension() == ".jinja") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 60u);

  const auto ctxs = contexts();
  json request = {{"cases", json::array()}};
  for (const auto& f : files)
    for (const auto& c : ctxs) request["cases"].push_back({{"template", f.string()}, {"context", c}});
  testing::TempDir dir("bs_jinja");
  const fs::path in = dir.path() / "in.json", out = dir.path() / "out.json";
  std::ofstream(in) << request.dump();
  const std::string cmd = "/usr/bin/python3 '" + kRenderer.string() + "' < '" + in.string() + "' > '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " (python3-jinja2 installed? tools/setup.sh)";
  const json results = json::parse(slurp(out))["results"];
  ASSERT_EQ(results.size(), files.size() * ctxs.size());

  // The tool cases (3 and 4) where Python's jinja2 fails or differs for reasons of its
  // own, by name, so a change either way is seen.
  const std::map<std::string, std::string> python_tool_quirks = {
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", "reads a tool field our request leaves out: an error in "
                                                         "Python, empty here"},
      {"Kimi-K2-Instruct.jinja", "list.append, which Python's immutable sandbox refuses"},
      {"Kimi-K2-Thinking.jinja", "list.append, which Python's immutable sandbox refuses"},
      {"llama-cpp-deepseek-r1.jinja", "tojson of map(): a generator in Python, which it cannot serialize"},
      {"meetkai-functionary-medium-v3.1.jinja", "'...'|safe + a string: Python's Markup HTML-escapes the string"},
      {"meetkai-functionary-medium-v3.2.jinja", "a string + the arguments object: a TypeError in Python"},
  };
  std::set<std::string> quirks_seen;
  int same = 0, both_refused = 0, python_cannot = 0;
  std::map<std::string, std::string> we_refuse;  // template -> our engine's reason
  std::set<std::string> lenient_undefined;        // templates needing variables no request gives
  for (size_t t = 0; t < files.size(); ++t) {
    const std::string name = files[t].filename().string();
    std::unique_ptr<JinjaTemplate> tmpl;
    std::string parse_error;
    try {
      tmpl = std::make_unique<JinjaTemplate>(slurp(files[t]));
    } catch (const std::invalid_argument& e) {
      parse_error = e.what();
    }
    for (size_t c = 0; c < ctxs.size(); ++c) {
      const json& want = results[t * ctxs.size() + c];
      const bool python_ok = want.contains("text");
      if (!python_ok && want["error"].get<std::string>().rfind("TemplateSyntaxError", 0) == 0) {
        ++python_cannot;
        continue;
      }
      if (!tmpl) {
        we_refuse[name] = parse_error;
        continue;
      }
      std::string got, error;
      try {
        got = tmpl->render(ctxs[c].dump());
      } catch (const std::invalid_argument& e) {
        error = e.what();
      }
      if (c >= 3 && python_tool_quirks.count(name) &&
          (!python_ok || !error.empty() || got != want["text"].get<std::string>())) {
        quirks_seen.insert(name);
        continue;
      }
      if (!python_ok) {
        // The one known difference: a variable the request does not give (FireFunction's
        // `functions`) is an error in Python where used in an expression; the engine
        // renders it as empty. Asserted by name, so a change either way is seen.
        if (want["error"].get<std::string>().rfind("UndefinedError", 0) == 0) {
          EXPECT_EQ(name, "fireworks-ai-llama-3-firefunction-v2.jinja") << want["error"];
          lenient_undefined.insert(name);
          continue;
        }
        EXPECT_FALSE(error.empty()) << name << " case " << c << ": Python refused (" << want["error"]
                                    << ") but we rendered:\n" << got;
        ++both_refused;
        continue;
      }
      EXPECT_TRUE(error.empty()) << name << " case " << c << ": " << error;
      EXPECT_EQ(got, want["text"].get<std::string>()) << name << " case " << c;
      if (error.empty() && got == want["text"].get<std::string>()) ++same;
    }
  }
  for (const auto& [name, why] : python_tool_quirks) EXPECT_TRUE(quirks_seen.count(name)) << name << ": " << why;
  std::printf("{\"templates\": %zu, \"cases_equal\": %d, \"cases_both_refused\": %d, "
              "\"cases_python_cannot_compile\": %d, \"templates_we_refuse\": %zu, "
              "\"templates_with_undefined_variables\": %zu, \"tool_cases_python_quirks\": %zu}\n",
              files.size(), same, both_refused, python_cannot, we_refuse.size(), lenient_undefined.size(),
              quirks_seen.size());
  for (const auto& [name, why] : we_refuse) std::printf("refused: %s: %s\n", name.c_str(), why.substr(0, 200).c_str());
  EXPECT_GE(same, 250);  // most of the 71 templates x 5 cases
}

TEST(JinjaTemplate, SyntaxErrorsAndRaiseExceptionAreInvalidArgument) {
  EXPECT_THROW(JinjaTemplate("{% for m in messages %}{{ m.content }}"), std::invalid_argument);
  EXPECT_THROW(JinjaTemplate("{{ 1 + }}"), std::invalid_argument);
  // The engine checks what it parsed with assert (model/third_party_shim/assert.h makes
  // a failed check a refusal): a filter that is no name, found by the fuzzer.
  EXPECT_THROW(JinjaTemplate("{{ x | 1 }}"), std::invalid_argument);
  const JinjaTemplate t(
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}");
  EXPECT_EQ(t.render(R"({"messages":[{"role":"user","content":" hi "}],"add_generation_prompt":true})"),
            "<user>hi<assistant>");
  try {
    (void)t.render(R"({"messages":[{"role":"system","content":"x"}]})");
    ADD_FAILURE() << "rendered a system message the template forbids";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("System role not supported"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.render("not json"), std::invalid_argument);
}

// Integer arithmetic past what the engine holds is refused as Python's jinja2 refuses
// a modulo by zero, never cast from a NaN (tools/patches/llama-jinja-int-range.patch,
// found by fuzz_chat_template under UBSan); `|int` of NaN is the filter's default, 0;
// a modulo takes the divisor's sign, as in Python.
TEST(JinjaTemplate, IntegerArithmeticOutOfRangeIsRefusedNotUndefined) {
  const std::string vars = R"({"n":0,"big":9223372036854775807})";
  EXPECT_EQ(JinjaTemplate("{{ 7 % 3 }} {{ -7 % 3 }} {{ 'nan' | float | int }}").render(vars), "1 2 0");
  for (const char* src : {"{{ 7 % n }}", "{{ 7.5 % n }}", "{{ big * 4 }}", "{{ '1e300' | float | int }}"}) {
    SCOPED_TRACE(src);
    EXPECT_THROW((void)JinjaTemplate(src).render(vars), std::invalid_argument);
  }
}

}  // namespace
}  // namespace bs
