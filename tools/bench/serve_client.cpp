#include "tools/bench/serve_client.h"

#include <stdexcept>
#include <string_view>

#include "tools/bench/bench_serve.h"
#include "tools/cli/progress.h"

namespace bs::tools {

void SseParser::feed(std::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  size_t start = 0;
  for (;;) {
    const size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view l(pending_.data() + start, nl - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    line(l);
    start = nl + 1;
  }
  pending_.erase(0, start);
}

void SseParser::finish() {
  if (!pending_.empty()) {
    std::string rest;
    rest.swap(pending_);
    if (!rest.empty() && rest.back() == '\r') rest.pop_back();
    line(rest);
  }
  line("");
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {  // end of event
    if (has_data_) {
      std::string data;
      data.swap(data_);
      has_data_ = false;
      on_data_(data);
    }
    return;
  }
  if (l.front() == ':') return;  // comment
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_.append(value.data(), value.size());
  has_data_ = true;
}

}  // namespace bs::tools

namespace bs::tools::serve {

using json = nlohmann::json;

json Violations::to_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  json j = json::object();
  for (const auto& [k, v] : counts_) j[k] = v;
  return j;
}

std::unique_ptr<httplib::Client> make_client(const Endpoint& ep, double read_timeout_s) {
  auto c = std::make_unique<httplib::Client>(ep.url);
  if (!c->is_valid()) throw std::runtime_error("invalid --url " + ep.url + " (expected http://HOST:PORT)");
  c->set_connection_timeout(5);
  const auto rt = std::chrono::duration<double>(read_timeout_s);
  c->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(rt));
  c->set_write_timeout(60);
  if (!ep.api_key.empty()) c->set_bearer_token_auth(ep.api_key);
  return c;
}

std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (nothing listening?)";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "read failed or timed out (--timeout)";
    case httplib::Error::Write: return "write failed";
    default: return httplib::to_string(e);
  }
}

std::string error_message(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return body.substr(0, 300);
}

HttpReply call(const Endpoint& ep, const std::string& method, const std::string& path, const std::string& body,
               double timeout_s) {
  auto c = make_client(ep, timeout_s);
  httplib::Result r = method == "GET"      ? c->Get(path.c_str())
                      : method == "DELETE" ? c->Delete(path.c_str())
                                           : c->Post(path.c_str(), body, "application/json");
  if (!r)
    throw std::runtime_error("cannot reach blendserve at " + ep.url + " (" + method + " " + path +
                             "): " + describe(r.error()) +
                             "; start it with `blendserve serve --port PORT` or pass --spawn");
  return {r->status, r->body, r->get_header_value("Retry-After")};
}

Outcome stream_request(const Endpoint& ep, const std::string& body, Clock::time_point epoch, Violations& v) {
  Outcome o;
  auto c = make_client(ep, ep.read_timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");

  bool sse = false, done = false, seen_choice = false, after_done = false;
  std::string err_body, id, retry_after, stream_error;
  double done_s = std::nan("");
  auto on_event = [&](std::string_view data) {
    const double now = seconds_since(epoch);
    if (done) after_done = true;
    if (data == "[DONE]") {
      done = true;
      done_s = now;
      return;
    }
    const json j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      v.add("an SSE event that is not JSON");
      return;
    }
    if (j.contains("error")) {
      stream_error = j["error"].is_object() ? j["error"].value("message", j["error"].dump()) : j["error"].dump();
      return;
    }
    if (j.value("object", "") != "chat.completion.chunk") v.add("a chunk whose object is not chat.completion.chunk");
    const std::string cid = j.value("id", "");
    if (id.empty()) id = cid;
    else if (cid != id) v.add("chunks of one stream with different ids");
    const bool has_usage = j.contains("usage") && j["usage"].is_object();
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      if (has_usage) v.add("a usage chunk with non-empty choices");
      const json& ch = j["choices"][0];
      const json delta = ch.value("delta", json::object());
      if (!seen_choice && delta.value("role", "") != "assistant") v.add("first delta without role assistant");
      seen_choice = true;
      if (delta.contains("content") && delta["content"].is_string() &&
          !delta["content"].get_ref<const std::string&>().empty()) {
        if (o.content_deltas++ == 0) o.first_s = now;
      }
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        o.finish_reason = ch["finish_reason"].get<std::string>();
    } else if (!has_usage) {
      v.add("a chunk with neither choices nor usage");
    }
    if (has_usage) {
      const json& u = j["usage"];
      o.usage = true;
      o.prompt_tokens = u.value("prompt_tokens", int64_t{0});
      o.completion_tokens = u.value("completion_tokens", int64_t{0});
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        o.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
      else
        v.add("usage without prompt_tokens_details");
    }
  };
  SseParser parser([&](std::string_view data) {
    try {
      on_event(data);
    } catch (const json::exception& e) {  // a field of the wrong type
      v.add(std::string("a chunk with a wrongly typed field (") + e.what() + ")");
    }
  });
  req.response_handler = [&](const httplib::Response& r) {
    o.status = r.status;
    sse = r.status == 200 && r.get_header_value("Content-Type").rfind("text/event-stream", 0) == 0;
    retry_after = r.get_header_value("Retry-After");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (sse) parser.feed(std::string_view(data, n));
    else if (err_body.size() < 65536) err_body.append(data, n);
    return true;
  };
  o.send_s = seconds_since(epoch);
  httplib::Result r = c->send(req);
  const double end_s = seconds_since(epoch);
  if (sse) parser.finish();
  if (!r) {
    o.kind = Kind::Error;
    o.error = "transport: " + describe(r.error());
    return o;
  }
  if (o.status == 429) {
    o.kind = Kind::Rejected;
    if (retry_after.empty()) v.add("429 without Retry-After");
    return o;
  }
  if (o.status != 200) {
    o.kind = Kind::Error;
    o.error = "HTTP " + std::to_string(o.status) + ": " + error_message(err_body);
    const json e = json::parse(err_body, nullptr, false);
    if (e.is_discarded() || !e.is_object() || !e.contains("error") || !e["error"].is_object())
      v.add("an error response whose body is not {\"error\":{...}}");
    return o;
  }
  if (!sse) {
    o.kind = Kind::Error;
    o.error = "200 but not text/event-stream (stream: true ignored?)";
    return o;
  }
  if (!stream_error.empty()) {
    o.kind = Kind::Error;
    o.error = "error event in the stream: " + stream_error;
    return o;
  }
  if (!done && o.finish_reason.empty()) {
    o.kind = Kind::Error;
    o.error = "the stream ended early (no finish_reason, no [DONE])";
    return o;
  }
  if (!done) v.add("a stream that ends without data: [DONE]");
  if (after_done) v.add("events after data: [DONE]");
  if (o.finish_reason.empty()) v.add("a stream without finish_reason");
  if (!o.usage) v.add("no usage chunk although stream_options.include_usage");
  o.end_s = std::isnan(done_s) ? end_s : done_s;
  if (o.content_deltas == 0) o.first_s = o.end_s;  // nothing generated: the answer ended
  o.ttft = o.first_s - o.send_s;
  o.latency = o.end_s - o.send_s;
  o.kind = Kind::Ok;
  return o;
}

}  // namespace bs::tools::serve
