// tools/cli/trace_chrome: a request trace as Chrome trace-event JSON. On a trace a real
// run wrote (tensor parallel at 3 ranks, documents from the SSD tier; trimmed to its
// first two layers) and on hand-written edge cases. tests/test_cli.cpp runs the real
// binaries end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/cli/trace_chrome.h"

namespace {

using json = nlohmann::json;
using bs::tools::trace_to_chrome;

// What Perfetto and chrome://tracing need of a trace-event file, as this converter
// writes it: every event has ph/name/ts/pid/tid; metadata first (ts 0), then the
// events by ts, none negative; complete events have dur >= 0 and nest on their
// thread (the viewers cannot draw crossing slices); one process_name per pid, a
// thread_name for every (pid, tid) an event uses.
void expect_valid_chrome_trace(const json& j) {
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j.contains("traceEvents") && j.at("traceEvents").is_array()) << j.dump();
  EXPECT_EQ(j.value("displayTimeUnit", ""), "ms");
  ASSERT_TRUE(j.contains("otherData") && j.at("otherData").is_object());
  std::map<int, int> process_names;
  std::map<std::pair<int, int>, int> thread_names;
  std::set<std::pair<int, int>> used;
  std::map<std::pair<int, int>, std::vector<double>> open;  // ends of the open X events per thread
  double last_ts = 0;
  bool metadata_done = false;
  for (const auto& e : j.at("traceEvents")) {
    for (const char* key : {"ph", "name"}) ASSERT_TRUE(e.contains(key) && e.at(key).is_string()) << e.dump();
    ASSERT_TRUE(e.contains("ts") && e.at("ts").is_number()) << e.dump();
    for (const char* key : {"pid", "tid"}) ASSERT_TRUE(e.contains(key) && e.at(key).is_number_integer()) << e.dump();
    const std::string ph = e.at("ph");
    const double ts = e.at("ts");
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    EXPECT_GE(ts, 0.0) << e.dump();
    EXPECT_GE(ts, last_ts) << "not in time order: " << e.dump();
    last_ts = ts;
    if (ph == "M") {
      EXPECT_FALSE(metadata_done) << "metadata after the events: " << e.dump();
      EXPECT_EQ(ts, 0.0);
      const std::string name = e.at("name");
      if (name == "process_name") ++process_names[thread.first];
      if (name == "thread_name") ++thread_names[thread];
      if (name == "process_name" || name == "thread_name") {
        EXPECT_TRUE(e.at("args").at("name").is_string()) << e.dump();
      }
      continue;
    }
    metadata_done = true;
    used.insert(thread);
    if (ph == "i") {
      EXPECT_EQ(e.value("s", ""), "p") << e.dump();
      continue;
    }
    ASSERT_EQ(ph, "X") << e.dump();
    ASSERT_TRUE(e.contains("dur") && e.at("dur").is_number()) << e.dump();
    const double dur = e.at("dur");
    EXPECT_GE(dur, 0.0) << e.dump();
    EXPECT_TRUE(e.at("cat").is_string() && e.at("args").is_object()) << e.dump();
    auto& stack = open[thread];
    const double ns = 1e-3;  // ts + dur in floating point: equal ends may differ in the last bit
    while (!stack.empty() && stack.back() <= ts + ns) stack.pop_back();
    EXPECT_TRUE(stack.empty() || ts + dur <= stack.back() + ns) << "crosses an open event of its thread: " << e.dump();
    stack.push_back(ts + dur);
  }
  for (const auto& [pid, tid] : used) {
    EXPECT_EQ(process_names[pid], 1) << "pid " << pid;
    const int named = thread_names[{pid, tid}];
    EXPECT_EQ(named, 1) << "pid " << pid << " tid " << tid;
  }
  for (const auto& [pid, n] : process_names) EXPECT_EQ(n, 1) << "pid " << pid;
}

