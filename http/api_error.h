// An error as the OpenAI API reports it: an HTTP status and the body
// {"error": {"message", "type", "param", "code"}}. Clients (the official SDKs)
// pick their exception class from the status, so the status is the contract;
// type/param/code tell a person what to fix.
#pragma once

#include <stdexcept>
#include <string>

namespace bs::http {

struct ApiError : std::runtime_error {
  ApiError(int status_, std::string message, std::string type_, std::string param_ = "", std::string code_ = "")
      : std::runtime_error(std::move(message)),
        status(status_),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string type;   // invalid_request_error | authentication_error | rate_limit_error | server_error
  std::string param;  // the request field at fault ("messages[1].role"), empty: null
  std::string code;   // machine-readable reason ("context_length_exceeded"), empty: null
};

// 400 invalid_request_error naming the parameter.
inline ApiError bad_request(std::string message, std::string param = "", std::string code = "") {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}

// The JSON body of an error response.
std::string error_body(const ApiError& e);

}  // namespace bs::http
