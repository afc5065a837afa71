// libFuzzer target for the chat template parser and renderer (model/jinja_template.h,
// llama.cpp's Jinja engine): any bytes as a template's source either parse or are
// refused with std::invalid_argument; a parsed template renders a fixed conversation or
// refuses it the same way. Never a crash, a hang (-timeout) or another exception.
// tools/fuzz_chat_template.sh seeds it with the 70 real templates.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

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
  return 0;
}
