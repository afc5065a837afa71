// GET /console: the inspection page (http/console.html, compiled in), served by a
// single server and by a cluster's frontend alike. The page holds no data, so no
// key is needed to load it; every number it shows comes from /v1/inspect/*, which
// the API keys guard. The page reads /v1/inspect/snapshot (one node, or every node
// of a cluster) and /v1/inspect/requests/<id>[?node=<worker>].
#pragma once

namespace httplib {
struct Response;
}

namespace bs::http {

// The page with its headers: no caching, and a content security policy that lets
// it fetch nothing but this server.
void send_console_page(httplib::Response& res);

}  // namespace bs::http
