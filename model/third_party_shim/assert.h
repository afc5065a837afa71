// assert() for llama.cpp's Jinja engine (model/CMakeLists.txt puts this folder first in
// that library's include path, and in model/jinja_template.cpp's): the engine checks
// the shape of what it parsed with assert, which NDEBUG removes in a Release build (a
// malformed template then reads a node as the wrong type) and which aborts otherwise.
// Here a failed check throws, and JinjaTemplate refuses the template by name.
// tests/fuzz/fuzz_chat_template.cpp found the first such template in seconds.
#include <stdexcept>

#undef assert
#define assert(expr) \
  (static_cast<bool>(expr) ? void(0) : throw std::runtime_error("template engine check failed: " #expr))