// (thread name, event name) of every complete event; thread names by (pid, tid).
std::map<std::pair<int, int>, std::string> thread_names(const json& chrome) {
  std::map<std::pair<int, int>, std::string> names;
  for (const auto& e : chrome.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[{e.at("pid"), e.at("tid")}] = e.at("args").at("name");
  return names;
}
std::vector<json> events_of(const json& chrome, const std::string& ph) {
  std::vector<json> out;
  for (const auto& e : chrome.at("traceEvents"))
    if (e.at("ph") == ph) out.push_back(e);
  return out;
}

// A trace `blendserve generate --tp 3` wrote for two documents stored on the SSD
// tier by an earlier run (layers 0 and 1 of 30 kept).
const char* kRealTrace = R"({"chunk_tiers": ["ssd", "ssd"], "chunks": 2, "computed_tokens": 13, "controller": {"est_compute_at_floor_s": 0.03310799995422363, "est_compute_s": 0.03310799995422363, "est_load_s": 0.00172032, "est_ttft_s": 0.03316534395422361, "inputs": {"bytes_ram": 0, "bytes_ssd": 2580480, "cached_tokens": 32, "compute_s_per_token_layer": 6e-05, "other_tokens": 10, "overhead_s_per_prompt_token": 5e-05, "ram_bytes_per_s": 8000000000.0, "ssd_bytes_per_s": 1500000000.0}, "ratio": 0.10000000149011612, "ratio_floor": 0.10000000149011612, "reason": "floor"}, "decode": {"interleaved_steps": 0, "mean_batch": 1.0, "steps": 2}, "fallback": false, "finish_reason": "length", "first_token_s": 0.031106845, "id": 1, "load_bytes": 1290240, "load_hidden_fraction": 0.0, "load_span_s": 0.005746631, "mode": "blend", "prompt_tokens": 66, "rank-0_collective_s": 0.010418191, "rank-1_collective_s": 0.011579061, "rank-2_collective_s": 0.010449068, "ratio": 0.10000000149011612, "recomputed_tokens": 3, "select_s": 0.011420893000000001, "total_s": 0.050477576, "wait_s": 0.006320627, "events": [
{"actor": "intake", "begin_s": 0.0, "end_s": 0.000244544, "what": "tokenize"},
{"actor": "controller", "begin_s": 0.000263162, "end_s": 0.000816327, "what": "plan"},
{"actor": "loader-ssd", "begin_s": 0.001628559, "bytes": 43008, "end_s": 0.001859964, "layer": 0, "what": "load"},
{"actor": "loader-ssd", "begin_s": 0.001861706, "bytes": 43008, "end_s": 0.002061234, "layer": 1, "what": "load"},
{"actor": "rank-0", "begin_s": 0.0039670569999999995, "end_s": 0.005190251, "layer": 0, "what": "collective wait"},
{"actor": "rank-1", "begin_s": 0.002071439, "end_s": 0.005198193, "layer": 0, "what": "compute"},
{"actor": "rank-1", "begin_s": 0.0033096260000000004, "end_s": 0.005198193, "layer": 0, "what": "collective wait"},
{"actor": "rank-2", "begin_s": 0.002986234, "end_s": 0.005205143, "layer": 0, "what": "compute"},
{"actor": "rank-2", "begin_s": 0.003931303, "end_s": 0.005205143, "layer": 0, "what": "collective wait"},
{"actor": "rank-0", "begin_s": 0.007212397, "end_s": 0.007501308, "layer": 1, "what": "collective wait"},
{"actor": "rank-1", "begin_s": 0.005366944, "end_s": 0.007508468, "layer": 1, "what": "compute"},
{"actor": "rank-1", "begin_s": 0.006888663, "end_s": 0.007508468, "layer": 1, "what": "collective wait"},
{"actor": "rank-2", "begin_s": 0.005282699, "end_s": 0.007545664, "layer": 1, "what": "compute"},
{"actor": "rank-2", "begin_s": 0.00726118, "end_s": 0.007545664, "layer": 1, "what": "collective wait"},
{"actor": "worker", "begin_s": 0.000861955, "end_s": 0.003381233, "layer": 0, "what": "wait+repair"},
{"actor": "worker", "begin_s": 0.003381263, "end_s": 0.00518984, "layer": 0, "what": "compute"},
{"actor": "worker", "begin_s": 0.005190742, "end_s": 0.005440865, "layer": 1, "what": "wait+repair"},
{"actor": "worker", "begin_s": 0.005440895, "end_s": 0.007501027, "layer": 1, "what": "compute"},
{"actor": "worker", "begin_s": 0.000857659, "end_s": 0.031043551, "what": "prefill"},
{"actor": "decoder", "begin_s": 0.031106845, "end_s": 0.031106845, "what": "first token"}]})";

