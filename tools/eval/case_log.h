// The case log of a resumable `blendctl eval --resume F.jsonl`.
//
// The shipped set's 240-case ratio sweep runs ~3 h on 2 AVX2 cores, longer than a
// session or a patient user: a run stopped at case 170 must not cost the 170 again.
// F keeps every finished (case, run) line as it is printed, one JSON object per line,
// flushed before the next run starts; a later eval with the same settings reads them
// back instead of recomputing them and appends what is still missing. The summaries
// are always computed from these lines (fresh or read), so a resumed run's summary is
// the one an uninterrupted run would print, up to timing.
//
// F's first line is the settings that decide a line's values (dataset content, model
// fingerprint, kernels, precision, CPU, blend options, answer length): resuming under
// others is refused naming the first key that differs, because mixing them would
// average numbers that are not comparable (TTFT from two machines, F1 at two answer
// lengths). Which runs (modes, ratios) and which cases are asked for is not a setting:
// a later run may add a ratio or extend --max-cases and reuses what matches.
#pragma once

#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace bs::tools {

class CaseLog {
 public:
  // Opens `path`: a missing or empty file is created with `settings` (an object; its
  // "eval" key is set to "settings") as its first line;
  // an existing one must start with exactly these settings (std::runtime_error naming
  // the first differing key otherwise) and its case lines are read. A last line cut
  // short (the process killed mid-write: no final newline) is dropped and the file
  // truncated to the lines before it; any other line that is not a case line, or a
  // second line for the same (case, run), is an error and nothing is rewritten.
  CaseLog(const std::string& path, const nlohmann::json& settings);

  // The line of case `case_no` (0-based index in the dataset) for `mode` (and, for the
  // blend, `ratio`; ignored otherwise), or null if it has not been run.
  const nlohmann::json* find(int case_no, const std::string& mode, double ratio) const;

  // Appends one case line (it must carry "case", "mode" and, for the blend, "ratio")
  // and flushes it, so a run killed later keeps it.
  void append(const nlohmann::json& line);

  int lines_read() const { return lines_read_; }
  const std::string& path() const { return path_; }

  // The key of one (case, run): the blend's ratio to six decimals, as eval prints it.
  static std::string key(int case_no, const std::string& mode, double ratio);

 private:
  std::string path_;
  std::map<std::string, nlohmann::json> lines_;
  std::ofstream out_;
  int lines_read_ = 0;
};

}  // namespace bs::tools
