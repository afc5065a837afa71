#include "kernels/tensor_types.h"

#include "kernels/dequant.h"
#include "kernels/kquant_blocks.h"

namespace bs::kernels {
namespace {

constexpr TensorTypeTraits kTable[] = {
    {TensorType::F32, "F32", 1, 4, dequantize_f32},
    {TensorType::F16, "F16", 1, 2, dequantize_f16},
    {TensorType::Q4_0, "Q4_0", 32, 2 + 16, dequantize_q4_0},
    {TensorType::Q4_1, "Q4_1", 32, 2 + 2 + 16, dequantize_q4_1},
    {TensorType::Q5_0, "Q5_0", 32, 2 + 4 + 16, dequantize_q5_0},
    {TensorType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, dequantize_q5_1},
    {TensorType::Q8_0, "Q8_0", 32, 2 + 32, dequantize_q8_0},
    {TensorType::Q4_K, "Q4_K", kQK_K, kBlockBytesQ4_K, dequantize_q4_k},
    {TensorType::Q5_K, "Q5_K", kQK_K, kBlockBytesQ5_K, dequantize_q5_k},
    {TensorType::Q6_K, "Q6_K", kQK_K, kBlockBytesQ6_K, dequantize_q6_k},
    {TensorType::BF16, "BF16", 1, 2, dequantize_bf16},
};

}  // namespace

const TensorTypeTraits* find_tensor_type(uint32_t ggml_type) {
  for (const auto& t : kTable)
    if (static_cast<uint32_t>(t.type) == ggml_type) return &t;
  return nullptr;
}

const TensorTypeTraits& type_traits(TensorType type) { return *find_tensor_type(static_cast<uint32_t>(type)); }

const char* ggml_type_name(uint32_t ggml_type) {
  if (const auto* t = find_tensor_type(ggml_type)) return t->name;
  switch (ggml_type) {
    case 4: return "Q4_2 (removed)";
    case 5: return "Q4_3 (removed)";
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    default: return nullptr;
  }
}

}  // namespace bs::kernels
