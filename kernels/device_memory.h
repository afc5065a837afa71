// Memory a backend owns, and the order in which its work runs.
//
// Why: everything the model touches between ops (activations, the KV pool, norm
// weights) must live where the backend computes — host memory for the CPU backends,
// device memory for a GPU backend — so that a device backend can run the same
// Transformer and blend code. The host side holds handles (DeviceBuffer) and moves
// bytes only through the backend's copies.
//
// Streams and events follow CUDA's model: work issued on one stream runs in order;
// an event recorded on a stream completes when the work issued before it has; another
// stream (or the host) can wait for it. The CPU backends run every op and copy when it
// is called, so there a stream is only a label and an event is complete when
// recorded: the code that uses them is the same on every backend.
#pragma once

#include <cstdint>
#include <utility>

namespace bs::kernels {

class Backend;

// Bytes of one backend's memory, freed through it when the handle goes. Move-only.
// Contents start undefined (a KV pool of GBs is never zero-filled; see KvPagePool).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, int64_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset();  // backend.cpp: frees through the owner
  void* data() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }
  Backend* owner() const { return owner_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// An in-order queue of a backend's work (a CUDA stream). Made by Backend::make_stream.
struct Stream {
  virtual ~Stream() = default;
};

// A point in a stream's work (a CUDA event). Made by Backend::make_event.
struct Event {
  virtual ~Event() = default;
};

}  // namespace bs::kernels
