// The NCCL communicator (kernels/cuda/nccl_communicator.h) on a GPU, label "cuda":
// without a GPU (or a driver) it prints why and exits 77 (CTest: skipped). NCCL 2.28
// refuses two ranks on one GPU, so on a one-GPU machine the group has one rank: the
// collectives' plumbing (device buffers, the host broadcast's staging, polling with a
// deadline), the unique id handed over as bytes, and abort -> CommError on every later
// call. A machine with several GPUs also runs the two-rank group (one thread per rank).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/nccl_communicator.h"

namespace bs::kernels::cuda {
namespace {

using namespace std::chrono_literals;

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) ADD_FAILURE() << "D2H";
  return h;
}
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(T)) != cudaSuccess) ADD_FAILURE() << "cudaMalloc";
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

TEST(NcclCommunicator, OneRankGroupRunsEveryCollective) {
  const NcclId id = make_nccl_id();
  NcclId copy;
  std::memcpy(copy.data(), id.data(), id.size());  // as a message would carry it
  auto comm = make_nccl_communicator(copy, 0, 1, 0, 30s);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  float* df = to_device(f);
  comm->all_reduce_sum(df, static_cast<int64_t>(f.size()), 10s);
  EXPECT_EQ(to_host(df, f.size()), f);
  std::vector<double> d = {1e-300, 2.5, -1e300};
  double* dd = to_device(d);
  comm->all_reduce_sum(dd, static_cast<int64_t>(d.size()), 10s);
  EXPECT_EQ(to_host(dd, d.size()), d);
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&gathered), f.size() * sizeof(float)), cudaSuccess);
  comm->all_gather(df, gathered, static_cast<int64_t>(f.size()), 10s);
  EXPECT_EQ(to_host(gathered, f.size()), f);
  std::vector<unsigned char> bytes = {1, 2, 3, 250, 7, 9, 11};
  unsigned char* db = to_device(bytes);
  unsigned char* gb = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&gb), bytes.size()), cudaSuccess);
  comm->all_gather_bytes(db, gb, static_cast<int64_t>(bytes.size()), 10s);
  EXPECT_EQ(to_host(gb, bytes.size()), bytes);
  int64_t decision[2] = {4, 17};  // host memory, as the leader's decisions
  comm->broadcast(decision, sizeof decision, 0, 10s);
  EXPECT_EQ(decision[0], 4);
  EXPECT_EQ(decision[1], 17);
  comm->barrier(10s);
  EXPECT_FALSE(comm->failed());

  comm->abort("a test");
  EXPECT_TRUE(comm->failed());
  try {
    comm->all_reduce_sum(df, 1, 10s);
    FAIL() << "a collective ran on an aborted group";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("a test"), std::string::npos) << e.what();
  }
  cudaFree(df);
  cudaFree(dd);
  cudaFree(gathered);
  cudaFree(db);
  cudaFree(gb);
}

TEST(NcclCommunicator, TwoRanksOnTwoGpusSumInEveryRank) {
  if (device_count() < 2) GTEST_SKIP() << "one GPU: NCCL 2.28 refuses two ranks on it";
  const NcclId id = make_nccl_id();
  auto group = std::make_shared<GroupFailure>();
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      cudaSetDevice(r);
      auto comm = make_nccl_communicator(id, r, 2, r, 60s, group);
      std::vector<float> v = {1.0f + r, 10.0f * (r + 1)};
      float* d = to_device(v);
      comm->all_reduce_sum(d, 2, 30s);
      got[static_cast<size_t>(r)] = to_host(d, 2);
      cudaFree(d);
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(got[0], (std::vector<float>{3.0f, 30.0f}));
  EXPECT_EQ(got[1], got[0]);
}

}  // namespace
}  // namespace bs::kernels::cuda

int main(int argc, char** argv) {
  const int devices = bs::kernels::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device (or no driver): the NCCL communicator tests are skipped\n");
    return 77;
  }
  std::printf("NCCL %d, %d CUDA device(s)\n", bs::kernels::cuda::nccl_version(), devices);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