TEST(TraceExport, ARealTraceBecomesOneThreadPerActorInOrder) {
  const json trace = json::parse(kRealTrace);
  const json chrome = trace_to_chrome(trace);
  expect_valid_chrome_trace(chrome);

  // One process, "local" (the trace names no node).
  std::vector<std::string> processes;
  for (const auto& e : events_of(chrome, "M"))
    if (e.at("name") == "process_name") processes.push_back(e.at("args").at("name"));
  EXPECT_EQ(processes, std::vector<std::string>{"local"});
  // Threads: intake, controller, loaders, the layer worker, the ranks, the decoder;
  // tids 1.. in that order, thread_sort_index the same.
  const auto names = thread_names(chrome);
  std::vector<std::string> in_order;
  for (const auto& [thread, name] : names) {
    EXPECT_EQ(thread.first, 1);
    EXPECT_EQ(thread.second, static_cast<int>(in_order.size()) + 1);
    in_order.push_back(name);
  }
  EXPECT_EQ(in_order, (std::vector<std::string>{"intake", "controller", "loader-ssd", "worker", "rank-0", "rank-1",
                                                "rank-2", "decoder"}));
  for (const auto& e : events_of(chrome, "M")) {
    if (e.at("name") == "thread_sort_index") {
      EXPECT_EQ(e.at("args").at("sort_index"), e.at("tid"));
    }
  }

  // Every trace event is one complete event on its actor's thread, named what
  // (+ " L<layer>"), its kind as cat, microseconds since submit.
  const auto xs = events_of(chrome, "X");
  ASSERT_EQ(xs.size(), trace.at("events").size());
  std::multiset<std::tuple<std::string, std::string, long long, long long>> want, got;
  for (const auto& e : trace.at("events")) {
    std::string name = e.at("what");
    if (e.contains("layer")) name += " L" + std::to_string(e.at("layer").get<int>());
    want.insert({e.at("actor"), name, std::llround(e.at("begin_s").get<double>() * 1e6),
                 std::llround((e.at("end_s").get<double>() - e.at("begin_s").get<double>()) * 1e6)});
  }
  for (const auto& x : xs) {
    got.insert({names.at({x.at("pid"), x.at("tid")}), x.at("name"), std::llround(x.at("ts").get<double>()),
                std::llround(x.at("dur").get<double>())});
  }
  EXPECT_EQ(got, want);
  std::map<std::string, std::string> kinds;
  for (const auto& x : xs) kinds[names.at({x.at("pid"), x.at("tid")})] = x.at("cat");
  EXPECT_EQ(kinds, (std::map<std::string, std::string>{{"intake", "intake"},
                                                        {"controller", "controller"},
                                                        {"loader-ssd", "loader"},
                                                        {"worker", "layer-worker"},
                                                        {"rank-0", "rank"},
                                                        {"rank-1", "rank"},
                                                        {"rank-2", "rank"},
                                                        {"decoder", "decoder"}}));
  for (const auto& x : xs) {
    if (x.at("name") == "load L1") {
      EXPECT_EQ(x.at("args"), (json{{"layer", 1}, {"bytes", 43008}}));
      EXPECT_DOUBLE_EQ(x.at("ts").get<double>(), 1861.706);
      EXPECT_DOUBLE_EQ(x.at("dur").get<double>(), 199.528);
    }
    if (x.at("name") == "prefill") {
      EXPECT_EQ(x.at("args"), json::object());
    }
  }
  // The prefill spans the worker's layers: it comes first and they nest in it.
  const auto worker = std::find_if(xs.begin(), xs.end(), [&](const json& x) { return x.at("tid") == 4; });
  ASSERT_NE(worker, xs.end());
  EXPECT_EQ(worker->at("name"), "prefill");

  // The first token: a process-scoped instant on the decoder's thread.
  const auto instants = events_of(chrome, "i");
  ASSERT_EQ(instants.size(), 1u);
  EXPECT_EQ(instants[0].at("name"), "first token");
  EXPECT_EQ(instants[0].at("tid"), 8);
  EXPECT_DOUBLE_EQ(instants[0].at("ts").get<double>(), 31106.845);

  // The request's fields, but not its events, as otherData.
  const auto& other = chrome.at("otherData");
  for (const char* key : {"id", "mode", "ratio", "chunk_tiers", "first_token_s", "controller", "decode"})
    EXPECT_EQ(other.at(key), trace.at(key)) << key;
  EXPECT_FALSE(other.contains("events"));
  EXPECT_FALSE(other.contains("ts_origin_s"));
}

