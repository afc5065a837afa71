#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/dequant.h"

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace bs::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

// GGUF metadata value types.
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

const char* value_type_name(uint32_t t) {
  switch (t) {
    case kU8: return "uint8";
    case kI8: return "int8";
    case kU16: return "uint16";
    case kI16: return "int16";
    case kU32: return "uint32";
    case kI32: return "int32";
    case kF32: return "float32";
    case kBool: return "bool";
    case kString: return "string";
    case kArray: return "array";
    case kU64: return "uint64";
    case kI64: return "int64";
    case kF64: return "float64";
    default: return "unknown";
  }
}

// Smallest encoded size of one value of a (non-array) type; 0 for unknown types.
uint64_t min_value_size(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    case kString: return 8;  // the length prefix
    case kArray: return 4 + 8;
    default: return 0;
  }
}

[[noreturn]] void fail(const std::string& msg) { throw GgufError("gguf: " + msg); }

std::string quoted(std::string_view s) {
  // Keep messages printable and bounded even for hostile names.
  std::string out = "'";
  const size_t limit = 120;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > limit) out += "...";
  out += "'";
  return out;
}

// Bounds-checked little-endian reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  // `what` names the value in the error, after `prefix` ("length of "): joined only when
  // the read fails, since a parse reads ~100k strings (the vocabulary and the merges).
  template <typename T>
  T read(const std::string& what, std::string_view prefix = {}) {
    if (remaining() < sizeof(T)) {
      fail("truncated file: " + std::string(prefix) + what + " at offset " + std::to_string(pos_) + " needs " +
           std::to_string(sizeof(T)) + " bytes, " + std::to_string(remaining()) + " left");
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const std::string& what) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(what, "length of ");
    if (len > remaining()) {
      fail("string length " + std::to_string(len) + " of " + what + " at offset " +
           std::to_string(at) + " exceeds the " + std::to_string(remaining()) +
           " bytes left in the file");
    }
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Up-front reservations are bounded by what the remaining bytes can hold (checked before
// every reserve) and additionally capped, so a hostile count never allocates much before
// the elements have actually been read.
size_t capped(uint64_t n) { return static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 16)); }

// ceil(x / a) * a for a power-of-two a; false on overflow.
bool align_up(uint64_t x, uint64_t a, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(x, a - 1, &sum)) return false;
  *out = sum & ~(a - 1);
  return true;
}

// "F32, F16, ...": the types find_tensor_type knows, in ggml order (for messages).
std::string supported_type_names() {
  std::string out;
  for (uint32_t t = 0; t < 64; ++t) {
    if (const kernels::TensorTypeTraits* tr = kernels::find_tensor_type(t)) {
      if (!out.empty()) out += ", ";
      out += tr->name;
    }
  }
  return out;
}

}  // namespace

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) return 0;  // never for a parsed tensor
  }
  return n;
}

// ---- mapping --------------------------------------------------------------------------

struct GgufFile::Mapping {
  void* addr = nullptr;
  size_t len = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, len);
  }
};

// ---- parser ---------------------------------------------------------------------------

struct Parser {
  GgufFile& f;
  Cursor cur;
  const uint8_t* base;
  size_t size;

  Parser(GgufFile& file, const uint8_t* data, size_t n) : f(file), cur(data, n), base(data), size(n) {}

