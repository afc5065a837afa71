// Scratch memory of a backend for the activations between ops.
//
// Why: a prefill's activations are tens of MB per layer; allocating (and, for host
// vectors, zero-filling) fresh buffers for every op costs more than the element-wise
// ops themselves. A workspace keeps numbered slots that only grow. One workspace per
// thread per backend (Backend::workspace): compute may run on several threads (a
// runtime's compute thread, a tool's threads) and each needs its own slots. A thread
// that goes idle drops its workspace (Backend::release_scratch), so the slots are as
// large as the longest prompt only while there is work.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/device_memory.h"

namespace bs::kernels {

class Workspace {
 public:
  explicit Workspace(Backend& backend) : backend_(backend) {}

  // Slot `slot`'s memory, at least `bytes` long: valid until the next call for the
  // same slot with more bytes. Contents are undefined after growth.
  void* bytes(int slot, int64_t bytes);
  template <class T>
  T* get(int slot, int64_t count) {
    return static_cast<T*>(bytes(slot, count * static_cast<int64_t>(sizeof(T))));
  }

 private:
  Backend& backend_;
  std::vector<DeviceBuffer> slots_;
};

}  // namespace bs::kernels
