// A request trace as Chrome trace-event JSON (see tools/cli/trace_chrome.h).
#include "tools/cli/trace_chrome.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <vector>

namespace bs::tools {

namespace {

using json = nlohmann::json;

const std::vector<std::string>& kind_order() {
  static const std::vector<std::string> order{"intake", "controller", "loader", "layer-worker",
                                              "rank",   "decoder",    "other"};
  return order;
}

int kind_rank(const std::string& kind) {
  const auto& order = kind_order();
  return static_cast<int>(std::find(order.begin(), order.end(), kind) - order.begin());
}

bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Names compared with their digit runs as numbers (rank-2 before rank-10); ties
// (rank-01, rank-1) broken by the plain comparison, so the order is total.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && is_digit(a[i2])) ++i2;
      while (j2 < b.size() && is_digit(b[j2])) ++j2;
      std::string_view x(a.data() + i, i2 - i), y(b.data() + j, j2 - j);
      x.remove_prefix(std::min(x.find_first_not_of('0'), x.size()));
      y.remove_prefix(std::min(y.find_first_not_of('0'), y.size()));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
      ++i;
      ++j;
    }
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;
}

int64_t to_ns(double seconds) { return std::llround(seconds * 1e9); }
double ns_to_us(int64_t ns) { return static_cast<double>(ns) / 1e3; }

struct Event {
  std::string node, actor, name, kind;
  int64_t begin_ns = 0, end_ns = 0;
  json args = json::object();
  size_t index = 0;  // in the trace's "events"
  int lane = 0;      // 0: the actor's own thread; N: its N-th overlap thread
  int64_t dur_ns() const { return std::max<int64_t>(end_ns - begin_ns, 0); }
};

struct Thread {
  std::string actor;
  int lane = 0;
  int tid = 0;
};

}  // namespace

void check_request_trace(const json& trace) {
  if (!trace.is_object()) throw std::invalid_argument("not a request trace: not a JSON object");
  if (!trace.contains("events") || !trace.at("events").is_array())
    throw std::invalid_argument("not a request trace: no \"events\" array");
  if (trace.contains("node") && !trace.at("node").is_string())
    throw std::invalid_argument("not a request trace: \"node\" is not a string");
  if (trace.contains("first_token_s") && !trace.at("first_token_s").is_number())
    throw std::invalid_argument("not a request trace: \"first_token_s\" is not a number");
  size_t i = 0;
  for (const auto& e : trace.at("events")) {
    const std::string where = "not a request trace: event " + std::to_string(i++);
    if (!e.is_object()) throw std::invalid_argument(where + " is not an object");
    for (const char* key : {"actor", "what"})
      if (!e.contains(key) || !e.at(key).is_string())
        throw std::invalid_argument(where + ": \"" + key + "\" missing or not a string");
    for (const char* key : {"begin_s", "end_s"})
      if (!e.contains(key) || !e.at(key).is_number() || !std::isfinite(e.at(key).get<double>()))
        throw std::invalid_argument(where + ": \"" + key + "\" missing or not a number");
    for (const char* key : {"layer", "bytes"})
      if (e.contains(key) && !e.at(key).is_number_integer())
        throw std::invalid_argument(where + ": \"" + key + "\" is not an integer");
    if (e.contains("node") && !e.at("node").is_string())
      throw std::invalid_argument(where + ": \"node\" is not a string");
  }
}

std::string trace_actor_kind(const std::string& actor) {
  if (actor == "intake" || actor == "controller" || actor == "decoder") return actor;
  if (actor.rfind("loader", 0) == 0) return "loader";
  if (actor == "worker" || actor == "layer-worker") return "layer-worker";
  if (actor.size() > 5 && actor.rfind("rank-", 0) == 0 &&
      std::all_of(actor.begin() + 5, actor.end(), [](char c) { return is_digit(c); }))
    return "rank";
  return "other";
}

