// The compute backend interface. Every op the model needs is one virtual here;
// the scalar reference (kernels/ref), the CPU backend (kernels/cpu: per-ISA kernel
// variants chosen at start-up, oneDNN GEMMs) and the CUDA backend (kernels/cuda/
// cuda_backend.h, built where nvcc is found) fill it, and tests run every op on every
// backend against the reference.
//
// Memory belongs to the backend (kernels/device_memory.h): every pointer an op takes
// is the backend's memory (alloc(), a workspace slot, a KV pool made on it) unless the
// parameter says "host". The model, the transformer and the blend engine hold
// DeviceBuffers and move bytes only through copy_to_backend / copy_to_host, so a device
// backend runs the same code. The CPU backends' memory is host memory
// (host_accessible()), so tests may pass host arrays to their ops directly.
//
// The KV cache is paged: the attention and KV ops read and write it through a KvView
// (kernels/kv_view.h). Shapes are given next to each parameter, row-major, innermost
// last.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include "kernels/device_memory.h"
#include "kernels/kv_view.h"
#include "kernels/sampling.h"
#include "kernels/tensor_types.h"
#include "kernels/workspace.h"

namespace bs::kernels {


// Arithmetic used by the large GEMMs (prefill). Decode-size products always read
// the stored (quantized) weights directly with fp32 accumulation.
enum class Precision { F32, BF16 };

// A weight matrix W: [out_features, in_features], each row stored contiguously in
// `type` (kernels/tensor_types.h; quantized blocks along in_features), as it comes from
// the model file. `data` must outlive the prepared weights.
struct WeightView {
  TensorType type = TensorType::F32;
  const void* data = nullptr;
  int64_t out_features = 0;
  int64_t in_features = 0;
};

// Backend-owned, prepared form of a weight matrix (packed copies, device buffers...).
struct PreparedWeights {
  virtual ~PreparedWeights() = default;
  WeightView view;
};

enum class RopeStyle {
  Interleaved,  // rotate pairs (x[2i], x[2i+1]); ggml "NORM" (Llama GGUFs, Q/K permuted at conversion)
  HalfSplit,    // rotate pairs (x[i], x[i+d/2]); ggml "NEOX" (Qwen2)
};

// Per-dimension-pair inverse frequencies, scaling already applied (linear,
// Llama-3 style frequency factors): angle(pos, i) = pos * inv_freq[i].
struct RopeTable {
  RopeStyle style = RopeStyle::Interleaved;
  int head_dim = 0;               // rotary dimensions == head_dim here
  std::vector<float> inv_freq;    // [head_dim / 2]
};

// Backend-owned form of a RoPE table (a device copy, cached cos/sin...). `table` is
// the host description it was made from.
struct PreparedRope {
  virtual ~PreparedRope() = default;
  RopeTable table;
};

// What the blend's per-token deviation compares: fresh K, fresh V, or both.
enum class KvDeviation { K, V, KV };

const char* precision_name(Precision p);  // "f32", "bf16"
class Backend;
// "auto" (the backend's fastest), "bf16" or "f32"; throws std::invalid_argument for other
// names and for a precision the backend does not support, naming the alternatives.
Precision choose_precision(std::string_view name, const Backend& backend);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Which code computes, e.g. "cpu/avx2" or "reference": printed by `--stats`, in every
  // benchmark's JSON, and part of the chunk-KV cache key (KV computed by one kernel
  // variant is never served as another's).
  virtual std::string kernel_id() const { return name(); }
  // Whether prepare/linear/attention run at `precision` here (CPU: bf16 only with
  // native bf16 dot products and a oneDNN bf16 matmul).
  virtual bool supports(Precision precision) const = 0;
  // Seconds spent so far on one-time set-up during ops (e.g. creating a GEMM
  // primitive for a new row count): benchmarks subtract it from timings that
  // should measure steady-state compute.
  virtual double setup_seconds() const { return 0.0; }
  // The fastest precision this backend supports.
  Precision default_precision() const { return supports(Precision::BF16) ? Precision::BF16 : Precision::F32; }
  // Whether the attention ops honour KvView::window (sliding-window layers): the
  // reference and CPU backends do; a backend that does not makes the model loader
  // refuse an architecture that needs it, by name.
  virtual bool sliding_window_attention() const { return true; }
  // Up to this many rows, linear() computes every row bit-identically to a call with
  // that row alone (the same kernel and summation order whatever the row count), so
  // a batched decode step equals one-token forwards (Transformer::decode_step splits
  // larger batches). 1 is always true.
  virtual int64_t linear_exact_rows() const { return 1; }
  // Whether every row of linear() and attention() is bit-identical to that row
  // computed alone, for any row count and whatever rows are beside it
  // (model.batch_invariant). Then a prompt's KV and logits do not depend on how it was
  // split into prefills, so a prefix-cache hit (the stored rows, then the rest computed)
  // answers exactly what one cold prefill of the whole prompt does. Without it the CPU's
  // prefill-size products (oneDNN) and attention tiles round differently from its
  // decode-size ones, which can flip a greedy token in a near-tie. When true,
  // kernel_id() says so (stored KV of the other mode is never served as this one's).
  virtual bool batch_invariant() const { return false; }

