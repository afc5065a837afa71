// Shared test helpers: the real model, loaded once per test binary and precision.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "model/llama_model.h"

namespace bs::testing {

inline std::string model_path() {
  if (const char* env = std::getenv("BLENDSERVE_MODEL")) return env;
  return BLENDSERVE_DEFAULT_MODEL;
}

inline bool model_available() { return std::filesystem::exists(model_path()); }

// The CPU backend on the best kernel variant (BLENDSERVE_CPU_ISA caps it).
inline kernels::Backend& shared_backend() {
  static std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend();
  return *backend;
}

// The precision the runtime uses by default here: bf16 where the CPU has native bf16
// dot products, f32 otherwise.
inline kernels::Precision fast_precision() { return shared_backend().default_precision(); }

// The model on the CPU backend at the given GEMM precision and KV dtype, loaded on
// first use.
inline const LlamaModel& shared_model(kernels::Precision precision,
                                      kernels::TensorType kv_dtype = kernels::TensorType::F32) {
  auto* backend = &shared_backend();
  static std::map<std::pair<kernels::Precision, kernels::TensorType>, std::unique_ptr<LlamaModel>> models;
  auto& m = models[{precision, kv_dtype}];
  if (!m) m = std::make_unique<LlamaModel>(model_path(), *backend, precision, kv_dtype);
  return *m;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace bs::testing

// The model file comes from tools/setup.sh; without it the model tests cannot run.
#define REQUIRE_MODEL()                                                              \
  do {                                                                               \
    if (!bs::testing::model_available()) FAIL() << "model missing: run tools/setup.sh"; \
  } while (0)
