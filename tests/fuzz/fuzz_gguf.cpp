// libFuzzer target for the GGUF reader: any input must either parse or throw GgufError,
// never crash, read out of bounds or allocate absurdly. When it parses, the first row of
// every tensor (bounded) is dequantized, which touches the tensor's data pointer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/dequant.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bs::gguf;
  try {
    const GgufFile f = GgufFile::parse(data, size);
    std::vector<float> row;
    std::vector<uint16_t> row16;
    constexpr int64_t kMaxRow = 1 << 16;
    for (const TensorInfo& t : f.tensors()) {
      // Everything the parser promised must hold.
      if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size) std::abort();
      const int64_t n = t.row_elements();
      const int64_t be = bs::kernels::type_traits(t.type).block_elements;
      if (n <= 0 || n % be != 0 || t.n_elements() <= 0 || t.n_elements() % n != 0) std::abort();
      const int64_t row_bytes = bs::kernels::type_row_bytes(t.type, n);
      if (row_bytes <= 0 || static_cast<uint64_t>(row_bytes) > t.nbytes) std::abort();
      if (f.find_tensor(t.name) != &t) std::abort();
      const int64_t m = n < kMaxRow ? n : kMaxRow - kMaxRow % be;
      row.resize(static_cast<size_t>(m));
      row16.resize(static_cast<size_t>(m));
      bs::kernels::dequantize_row(t.type, t.data, row.data(), m);
      bs::kernels::dequantize_row_to_bf16(t.type, t.data, row16.data(), m);
    }
    // Exercise the typed getters on every key; wrong types must throw GgufError only.
    for (const auto& [key, value] : f.metadata()) {
      (void)value;
      try { (void)f.get_int(key); } catch (const GgufError&) {}
      try { (void)f.get_float(key); } catch (const GgufError&) {}
      try { (void)f.get_string(key); } catch (const GgufError&) {}
      try { (void)f.get_string_array(key); } catch (const GgufError&) {}
    }
  } catch (const GgufError&) {
    // expected for malformed input
  }
  return 0;
}