  // ---- Memory and ordering (kernels/device_memory.h) ----

  // Whether this backend's memory is host memory that the host may read and write in
  // place (the CPU backends). A device backend returns false.
  virtual bool host_accessible() const { return true; }
  // Bytes of this backend's memory free now, for sizing a KV pool; -1 when it is the
  // host's memory (size it from the machine's).
  virtual int64_t free_memory_bytes() const { return -1; }
  // The hardware computing, for --stats, /metrics and benchmarks' JSON: the GPU's name
  // and size for a device backend; empty for the CPU backends (kernel_id says enough).
  virtual std::string device_name() const { return {}; }
  // `bytes` of this backend's memory, contents undefined, aligned to 64 bytes.
  // Throws std::bad_alloc when it cannot be had.
  DeviceBuffer alloc(int64_t bytes);
  // alloc() and copy_to_backend of `bytes` host bytes.
  DeviceBuffer upload(const void* host, int64_t bytes);
  // The calling thread's scratch slots on this backend (kernels/workspace.h).
  Workspace& workspace();
  // Frees the calling thread's scratch: its workspace slots, the per-thread buffers the
  // ops grow (the host copy of sampled logits; on the CPU, the GEMMs' dequantized
  // chunks and the ops' staging vectors), and gives the freed heap back to the system
  // (malloc_trim). Why: a prefill's activations are tens of MB that only grow, so a
  // server that answered one long prompt would hold them for ever; the runtime's
  // compute threads call this once they have been idle a while
  // (actors/runtime/compute_thread.h), so memory between requests is the model, its
  // KV pool and little else. The next op allocates again. Never while an op of this
  // thread runs. The CUDA backend keeps its device memory (its CUDA graphs hold the
  // workspace's addresses, and a free waits for the device).
  virtual void release_scratch();

  virtual std::unique_ptr<Stream> make_stream();
  virtual std::unique_ptr<Event> make_event();
  // Copies on `stream` (nullptr: the stream the ops run on). A copy to the host with
  // no stream returns when the bytes are there; on a stream, once an event recorded
  // after it completes. The host memory must stay valid until then.
  virtual void copy_to_backend(void* dst, const void* host_src, int64_t bytes, Stream* stream = nullptr);
  virtual void copy_to_host(void* host_dst, const void* src, int64_t bytes, Stream* stream = nullptr);
  virtual void copy_within(void* dst, const void* src, int64_t bytes, Stream* stream = nullptr);
  // `event` completes once the work issued on `stream` so far has.
  virtual void record(Event& event, Stream* stream = nullptr);
  // Work issued on `stream` after this call starts only once `event` completed.
  virtual void wait(const Event& event, Stream* stream = nullptr);
  // The host blocks until `event` completed / until all of this backend's work has.
  // A device backend bounds the wait (the CUDA backend: device.wait_timeout) and
  // throws past it.
  virtual void synchronize(const Event& event);
  virtual void synchronize();

