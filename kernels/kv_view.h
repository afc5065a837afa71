// Where the K and V rows of one layer of one sequence live, for the attention ops.
//
// The KV cache is paged (vLLM's block tables): a pool holds pages of 2^page_shift
// consecutive positions, and a sequence's page table maps its page index
// (position >> page_shift) to a page of the pool, anywhere in it, in any order.
// Within a page the rows of each KV head are consecutive ([kv_heads, positions,
// head_dim]), so a kernel walks a page's rows of one head as a plain array.
//
// A contiguous cache ([kv_heads, capacity, head_dim], rows of a head consecutive) is
// the one-page case: KvView::contiguous. Page sizes are powers of two so that a row
// address is a shift, a mask and one table load, cheap enough per key in the decode
// kernels.
//
// Elements are `dtype`: F32, or F16 / BF16 (half the bytes per token; the kernels
// widen each element to fp32 as they load it and accumulate in fp32). Offsets and
// strides count elements, not bytes.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/tensor_types.h"

namespace bs::kernels {

// Whether K/V may be stored as `type` (F32, F16, BF16).
inline bool is_kv_dtype(TensorType type) {
  return type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16;
}
// Bytes of one stored K/V element.
inline int64_t kv_dtype_bytes(TensorType type) { return type == TensorType::F32 ? 4 : 2; }
// "f32", "f16", "bf16" (the config's and the tools' names); "?" for other types.
const char* kv_dtype_name(TensorType type);
// The KV dtype of such a name; false when it is not one.
bool kv_dtype_from_name(std::string_view name, TensorType& type);

struct KvView {
  // Writable: the attention ops only read, store_kv and rope_kv_rows write. Backend
  // memory (the pool's); `pages` is host memory, a value the call carries (a device
  // backend copies it with the call, as vLLM's block tables).
  void* k = nullptr;               // the pool's K of this layer (page 0, head 0, row 0)
  void* v = nullptr;               // the pool's V of this layer, same layout
  TensorType dtype = TensorType::F32;  // of every element of k and v (is_kv_dtype)
  const int32_t* pages = nullptr;  // [page_count]: the pool page of each page of the sequence
  int64_t page_count = 0;
  int64_t capacity = 0;            // rows [0, capacity) of every head have an address
  int page_shift = 0;              // page = 2^page_shift positions
  int64_t page_stride = 0;         // elements from one pool page to the next
  int64_t head_stride = 0;         // elements from one KV head's rows to the next within a page
  int64_t kv_heads = 0, head_dim = 0;
  // Sliding-window attention (Gemma 3's local layers): a query at position p sees the
  // keys at positions j with j <= p and p - j < window, the last `window` positions
  // including its own (llama.cpp's LLAMA_SWA_TYPE_STANDARD, transformers'
  // sliding_window). 0: no window, every j <= p. Read by the attention ops only
  // (attention, attention_rows, attention_mass); the cache's rows are all kept. A
  // layer's view gets it from the model (Transformer::attention_view).
  int64_t window = 0;

  // The first key position a query at `pos` sees (0 without a window).
  int64_t first_visible(int64_t pos) const { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0; }

  int64_t page_positions() const { return int64_t{1} << page_shift; }
  bool single_page() const { return page_count == 1; }

  // Offset in elements of the row of KV head h at position j (0 <= j < capacity).
  int64_t row_offset(int64_t h, int64_t j) const {
    return pages[j >> page_shift] * page_stride + h * head_stride + (j & (page_positions() - 1)) * head_dim;
  }
  // The row [head_dim] of K / V of KV head h at position j, widened to fp32.
  void read_k_row(int64_t h, int64_t j, float* out) const { widen(k, h, j, out); }
  void read_v_row(int64_t h, int64_t j, float* out) const { widen(v, h, j, out); }

  // A contiguous [kv_heads, capacity, head_dim] cache as one page of at least
  // `capacity` positions (the page table is a static {0}). Const arrays may be viewed
  // for the attention ops, which only read; the ops that write need writable ones.
  static KvView contiguous(const void* k, const void* v, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                           TensorType dtype = TensorType::F32) {
    static const int32_t kPageZero = 0;
    KvView view;
    view.k = const_cast<void*>(k);
    view.v = const_cast<void*>(v);
    view.dtype = dtype;
    view.pages = &kPageZero;
    view.page_count = 1;
    view.capacity = capacity;
    while ((int64_t{1} << view.page_shift) < capacity) ++view.page_shift;
    view.page_stride = 0;
    view.head_stride = capacity * head_dim;
    view.kv_heads = kv_heads;
    view.head_dim = head_dim;
    return view;
  }

 private:
  void widen(const void* base, int64_t h, int64_t j, float* out) const;  // kv_view.cpp
};

}  // namespace bs::kernels
