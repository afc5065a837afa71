// Which backend computes (kernels/backend_choice.h) and what a user sees when the one
// they asked for is not there: a build without nvcc, or a machine without a GPU (CI's
// machines are one or the other), refuse cuda with a sentence, never a crash. Label
// "unit" (no model: the runtime fails on the backend before it opens one).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/runtime/runtime.h"
#include "actors/config/runtime_config.h"
#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"

namespace bs::kernels {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

bool cuda_built() {
  const auto kinds = device_kinds_built();
  return std::find(kinds.begin(), kinds.end(), "cuda") != kinds.end();
}

TEST(BackendChoice, CpuIsAlwaysThere) {
  const auto kinds = device_kinds_built();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.front(), "cpu");
  EXPECT_TRUE(is_device_kind("cpu"));
  EXPECT_TRUE(is_device_kind("cuda"));
  EXPECT_FALSE(is_device_kind("tpu"));
  auto be = make_backend(BackendChoice{});
  EXPECT_EQ(be->kernel_id().rfind("cpu/", 0), 0u) << be->kernel_id();
  EXPECT_TRUE(be->host_accessible());
  EXPECT_EQ(be->free_memory_bytes(), -1);
  EXPECT_TRUE(be->device_name().empty());
  BackendChoice exact;
  exact.decode_activations = "exact";
  EXPECT_EQ(make_backend(exact)->kernel_id().find("+int8"), std::string::npos);
}

TEST(BackendChoice, UnknownWordsAreNamed) {
  BackendChoice tpu;
  tpu.kind = "tpu";
  try {
    make_backend(tpu);
    ADD_FAILURE() << "tpu made a backend";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown device kind 'tpu' (cpu, cuda)"));
  }
  BackendChoice odd;
  odd.decode_activations = "int4";
  EXPECT_THROW(make_backend(odd), std::invalid_argument);
}

// model.batch_invariant: the CPU backend says so in its kernel id (its stored KV is its
// own); the CUDA backend does not implement it and refuses it by name, GPU or not.
TEST(BackendChoice, BatchInvariantIsACpuBackendOrARefusal) {
  BackendChoice inv;
  inv.batch_invariant = true;
  auto be = make_backend(inv);
  EXPECT_TRUE(be->batch_invariant());
  EXPECT_EQ(be->kernel_id(), make_backend(BackendChoice{})->kernel_id() + "+batch-invariant");
  inv.kind = "cuda";
  try {
    make_backend(inv);
    ADD_FAILURE() << "a batch-invariant CUDA backend";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(cuda_built());
    EXPECT_THAT(e.what(), HasSubstr("batch_invariant is not implemented on the CUDA backend"));
  } catch (const std::runtime_error& e) {
    EXPECT_FALSE(cuda_built());
    EXPECT_THAT(e.what(), HasSubstr("this build has no CUDA backend"));
  }
}

// Without a GPU (every CI machine): cuda says why it cannot be had.
TEST(BackendChoice, CudaWithoutAGpuIsRefusedWithAReason) {
  if (cuda_devices_visible() > 0) GTEST_SKIP() << "this machine has a GPU: tests/cuda_test_backend.cpp covers it";
  BackendChoice cuda;
  cuda.kind = "cuda";
  try {
    make_backend(cuda);
    ADD_FAILURE() << "a CUDA backend without a GPU";
  } catch (const std::runtime_error& e) {
    if (cuda_built())
      EXPECT_THAT(e.what(), HasSubstr("cuda: no CUDA device 0 (0 visible: no GPU or no driver)"));
    else
      EXPECT_THAT(e.what(), HasSubstr("cuda: this build has no CUDA backend"));
  }
}

// A wait limit that is no limit is refused before any device is looked for (a CUDA
// build; without CUDA the kind itself is refused).
TEST(BackendChoice, ACudaWaitLimitOutsideItsRangeIsRefused) {
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build";
  for (double limit : {0.0, -1.0, 1e9, std::nan("")}) {
    BackendChoice cuda;
    cuda.kind = "cuda";
    cuda.wait_timeout_s = limit;
    try {
      make_backend(cuda);
      ADD_FAILURE() << "wait limit " << limit << " made a backend";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("wait timeout must be in (0, 86400] seconds")) << limit;
    }
  }
}

