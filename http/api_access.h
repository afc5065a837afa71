// Who may call the API, and how a refusal is written: the one rule both HTTP servers
// (a worker's, http/server.cpp, and a cluster's frontend, http/frontend.cpp) apply, so
// a client sees the same 401s and error bodies from either.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "http/api_error.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace bs::http {

// Equal-length-independent, data-independent comparison of a presented API key
// with one configured key (no early exit on the first differing byte).
bool constant_time_equal(const std::string& a, const std::string& b);

// The refusal for a request whose Authorization header ("Bearer <key>") does not
// present one of `keys` (401, missing_api_key or invalid_api_key), or nullopt when
// it does or no keys are configured. Every key is compared (no early exit).
std::optional<ApiError> api_key_refusal(const std::vector<std::string>& keys, const std::string& authorization);

// The paths open without a key: the probes (/health, /ready, /live) and the console's
// page (its data routes need the key).
bool open_path(const std::string& path);

// True when `req` may go on (an open path, or a key of `keys`, or no keys configured);
// otherwise `res` holds the 401 and the caller returns.
bool authorized(const std::vector<std::string>& keys, const httplib::Request& req, httplib::Response& res);

// The OpenAI error response: e.status, error_body(e) as JSON, and for a 401 the
// WWW-Authenticate challenge.
void send_error(httplib::Response& res, const ApiError& e);

// The error for a response that ends >= 400 without a body (no route, a request
// httplib could not read): a 404 names the method and path (unknown_url), any other
// status says it (server_error from 500 up, else invalid_request_error).
ApiError status_error(const httplib::Request& req, int status);

// A handler that threw: 500, server_error, with what it threw ("internal error" for
// a throw of something that is not a std::exception).
void send_exception(httplib::Response& res, std::exception_ptr thrown);

}  // namespace bs::http
