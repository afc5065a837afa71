// blendctl top: a live terminal view of a server's actors and requests, read
// from /v1/inspect/snapshot every interval and drawn with ncurses (Debian's
// libncurses; the layout is tools/cli/top_view.*). A server that goes away is said
// on the status line and asked again every interval; `q` quits, `s` changes the
// sort, `/` filters the actors. `--once --json` prints one snapshot instead.
#include <curses.h>
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/bench/bench.h"
#include "tools/cli/top_view.h"

namespace bs::tools {

namespace {

// One GET of the snapshot; throws with what went wrong (unreachable, 401, ...).
nlohmann::json fetch_snapshot(const TopOptions& opt) {
  std::string url = opt.url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  httplib::Client c(url);
  if (!c.is_valid()) throw std::invalid_argument("top: invalid --url " + opt.url + " (expected http://HOST:PORT)");
  const auto secs = static_cast<time_t>(std::max(1.0, opt.timeout_s));
  c.set_connection_timeout(secs, 0);
  c.set_read_timeout(secs, 0);
  httplib::Headers headers;
  if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);
  auto r = c.Get("/v1/inspect/snapshot", headers);
  if (!r) throw std::runtime_error("cannot reach " + url + " (" + httplib::to_string(r.error()) + ")");
  if (r->status == 401) throw std::runtime_error(url + " refused: 401 (give --api-key or $BLENDSERVE_API_KEY)");
  if (r->status != 200) throw std::runtime_error(url + " answered " + std::to_string(r->status));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("nodes")) throw std::runtime_error(url + ": not a blendserve snapshot");
  return j;
}

std::string clock_text() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", std::localtime(&t));
  return buf;
}

// ncurses on and off with the scope, whatever ends it.
struct Screen {
  Screen() {
    initscr();
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
  }
  ~Screen() { endwin(); }
};

}  // namespace

int run_top(const TopOptions& opt) {
  if (opt.once) {
    try {
      const auto snap = fetch_snapshot(opt);
      if (opt.json) {
        std::printf("%s\n", snap.dump().c_str());
      } else {
        TopViewOptions v;
        v.status = "snapshot at " + clock_text();
        for (const auto& l : top_lines(snap, v)) std::printf("%s\n", l.c_str());
      }
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "blendctl top: %s\n", e.what());
      return 1;
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  Screen screen;
  TopViewOptions view;
  nlohmann::json last = nlohmann::json::object();
  bool filtering = false;
  std::string typed;
  auto next_fetch = std::chrono::steady_clock::now();
  while (true) {
    if (std::chrono::steady_clock::now() >= next_fetch) {
      try {
        last = fetch_snapshot(opt);
        view.status = "updated " + clock_text() + " from " + opt.url;
      } catch (const std::exception& e) {
        // The last view stays up, marked stale; ask again next interval.
        view.status = std::string("server gone: ") + e.what() + "; retrying every " +
                      std::to_string(static_cast<int>(opt.interval_s)) + " s (last view from before)";
      }
      next_fetch = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(1000 * opt.interval_s));
    }
    view.width = COLS;
    if (filtering) view.status = "filter: " + typed + "_";
    erase();
    const auto lines = top_lines(last, view);
    for (int i = 0; i < static_cast<int>(lines.size()) && i < LINES; ++i) mvaddnstr(i, 0, lines[static_cast<size_t>(i)].c_str(), COLS);
    refresh();
    timeout(100);  // keys are read every 100 ms; the snapshot every interval
    const int ch = getch();
    if (ch == ERR) continue;
    if (filtering) {
      if (ch == '\n' || ch == KEY_ENTER) {
        filtering = false;
        view.filter = typed;
        next_fetch = std::chrono::steady_clock::now();
      } else if (ch == KEY_BACKSPACE || ch == 127 || ch == 8) {
        if (!typed.empty()) typed.pop_back();
      } else if (ch == 27) {
        filtering = false;
      } else if (ch >= 32 && ch < 127) {
        typed.push_back(static_cast<char>(ch));
      }
      continue;
    }
    if (ch == 'q' || ch == 'Q') return 0;
    if (ch == 's') view.sort = next_sort(view.sort);
    if (ch == '/') {
      filtering = true;
      typed.clear();
    }
  }
}

}  // namespace bs::tools