  static int64_t to_i64(uint64_t v, const std::string& what) {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("value " + std::to_string(v) + " of " + what + " does not fit in int64");
    }
    return static_cast<int64_t>(v);
  }

  bool read_bool(const std::string& what) {
    const uint8_t b = cur.read<uint8_t>(what);
    if (b > 1) fail("invalid bool value " + std::to_string(b) + " in " + what);
    return b != 0;
  }

  // Reads one integer of type t (already known to be an integer type) widened to int64/uint64.
  // Returns true and sets *u when it is a uint64 above INT64_MAX.
  int64_t read_int(uint32_t t, const std::string& what, bool* big, uint64_t* u) {
    *big = false;
    switch (t) {
      case kU8: return cur.read<uint8_t>(what);
      case kI8: return cur.read<int8_t>(what);
      case kU16: return cur.read<uint16_t>(what);
      case kI16: return cur.read<int16_t>(what);
      case kU32: return cur.read<uint32_t>(what);
      case kI32: return cur.read<int32_t>(what);
      case kI64: return cur.read<int64_t>(what);
      case kU64: {
        const uint64_t v = cur.read<uint64_t>(what);
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          *big = true;
          *u = v;
          return 0;
        }
        return static_cast<int64_t>(v);
      }
      default: fail("internal: not an integer type");
    }
  }

  static bool is_int_type(uint32_t t) {
    return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kU64 ||
           t == kI64;
  }

  MetaValue read_array(const std::string& what) {
    const uint32_t et = cur.read<uint32_t>("element type of " + what);
    const uint64_t count = cur.read<uint64_t>("element count of " + what);
    if (et == kArray) fail(what + ": arrays of arrays are not supported");
    const uint64_t min_size = min_value_size(et);
    if (min_size == 0) fail(what + ": unknown array element type " + std::to_string(et));
    if (count > cur.remaining() / min_size) {
      fail(what + ": array of " + std::to_string(count) + " " + value_type_name(et) +
           " elements cannot fit in the " + std::to_string(cur.remaining()) + " bytes left in the file");
    }
    const size_t n = static_cast<size_t>(count);  // bounded by the file size now
    const std::string ew = "element of " + what;
    if (is_int_type(et)) {
      std::vector<int64_t> v;
      v.reserve(capped(n));
      for (size_t i = 0; i < n; ++i) {
        bool big = false;
        uint64_t u = 0;
        const int64_t x = read_int(et, ew, &big, &u);
        if (big) fail(what + ": uint64 element " + std::to_string(u) + " does not fit in int64");
        v.push_back(x);
      }
      return v;
    }
    switch (et) {
      case kF32: {
        std::vector<double> v;
        v.reserve(capped(n));
        for (size_t i = 0; i < n; ++i) v.push_back(cur.read<float>(ew));
        return v;
      }
      case kF64: {
        std::vector<double> v;
        v.reserve(capped(n));
        for (size_t i = 0; i < n; ++i) v.push_back(cur.read<double>(ew));
        return v;
      }
      case kBool: {
        std::vector<bool> v;
        v.reserve(capped(n));
        for (size_t i = 0; i < n; ++i) v.push_back(read_bool(ew));
        return v;
      }
      case kString: {
        std::vector<std::string> v;
        v.reserve(capped(n));
        for (size_t i = 0; i < n; ++i) v.emplace_back(cur.read_string(ew));
        return v;
      }
      default: fail(what + ": unknown array element type " + std::to_string(et));
    }
  }

  MetaValue read_value(uint32_t t, const std::string& what) {
    if (is_int_type(t)) {
      bool big = false;
      uint64_t u = 0;
      const int64_t x = read_int(t, what, &big, &u);
      if (big) return u;
      return x;
    }
    switch (t) {
      case kF32: return static_cast<double>(cur.read<float>(what));
      case kF64: return cur.read<double>(what);
      case kBool: return read_bool(what);
      case kString: return std::string(cur.read_string(what));
      case kArray: return read_array(what);
      default: fail(what + " has unknown value type " + std::to_string(t));
    }
  }

  void run() {
    if (size < 4) fail("truncated file: " + std::to_string(size) + " bytes is too small for a GGUF header");
    const uint32_t magic = cur.read<uint32_t>("magic");
    if (magic != kMagic) fail("bad magic (not a GGUF file)");
    const uint32_t version = cur.read<uint32_t>("version");
    if (version != 2 && version != 3) {
      if (version == 1) fail("unsupported version 1 (only GGUF v2 and v3 are supported)");
      if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3) {
        fail("unsupported big-endian GGUF file");
      }
      fail("unsupported version " + std::to_string(version));
    }
    f.version_ = version;
    const uint64_t n_tensors = cur.read<uint64_t>("tensor count");
    const uint64_t n_kv = cur.read<uint64_t>("metadata key/value count");

    // Every key/value pair needs at least a key length, a type and one byte of value;
    // every tensor info at least a name length, n_dims, one dim, a type and an offset.
    constexpr uint64_t kMinKv = 8 + 4 + 1;
    constexpr uint64_t kMinTensor = 8 + 4 + 8 + 4 + 8;
    if (n_kv > cur.remaining() / kMinKv) {
      fail("metadata key/value count " + std::to_string(n_kv) + " is too large for the " +
           std::to_string(cur.remaining()) + " bytes left in the file");
    }
    if (n_tensors > cur.remaining() / kMinTensor) {
      fail("tensor count " + std::to_string(n_tensors) + " is too large for the " +
           std::to_string(cur.remaining()) + " bytes left in the file");
    }
    // Both bounded by remaining() above, so this cannot overflow.
    if (n_kv * kMinKv + n_tensors * kMinTensor > cur.remaining()) {
      fail("metadata key/value count " + std::to_string(n_kv) + " and tensor count " +
           std::to_string(n_tensors) + " are too large for the " + std::to_string(cur.remaining()) +
           " bytes left in the file");
    }

    // ---- metadata ----
    f.meta_.reserve(capped(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string idx = "metadata key #" + std::to_string(i);
      std::string key(cur.read_string(idx));
      const std::string what = "key " + quoted(key);
      if (f.meta_.count(key) != 0) fail("duplicate key " + quoted(key));
      const uint32_t t = cur.read<uint32_t>("value type of " + what);
      MetaValue v = read_value(t, what);
      f.meta_.emplace(std::move(key), std::move(v));
    }

    uint64_t alignment = kDefaultAlignment;
    if (auto it = f.meta_.find("general.alignment"); it != f.meta_.end()) {
      if (std::holds_alternative<uint64_t>(it->second)) fail("general.alignment is too large");
      const auto* a = std::get_if<int64_t>(&it->second);
      if (a == nullptr) fail("key 'general.alignment' must be an integer");
      if (*a <= 0 || (*a & (*a - 1)) != 0) {
        fail("general.alignment " + std::to_string(*a) + " is not a power of two");
      }
      if (*a > (int64_t{1} << 30)) fail("general.alignment " + std::to_string(*a) + " is too large");
      alignment = static_cast<uint64_t>(*a);
    }

    // ---- tensor table ----
    f.tensors_.reserve(capped(n_tensors));
    f.tensor_index_.reserve(capped(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      TensorInfo ti;
      ti.name = std::string(cur.read_string("name of tensor #" + std::to_string(i)));
      const std::string what = "tensor " + quoted(ti.name);
      if (f.tensor_index_.count(ti.name) != 0) fail("duplicate tensor name " + quoted(ti.name));
      const uint32_t n_dims = cur.read<uint32_t>("n_dims of " + what);
      if (n_dims == 0 || n_dims > kMaxDims) {
        fail(what + " has invalid n_dims " + std::to_string(n_dims) + " (must be 1.." +
             std::to_string(kMaxDims) + ")");
      }
      int64_t n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t raw = cur.read<uint64_t>("dims of " + what);
        if (raw == 0 || raw > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          fail(what + " has invalid dimension " + std::to_string(static_cast<int64_t>(raw)) +
               " (dims[" + std::to_string(d) + "])");
        }
        const auto dim = static_cast<int64_t>(raw);
        if (__builtin_mul_overflow(n_elements, dim, &n_elements)) {
          fail(what + " has an element count that overflows int64");
        }
        ti.dims.push_back(dim);
      }
      const uint32_t type = cur.read<uint32_t>("type of " + what);
      const kernels::TensorTypeTraits* traits = kernels::find_tensor_type(type);
      if (!traits) {
        const char* nm = kernels::ggml_type_name(type);
        fail(what + " has unsupported tensor type " + std::to_string(type) +
             (nm ? std::string(" (") + nm + ")" : std::string(" (unknown)")) +
             "; supported types: " + supported_type_names());
      }
      ti.type = traits->type;
      const int64_t be = traits->block_elements;
      const int64_t bb = traits->block_bytes;
      if (ti.dims[0] % be != 0) {
        fail(what + " has row size " + std::to_string(ti.dims[0]) + " that is not a multiple of the " +
             traits->name + " block size " + std::to_string(be));
      }
      ti.offset = cur.read<uint64_t>("data offset of " + what);
      // n_elements is a multiple of be because dims[0] is.
      uint64_t nbytes;
      if (__builtin_mul_overflow(static_cast<uint64_t>(n_elements / be), static_cast<uint64_t>(bb), &nbytes)) {
        fail(what + " has a byte size that overflows uint64");
      }
      if (nbytes > size) {
        fail(what + " extends past end of file (" + std::to_string(nbytes) + " bytes of data in a " +
             std::to_string(size) + "-byte file)");
      }
      ti.nbytes = static_cast<size_t>(nbytes);
      if (ti.offset % alignment != 0) {
        fail(what + " has data offset " + std::to_string(ti.offset) + " that is not aligned to " +
             std::to_string(alignment));
      }
      ti.data = nullptr;
      f.tensor_index_.emplace(ti.name, f.tensors_.size());
      f.tensors_.push_back(std::move(ti));
    }

    // ---- data section ----
    uint64_t data_start = 0;
    if (!align_up(cur.pos(), alignment, &data_start)) fail("data section offset overflows");
    if (f.tensors_.empty()) return;
    if (data_start > size) {
      fail("truncated file: data section starts at offset " + std::to_string(data_start) +
           " past the end of the " + std::to_string(size) + "-byte file");
    }
    const uint64_t data_size = size - data_start;
    for (auto& ti : f.tensors_) {
      uint64_t end;
      if (__builtin_add_overflow(ti.offset, static_cast<uint64_t>(ti.nbytes), &end) || end > data_size) {
        fail("tensor " + quoted(ti.name) + " extends past end of file (data offset " +
             std::to_string(ti.offset) + ", " + std::to_string(ti.nbytes) + " bytes, data section is " +
             std::to_string(data_size) + " bytes)");
      }
      ti.data = base + data_start + ti.offset;
    }
    // Overlap check: sort by offset, each range must start at or after the previous end.
    std::vector<size_t> order(f.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return f.tensors_[a].offset < f.tensors_[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = f.tensors_[order[k - 1]];
      const TensorInfo& t = f.tensors_[order[k]];
      if (t.offset < prev.offset + prev.nbytes) {
        fail("tensor " + quoted(t.name) + " overlaps tensor " + quoted(prev.name));
      }
    }
  }
};

