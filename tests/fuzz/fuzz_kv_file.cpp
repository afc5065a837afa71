// libFuzzer target for the SSD tier's file reader (storage/disk_store.h): the input
// is the content of one `<key>.bskv` file (named after the key its header claims, so
// the reader goes past the name check), put in a fresh directory the store then opens
// (the start-up scan), looks up (get) and reads layer by layer (open_layers). Any file
// must be either served with the shape its header claims and every byte its checksums
// vouch for, or be a miss that removes it and counts it corrupt — never a crash, an
// out-of-bounds read, an absurd allocation or a throw. A seed run
// (BLENDSERVE_FUZZ_SEED_DIR set) writes valid entries there first, so the fuzzer
// starts from files that pass every check.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "storage/disk_store.h"

namespace fs = std::filesystem;

namespace {

fs::path work_dir;

std::shared_ptr<bs::ChunkKv> entry(int layers, int heads, int dim, int tokens, bs::kernels::TensorType dtype) {
  auto kv = std::make_shared<bs::ChunkKv>();
  kv->n_layers = layers;
  kv->kv_heads = heads;
  kv->head_dim = dim;
  kv->dtype = dtype;
  for (int t = 0; t < tokens; ++t) kv->tokens.push_back(1000 + t);
  kv->allocate();
  for (size_t i = 0; i < kv->k.size(); ++i) kv->k[i] = static_cast<std::byte>(i * 7);
  for (size_t i = 0; i < kv->v.size(); ++i) kv->v[i] = static_cast<std::byte>(i * 13 + 1);
  return kv;
}

void write_seeds(const fs::path& out) {
  const fs::path dir = work_dir / "seeds";
  fs::create_directories(dir);
  bs::DiskKvStore store(dir.string(), int64_t{1} << 30);
  struct Seed {
    int layers, heads, dim, tokens;
    bs::kernels::TensorType dtype;
  };
  const Seed seeds[] = {{2, 1, 4, 3, bs::kernels::TensorType::F32},
                        {3, 2, 8, 5, bs::kernels::TensorType::F16},
                        {1, 1, 2, 1, bs::kernels::TensorType::BF16}};
  uint64_t n = 1;
  for (const Seed& s : seeds) {
    const bs::ChunkKey key{0x1234 + n, 0xabcd + n};
    ++n;
    if (!store.put(key, entry(s.layers, s.heads, s.dim, s.tokens, s.dtype))) std::abort();
    fs::copy_file(store.path_of(key), out / ("seed_" + key.hex() + ".bskv"), fs::copy_options::overwrite_existing);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  work_dir = fs::temp_directory_path() / ("bs_fuzz_kv_file_" + std::to_string(::getpid()));
  fs::remove_all(work_dir);
  fs::create_directories(work_dir);
  if (const char* seeds = std::getenv("BLENDSERVE_FUZZ_SEED_DIR")) write_seeds(seeds);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(work_dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;
  const fs::path dir = work_dir / "store";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The key the header claims (bytes 8..23), so the file's name matches it.
  bs::ChunkKey key{0x1111, 0x2222};
  if (size >= 24) {
    std::memcpy(&key.hi, data + 8, 8);
    std::memcpy(&key.lo, data + 16, 8);
  }
  {
    std::ofstream f(dir / (key.hex() + ".bskv"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  bs::DiskKvStore store(dir.string(), int64_t{1} << 30);
  const bool indexed = store.contains(key);
  const auto kv = store.get(key);
  if (kv) {
    if (!indexed || !kv->consistent() || kv->n_layers < 1 || kv->length() < 1) std::abort();
    if (kv->k.size() + kv->v.size() > size) std::abort();  // served bytes came from the file
  }
  // The per-layer reader over a fresh store (get() may have removed a bad file).
  bs::DiskKvStore again(dir.string(), int64_t{1} << 30);
  if (auto reader = again.open_layers(key)) {
    if (!kv) std::abort();  // get() refused what the layer reader accepts
    if (reader->n_layers() != kv->n_layers || reader->layer_bytes() != kv->layer_bytes() || reader->tokens() != kv->tokens)
      std::abort();
    std::vector<std::byte> k(static_cast<size_t>(kv->layer_bytes())), v(k.size());
    for (int l = 0; l < kv->n_layers; ++l) {
      if (!reader->read_layer(l, k.data(), v.data())) break;
      if (std::memcmp(k.data(), kv->k_layer(l), k.size()) != 0 || std::memcmp(v.data(), kv->v_layer(l), v.size()) != 0)
        std::abort();
    }
  }
  return 0;
}