  // ---- Prepared constants ----

  // Throws std::invalid_argument when !supports(precision).
  virtual std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) = 0;
  // Several matrices with the same input (the query, key and value rows; gate and up),
  // prepared as one whose rows are theirs in order, so one linear() computes them all.
  // The parts may differ in type (a Q4_K_M file stores attn_v as Q6_K beside Q4_K). The
  // default concatenates them into a temporary host copy (raw when the types agree, else
  // F32 rows) and prepares that: right for backends that copy at prepare (CUDA, the
  // reference); the CPU backend reads each part in place instead, so the file is never
  // duplicated. Every part must have the same in_features and outlive the result.
  virtual std::unique_ptr<PreparedWeights> prepare_fused(const std::vector<WeightView>& parts, Precision precision);
  // An embedding table for embed() (rows gathered, never multiplied: kept as stored).
  virtual std::unique_ptr<PreparedWeights> prepare_embedding(const WeightView& table);
  virtual std::unique_ptr<PreparedRope> prepare_rope(const RopeTable& table);

  // y = x · Wᵀ (+ bias)
  virtual void linear(const PreparedWeights& w,
                      const float* x,      // [n, in_features]
                      float* y,            // [n, out_features]
                      int64_t n,
                      const float* bias    // [out_features] or nullptr
                      ) = 0;

  // ---- Ops ----

  // Rows of an embedding table, dequantized. An id outside [0, vocab) throws
  // std::out_of_range before anything is written.
  virtual void embed(const PreparedWeights& table,  // prepare_embedding: [vocab, dim]
                     const int32_t* ids,            // [n]
                     float* out,                    // [n, dim]
                     int64_t n) = 0;

  virtual void rmsnorm(const float* x,       // [n, dim]
                       const float* weight,  // [dim]
                       float* out,           // [n, dim]
                       int64_t n, int64_t dim, float eps) = 0;

  // In-place rotary embedding of `heads` heads per row at the given positions.
  // Positions may be negative (a rotation by -p undoes one by p).
  virtual void rope(float* x,              // [n, heads, head_dim]
                    const int32_t* pos,    // [n]
                    int64_t n, int64_t heads, const PreparedRope& rope) = 0;

  // out = silu(gate) * up, with gate and up side by side in one row (the fused
  // gate/up projection's output).
  virtual void swiglu(const float* gate_up,  // [n, 2 * ff]: gate [ff] then up [ff]
                      float* out,            // [n, ff]
                      int64_t n, int64_t ff) = 0;

  // out = gelu_tanh(gate) * up (GeGLU, Gemma's feed-forward: kernels/op_math.h
  // gelu_tanh_mul), laid out as swiglu's. The default computes in place on host memory
  // (the CPU backends; the reference overrides it in double); a backend whose memory
  // the host cannot touch must override it or throws std::logic_error.
  virtual void geglu(const float* gate_up,  // [n, 2 * ff]: gate [ff] then up [ff]
                     float* out,            // [n, ff]
                     int64_t n, int64_t ff);

  // x *= s (Gemma's embeddings scaled by sqrt(dim)). Default as geglu's.
  virtual void scale(float* x,  // [count]
                     int64_t count, float s);

  // y += x: the residual stream.
  virtual void add(float* y,        // [count]
                   const float* x,  // [count]
                   int64_t count) = 0;

  // The fused QKV projection's rows split into Q, K and V.
  virtual void split_qkv(const float* qkv,  // [n, q_dim + 2 * kv_dim]: q, k, v side by side
                         float* q,          // [n, q_dim]
                         float* k,          // [n, kv_dim]
                         float* v,          // [n, kv_dim]
                         int64_t n, int64_t q_dim, int64_t kv_dim) = 0;

  // dst[i] = src[rows[i]]: the rows that go on (the blend's narrowing). dst must not
  // overlap src.
  virtual void gather_rows(const float* src,     // [*, width]
                           const int32_t* rows,  // [n], each a row of src
                           float* dst,           // [n, width]
                           int64_t n, int64_t width) = 0;

  // Writes the K (and V) rows of n tokens into the cache at their positions, rounded
  // to kv.dtype (K is stored after RoPE). A position outside [0, kv.capacity) throws
  // std::out_of_range before any row is written.
  virtual void store_kv(const KvView& kv,
                        const int32_t* pos,  // [n]
                        const float* k,      // [n, kv.kv_heads, kv.head_dim]
                        const float* v,      // [n, kv.kv_heads, kv.head_dim], or nullptr: K only
                        int64_t n) = 0;

  // One decode row per cache: row i's K (and V) written into kv[i] at pos[i], exactly
  // as store_kv(kv[i], pos + i, k + i * width, v + i * width, 1) (width = kv_heads *
  // head_dim; every kv[i] has the same kv_heads, head_dim and dtype). A batched decode
  // step stores all its rows in one call; a device backend overrides it with one
  // launch instead of one per row. Positions are checked as store_kv's.
  virtual void store_kv_rows(const KvView* kv,    // [n]
                             const int32_t* pos,  // [n]
                             const float* k,      // [n, kv_heads, head_dim]
                             const float* v,      // [n, kv_heads, head_dim], or nullptr: K only
                             int64_t n) {
    if (n <= 0) return;
    const int64_t width = kv[0].kv_heads * kv[0].head_dim;
    for (int64_t i = 0; i < n; ++i) store_kv(kv[i], pos + i, k + i * width, v ? v + i * width : nullptr, 1);
  }

  // Rows [first, first + m) of every KV head of `kv` from host bytes already in kv.dtype
  // (a stored chunk's layer: no rounding), on `stream` as copy_to_backend orders its
  // copies (nullptr: the compute stream). The default copies each page run of each
  // head; a device backend sends the block in one DMA and scatters it into the pages
  // on the device. Throws std::out_of_range for rows outside [0, kv.capacity).
  virtual void write_kv_block(const KvView& kv, int64_t first, int64_t m,
                              const void* k,  // host [kv.kv_heads, m, kv.head_dim] of kv.dtype
                              const void* v,  // host, the same shape
                              Stream* stream = nullptr);

  // The blend's per-token deviation: out[i] = sum over KV heads and elements of
  // (fresh - cached)^2 for K, V or both, the cached rows at pos[i] widened from
  // kv.dtype, in double. Positions are checked as store_kv's.
  virtual void kv_deviation(const KvView& kv,
                            const int32_t* pos,  // [n]
                            const float* k,      // [n, kv.kv_heads, kv.head_dim]: fresh K
                            const float* v,      // [n, kv.kv_heads, kv.head_dim]: fresh V
                            int64_t n, KvDeviation which,
                            double* out          // [n]
                            ) = 0;

  // The attention n query rows pay each key (the blend's query-aware selection: how
  // much the question reads a cached token). out[j] = sum over query heads h (outer)
  // and rows i (inner) of softmax_j(scale * q[i, h] . K[h / group, j]) over the keys
  // j < n_kv with j <= qpos[i] (and inside kv.window), as in attention(); 0 for a key
  // no row sees. The
  // reference's arithmetic is the definition: each score an fp32 dot product summed
  // over head_dim in order, times scale; the row's max, exp(s - max) and their fp32
  // sum in key order; each weight (fp32 e / sum) added to out[j] in double, heads then
  // rows. Other backends agree within fp32 rounding (vector FMAs and exps on the CPU,
  // atomics in the scheduler's order on a device).
  // Rows with qpos < 0 see no key. K elements are kv.dtype, read as their fp32 value.
  virtual void attention_mass(const float* q,       // [n, q_heads, kv.head_dim]
                              const int32_t* qpos,  // [n]
                              const KvView& kv,     // n_kv <= kv.capacity rows per KV head
                              int64_t n, int64_t q_heads, int64_t n_kv, float scale,
                              double* out           // [n_kv]
                              ) = 0;

  // The indices of the k largest scores, largest first; equal scores by lower index;
  // NaN below every number. 0 <= k <= n.
  virtual void top_k(const double* score,  // [n]
                     int64_t n, int64_t k,
                     int32_t* out          // [k]
                     ) = 0;

  // Delta-RoPE of a placed chunk: K of cache rows [first, first + m) of every KV head
  // rotated by `delta` positions in place (R(p + d) = R(d)·R(p)), through fp32 and
  // rounded back to kv.dtype as K computed at the new position would be. V is not
  // touched. delta may be negative (rotating a chunk back to positions 0..m-1).
  virtual void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta,
                            const PreparedRope& rope) = 0;

  // Causal-by-position multi-head attention with grouped KV heads. Query i
  // attends to every cached key j < n_kv with j <= qpos[i] and, where kv.window is
  // set, qpos[i] - j < kv.window (the cache is indexed
  // by prompt position; its rows are wherever `kv`'s page table puts them). Query
  // head h reads KV head h / (q_heads / kv.kv_heads). K/V elements are kv.dtype (F32,
  // F16 or BF16), each read as its exact fp32 value; scores and sums are fp32.
  virtual void attention(const float* q,       // [n, q_heads, kv.head_dim]
                         const int32_t* qpos,  // [n]
                         const KvView& kv,     // n_kv <= kv.capacity rows per KV head
                         float* out,           // [n, q_heads, kv.head_dim]
                         int64_t n, int64_t q_heads, int64_t n_kv, float scale,
                         Precision precision  // BF16: bf16 dot products, fp32 softmax/accumulation
                         ) = 0;

  // One token per row of logits, picked where the logits are, exactly as
  // kernels/sampling.h's pick_token picks it from the same row and draw. The default
  // copies the logits to the host and picks there; a device backend picks on the device
  // and only the n ids come back.
  virtual void sample_rows(const float* logits,    // [n, vocab]
                           int64_t n, int64_t vocab,
                           const SampleRow* rows,  // host [n]: settings and draw per row
                           int32_t* tokens         // host [n]
  );

  // Runs one decode step's ops: `body` issues them (embedding through the output
  // projection) for n rows whose KV views, every layer's, are views[l * n + i] (layer l,
  // row i); the store_kv_rows and attention_rows calls of the body pass pointers into
  // that array (views + l * n). The default runs body. A device backend may upload the
  // views once and replay the body's ops from a captured graph (the CUDA backend: a
  // CUDA graph per row count), so body must issue the same ops on the same memory for
  // the same n and views' capacities and do no host work the ops depend on besides
  // those arguments: the step's inputs (ids, positions) are copied before the call.
  virtual void decode_step(const KvView* views,  // [layers * n]
                           int layers, int64_t n, const std::function<void()>& body) {
    (void)views;
    (void)layers;
    (void)n;
    body();
  }
  // Page-locks `bytes` of host memory at `p` for the device's DMA (the RAM tier's
  // entries: a loader's copy then reads them in place instead of through staging) and
  // returns what unlocks it when released; the memory must outlive that. nullptr: not
  // pinned (the default: the CPU backends have nothing to pin; a device backend that
  // cannot, e.g. memory already registered) — callers go on without.
  virtual std::shared_ptr<void> pin_host(const void* p, int64_t bytes) {
    (void)p;
    (void)bytes;
    return nullptr;
  }
  // Decode steps replayed from a captured graph so far (0: a backend without them).
  virtual int64_t graph_launches() const { return 0; }

  // One decode query per row, each row a different sequence with its own cache: row i
  // (q_heads heads) attends to rows [kv[i].first_visible(qpos[i]), qpos[i]] of kv[i]
  // (all of [0, qpos[i]] without a window). Every row equals
  // attention() of that row alone with n_kv = qpos[i] + 1 (a batched decode step
  // relies on it); a backend overrides this to spread the rows' heads over its
  // threads at once. Every kv[i] has the same kv_heads and head_dim.
  virtual void attention_rows(const float* q,       // [n, q_heads, head_dim]
                              const int32_t* qpos,  // [n]
                              const KvView* kv,     // [n]
                              float* out,           // [n, q_heads, head_dim]
                              int64_t n, int64_t q_heads, float scale, Precision precision) {
    if (n == 0) return;
    const int64_t qd = q_heads * kv[0].head_dim;
    for (int64_t i = 0; i < n; ++i)
      attention(q + i * qd, qpos + i, kv[i], out + i * qd, 1, q_heads, int64_t{qpos[i]} + 1, scale, precision);
  }

 protected:
  // Raw memory for alloc(): the default is host memory (operator new, 64-byte aligned).
  virtual void* allocate_bytes(int64_t bytes);
  virtual void free_bytes(void* data, int64_t bytes);
  // Frees every thread's workspace. A backend that overrides free_bytes calls it in its
  // destructor: the workspaces are the base class's, and by the base destructor the
  // override is gone.
  void release_workspaces();

 private:
  friend class DeviceBuffer;
  std::mutex workspaces_mu_;
  std::map<std::thread::id, std::unique_ptr<Workspace>> workspaces_;
};