// The runtime makes the backend first, so the refusal is a configuration error naming
// the key, before any model is opened.
TEST(BackendChoice, TheRuntimeRefusesCudaWithoutAGpuAsAConfigError) {
  if (cuda_devices_visible() > 0) GTEST_SKIP() << "this machine has a GPU";
  RuntimeConfig config = default_runtime_config();
  config.device_kind = "cuda";
  config.model_path = "/nonexistent/model.gguf";
  try {
    Runtime runtime(config);
    ADD_FAILURE() << "a runtime on cuda without a GPU";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AnyOf(HasSubstr("device.kind: cuda: no CUDA device 0"),
                                HasSubstr("device.kind: cuda: this build has no CUDA backend")));
  }
  // Tensor parallel on cuda: a GPU per rank, joined by NCCL. The combinations that
  // cannot work are refused before any device is touched; a right one reaches the
  // backend (and finds no GPU here).
  auto refusal = [&](const RuntimeConfig& c) -> std::string {
    try {
      Runtime runtime(c);
    } catch (const ConfigError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a ConfigError: ") + e.what();
    }
    return "accepted";
  };
  config.tp = 2;
  EXPECT_THAT(refusal(config), HasSubstr("device.gpus: tp 2 on cuda puts each rank on a GPU of its own: list 2 "
                                         "devices (e.g. [0, 1]); 1 listed"));
  config.gpus = {1, 1};
  EXPECT_THAT(refusal(config), HasSubstr("device.gpus: GPU 1 is listed for ranks 0 and 1; NCCL 2.28 refuses two "
                                         "ranks on one GPU"));
  config.gpus = {0, 1};
  config.communicator = "inprocess";
  EXPECT_THAT(refusal(config), HasSubstr("device.communicator: inprocess joins CPU ranks through host memory"));
  config.communicator = "auto";
  EXPECT_THAT(refusal(config), AnyOf(HasSubstr("device.kind: cuda: no CUDA device 0"),
                                     HasSubstr("device.kind: cuda: this build has no CUDA backend")));
  config.communicator = "mpi";
  EXPECT_THAT(refusal(config), HasSubstr("device.communicator: unknown communicator 'mpi'"));
  RuntimeConfig cpu = default_runtime_config();
  cpu.model_path = "/nonexistent/model.gguf";
  cpu.communicator = "nccl";
  EXPECT_THAT(refusal(cpu), HasSubstr("device.communicator: nccl joins GPU ranks, and device.kind is cpu"));
}

bool nccl_built() {
  const auto kinds = communicator_kinds_built();
  return std::find(kinds.begin(), kinds.end(), "nccl") != kinds.end();
}

// The communicator by its word: auto follows the device; the in-process group is always
// there and joins its ranks (an all-reduce across threads); an unknown word is named;
// NCCL without a GPU (or not built) is an error in words, never a crash.
TEST(CommunicatorChoice, KindsByNameAndGroupsThatFormOrSayWhyNot) {
  EXPECT_EQ(resolve_communicator_kind("auto", "cpu"), "inprocess");
  EXPECT_EQ(resolve_communicator_kind("auto", "cuda"), "nccl");
  EXPECT_EQ(resolve_communicator_kind("inprocess", "cuda"), "inprocess");
  EXPECT_TRUE(is_communicator_kind("nccl") && is_communicator_kind("auto") && !is_communicator_kind("mpi"));
  const auto kinds = communicator_kinds_built();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "inprocess"), kinds.end());
  EXPECT_EQ(nccl_built(), cuda_built() && kinds.size() == 2);

  auto group = make_group("inprocess", {0, 0, 0}, std::chrono::seconds(10));
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::thread> ranks;
  std::vector<float> sums(3);
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      float x = static_cast<float>(r + 1);
      group[static_cast<size_t>(r)]->all_reduce_sum(&x, 1, std::chrono::seconds(10));
      sums[static_cast<size_t>(r)] = x;
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(sums, (std::vector<float>{6, 6, 6}));

  EXPECT_THROW(make_group("mpi", {0}, std::chrono::seconds(1)), std::invalid_argument);
  EXPECT_THROW(make_group("inprocess", {}, std::chrono::seconds(1)), std::invalid_argument);
  if (cuda_devices_visible() == 0) {
    try {
      make_group("nccl", {0}, std::chrono::seconds(5));
      ADD_FAILURE() << "an NCCL group without a GPU";
    } catch (const std::invalid_argument& e) {
      ADD_FAILURE() << "not a runtime error: " << e.what();
    } catch (const std::exception& e) {
      EXPECT_GT(std::string(e.what()).size(), 10u) << "a reason in words";
      if (!nccl_built()) {
        EXPECT_THAT(e.what(), HasSubstr("this build has no NCCL communicator"));
      }
    }
  }
}

// The command lines: --device after the subcommand too (blendserve serve --device cuda,
// blendctl bench prefill --device cuda), and without a GPU the refusal in words, exit 1.
TEST(BackendChoice, TheCommandLinesRefuseCudaWithoutAGpuInWords) {
  if (cuda_devices_visible() > 0) GTEST_SKIP() << "this machine has a GPU";
  const std::string bin = BLENDSERVE_BINARY_DIR;
  for (const std::string& command :
       {bin + "/blendserve serve --device cuda --port 0", bin + "/blendserve --device cuda generate --prompt hi",
        bin + "/blendserve serve --device cuda --tp 2 --port 0",
        bin + "/blendctl bench prefill --device cuda --lengths 8"}) {
    const std::string exe = command.substr(0, command.find(' '));
    if (!std::filesystem::exists(exe)) GTEST_SKIP() << exe << " is not built in this build";
    FILE* p = ::popen((command + " 2>&1").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int status = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << command << ": " << out;
    EXPECT_THAT(out, AnyOf(HasSubstr("cuda: no CUDA device 0"), HasSubstr("cuda: this build has no CUDA backend")))
        << command;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("not expected"))) << command;
  }
}

}  // namespace
}  // namespace bs::kernels
