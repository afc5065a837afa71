#include "kernels/kv_view.h"

#include <cstring>

#include "kernels/dequant.h"

namespace bs::kernels {

const char* kv_dtype_name(TensorType type) {
  switch (type) {
    case TensorType::F32: return "f32";
    case TensorType::F16: return "f16";
    case TensorType::BF16: return "bf16";
    default: return "?";
  }
}

bool kv_dtype_from_name(std::string_view name, TensorType& type) {
  for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
    if (name == kv_dtype_name(t)) {
      type = t;
      return true;
    }
  return false;
}

void KvView::widen(const void* base, int64_t h, int64_t j, float* out) const {
  const int64_t at = row_offset(h, j);
  switch (dtype) {
    case TensorType::F16: {
      const uint16_t* row = static_cast<const uint16_t*>(base) + at;
      for (int64_t d = 0; d < head_dim; ++d) out[d] = fp16_to_fp32(row[d]);
      return;
    }
    case TensorType::BF16: {
      const uint16_t* row = static_cast<const uint16_t*>(base) + at;
      for (int64_t d = 0; d < head_dim; ++d) out[d] = bf16_to_fp32(row[d]);
      return;
    }
    default:
      std::memcpy(out, static_cast<const float*>(base) + at, sizeof(float) * head_dim);
  }
}

}  // namespace bs::kernels
