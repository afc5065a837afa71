// Test helper: the same K/V rows as a contiguous cache and as a paged one whose pages
// lie in the pool in a shuffled order (kernels/kv_view.h), for the attention tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/kv_view.h"

namespace bs::test {

struct PagedKv {
  // The pool: [pool_pages, kv_heads, 2^page_shift, head_dim] elements of the dtype,
  // unused rows all ones bits (NaN in every dtype).
  std::vector<std::byte> k, v;
  std::vector<int32_t> pages;    // the sequence's page table
  kernels::KvView view;
};

// Rows [0, rows) of k, v ([kv_heads, stride, head_dim], contiguous fp32) rounded to
// `dtype` and copied into pages of 2^page_shift positions, placed at shuffled pool
// pages among `spare` unused ones (left NaN: a kernel reading a wrong page gives NaN).
// The last page may be partial.
inline PagedKv make_paged(const std::vector<float>& k, const std::vector<float>& v, int64_t kv_heads, int64_t stride,
                          int64_t head_dim, int64_t rows, int page_shift, uint32_t seed, int64_t spare = 3,
                          kernels::TensorType dtype = kernels::TensorType::F32) {
  const int64_t P = int64_t{1} << page_shift;
  const int64_t count = (rows + P - 1) / P;
  const int64_t pool_pages = count + spare;
  const int64_t eb = kernels::kv_dtype_bytes(dtype);
  std::vector<int32_t> order(static_cast<size_t>(pool_pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  PagedKv out;
  out.pages.assign(order.begin(), order.begin() + count);
  const int64_t page_elems = kv_heads * P * head_dim;
  out.k.assign(static_cast<size_t>(pool_pages * page_elems * eb), std::byte{0xFF});
  out.v.assign(out.k.size(), std::byte{0xFF});
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t dst = (out.pages[j / P] * page_elems + (h * P + j % P) * head_dim) * eb;
      const int64_t src = (h * stride + j) * head_dim;
      kernels::kv_from_fp32(dtype, &k[src], &out.k[dst], head_dim);
      kernels::kv_from_fp32(dtype, &v[src], &out.v[dst], head_dim);
    }
  auto& w = out.view;
  w.k = out.k.data();
  w.v = out.v.data();
  w.dtype = dtype;
  w.pages = out.pages.data();
  w.page_count = count;
  w.capacity = rows;
  w.page_shift = page_shift;
  w.page_stride = page_elems;
  w.head_stride = P * head_dim;
  w.kv_heads = kv_heads;
  w.head_dim = head_dim;
  return out;
}

// x rounded to `dtype` and widened back: the values a cache of that dtype holds.
inline std::vector<float> as_stored(const std::vector<float>& x, kernels::TensorType dtype) {
  std::vector<std::byte> raw(x.size() * static_cast<size_t>(kernels::kv_dtype_bytes(dtype)));
  kernels::kv_from_fp32(dtype, x.data(), raw.data(), static_cast<int64_t>(x.size()));
  std::vector<float> out(x.size());
  kernels::kv_to_fp32(dtype, raw.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

}  // namespace bs::test
