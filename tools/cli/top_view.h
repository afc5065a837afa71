// blendctl top's screen as text: a server's /v1/inspect/snapshot laid out in
// lines of at most `width` columns — nodes, tiers (hit rate, bytes, loaded),
// queue and KV pages, the actors sorted by the chosen key and filtered, the
// requests in flight with their phase. A pure function, so the layout is tested
// without a terminal; tools/cli/top.cpp draws it with ncurses.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bs::tools {

enum class TopSort { BusyShare, Mailbox, Messages, Name };
// The next key in the cycle the `s` key walks, and its column title.
TopSort next_sort(TopSort s);
const char* sort_name(TopSort s);

struct TopViewOptions {
  int width = 80;           // columns; every line is cut to it
  TopSort sort = TopSort::BusyShare;
  std::string filter;       // only actors whose name or kind contains it
  std::string status;       // the last line: what happened to the last fetch
};

std::vector<std::string> top_lines(const nlohmann::json& snapshot, const TopViewOptions& opt);

}  // namespace bs::tools
