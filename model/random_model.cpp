#include "model/random_model.h"

#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string_view>

#include "kernels/dequant.h"
#include "kernels/tensor_types.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"

namespace bs {
namespace {

const std::vector<RandomLlamaShape>& known() {
  static const std::vector<RandomLlamaShape> shapes = {
      {"smollm2-135m", 30, 576, 1536, 9, 3, 49152, 100000.0f},
      {"llama-3.2-1b", 16, 2048, 8192, 32, 8, 128256, 500000.0f},
      {"llama-3.1-8b", 32, 4096, 14336, 32, 8, 128256, 500000.0f},
      {"tiny-256", 2, 256, 512, 4, 2, 1024, 10000.0f},  // tests: every width a multiple of 256
  };
  return shapes;
}

// Q4_0 rows [out, in] of random nibbles, each block's scale making the weights'
// standard deviation about 1/sqrt(in) (nibbles uniform in -8..7: sd ~4.6).
std::vector<uint8_t> random_q4_0(int64_t out, int64_t in, std::mt19937& rng) {
  const int64_t blocks = out * (in / 32);
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * 18));
  const uint16_t scale = kernels::fp32_to_fp16(static_cast<float>(1.0 / (4.6 * std::sqrt(in))));
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = bytes.data() + b * 18;
    std::memcpy(blk, &scale, 2);
    for (int i = 0; i < 16; ++i) blk[2 + i] = static_cast<uint8_t>(byte(rng));
  }
  return bytes;
}

// 64 random bits for counter i of stream `seed` (splitmix64): tensors fill in parallel
// and are the same every time.
inline uint64_t mix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// BF16 rows [out, in] of uniform values with standard deviation 1/sqrt(in), from a
// counter hash (mix64) so rows fill in parallel and the file is the same every
// time: 8B parameters take seconds, not minutes of mt19937.
void fill_random_bf16(uint8_t* dst, int64_t out, int64_t in, uint64_t seed) {
  const int64_t count = out * in;
  const float half_width = static_cast<float>(std::sqrt(3.0 / static_cast<double>(in)));  // uniform: sd = w/sqrt(3)
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t z = mix64(seed, static_cast<uint64_t>(i));
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const uint16_t bits = kernels::fp32_to_bf16((2.0f * u - 1.0f) * half_width);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

// K-quant rows [out, in] of random quants under fixed scales, the weights' mean about 0
// and standard deviation about 1/sqrt(in), generated in parallel:
//   Q4_K (144-byte blocks of 256): every sub-block scale and min 8 (6-bit fields
//     packed as ggml packs them), w = d*8*q - dmin*8 with dmin = 7.5 d (q uniform 0..15);
//   Q6_K (210-byte blocks of 256): ql, qh random, the 16 int8 scales 16, w = d*16*(q-32).
void fill_random_kquant(kernels::TensorType type, uint8_t* dst, int64_t out, int64_t in, uint64_t seed) {
  const int64_t blocks = out * (in / 256);
  const double sd = 1.0 / std::sqrt(static_cast<double>(in));
  const bool q4 = type == kernels::TensorType::Q4_K;
  const int64_t block_bytes = q4 ? 144 : 210;
  const uint16_t d = kernels::fp32_to_fp16(static_cast<float>(q4 ? sd / (8 * 4.6) : sd / (16 * 18.5)));
  const uint16_t dmin = kernels::fp32_to_fp16(static_cast<float>(7.5 * sd / (8 * 4.6)));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = dst + b * block_bytes;
    const int64_t random_bytes = q4 ? 128 : 192;  // Q4_K: qs; Q6_K: ql then qh
    uint8_t* q = q4 ? blk + 16 : blk;
    for (int64_t i = 0; i < random_bytes; i += 8) {
      const uint64_t r = mix64(seed, static_cast<uint64_t>(b * 32 + i / 8));
      std::memcpy(q + i, &r, 8);
    }
    if (q4) {
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
      std::memset(blk + 4, 8, 8);        // scales and mins of sub-blocks 0..3 (high bits 0)
      std::memset(blk + 12, 0x88, 4);    // low nibbles of sub-blocks 4..7: scale 8, min 8
    } else {
      std::memset(blk + 192, 16, 16);    // int8 scales
      std::memcpy(blk + 208, &d, 2);
    }
  }
}

}  // namespace

std::vector<std::string> random_llama_shape_names() {
  std::vector<std::string> out;
  for (const auto& s : known()) out.push_back(s.name);
  return out;
}

