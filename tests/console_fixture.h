// The console page in a real headless Chromium (Debian's `chromium`), for the tests
// that check what it shows: the DOM after its scripts ran, and the attributes of
// the elements that carry data-* markers.
#pragma once

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "process_fixture.h"

namespace bs::testing {

inline std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

// The console's DOM once its scripts ran (a few seconds of the page's time),
// without the script's own text (its templates look like elements).
inline std::string console_dom(const std::string& chromium, int port, const std::string& fragment, const std::filesystem::path& profile) {
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/console#" + fragment;
  const std::string dom = run_command("timeout 90 " + chromium + " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" +
             profile.string() + " --virtual-time-budget=3000 --dump-dom '" + url + "' 2>/dev/null").out;
  return dom.substr(0, dom.find("<script"));
}

// The attribute values of every element of the DOM with `marker` among its attributes.
inline std::vector<std::map<std::string, std::string>> elements_with(const std::string& dom, const std::string& tag,
                                                              const std::string& marker) {
  std::vector<std::map<std::string, std::string>> out;
  const std::regex element("<" + tag + "\\s([^>]*)>");
  const std::regex attribute(R"re(([a-z-]+)="([^"]*)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), element); it != std::sregex_iterator(); ++it) {
    const std::string attrs = (*it)[1];
    if (attrs.find(marker) == std::string::npos) continue;
    std::map<std::string, std::string> m;
    for (auto a = std::sregex_iterator(attrs.begin(), attrs.end(), attribute); a != std::sregex_iterator(); ++a)
      m[(*a)[1]] = (*a)[2];
    out.push_back(std::move(m));
  }
  return out;
}

inline std::string unescape(std::string s) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}}) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  }
  return s;
}

}  // namespace bs::testing
