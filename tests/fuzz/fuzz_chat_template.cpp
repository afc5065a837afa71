// libFuzzer target for the chat template parser and renderer (model/jinja_template.h,
// llama.cpp's Jinja engine): any bytes as a template's source either parse or are
// refused with std::invalid_argument; a parsed template renders a fixed conversation or
// refuses it the same way; as a model's chat template (model/chat_template.h) it loads or
// is refused, and is cut around the last message or refuses. Never a
// crash, a hang (-timeout) or another exception.
// tools/ci/fuzz_chat_template.sh seeds it with the 70 real templates.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/jinja_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  static const std::string context =
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi {{ x }}"},)"
      R"({"role":"assistant","content":"Hello."},{"role":"user","content":"Again"}],)"
      R"("add_generation_prompt":true,"bos_token":"<s>","eos_token":"</s>"})";
  try {
    const bs::JinjaTemplate t(source);
    try {
      const std::string out = t.render(context);
      if (out.size() > (size_t{64} << 20)) std::abort();
    } catch (const std::invalid_argument&) {
    }
  } catch (const std::invalid_argument&) {
  }
  // The same source as a model's chat template: its load check, then the RAG cut of a
  // conversation (a template may render a message's length or test its text, so the cut
  // need not reassemble an arbitrary template's rendering: tests/test_chat_template.cpp
  // checks that on the real ones).
  try {
    const bs::ChatTemplate t(source, "fuzzed", "<s>", "</s>");
    const std::vector<bs::ChatMessage> conv = {{"user", "Hi {{ x }}"}, {"assistant", "Hello."}, {"user", "Again"}};
    try {
      const auto cut = t.cut_at_last_message(conv);
      if (cut.before.size() + cut.after.size() > (size_t{64} << 20)) std::abort();
    } catch (const std::invalid_argument&) {
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