RandomLlamaShape random_llama_shape(const std::string& name) {
  std::string names;
  for (const auto& s : known()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw std::invalid_argument("unknown random model shape '" + name + "' (known: " + names + ")");
}

// The GGUF of a random model of `s` (BF16 matrices generated as it is written).
GgufWriter random_llama_gguf(const RandomLlamaShape& s, uint32_t seed, kernels::TensorType weights);

void write_random_llama(const RandomLlamaShape& s, const std::string& path, uint32_t seed,
                        kernels::TensorType weights) {
  if (weights != kernels::TensorType::Q4_0 && weights != kernels::TensorType::BF16 &&
      weights != kernels::TensorType::Q4_K)
    throw std::invalid_argument("random model weights must be Q4_0, Q4_K (the Q4_K_M mix) or BF16");
  if (weights == kernels::TensorType::Q4_K && (s.dim % 256 != 0 || s.ff % 256 != 0))
    throw std::invalid_argument("the Q4_K_M mix needs widths that are multiples of 256 (" + s.name + ": " +
                                std::to_string(s.dim) + ", " + std::to_string(s.ff) + ")");
  const GgufWriter w = random_llama_gguf(s, seed, weights);
  w.write(path);
}

std::string materialize_model_path(const std::string& path) {
  if (path.rfind(kRandomModelPrefix, 0) != 0) return path;
  const RandomLlamaShape shape = random_llama_shape(path.substr(std::string_view(kRandomModelPrefix).size()));
  static std::mutex mu;
  static std::map<std::string, std::string> built;  // name -> /proc/self/fd/N
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = built.find(shape.name); it != built.end()) return it->second;
  const int fd = ::memfd_create(("blendserve-random-" + shape.name).c_str(), MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error("random model " + shape.name + ": memfd_create: " + std::strerror(errno));
  // Never closed: the path below names the fd for the rest of the process.
  random_llama_gguf(shape, 1, kernels::TensorType::BF16).write_fd(fd, "random model " + shape.name + " (memfd)");
  const std::string fd_path = "/proc/self/fd/" + std::to_string(fd);
  built.emplace(shape.name, fd_path);
  return fd_path;
}

GgufWriter random_llama_gguf(const RandomLlamaShape& s, uint32_t seed, kernels::TensorType weights) {
  std::mt19937 rng(seed);
  GgufWriter w;
  const std::string a = "llama";
  w.str("general.architecture", a);
  w.str("general.name", "random " + s.name);
  w.u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  w.u32(a + ".context_length", 32768);  // 20 chunks of 512 tokens and more (the GPU blend benchmark)
  w.u32(a + ".embedding_length", static_cast<uint32_t>(s.dim));
  w.u32(a + ".feed_forward_length", static_cast<uint32_t>(s.ff));
  w.u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  w.u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.f32(a + ".rope.freq_base", s.rope_theta);
  // Tokenizer: the 256 byte tokens, numbered filler tokens, then end-of-text.
  std::vector<std::string> tokens = byte_level_alphabet();
  std::vector<int32_t> types(tokens.size(), 1);
  while (static_cast<int>(tokens.size()) < s.vocab - 1) {
    tokens.push_back("<|filler_" + std::to_string(tokens.size()) + "|>");
    types.push_back(4);  // user-defined: never produced by the BPE
  }
  tokens.push_back("<|endoftext|>");
  types.push_back(3);
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "gpt-2");
  w.str_array("tokenizer.ggml.tokens", tokens);
  w.i32_array("tokenizer.ggml.token_type", types);
  w.str_array("tokenizer.ggml.merges", {});
  w.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(s.vocab - 1));
  w.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(s.vocab - 1));
  w.boolean("tokenizer.ggml.add_bos_token", false);

  const auto q4 = static_cast<uint32_t>(kernels::TensorType::Q4_0);
  uint64_t tensor_seed = seed;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    const std::vector<uint64_t> dims{static_cast<uint64_t>(in), static_cast<uint64_t>(out)};
    if (weights == kernels::TensorType::Q4_0) {
      w.tensor(name, dims, q4, random_q4_0(out, in, rng));
      return;
    }
    const uint64_t ts = (tensor_seed += 0x632BE59BD9B4E019ull);
    if (weights == kernels::TensorType::Q4_K) {
      // llama.cpp's Q4_K_M keeps attn_v, ffn_down and the LM head at Q6_K.
      const bool six = name.find("attn_v.") != std::string::npos || name.find("ffn_down.") != std::string::npos ||
                       name == "output.weight";
      const auto t = six ? kernels::TensorType::Q6_K : kernels::TensorType::Q4_K;
      w.generated_tensor(name, dims, static_cast<uint32_t>(t), static_cast<uint64_t>(kernels::type_row_bytes(t, in) * out),
                         [t, out, in, ts](uint8_t* dst) { fill_random_kquant(t, dst, out, in, ts); });
      return;
    }
    w.generated_tensor(name, dims, static_cast<uint32_t>(kernels::TensorType::BF16), static_cast<uint64_t>(out * in) * 2,
                       [out, in, ts](uint8_t* dst) { fill_random_bf16(dst, out, in, ts); });
  };
  auto ones = [&](const std::string& name) {
    w.tensor(name, {static_cast<uint64_t>(s.dim)}, 0, GgufWriter::f32_bytes(std::vector<float>(s.dim, 1.0f)));
  };
  const int hd = s.dim / s.heads;
  matrix("token_embd.weight", s.vocab, s.dim);  // tied: also the LM head (but in the Q4_K_M mix)
  if (weights == kernels::TensorType::Q4_K) matrix("output.weight", s.vocab, s.dim);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ones(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", s.dim, s.dim);
    matrix(p + "attn_k.weight", int64_t{s.kv_heads} * hd, s.dim);
    matrix(p + "attn_v.weight", int64_t{s.kv_heads} * hd, s.dim);
    matrix(p + "attn_output.weight", s.dim, s.dim);
    ones(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", s.ff, s.dim);
    matrix(p + "ffn_up.weight", s.ff, s.dim);
    matrix(p + "ffn_down.weight", s.dim, s.ff);
  }
  ones("output_norm.weight");
  return w;
}

}  // namespace bs