// ---- GgufFile -------------------------------------------------------------------------

GgufFile GgufFile::parse(const uint8_t* data, size_t size) {
  if (data == nullptr && size != 0) fail("null buffer");
  GgufFile f;
  Parser p(f, data, size);
  p.run();
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path + " is not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 4 + 4 + 8 + 8) {
    ::close(fd);
    fail("truncated file: " + path + " is only " + std::to_string(size) + " bytes");
  }
  auto m = std::make_shared<Mapping>();
  m->addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m->addr == MAP_FAILED) {
    m->addr = nullptr;
    fail("cannot mmap " + path + ": " + std::strerror(e));
  }
  m->len = size;
  try {
    GgufFile f = parse(static_cast<const uint8_t*>(m->addr), size);
    f.mapping_ = std::move(m);
    return f;
  } catch (const GgufError& err) {
    throw GgufError(std::string(err.what()) + " [" + path + "]");
  }
}

GgufFile GgufFile::assemble(std::unordered_map<std::string, MetaValue> meta, std::vector<TensorInfo> tensors,
                            std::vector<std::shared_ptr<const void>> keep) {
  GgufFile f;
  f.version_ = 3;
  f.meta_ = std::move(meta);
  f.tensors_ = std::move(tensors);
  f.keep_ = std::move(keep);
  for (size_t i = 0; i < f.tensors_.size(); ++i)
    if (!f.tensor_index_.emplace(f.tensors_[i].name, i).second)
      fail("duplicate tensor name " + quoted(f.tensors_[i].name));
  return f;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) throw GgufError("missing tensor " + std::string(name));
  return *t;
}