json trace_to_chrome(const json& trace) {
  check_request_trace(trace);
  const std::string top_node = trace.value("node", std::string("local"));

  std::vector<Event> events;
  int64_t earliest = 0;
  for (const auto& e : trace.at("events")) {
    Event x;
    x.node = e.value("node", top_node);
    x.actor = e.at("actor").get<std::string>();
    x.kind = trace_actor_kind(x.actor);
    x.name = e.at("what").get<std::string>();
    if (e.contains("layer")) {
      x.name += " L" + std::to_string(e.at("layer").get<int64_t>());
      x.args["layer"] = e.at("layer");
    }
    if (e.contains("bytes")) x.args["bytes"] = e.at("bytes");
    x.begin_ns = to_ns(e.at("begin_s").get<double>());
    x.end_ns = to_ns(e.at("end_s").get<double>());
    if (x.end_ns < x.begin_ns) x.args["end_before_begin_us"] = ns_to_us(x.end_ns - x.begin_ns);
    x.index = events.size();
    earliest = std::min(earliest, x.begin_ns);
    events.push_back(std::move(x));
  }
  const bool has_first_token = trace.contains("first_token_s");
  int64_t first_token_ns = has_first_token ? to_ns(trace.at("first_token_s").get<double>()) : 0;
  earliest = std::min(earliest, first_token_ns);
  // Times are since the submit, so never negative; should one be, shift all.
  const int64_t shift = -earliest;
  for (auto& x : events) {
    x.begin_ns += shift;
    x.end_ns += shift;
  }
  first_token_ns += shift;

  // Timeline order: by begin, the longer first (parents before what nests in them).
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Event &x = events[a], &y = events[b];
    return std::make_tuple(x.begin_ns, -x.dur_ns(), x.index) < std::make_tuple(y.begin_ns, -y.dur_ns(), y.index);
  });

  // Lanes: a thread's complete events must nest; one that would cross an open one of
  // its actor goes to the first lane where it nests (a stack of open ends per lane).
  std::map<std::pair<std::string, std::string>, std::vector<std::vector<int64_t>>> lanes;
  for (size_t i : order) {
    Event& x = events[i];
    auto& actor_lanes = lanes[{x.node, x.actor}];
    const int64_t end = x.begin_ns + x.dur_ns();
    size_t k = 0;
    for (; k < actor_lanes.size(); ++k) {
      auto& open = actor_lanes[k];
      while (!open.empty() && open.back() <= x.begin_ns) open.pop_back();
      if (open.empty() || end <= open.back()) break;
    }
    if (k == actor_lanes.size()) actor_lanes.emplace_back();
    actor_lanes[k].push_back(end);
    x.lane = static_cast<int>(k);
  }

  // Processes (nodes, the trace's own first) and their threads.
  std::vector<std::string> nodes{top_node};
  for (const auto& x : events)
    if (std::find(nodes.begin(), nodes.end(), x.node) == nodes.end()) nodes.push_back(x.node);
  std::map<std::string, std::vector<Thread>> threads;
  auto add_thread = [&](const std::string& node, const std::string& actor, int lane) {
    auto& list = threads[node];
    for (const auto& t : list)
      if (t.actor == actor && t.lane == lane) return;
    list.push_back({actor, lane, 0});
  };
  for (const auto& x : events) add_thread(x.node, x.actor, x.lane);
  if (has_first_token) add_thread(top_node, "decoder", 0);
  for (auto& [node, list] : threads) {
    std::sort(list.begin(), list.end(), [](const Thread& a, const Thread& b) {
      const int ka = kind_rank(trace_actor_kind(a.actor)), kb = kind_rank(trace_actor_kind(b.actor));
      if (ka != kb) return ka < kb;
      if (a.actor != b.actor) return natural_less(a.actor, b.actor);
      return a.lane < b.lane;
    });
    for (size_t i = 0; i < list.size(); ++i) list[i].tid = static_cast<int>(i) + 1;
  }
  auto pid_of = [&](const std::string& node) {
    return static_cast<int>(std::find(nodes.begin(), nodes.end(), node) - nodes.begin()) + 1;
  };
  auto tid_of = [&](const std::string& node, const std::string& actor, int lane) {
    for (const auto& t : threads[node])
      if (t.actor == actor && t.lane == lane) return t.tid;
    return 0;  // unreachable: every event's thread was added
  };

  json out_events = json::array();
  auto metadata = [](const char* name, int pid, int tid, json args) {
    return json{{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", std::move(args)}};
  };
  for (const auto& node : nodes) {
    const int pid = pid_of(node);
    out_events.push_back(metadata("process_name", pid, 0, {{"name", node}}));
    out_events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
    for (const auto& t : threads[node]) {
      const std::string name = t.lane == 0 ? t.actor : t.actor + " (overlap " + std::to_string(t.lane) + ")";
      out_events.push_back(metadata("thread_name", pid, t.tid, {{"name", name}}));
      out_events.push_back(metadata("thread_sort_index", pid, t.tid, {{"sort_index", t.tid}}));
    }
  }
  bool first_token_done = !has_first_token;
  auto emit_first_token = [&] {
    out_events.push_back({{"ph", "i"},
                          {"s", "p"},
                          {"name", "first token"},
                          {"cat", "request"},
                          {"pid", pid_of(top_node)},
                          {"tid", tid_of(top_node, "decoder", 0)},
                          {"ts", ns_to_us(first_token_ns)},
                          {"args", {{"first_token_s", trace.at("first_token_s")}}}});
    first_token_done = true;
  };
  for (size_t i : order) {
    const Event& x = events[i];
    if (!first_token_done && first_token_ns < x.begin_ns) emit_first_token();
    out_events.push_back({{"ph", "X"},
                          {"name", x.name},
                          {"cat", x.kind},
                          {"pid", pid_of(x.node)},
                          {"tid", tid_of(x.node, x.actor, x.lane)},
                          {"ts", ns_to_us(x.begin_ns)},
                          {"dur", ns_to_us(x.dur_ns())},
                          {"args", x.args}});
  }
  if (!first_token_done) emit_first_token();

  json other = trace;
  other.erase("events");
  other["exported_by"] = "blendctl trace --format chrome";
  other["ts_zero"] = "the request's submit";
  if (shift != 0) other["ts_origin_s"] = static_cast<double>(earliest) / 1e9;  // ts 0 is this time since submit
  return json{{"traceEvents", std::move(out_events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

}  // namespace bs::tools
