// What llama.cpp's common/json.cpp takes from ggml.h when it is compiled for
// blendserve's Jinja engine (model/CMakeLists.txt): GGML_ASSERT, as an exception the
// template renderer turns into a refusal, never an abort of the server.
#pragma once

#include <stdexcept>

#define GGML_ASSERT(x)                                                              \
  do {                                                                              \
    if (!(x)) throw std::runtime_error("llama.cpp json assertion failed: " #x);    \
  } while (0)
