#include "http/upstream.h"

#include <httplib.h>
#include <unistd.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "http/cluster_tls.h"

namespace bs::http {

using json = nlohmann::json;

bool event_has_token(std::string_view event) {
  if (event.rfind("data: ", 0) != 0) return false;
  const auto payload = event.substr(6);
  if (payload == "[DONE]") return false;
  const json j = json::parse(payload, nullptr, false);
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array()) return false;
  for (const auto& c : j["choices"]) {
    // A text completion's text; a chat delta's content or tool calls.
    if (const auto text = c.find("text"); text != c.end() && text->is_string() && !text->get<std::string>().empty())
      return true;
    const auto d = c.find("delta");
    if (d == c.end() || !d->is_object()) continue;
    const auto content = d->find("content");
    if (content != d->end() && content->is_string() && !content->get<std::string>().empty()) return true;
    if (const auto calls = d->find("tool_calls"); calls != d->end() && calls->is_array() && !calls->empty()) return true;
  }
  return false;
}

void run_upstream(std::shared_ptr<Upstream> u, FrontendWorker w, const tls::Files& tls, std::string key,
                  std::string method, std::string path, std::string body, double connect_s, double idle_s,
                  bool stream) {
  const auto client = make_member_client(w.host, w.http_port, tls, w.name);  // HTTPS in a TLS cluster
  httplib::Client& cli = *client;
  cli.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(connect_s)));
  cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(idle_s)));
  cli.set_write_timeout(30, 0);
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.headers.emplace("Authorization", "Bearer " + key);
  if (!body.empty()) req.headers.emplace("Content-Type", "application/json");
  req.body = std::move(body);
  req.response_handler = [u](const httplib::Response& r) {
    std::lock_guard<std::mutex> lock(u->mu);
    u->got_status = true;
    u->status = r.status;
    u->content_type = r.get_header_value("Content-Type");
    u->cv.notify_all();
    return !u->cancel.load();
  };
  req.content_receiver = [u, stream](const char* data, size_t n, uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lock(u->mu);
    u->pending.append(data, n);
    if (stream && !u->first_token) {
      u->scan.append(data, n);
      for (size_t end; !u->first_token && (end = u->scan.find("\n\n")) != std::string::npos;) {
        u->first_token = event_has_token(std::string_view(u->scan).substr(0, end));
        u->scan.erase(0, end + 2);
      }
    }
    u->cv.notify_all();
    return !u->cancel.load();
  };
  {
    std::lock_guard<std::mutex> lock(u->mu);
    if (u->cancel.load()) {  // aborted before it started
      u->done = u->failed = true;
      u->error = "cancelled";
      u->cv.notify_all();
      return;
    }
  }
  cli.set_socket_options([u](socket_t sock) {
    std::lock_guard<std::mutex> lock(u->mu);
    if (u->socket_dup >= 0) ::close(u->socket_dup);
    u->socket_dup = ::dup(sock);
    if (u->cancel.load() && u->socket_dup >= 0) ::shutdown(u->socket_dup, SHUT_RDWR);  // aborted meanwhile
  });
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli.send(req, res, err);
  std::lock_guard<std::mutex> lock(u->mu);
  if (u->socket_dup >= 0) ::close(u->socket_dup);
  u->socket_dup = -1;
  u->done = true;
  if (!ok) {
    u->failed = true;
    u->error = u->cancel.load() ? "cancelled" : httplib::to_string(err);
  }
  u->cv.notify_all();
}

}  // namespace bs::http
