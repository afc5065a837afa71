#include "http/console_page.h"

#include <httplib.h>

#include <cstddef>

namespace bs::generated {
extern const char console_html[];  // http/console.html, compiled in (http/CMakeLists.txt)
extern const std::size_t console_html_size;
}  // namespace bs::generated

namespace bs::http {

void send_console_page(httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                 "img-src 'self' data:");
  res.set_content(bs::generated::console_html, bs::generated::console_html_size, "text/html; charset=utf-8");
}

}  // namespace bs::http
