// llama.cpp's golden outputs for SmolLM2 (tests/fixtures/golden_logits.json, made by
// tools/make_golden.py on an F32 export of the same weights): each prompt's text and
// ids, final-position logits, 32 greedy tokens and teacher-forced top-1 per position.
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
  std::vector<int32_t> greedy32;
  std::vector<int32_t> position_top1;
};

inline const std::vector<GoldenPrompt>& golden() {
  static std::vector<GoldenPrompt> prompts = [] {
    std::vector<GoldenPrompt> out;
    const std::string dir = BLENDSERVE_FIXTURES;
    auto j = nlohmann::json::parse(read_file(dir + "/golden_logits.json"));
    for (const auto& p : j.at("prompts")) {
      GoldenPrompt g;
      g.text = p.at("text").get<std::string>();
      g.ids = p.at("ids").get<std::vector<int32_t>>();
      g.greedy32 = p.at("greedy32").get<std::vector<int32_t>>();
      g.position_top1 = p.at("position_top1").get<std::vector<int32_t>>();
      const std::string raw = read_file(dir + "/" + p.at("final_logits_file").get<std::string>());
      g.final_logits.resize(raw.size() / 4);
      std::memcpy(g.final_logits.data(), raw.data(), raw.size());
      out.push_back(std::move(g));
    }
    return out;
  }();
  return prompts;
}

}  // namespace bs::testing
