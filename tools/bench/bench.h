// Benchmarks run by blendctl; each prints one JSON object per measurement.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/runtime_config.h"
#include "blend/blend_engine.h"
#include "kernels/backend.h"
#include "kernels/backend_choice.h"
#include "model/tokenizer.h"

namespace bs::tools {

// The KV dtype a --kv-dtype option names (f32, f16, bf16); std::invalid_argument else.
kernels::TensorType kv_dtype_option(const std::string& name);

// The runtime config a benchmark's runtime starts from: the default, with the model,
// device (kind and GPU), precision and KV dtype asked for, its data in `data_dir`.
RuntimeConfig bench_runtime_config(const std::string& model_path, const kernels::BackendChoice& device,
                                   const std::string& precision, const std::string& kv_dtype,
                                   const std::string& data_dir);

struct BenchOptions {
  std::string model_path;
  kernels::BackendChoice device;  // --device cpu | cuda, --gpu N
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::string kv_dtype = kDefaultKvDtype;  // f32 | f16 | bf16: how the KV cache holds K and V
  std::vector<int64_t> prefill_lengths{512, 3072};
  int repeats = 3;
  int64_t decode_context = 512;
  int decode_tokens = 128;
  // Batch sizes of the batched-decode breakdown (decode_step of B sequences).
  std::vector<int64_t> decode_batches{1, 8};
};

int bench_prefill(const BenchOptions& opt);

struct TtftOptions {
  std::string model_path;
  kernels::BackendChoice device;  // --device cpu | cuda, --gpu N
  std::string dataset;  // JSON lines with "documents": text the chunks are cut from
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::string kv_dtype = kDefaultKvDtype;  // f32 | f16 | bf16: how the KV cache holds K and V
  int chunks = 6;
  int chunk_tokens = 512;
  // The blend's defaults (BlendOptions): one place says what "default" means.
  float ratio = BlendOptions{}.ratio;
  std::vector<int> check_layers = BlendOptions{}.check_layers;
  std::vector<float> schedule;             // kept fractions after each check layer but the last
  std::string filtering = "single-pass";   // single-pass | two-pass
  std::string selection = selection_name(BlendOptions{}.selection);  // deviation | attention | impact | query-first
  int query_first_from_layer = BlendOptions{}.query_first_from_layer;  // first layer query-first sums
  int requests = 3;  // distinct requests (different chunks)
  int repeats = 1;   // runs of each request per mode (median reported)
};
int bench_ttft(const TtftOptions& opt);
// The blend options a TTFT bench runs at (ratio, check layers, schedule, filtering,
// selection, query_first_from_layer; the mode is the caller's): one place, so every
// path of `bench ttft` (the engine's modes and the runtime's tiers) runs what was asked.
BlendOptions blend_options(const TtftOptions& opt);

// `bench tp`: full prefill of `tokens` random token ids at each tensor parallel
// degree (CPU ranks, the cores split between them), best of `repeats`, with the time
// spent in collectives per layer; the summary gives each degree's ratio to the first.
struct TpBenchOptions {
  std::string model_path;    // a GGUF file, unless random_shape is set
  std::string random_shape;  // random weights in a known shape (model/random_model.h)
  std::string precision = "auto";
  std::string kv_dtype = kDefaultKvDtype;
  std::vector<int> degrees{1, 2};
  int64_t tokens = 3072;
  int repeats = 2;
};
int bench_tp(const TpBenchOptions& opt);

// `bench memory`: the process's resident memory before and after a model loads and
// after it answered (a random prompt prefilled, greedy tokens decoded), the model's
// share over its file size (target: at most 1.25x plus the KV cache). Exit status 1
// when the target is missed.
struct MemoryBenchOptions {
  std::string model_path;
  kernels::BackendChoice device;
  std::string precision = "auto";
  std::string kv_dtype = kDefaultKvDtype;
  int64_t tokens = 512;   // prompt tokens prefilled
  int decode_tokens = 8;  // greedy tokens decoded after it
};
int bench_memory(const MemoryBenchOptions& opt);

// `bench gemv`: the decode-size product of one random block-quantized matrix per
// (type, shape, token count), with the default and with int8 activations, on the CPU
// kernels this machine selects: microseconds and weight GB/s, fastest of `repeats`.
struct GemvBenchOptions {
  std::vector<std::string> types{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"};
  std::vector<std::pair<int64_t, int64_t>> shapes{{2048, 640}, {640, 2048}, {32768, 640}};  // rows x in
  std::vector<int64_t> tokens{1, 8};
  int repeats = 5;
};
int bench_gemv(const GemvBenchOptions& opt);

// `bench text`: encoding a MuSiQue prompt (the first --dataset case's documents and
// question), rendering the chat template around a question, assembling the RAG prompt;
// median and fastest of `repeats` (targets: 2 ms and 1 ms). Tokenizer and template only.
struct TextBenchOptions {
  std::string model_path;
  std::string dataset;
  std::string chat_template;  // a Jinja file instead of the model's own
  int repeats = 50;
};
int bench_text(const TextBenchOptions& opt);

// `bench decode`: N concurrent greedy streams through the runtime (continuous
// batching) for each N in `streams`; the decode-phase tokens/s of each, and the
// ratio of the last stream count to the first.
struct DecodeBenchOptions {
  std::string model_path;
  kernels::BackendChoice device;  // --device cpu | cuda, --gpu N
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::string kv_dtype = kDefaultKvDtype;  // f32 | f16 | bf16: how the KV cache holds K and V
  std::vector<int> streams{1, 8};
  int tokens = 64;          // generated per stream
  int prompt_tokens = 256;  // prompt per stream
  int repeats = 1;          // runs per stream count; the fastest is reported
  int max_batch = 0;        // limits.max_decode_batch; 0: the config's, at least the largest count
  double interleave = -1;   // limits.decode_interleave; < 0: off (the prefills run first)
  // Also time the inspection data's collection (actors/runtime/inspection_cost.h) and report it
  // as a fraction of each run's wall time.
  bool inspection_cost = false;
};
int bench_decode(const DecodeBenchOptions& opt);

// Chunks of exactly `chunk_tokens` tokens cut from the dataset's documents (after
// skipping `skip` documents).
std::vector<std::vector<int32_t>> make_bench_chunks(const Tokenizer& tok, const std::string& dataset, int count,
                                                    int chunk_tokens, int skip);

// `bench ttft --tier ...`: the same blend requests through the actor runtime with
// chunks stored in the given tiers, against a direct BlendEngine call over the same
// stores, plus `full` for reference; the trace's load overlap per request.
struct RuntimeBenchOptions {
  TtftOptions ttft;
  std::vector<std::string> tiers{"ram"};  // ram | ssd | remote (each run in its own runtime)
  bool direct_io = false;                 // SSD reads with O_DIRECT (real reads, not the page cache)
  std::string remote_transport = "tls";   // the remote tier's link: tls (TLS 1.3, mutual; a cluster's default) | plain
  double throttle_bytes_per_s = 0;        // SSD read bandwidth cap (0: none)
  bool adaptive = false;                  // let the loading controller pick the ratio (>= --ratio)
  std::string data_dir;                   // where the SSD tier lives (default: a fresh temp dir)
  // device.communicator of the runtime: auto, or nccl at tp 1 (the single-GPU path
  // with its all-reduces through NCCL, against auto's plain path).
  std::string communicator = "auto";
};
int bench_ttft_runtime(const RuntimeBenchOptions& opt);

// blendctl trace: one request's trace, from <data_dir>/traces/<id>.json (the last
// trace_history requests), last.json (--last), a file, or a running server's
// /v1/inspect/traces (--url); printed as text (per layer: load per tier, wait,
// compute; the controller's decision and the fraction of load time hidden), as its
// JSON, or as Chrome trace-event JSON (tools/cli/trace_chrome.h). Throws with a clear
// message for a missing trace, an unreachable server, a refused key, not a trace.
struct TraceOptions {
  std::string id;               // a request id (exactly one of id, last, file)
  bool last = false;            // the newest trace
  std::string file;             // a trace JSON file
  std::string data_dir;         // empty: as the runtime resolves it
  std::string url;              // a server: http://HOST:PORT (with id or last)
  std::string api_key;          // its Bearer token
  double timeout_s = 10;        // connect and read timeout for --url
  std::string format = "text";  // text | json | chrome
  std::string out;              // write here instead of stdout
};
int print_trace(const TraceOptions& opt);

struct EvalOptions {
  std::string model_path;
  std::string dataset;
  std::string chat_template;  // --chat-template: a Jinja file rendering the chats instead of the model's own
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::string kv_dtype = kDefaultKvDtype;  // f32 | f16 | bf16: how the KV cache holds K and V
  std::vector<std::string> modes{"blend"};
  float ratio = BlendOptions{}.ratio;                           // the blend's defaults
  std::vector<int> check_layers = BlendOptions{}.check_layers;
  std::vector<float> schedule;
  std::string deviation = "kv";        // k | v | kv
  std::string quota = "global";        // global | per-chunk
  std::string filtering = "single-pass";  // single-pass | two-pass
  std::string selection = selection_name(BlendOptions{}.selection);  // BlendOptions::selection
  int sink_tokens = 0;                 // first tokens of each cached chunk always recomputed
  int query_first_from_layer = BlendOptions{}.query_first_from_layer;  // first layer query-first sums
  std::string chunk_prelude;           // text every chunk is computed behind (dropped)
  std::string reference_dir;           // keeps/reads full's teacher-forced reference per case
  // --forced-rows: one JSON line per teacher-forced row of the gold answer, per run made
  // now (not those --resume reads back): the gold token, full's (the reference's) token
  // and its lead over full's runner-up, the mode's token and how far it puts full's
  // token below its own. Full's logits are then computed for every case (a reference
  // file holds only their argmax). Empty: none.
  std::string forced_rows_path;
  // --sweep-ratio: the blend runs at each of these ratios (each in (0, 1]; sorted and
  // deduplicated by eval_rag) instead of `ratio`, beside one `full` run per case that
  // all share; a final {"eval":"sweep"} line gathers the points. Empty: no sweep.
  std::vector<double> sweep_ratios;
  std::string plot_path;  // --plot: the trade-off chart as SVG (tools/eval/sweep_plot.h)
  // --resume: the case log (tools/eval/case_log.h); finished runs are read back from it,
  // new ones appended. Empty: none.
  std::string resume_path;
  int skip_cases = 0;  // start after the first N cases (split a long run)
  int max_cases = 0;   // 0: all
  int max_tokens = 32;
  bool print_cases = true;
  // --pasted: each case's documents are stored, then sent pasted into the user's
  // message (paste_lead, the passages joined by blank lines, the question) with no
  // documents field; the runs use the prompt the pasted-chunk index makes of it
  // (blend/pasted_chunks.h). Case lines say how much of the stored passages was found.
  bool pasted = false;
  std::string paste_lead;
  bool match_only = false;  // --pasted without the model's runs: only what was found
  // --reverse-documents: each case's documents in the reverse order (the request that
  // comes after one that sent them in the case's order).
  bool reverse_documents = false;
  // --stored-in-context: each chunk stored as a runtime's provisional entry
  // (actors/runtime/chunk_flights.h) is: its rows of a full prefill of the case in the case's
  // own order (BlendEngine::chunk_in_context), not its KV computed alone.
  bool stored_in_context = false;
  std::string system_prompt =
      "You will be asked a question after reading several passages. Please directly answer the question based on "
      "the given passages. Do NOT repeat the question. The answer should be within 5 words.";
  std::string question_prefix =
      "Answer the question directly based on the given passages. Do NOT repeat the question. The answer should be "
      "within 5 words.\nQuestion: ";
};
int eval_rag(const EvalOptions& opt);

// blendctl top: a server's actors and requests live in the terminal (tools/cli/top.cpp).
struct TopOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;       // default $BLENDSERVE_API_KEY
  double interval_s = 1.0;   // between snapshots
  double timeout_s = 5.0;    // connect and read timeout of one snapshot
  bool once = false;         // print one snapshot and exit (1 if the server cannot be read)
  bool json = false;         // with once: the snapshot as one JSON line, not the text view
};
int run_top(const TopOptions& opt);

}  // namespace bs::tools
