#include "actors/runtime/request.h"

namespace bs {

const char* errc_name(RequestErrc c) {
  switch (c) {
    case RequestErrc::invalid: return "invalid_request";
    case RequestErrc::too_long: return "context_length_exceeded";
    case RequestErrc::overloaded: return "overloaded";
    case RequestErrc::shutting_down: return "shutting_down";
    case RequestErrc::internal: return "internal_error";
    case RequestErrc::unavailable: return "unavailable";
  }
  return "?";
}

}  // namespace bs
