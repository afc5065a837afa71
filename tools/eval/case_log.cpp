#include "tools/eval/case_log.h"

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

namespace bs::tools {

using json = nlohmann::json;

namespace {

// "a value" for an error message: short, on one line.
std::string shown(const json* v) {
  if (!v) return "absent";
  std::string s = v->dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace

std::string CaseLog::key(int case_no, const std::string& mode, double ratio) {
  char k[160];
  if (mode == "blend")
    std::snprintf(k, sizeof k, "%d/%s/%.6f", case_no, mode.c_str(), ratio);
  else
    std::snprintf(k, sizeof k, "%d/%s", case_no, mode.c_str());
  return k;
}

CaseLog::CaseLog(const std::string& path, const json& given_settings) : path_(path) {
  json settings = given_settings;
  settings["eval"] = "settings";
  std::string text;
  if (std::filesystem::exists(path)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("--resume: cannot read " + path);
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  // A last line without its newline was cut short by a kill: drop it.
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    std::fprintf(stderr, "--resume: %s: dropping an unfinished last line (%zu bytes)\n", path.c_str(),
                 text.size() - complete);
    text.resize(complete);
    std::filesystem::resize_file(path, complete);
  }
  const bool fresh = text.empty();
  if (!fresh) {
    std::istringstream in(text);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      json j = json::parse(line, nullptr, false);
      if (line_no == 1) {
        if (j.is_discarded() || !j.is_object() || j.value("eval", "") != "settings")
          throw std::runtime_error("--resume: " + path + " is not a case log of blendctl eval (its first line is not "
                                   "the settings)");
        std::set<std::string> keys;
        for (const auto& [k, v] : j.items()) keys.insert(k);
        for (const auto& [k, v] : settings.items()) keys.insert(k);
        for (const auto& k : keys) {
          const json* there = j.contains(k) ? &j.at(k) : nullptr;
          const json* here = settings.contains(k) ? &settings.at(k) : nullptr;
          if (!there || !here || *there != *here)
            throw std::runtime_error("--resume: " + path + " was written with other settings: \"" + k + "\" is " +
                                     shown(there) + " there and " + shown(here) +
                                     " here; resume with the same settings or give another file");
        }
        continue;
      }
      const bool ok = !j.is_discarded() && j.is_object() && j.contains("case") && j.at("case").is_number_integer() &&
                      j.contains("mode") && j.at("mode").is_string() &&
                      (j.at("mode") != "blend" || (j.contains("ratio") && j.at("ratio").is_number()));
      if (!ok)
        throw std::runtime_error("--resume: " + path + " line " + std::to_string(line_no) +
                                 " is not a case line of blendctl eval; the file is left as it is");
      const std::string k =
          key(j.at("case").get<int>(), j.at("mode").get<std::string>(), j.value("ratio", 0.0));
      if (!lines_.emplace(k, std::move(j)).second)
        throw std::runtime_error("--resume: " + path + " line " + std::to_string(line_no) + " repeats the run " + k +
                                 "; the file is left as it is");
      ++lines_read_;
    }
  }
  out_.open(path, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error("--resume: cannot write " + path);
  if (fresh) {
    out_ << settings.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    out_.flush();
    if (!out_) throw std::runtime_error("--resume: cannot write " + path);
  }
}

const json* CaseLog::find(int case_no, const std::string& mode, double ratio) const {
  const auto it = lines_.find(key(case_no, mode, ratio));
  return it == lines_.end() ? nullptr : &it->second;
}

void CaseLog::append(const json& line) {
  out_ << line.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("--resume: cannot write " + path_ + " (disk full?)");
  lines_.emplace(key(line.at("case").get<int>(), line.at("mode").get<std::string>(), line.value("ratio", 0.0)), line);
}

}  // namespace bs::tools
