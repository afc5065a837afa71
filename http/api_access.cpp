#include "http/api_access.h"

#include <httplib.h>

#include <algorithm>

namespace bs::http {

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer string is touched whatever the contents; the length
  // difference is folded in without a branch on the data.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::optional<ApiError> api_key_refusal(const std::vector<std::string>& keys, const std::string& authorization) {
  if (keys.empty()) return std::nullopt;
  if (authorization.empty())
    return ApiError(401, "You didn't provide an API key: send 'Authorization: Bearer <key>'.", "invalid_request_error",
                    "", "missing_api_key");
  const std::string prefix = "Bearer ";
  const std::string key = authorization.rfind(prefix, 0) == 0 ? authorization.substr(prefix.size()) : std::string();
  bool ok = false;
  for (const auto& k : keys) ok |= constant_time_equal(key, k);  // no early exit
  if (ok) return std::nullopt;
  return ApiError(401, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key");
}

bool open_path(const std::string& path) {
  return path == "/health" || path == "/ready" || path == "/live" || path == "/console";
}

bool authorized(const std::vector<std::string>& keys, const httplib::Request& req, httplib::Response& res) {
  if (open_path(req.path)) return true;
  const auto refusal = api_key_refusal(keys, req.get_header_value("Authorization"));
  if (refusal) send_error(res, *refusal);
  return !refusal;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
}

ApiError status_error(const httplib::Request& req, int status) {
  if (status == 404)
    return ApiError(404, "unknown request URL: " + req.method + " " + req.path, "invalid_request_error", "",
                    "unknown_url");
  return ApiError(status, "the request could not be processed (HTTP " + std::to_string(status) + ")",
                  status >= 500 ? "server_error" : "invalid_request_error");
}

void send_exception(httplib::Response& res, std::exception_ptr thrown) {
  std::string what = "internal error";
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  send_error(res, ApiError(500, what, "server_error"));
}

}  // namespace bs::http
