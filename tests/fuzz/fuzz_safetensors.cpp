// libFuzzer target for the safetensors reader (model/safetensors.h): any input must
// either parse or throw SafetensorsError, never crash, read out of bounds or allocate
// absurdly. When it parses, every tensor's promises are checked and its first row
// (bounded) is converted, which touches its data.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/dequant.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bs::safetensors;
  try {
    const File f = File::parse(data, size, "fuzz input");
    std::vector<float> row;
    for (const Tensor& t : f.tensors()) {
      if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size) std::abort();
      int64_t count = 1;
      for (int64_t d : t.shape) count *= d;
      const size_t esize = bs::kernels::type_traits(t.type).block_bytes;
      if (static_cast<size_t>(count) * esize != t.nbytes) std::abort();
      const int64_t n = count < 4096 ? count : 4096;
      row.resize(static_cast<size_t>(n));
      bs::kernels::dequantize_row(t.type, t.data, row.data(), n);
    }
  } catch (const SafetensorsError&) {
  }
  return 0;
}
