// llama.cpp's golden outputs (made by tools/fixtures/make_golden.py on an F32 export of the
// same weights): for SmolLM2 tests/fixtures/golden_logits.json (32 greedy tokens), for
// Gemma 3 golden_gemma3_logits.json (--gemma3: 16). Each prompt's text and ids,
// final-position logits, the greedy tokens and the teacher-forced top-1 per position
// with its lead over the runner-up.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/model_fixture.h"

namespace bs::testing {

struct GoldenPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> final_logits;
  std::vector<int32_t> greedy;
  std::vector<int32_t> position_top1;
  std::vector<double> position_margin;
};

// The prompts of fixtures/<json>, whose greedy tokens are under `greedy_key`.
inline std::vector<GoldenPrompt> read_golden(const std::string& json, const std::string& greedy_key) {
  std::vector<GoldenPrompt> out;
  const std::string dir = BLENDSERVE_FIXTURES;
  auto j = nlohmann::json::parse(read_file(dir + "/" + json));
  for (const auto& p : j.at("prompts")) {
    GoldenPrompt g;
    g.text = p.at("text").get<std::string>();
    g.ids = p.at("ids").get<std::vector<int32_t>>();
    g.greedy = p.at(greedy_key).get<std::vector<int32_t>>();
    g.position_top1 = p.at("position_top1").get<std::vector<int32_t>>();
    g.position_margin = p.at("position_top1_margin").get<std::vector<double>>();
    const std::string raw = read_file(dir + "/" + p.at("final_logits_file").get<std::string>());
    g.final_logits.resize(raw.size() / 4);
    std::memcpy(g.final_logits.data(), raw.data(), raw.size());
    out.push_back(std::move(g));
  }
  return out;
}

// SmolLM2's, read once.
inline const std::vector<GoldenPrompt>& golden() {
  static const std::vector<GoldenPrompt> prompts = read_golden("golden_logits.json", "greedy32");
  return prompts;
}

}  // namespace bs::testing
