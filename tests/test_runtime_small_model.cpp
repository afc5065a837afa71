// The runtime's default blend (gradual filtering, check layers 1..6) on models with
// fewer layers than that: the default narrows to the layers the model has, so a
// small model runs on the embedded defaults; a check layer the user named past the
// model stops the start with an error naming the key. Tiny synthetic Llamas
// (tests/tiny_model.h, random weights): no real model needed, so this also runs
// under ASan+UBSan.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "actors/runtime/runtime.h"
#include "actors/config/runtime_config.h"
#include "actors/runtime/runtime_context.h"
#include "tests/temp_dir.h"
#include "tests/tiny_model.h"

namespace bs {
namespace {

struct TinyRuntimeSetup {
  explicit TinyRuntimeSetup(int layers) {
    testing::tiny_llama_writer("llama", layers).write(path);
    config = default_runtime_config();
    config.model_path = path;
    config.precision = "f32";
    config.ssd.enabled = false;  // RAM tier only: nothing written outside the temp dir
    config.data_dir = dir.path().string();
  }
  testing::TempDir dir{"bs_runtime_small_model"};
  std::string path = (dir.path() / "tiny.gguf").string();
  RuntimeConfig config;
};

// A pre-tokenized RAG prompt: a prefix, two chunks, a suffix.
RuntimeRequest blend_request(const Runtime& rt) {
  const auto& tok = rt.context().model->tokenizer();
  RagPrompt p;
  p.prefix = tok.encode("you read", false);
  p.chunks = {tok.encode("hello world and the world is on it", false),
              tok.encode("the hill and the inn at the end of it", false)};
  p.suffix = tok.encode("what is it", false);
  RuntimeRequest r;
  r.prompt = p;
  r.sampling.max_tokens = 2;
  r.mode = BlendMode::Blend;
  return r;
}

TEST(RuntimeSmallModel, TheDefaultCheckLayersNarrowToATwoLayerModel) {
  TinyRuntimeSetup s(2);
  ASSERT_EQ(s.config.blend.check_layers, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  Runtime rt(s.config);
  EXPECT_EQ(rt.context().config.blend.check_layers, std::vector<int>{1});
  // Blend requests run (before: every one was refused, "check layers must be in [1, 1]").
  const auto miss = rt.run(blend_request(rt));
  EXPECT_EQ(miss.finish_reason, "length") << miss.error;
  EXPECT_EQ(miss.tokens.size(), 2u);
  rt.shutdown(/*finish_write_back=*/true);
}

TEST(RuntimeSmallModel, TheDefaultCheckLayersStayOnASevenLayerModel) {
  TinyRuntimeSetup s(7);
  Runtime rt(s.config);
  EXPECT_EQ(rt.context().config.blend.check_layers, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  const auto r = rt.run(blend_request(rt));
  EXPECT_EQ(r.finish_reason, "length") << r.error;
}

TEST(RuntimeSmallModel, NamedCheckLayersPastTheModelStopTheStart) {
  TinyRuntimeSetup s(2);
  s.config.blend.check_layers = {1, 3};
  try {
    Runtime rt(s.config);
    FAIL() << "a check layer past a 2-layer model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "blend.check_layers: layer 3 is past the model's last layer (1 of a 2-layer model)");
  }
  // The default with a schedule written for six check layers cannot be narrowed either.
  s.config.blend.check_layers = BlendOptions{}.check_layers;
  s.config.blend.schedule = {0.9f, 0.8f, 0.6f, 0.4f, 0.2f};
  EXPECT_THROW(Runtime rt(s.config), std::invalid_argument);
}

// query_first_from_layer: the default fits any model; a layer named past the
// model's last stops the start with the key, as a check layer does.
TEST(RuntimeSmallModel, QueryFirstFromLayerPastTheModelStopsTheStart) {
  TinyRuntimeSetup s(2);
  {
    Runtime rt(s.config);
    EXPECT_LT(rt.context().config.blend.query_first_from_layer, 2);
    const auto r = rt.run(blend_request(rt));
    EXPECT_EQ(r.finish_reason, "length") << r.error;
    rt.shutdown(/*finish_write_back=*/true);
  }
  s.config.blend.query_first_from_layer = 4;
  try {
    Runtime rt(s.config);
    FAIL() << "a query-first layer past a 2-layer model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "blend.query_first_from_layer: layer 4 is past the model's last layer (1 of a 2-layer model)");
  }
}

}  // namespace
}  // namespace bs