// A backend whose memory is host memory, for pools and buffers made without a model
// (tests, tools): the reference backend, made once, never destroyed.
Backend& host_backend();

std::unique_ptr<Backend> make_reference_backend();

// How the CPU backend's decode-size products (up to linear_exact_rows() rows) of
// block-quantized weights (Q4_0 ... Q6_K) treat the activations. Exact: fp32 (the AVX2
// kernels round those of Q4_0/Q4_1 to int16 per block, <= 2^-16 of the block's largest
// value). Int8: rounded to int8 per block of 32, as llama.cpp's CPU backend does
// (kernels/activation_quant.h), on every kernel variant from AVX2 up; the scalar one
// runs Exact. When Int8 runs, kernel_id() ends in "+int8", so it is part of every
// chunk key.
enum class DecodeActivations { Exact, Int8 };
const char* decode_activations_name(DecodeActivations d);  // "exact", "int8"
// "exact" or "int8"; false for anything else.
bool decode_activations_from_name(std::string_view name, DecodeActivations& d);
// The choice when nothing is configured: $BLENDSERVE_DECODE_ACTIVATIONS when set
// (std::invalid_argument for an unknown value), else kDefaultDecodeActivations.
DecodeActivations default_decode_activations();
inline constexpr DecodeActivations kDefaultDecodeActivations = DecodeActivations::Exact;

// The CPU backend on the best kernel variant this CPU runs (BLENDSERVE_CPU_ISA caps it;
// kernels/cpu/isa.h), decode activations as default_decode_activations() says.
// make_cpu_backend_for (kernels/cpu/cpu_backend.h) picks the variant.
std::unique_ptr<Backend> make_cpu_backend();
// batch_invariant: every prefill product and attention through the decode-size kernels
// (rows of linear_exact_rows() at a time, attention reading the cache per row), so
// Backend::batch_invariant() holds; bf16 products are then not offered (they are the
// prefill GEMM's). Costs prefill speed (tools/bench/RESULTS.md, "Batch-invariant prefill").
std::unique_ptr<Backend> make_cpu_backend(DecodeActivations decode, bool batch_invariant = false);
// Threads the CPU kernels run on (OpenMP).
int cpu_compute_threads();

}  // namespace bs::kernels
