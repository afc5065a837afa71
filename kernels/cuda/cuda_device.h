// Which CUDA devices this process sees. Safe to call on machines without a GPU or a
// driver: the answer is then 0 devices, never an exception or a crash (the CPU build
// and CI call it to decide whether GPU tests run).
#pragma once

#include <string>

namespace bs::kernels::cuda {

// Devices visible to this process; 0 when there is no driver or no device.
int device_count() noexcept;

// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"; throws std::runtime_error when
// `device` does not exist.
std::string device_description(int device);

}  // namespace bs::kernels::cuda