TEST(TraceExport, ATraceWithoutEventsIsOnlyItsProcess) {
  const json chrome = trace_to_chrome(json{{"id", 4}, {"events", json::array()}});
  expect_valid_chrome_trace(chrome);
  ASSERT_EQ(chrome.at("traceEvents").size(), 2u) << chrome.dump();  // process_name, process_sort_index
  EXPECT_EQ(chrome.at("traceEvents")[0].at("args").at("name"), "local");
  EXPECT_EQ(chrome.at("otherData").at("id"), 4);

  // A first token and nothing else: the instant, on a decoder thread of its own.
  const json first = trace_to_chrome(json{{"id", 5}, {"first_token_s", 0.25}, {"events", json::array()}});
  expect_valid_chrome_trace(first);
  EXPECT_EQ(thread_names(first), (std::map<std::pair<int, int>, std::string>{{{1, 1}, "decoder"}}));
  const auto instants = events_of(first, "i");
  ASSERT_EQ(instants.size(), 1u);
  EXPECT_DOUBLE_EQ(instants[0].at("ts").get<double>(), 250000.0);
  EXPECT_TRUE(events_of(first, "X").empty());
}

TEST(TraceExport, UnknownActorsComeLastAndNumbersSortAsNumbers) {
  const json trace = {
      {"node", "gpu-node-7"},
      {"events",
       {{{"actor", "janitor"}, {"what", "sweep"}, {"begin_s", 0.001}, {"end_s", 0.002}},
        {{"actor", "rank-10"}, {"what", "compute"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
        {{"actor", "decoder"}, {"what", "step"}, {"begin_s", 0.003}, {"end_s", 0.004}},
        {{"actor", "rank-2"}, {"what", "compute"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
        {{"actor", "loader-ram-10"}, {"what", "load"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
        {{"actor", "layer-worker"}, {"what", "compute"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
        {{"actor", "loader-ram-2"}, {"what", "load"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
        {{"actor", "intake"}, {"what", "tokenize"}, {"begin_s", 0.0}, {"end_s", 0.0001}},
        {{"actor", "rank-x"}, {"what", "odd"}, {"begin_s", 0.0}, {"end_s", 0.0}}}}};
  const json chrome = trace_to_chrome(trace);
  expect_valid_chrome_trace(chrome);
  std::vector<std::string> in_order;
  for (const auto& [thread, name] : thread_names(chrome)) in_order.push_back(name);
  EXPECT_EQ(in_order, (std::vector<std::string>{"intake", "loader-ram-2", "loader-ram-10", "layer-worker", "rank-2",
                                                "rank-10", "decoder", "janitor", "rank-x"}));
  for (const auto& x : events_of(chrome, "X")) {
    if (x.at("name") == "sweep") {
      EXPECT_EQ(x.at("cat"), "other");
      EXPECT_EQ(x.at("args"), json::object());  // no layer, no bytes
    }
    if (x.at("name") == "odd") {
      EXPECT_EQ(x.at("cat"), "other");
    }
  }
  EXPECT_EQ(bs::tools::trace_actor_kind("worker"), "layer-worker");
  EXPECT_EQ(bs::tools::trace_actor_kind("loader-ssd"), "loader");
  EXPECT_EQ(bs::tools::trace_actor_kind("rank-"), "other");
  // The trace's node names the process.
  EXPECT_EQ(chrome.at("traceEvents")[0].at("name"), "process_name");
  EXPECT_EQ(chrome.at("traceEvents")[0].at("args").at("name"), "gpu-node-7");
}

TEST(TraceExport, EventsOfOtherNodesAreOtherProcesses) {
  const json trace = {{"events",
                       {{{"actor", "worker"}, {"what", "compute"}, {"layer", 0}, {"begin_s", 0.0}, {"end_s", 0.001}},
                        {{"actor", "rank-1"},
                         {"node", "peer"},
                         {"what", "compute"},
                         {"layer", 0},
                         {"begin_s", 0.0},
                         {"end_s", 0.001}}}}};
  const json chrome = trace_to_chrome(trace);
  expect_valid_chrome_trace(chrome);
  std::map<int, std::string> processes;
  for (const auto& e : events_of(chrome, "M"))
    if (e.at("name") == "process_name") processes[e.at("pid")] = e.at("args").at("name");
  EXPECT_EQ(processes, (std::map<int, std::string>{{1, "local"}, {2, "peer"}}));
  EXPECT_EQ(thread_names(chrome), (std::map<std::pair<int, int>, std::string>{{{1, 1}, "worker"}, {{2, 1}, "rank-1"}}));
}

TEST(TraceExport, OverlapsThatDoNotNestGoToAnExtraThreadAndOddTimesAreKeptValid) {
  // b crosses a (starts inside, ends after); c nests in a; d ends before it begins.
  const json trace = {
      {"events",
       {{{"actor", "worker"}, {"what", "a"}, {"begin_s", 0.0}, {"end_s", 0.010}},
        {{"actor", "worker"}, {"what", "b"}, {"begin_s", 0.005}, {"end_s", 0.015}},
        {{"actor", "worker"}, {"what", "c"}, {"begin_s", 0.001}, {"end_s", 0.002}},
        {{"actor", "worker"}, {"what", "d"}, {"begin_s", 0.020}, {"end_s", 0.019}}}}};
  const json chrome = trace_to_chrome(trace);
  expect_valid_chrome_trace(chrome);
  EXPECT_EQ(thread_names(chrome),
            (std::map<std::pair<int, int>, std::string>{{{1, 1}, "worker"}, {{1, 2}, "worker (overlap 1)"}}));
  std::map<std::string, int> tid;
  for (const auto& x : events_of(chrome, "X")) tid[x.at("name")] = x.at("tid");
  EXPECT_EQ(tid, (std::map<std::string, int>{{"a", 1}, {"b", 2}, {"c", 1}, {"d", 1}}));
  for (const auto& x : events_of(chrome, "X"))
    if (x.at("name") == "d") {
      EXPECT_EQ(x.at("dur"), 0.0);
      EXPECT_DOUBLE_EQ(x.at("args").at("end_before_begin_us").get<double>(), -1000.0);
    }

  // A time before the submit (none expected) shifts all; otherData says by how much.
  const json early = trace_to_chrome(
      json{{"first_token_s", 0.001},
           {"events", {{{"actor", "intake"}, {"what", "queued"}, {"begin_s", -0.002}, {"end_s", 0.0}}}}});
  expect_valid_chrome_trace(early);
  EXPECT_DOUBLE_EQ(early.at("otherData").at("ts_origin_s").get<double>(), -0.002);
  EXPECT_DOUBLE_EQ(events_of(early, "X").at(0).at("ts").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(events_of(early, "i").at(0).at("ts").get<double>(), 3000.0);
}

TEST(TraceExport, AnythingButATraceIsAClearError) {
  auto error_of = [](const json& j) -> std::string {
    try {
      trace_to_chrome(j);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of(json::array()), "not a request trace: not a JSON object");
  EXPECT_EQ(error_of(json{{"id", 1}}), "not a request trace: no \"events\" array");
  EXPECT_EQ(error_of(json{{"events", {1}}}), "not a request trace: event 0 is not an object");
  EXPECT_EQ(error_of(json{{"events", {{{"what", "x"}, {"begin_s", 0}, {"end_s", 0}}}}}),
            "not a request trace: event 0: \"actor\" missing or not a string");
  EXPECT_EQ(error_of(json{{"events", {{{"actor", "a"}, {"what", "x"}, {"begin_s", "0"}, {"end_s", 0}}}}}),
            "not a request trace: event 0: \"begin_s\" missing or not a number");
  EXPECT_EQ(
      error_of(json{{"events", {{{"actor", "a"}, {"what", "x"}, {"layer", 1.5}, {"begin_s", 0}, {"end_s", 0}}}}}),
      "not a request trace: event 0: \"layer\" is not an integer");
  EXPECT_EQ(error_of(json{{"first_token_s", "soon"}, {"events", json::array()}}),
            "not a request trace: \"first_token_s\" is not a number");
}

}  // namespace
