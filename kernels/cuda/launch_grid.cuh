// The 1-D launch shape of the element-wise helper kernels (conversions, gathers, bias
// adds): `threads` per block and enough blocks for `count` elements, at most 65535 of
// them; the kernels walk the rest grid-stride.
#pragma once

#include <cstdint>

namespace bs::kernels::cuda {

inline unsigned grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace bs::kernels::cuda