bool GgufFile::has(std::string_view key) const { return meta_.count(std::string(key)) != 0; }

namespace {

[[noreturn]] void wrong_type(std::string_view key, const char* want) {
  fail("key " + quoted(key) + " is not " + want);
}

}  // namespace

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return std::nullopt;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  if (const auto* u = std::get_if<uint64_t>(&it->second)) {
    fail("key " + quoted(key) + " value " + std::to_string(*u) + " does not fit in int64");
  }
  wrong_type(key, "an integer");
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return std::nullopt;
  if (const auto* v = std::get_if<double>(&it->second)) return *v;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return static_cast<double>(*v);
  if (const auto* v = std::get_if<uint64_t>(&it->second)) return static_cast<double>(*v);
  wrong_type(key, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return std::nullopt;
  if (const auto* v = std::get_if<bool>(&it->second)) return *v;
  wrong_type(key, "a bool");
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return std::nullopt;
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  wrong_type(key, "a string");
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return nullptr;
  if (const auto* v = std::get_if<std::vector<std::string>>(&it->second)) return v;
  wrong_type(key, "an array of strings");
}

const std::vector<int64_t>* GgufFile::get_int_array(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return nullptr;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return v;
  wrong_type(key, "an array of integers");
}

const std::vector<double>* GgufFile::get_float_array(std::string_view key) const {
  auto it = meta_.find(std::string(key));
  if (it == meta_.end()) return nullptr;
  if (const auto* v = std::get_if<std::vector<double>>(&it->second)) return v;
  wrong_type(key, "an array of floats");
}

}  // namespace bs::gguf
