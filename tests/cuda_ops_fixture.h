// What the CUDA op suites share (cuda_test_ops.cpp, cuda_test_ops_decode.cpp, one
// binary): host values on the device and back on one stream, the reference backend
// beside it, a host paged cache uploaded with its page table.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dequant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/device_waits.h"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/gemv_bf16.cuh"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/kv_deviation.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/residual_add.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope_kv_rows.cuh"
#include "kernels/cuda/split_qkv.cuh"
#include "kernels/cuda/store_kv.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/top_k.cuh"
#include "tests/paged_kv.h"
#include "tests/random_data.h"

namespace bs::kernels::cuda::ops_test {

using test::random_vec;
using test::rel_max_err;

// Host values on the device and back, on one stream.
struct OnDevice {
  CudaStream stream;
  DeviceAllocation up(const std::vector<float>& host) {
    DeviceAllocation d(host.size() * sizeof(float));
    BS_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), d.bytes(), cudaMemcpyHostToDevice, stream.get()));
    return d;
  }
  std::vector<float> down(const DeviceAllocation& d) {
    std::vector<float> host(d.bytes() / sizeof(float));
    BS_CUDA_CHECK(cudaMemcpyAsync(host.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    return host;
  }
};

class CudaOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> ref = make_reference_backend();
  OnDevice dev;
};


// A host paged cache (pages shuffled in the pool, spare pages NaN, a final partial
// page) copied to the device with its page table.
struct DevicePaged {
  DeviceAllocation k, v, pages;
  DevicePagedKv view;
};
inline DevicePaged upload_paged(OnDevice& dev, const test::PagedKv& host) {
  DevicePaged d{DeviceAllocation(host.k.size()), DeviceAllocation(host.v.size()),
                DeviceAllocation(host.pages.size() * sizeof(int32_t)), {}};
  auto s = dev.stream.get();
  BS_CUDA_CHECK(cudaMemcpyAsync(d.k.get(), host.k.data(), host.k.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(d.v.get(), host.v.data(), host.v.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(d.pages.get(), host.pages.data(), d.pages.bytes(), cudaMemcpyHostToDevice, s));
  KvView on_device = host.view;
  on_device.k = d.k.get();
  on_device.v = d.v.get();
  d.view = device_view(on_device, d.pages.as<int32_t>());
  return d;
}

}  // namespace bs::kernels::cuda::ops_test
