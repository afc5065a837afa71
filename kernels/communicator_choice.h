// Which communicator joins the ranks of a tensor-parallel group, from the
// configuration's words (device.communicator, device.gpus): the one place that knows
// every kind this build has, as backend_choice.h is for backends, so the runtime
// makes its first group and every rebuild the same way and a build or machine without
// NCCL answers with a sentence, not a crash.
//
//   inprocess  CPU ranks of one process (kernels/communicator.h: shared memory, one
//              thread per rank); buffers are host memory.
//   nccl       one GPU per rank (kernels/cuda/nccl_communicator.h); buffers are each
//              rank's device memory. Built where the CUDA toolkit's NCCL is found.
//   auto       nccl on cuda, inprocess on cpu.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/communicator.h"

namespace bs::kernels {

// The kinds this build can make: {"inprocess"} or {"inprocess", "nccl"}.
std::vector<std::string> communicator_kinds_built();
// Whether `kind` names a communicator at all ("auto", "inprocess", "nccl").
bool is_communicator_kind(std::string_view kind);
// "auto" resolved for a device kind (cpu -> inprocess, cuda -> nccl); others unchanged.
std::string resolve_communicator_kind(const std::string& kind, const std::string& device_kind);

// One group of devices.size() ranks, rank r's communicator at index r, on device
// devices[r] (nccl; inprocess ignores the devices). NCCL: rank 0's unique id is made
// here and handed to every rank as a value; each rank joins on a thread of its own
// (a join blocks until every rank joined) within `timeout`. Throws
// std::invalid_argument for an unknown kind or no devices, std::runtime_error saying
// why when the kind is not in this build, and CommError (or the CUDA error) when the
// group could not form (no GPU, a device twice: NCCL 2.28 refuses two ranks on one GPU).
std::vector<std::unique_ptr<Communicator>> make_group(const std::string& kind, const std::vector<int>& devices,
                                                      Communicator::Timeout timeout);

}  // namespace bs::kernels
