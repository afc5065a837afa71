// blendctl: benchmarks and the RAG quality evaluation.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "model/random_model.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_control.h"
#include "tools/bench/bench_remote.h"
#include "tools/bench/bench_serve.h"
#include "tools/cluster/cluster_ctl.h"
#include "tools/cluster/cluster_render.h"

int main(int argc, char** argv) {
  CLI::App app{"blendctl: blendserve benchmarks and tools"};
  app.fallthrough();  // --model, --device, --gpu also after the subcommand (bench prefill --device cuda)
  app.require_subcommand(1);
  bs::tools::BenchOptions opt;
  opt.model_path = std::getenv("BLENDSERVE_MODEL") ? std::getenv("BLENDSERVE_MODEL") : BLENDSERVE_DEFAULT_MODEL;
  app.add_option("--model", opt.model_path,
                 "GGUF model file, or random:NAME for random BF16 weights of a known shape built in memory (speed "
                 "only: smollm2-135m, llama-3.2-1b, llama-3.1-8b)");
  app.add_option("--device", opt.device.kind, "Compute backend of the benchmarks: cpu or cuda (builds made with nvcc)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--gpu", opt.device.gpu, "With --device cuda: the GPU's CUDA index")->check(CLI::NonNegativeNumber);
  app.add_flag("--batch-invariant", opt.device.batch_invariant,
               "CPU: every prefill row computed as that row alone (model.batch_invariant)");

  auto* bench = app.add_subcommand("bench", "Benchmarks (JSON lines on stdout)");
  bench->require_subcommand(1);
  auto* prefill = bench->add_subcommand("prefill", "Full prefill and decode throughput, GEMM throughput");
  std::string precision = "auto";
  prefill->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  std::string kv_dtype = bs::kDefaultKvDtype;
  const auto kv_dtypes = CLI::IsMember({"f32", "f16", "bf16"});
  const char* kv_dtype_help = "How the KV cache holds K and V (device.kv_dtype)";
  prefill->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);
  prefill->add_option("--lengths", opt.prefill_lengths, "Prompt lengths to prefill");
  prefill->add_option("--repeats", opt.repeats)->check(CLI::Range(1, 100));
  prefill->add_option("--decode-context", opt.decode_context)->check(CLI::Range(1, 8000));
  prefill->add_option("--decode-tokens", opt.decode_tokens)->check(CLI::Range(1, 4096));
  prefill->add_option("--decode-batches", opt.decode_batches, "Batch sizes of the batched-decode breakdown")
      ->capture_default_str()->check(CLI::Range(1, 64));

  bs::tools::TtftOptions topt;
  topt.dataset = std::string(BLENDSERVE_SOURCE_DIR) + "/tests/data/rag_qa.jsonl";
  auto* ttft = bench->add_subcommand("ttft", "Time to first token of full, prefix, reuse and blend on the same requests");
  ttft->add_option("--chunks", topt.chunks, "Documents per request")->check(CLI::Range(1, 64));
  ttft->add_option("--chunk-tokens", topt.chunk_tokens, "Tokens per document")->check(CLI::Range(16, 4096));
  ttft->add_option("--ratio", topt.ratio, "Blend recompute ratio")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  ttft->add_option("--check-layers", topt.check_layers, "Blend check layers")->capture_default_str();
  ttft->add_option("--schedule", topt.schedule, "Kept fractions after each check layer but the last");
  ttft->add_option("--filtering", topt.filtering, "single-pass or two-pass")
      ->check(CLI::IsMember({"single-pass", "two-pass"}))
      ->capture_default_str();
  ttft->add_option("--selection", topt.selection, "deviation, attention, impact or query-first")
      ->check(CLI::IsMember({"deviation", "attention", "impact", "query-first"}))
      ->capture_default_str();
  ttft->add_option("--query-first-from-layer", topt.query_first_from_layer,
                   "First layer whose attention query-first sums (the last layer if past it)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  ttft->add_option("--requests", topt.requests, "Distinct requests")->check(CLI::Range(1, 100));
  ttft->add_option("--repeats", topt.repeats, "Runs per request and mode")->check(CLI::Range(1, 100));
  ttft->add_option("--dataset", topt.dataset, "JSON lines whose documents provide the chunk text");
  ttft->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  ttft->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);
  bs::tools::RuntimeBenchOptions ropt;
  std::vector<std::string> tiers;
  double throttle_mbps = 0;
  ttft->add_option("--tier", tiers,
                   "Through the actor runtime with the chunks in this tier (ram, ssd, remote; repeatable): blend vs a "
                   "direct engine call, load overlap from the trace. remote: a storage node in this process on "
                   "127.0.0.1 (its own SSD tier in the data dir), RAM and SSD off, every chunk over TCP; with ssd "
                   "too the summary has remote_vs_ssd")
      ->check(CLI::IsMember({"ram", "ssd", "remote"}));
  ttft->add_option("--remote-transport", ropt.remote_transport,
                   "--tier remote: the link to the storage node, tls (TLS 1.3 with mutual authentication, certificates "
                   "of a CA made in the data dir: a cluster's default) or plain")
      ->check(CLI::IsMember({"tls", "plain"}))
      ->capture_default_str();
  ttft->add_flag("--direct-io", ropt.direct_io,
                 "SSD tier, and the remote tier's storage node: O_DIRECT reads (real reads, not the page cache; "
                 "without it both read from the page cache)");
  ttft->add_option("--throttle-mbps", throttle_mbps,
                   "SSD tier, and the remote tier's storage node's disk: cap reads at this many MB/s")
      ->check(CLI::NonNegativeNumber);
  ttft->add_flag("--adaptive", ropt.adaptive, "Let the loading controller raise the ratio above --ratio");
  ttft->add_option("--communicator", ropt.communicator,
                   "With --tier: the runtime's device.communicator (auto; nccl with --device cuda: tp 1 with the "
                   "all-reduces through NCCL, to compare with auto's plain path)")
      ->check(CLI::IsMember({"auto", "inprocess", "nccl"}))
      ->capture_default_str();
  ttft->add_option("--data-dir", ropt.data_dir,
                   "Where the SSD tier (and the remote tier's storage node) lives (default: a temp dir, removed after)");

  bs::tools::DecodeBenchOptions dopt;
  auto* decode = bench->add_subcommand(
      "decode", "Decode throughput of N concurrent streams through the runtime (continuous batching) vs fewer");
  decode->add_option("--streams", dopt.streams, "Concurrent stream counts (the summary: last vs first)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  decode->add_option("--tokens", dopt.tokens, "Tokens generated per stream")->check(CLI::Range(2, 4096))->capture_default_str();
  decode->add_option("--prompt-tokens", dopt.prompt_tokens, "Prompt tokens per stream")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  decode->add_option("--repeats", dopt.repeats, "Runs per stream count (the fastest is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  decode->add_option("--max-batch", dopt.max_batch, "limits.max_decode_batch (default: the config's, >= the streams)")
      ->check(CLI::Range(1, 1024));
  decode->add_option("--interleave", dopt.interleave,
                     "limits.decode_interleave in seconds (default: off, the prefills run before the decode phase)")
      ->check(CLI::NonNegativeNumber);
  decode->add_flag("--inspection-cost", dopt.inspection_cost,
                   "Also report the time spent collecting the inspection data as a fraction of each run");
  decode->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  decode->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);

  bs::tools::TpBenchOptions tpopt;
  auto* tp = bench->add_subcommand(
      "tp", "Prefill throughput at several tensor parallel degrees on CPU ranks (cores split), collective time per layer");
  tp->add_option("--random", tpopt.random_shape,
                 "Random Q4_0 weights in a known shape instead of --model (smollm2-135m, llama-3.2-1b)")
      ->check(CLI::IsMember(bs::random_llama_shape_names()));
  tp->add_option("--degrees", tpopt.degrees, "Tensor parallel degrees (the summary: each vs the first)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  tp->add_option("--tokens", tpopt.tokens, "Prompt tokens prefilled")->check(CLI::Range(1, 8192))->capture_default_str();
  tp->add_option("--repeats", tpopt.repeats, "Timed prefills per degree (the fastest is summarized)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  tp->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  tp->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);

  bs::tools::MemoryBenchOptions mopt;
  auto* memory = bench->add_subcommand(
      "memory", "Resident memory of a model after loading and after answering, against its file size (target 1.25x)");
  memory->add_option("--tokens", mopt.tokens, "Prompt tokens prefilled")->check(CLI::Range(1, 32768))->capture_default_str();
  memory->add_option("--decode", mopt.decode_tokens, "Greedy tokens decoded after the prompt")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  memory->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  memory->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);

  bs::tools::GemvBenchOptions gopt;
  std::vector<std::string> gemv_shapes;
  auto* gemv = bench->add_subcommand(
      "gemv", "Decode-size products of one random block-quantized matrix per type and shape, default vs int8 "
              "activations, on this CPU's kernels (no model)");
  gemv->add_option("--types", gopt.types, "Block types")->capture_default_str();
  gemv->add_option("--shapes", gemv_shapes, "ROWSxIN (default 2048x640 640x2048 32768x640)");
  gemv->add_option("--tokens", gopt.tokens, "Tokens per product")->check(CLI::Range(1, 8))->capture_default_str();
  gemv->add_option("--repeats", gopt.repeats)->check(CLI::Range(1, 100))->capture_default_str();

  bs::tools::TextBenchOptions xopt;
  xopt.dataset = topt.dataset;
  auto* text = bench->add_subcommand(
      "text", "Encoding a MuSiQue prompt, rendering the chat template, assembling the RAG prompt (targets 2 ms, 1 ms)");
  text->add_option("--dataset", xopt.dataset, "JSON lines; the first case's documents and question")->capture_default_str();
  text->add_option("--chat-template", xopt.chat_template, "Jinja chat template file instead of the model's own");
  text->add_option("--repeats", xopt.repeats)->check(CLI::Range(1, 10000))->capture_default_str();

  std::string random_shape, random_weights = "q4_0", random_out;
  auto* make_random = app.add_subcommand(
      "make-random-model", "Write a random-weight model of a known shape as GGUF (benchmarks of shapes we have no file for)");
  make_random->add_option("--shape", random_shape, "Shape")
      ->required()
      ->check(CLI::IsMember(bs::random_llama_shape_names()));
  make_random->add_option("--weights", random_weights, "Weight types: q4_0, q4_k_m (Q4_K with Q6_K attn_v, ffn_down, LM head) or bf16")
      ->check(CLI::IsMember({"q4_0", "q4_k_m", "bf16"}))
      ->capture_default_str();
  make_random->add_option("--out", random_out, "The GGUF file to write")->required();

  bs::tools::RemoteBenchOptions remote_opt;
  auto* remote = bench->add_subcommand(
      "remote",
      "Remote-disk tier data path on loopback: a storage node over an SSD tier in a temp dir (page cache), every "
      "layer of every chunk read through the remote store; GB/s per layers-in-flight");
  remote->add_option("--tokens", remote_opt.tokens, "Tokens per chunk")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  remote->add_option("--chunks", remote_opt.chunks, "Chunks stored and read")->check(CLI::Range(1, 1024))->capture_default_str();
  remote->add_option("--layers", remote_opt.layers, "Layers per chunk (SmolLM2-135M: 30)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  remote->add_option("--kv-heads", remote_opt.kv_heads, "KV heads (SmolLM2-135M: 3)")->check(CLI::Range(1, 1024))->capture_default_str();
  remote->add_option("--head-dim", remote_opt.head_dim, "Head dim (SmolLM2-135M: 64)")->check(CLI::Range(1, 4096))->capture_default_str();
  remote->add_option("--kv-dtype", remote_opt.kv_dtype, "Element type of the stored K and V")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  remote->add_option("--layers-in-flight", remote_opt.layers_in_flight, "Pipelined layer requests per reader (each a run)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  remote->add_option("--repeats", remote_opt.repeats, "Passes per layers-in-flight value")->check(CLI::Range(1, 1000))->capture_default_str();
  remote->add_option("--transport", remote_opt.transports,
                     "plain (TCP) and/or tls (TLS 1.3, mutual, certificates made in the temp dir): each a run, with "
                     "TLS's cost when both")
      ->check(CLI::IsMember({"plain", "tls"}))
      ->delimiter(',')
      ->capture_default_str();
  remote->add_option("--server-threads", remote_opt.server_threads, "The node's Asio threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  remote->add_option("--order", remote_opt.order,
                     "layer: layer l of every chunk, then l+1 (the loaders' order, a connection per chunk); chunk: "
                     "one chunk after another")
      ->check(CLI::IsMember({"layer", "chunk"}))
      ->capture_default_str();
  remote->add_option("--data-dir", remote_opt.data_dir, "Where the node's SSD tier lives (default: a temp dir, removed after)");

  bs::tools::ControlBenchOptions control_opt;
  auto* control = bench->add_subcommand(
      "control",
      "A storage node's control-plane round trip (the frontend's heartbeat request with its HMAC proof, over the "
      "control link, plaintext) idle and while one large KV entry is read from the same node over the data plane, whole, again "
      "and again, layer by layer as the loaders read (issue 21: a 64 MB transfer delays a control message by <= "
      "10 ms). The node is `blendserve --node storage` as a child process (unless --in-process) on 127.0.0.1; p50, "
      "p99, max per phase, the delay (loaded p99 - idle p50, and max), the transfers' bytes/s, requests failed or "
      "timed out (after two heartbeat intervals); exit 1 if any failed or the connection dropped");
  control->add_option("--megabytes", control_opt.megabytes,
                      "One transfer: MiB (2^20 bytes) of K+V in one entry (pushed in one PUT, read in --layers "
                      "slices)")
      ->check(CLI::Range(0.001, 240.0))
      ->capture_default_str();
  control->add_option("--layers", control_opt.layers, "Layers of the entry (SmolLM2-135M: 30), one slice each")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  control->add_option("--kv-heads", control_opt.kv_heads, "KV heads of the entry (SmolLM2-135M: 3)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  control->add_option("--head-dim", control_opt.head_dim, "Head dim of the entry (SmolLM2-135M: 64)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  control->add_option("--samples", control_opt.samples, "Control requests per phase")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  control->add_option("--interval-ms", control_opt.interval_ms, "Between the starts of consecutive control requests")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  control->add_option("--repeats", control_opt.repeats, "Idle + loaded phase pairs")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  control->add_option("--layers-in-flight", control_opt.layers_in_flight, "The reader's pipelined layer requests")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  control->add_option("--heartbeat", control_opt.heartbeat_s,
                      "cluster.heartbeat_interval in seconds (a request times out after two)")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  control->add_option("--connection-timeout", control_opt.connection_timeout_s,
                      "cluster.connection_timeout in seconds (CAF's silent-connection limit; >= --heartbeat)")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  control->add_flag("--direct-io", control_opt.direct_io,
                    "The node reads with O_DIRECT (the storage node's default; without it the node serves from the "
                    "page cache: the fastest transfer, the most CPU beside the control plane)");
  control->add_flag("--in-process", control_opt.in_process,
                    "The node's data server and control endpoint in this process instead of a blendserve child");
  control->add_option("--blendserve", control_opt.blendserve, "The blendserve binary (default: next to blendctl)");
  control->add_option("--startup-timeout", control_opt.startup_timeout_s, "Seconds the child node gets to listen")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  control->add_option("--data-dir", control_opt.data_dir,
                      "The node's files and its config (default: a temp dir, removed after)");
  control->add_flag("--print-samples", control_opt.print_samples,
                    "Also one JSON line per control request (its round trip, and how far into its transfer it was "
                    "sent)");

  bs::tools::ServeBenchOptions sopt;
  sopt.dataset = std::string(BLENDSERVE_SOURCE_DIR) + "/tests/data/rag_qa.jsonl";
  auto* serve = bench->add_subcommand(
      "serve",
      "RAG serving benchmark against `blendserve serve` over HTTP: blend vs full at the same offered load, closed "
      "loop (N clients) and open loop (Poisson rates); TTFT/latency percentiles, throughput, the highest load "
      "within a p99 TTFT SLO. Runtime scales with the server's prefill time: the defaults take about 5-8 minutes "
      "on an idle 2-core AVX2 machine (full prefill of a 3000-token prompt ~1.5 s), proportionally longer on a "
      "slower or busy one");
  auto* serve_url = serve->add_option("--url", sopt.url, "Server base URL")->capture_default_str();
  serve->add_flag("--spawn", sopt.spawn,
                  "Start blendserve (next to blendctl) on a free loopback port with a temporary data dir; stop it "
                  "at the end")
      ->excludes(serve_url);
  serve->add_option("--server-config", sopt.server_config, "--spawn: the server's --config file");
  serve->add_option("--spawn-timeout", sopt.spawn_timeout_s, "--spawn: seconds to wait for /health")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--api-key", sopt.api_key, "Bearer token (default: $BLENDSERVE_API_KEY)")
      ->envname("BLENDSERVE_API_KEY");
  serve->add_option("--dataset", sopt.dataset, "JSON lines whose documents and questions make the workload")
      ->capture_default_str();
  serve->add_option("--documents", sopt.documents, "Document pool size")->check(CLI::Range(1, 100000))->capture_default_str();
  serve->add_option("--doc-tokens", sopt.doc_tokens, "Tokens per document (about)")
      ->check(CLI::Range(16, 8192))
      ->capture_default_str();
  serve->add_option("--retrieve", sopt.retrieve, "Distinct documents per request")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  serve->add_option("--zipf", sopt.zipf, "Zipf exponent of document popularity (0: uniform)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve->add_option("--requests", sopt.requests, "Requests per mode and load point")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  serve->add_option("--clients", sopt.clients, "Closed loop: concurrent clients per point (0: no closed loop)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  serve->add_option("--rates", sopt.rates,
                    "Open loop: Poisson arrival rates in req/s (default: a doubling grid from half the slowest "
                    "mode's closed-loop throughput to 1.5x the fastest's; 0: no open loop)");
  serve->add_option("--modes", sopt.modes, "Modes compared")
      ->check(CLI::IsMember({"blend", "full", "prefix", "reuse"}))
      ->capture_default_str();
  serve->add_option("--max-tokens", sopt.max_tokens, "Answer length")->check(CLI::Range(1, 4096))->capture_default_str();
  serve->add_option("--slo-p99", sopt.slo_p99,
                    "p99 TTFT SLO in seconds (default: 2x full's median TTFT at its lowest load)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--seed", sopt.seed, "Workload seed (documents, retrieval, arrivals)")->capture_default_str();
  serve->add_option("--warmup", sopt.warmup, "Unmeasured requests per mode first")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  serve->add_flag("--all-points", sopt.all_points, "Open loop: keep raising a mode's rate after it missed the SLO");
  serve->add_option("--extend", sopt.extend,
                    "Open loop: up to N extra rates per mode (half the lowest, double the highest, ...) until its "
                    "SLO rate is bracketed (0: the shared rates only)")
      ->check(CLI::Range(0, 10))
      ->capture_default_str();
  serve->add_flag("--keep-documents", sopt.keep_documents, "Do not DELETE the uploaded documents at the end");
  serve->add_option("--timeout", sopt.request_timeout_s, "Per-request read timeout in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  auto* trace = app.add_subcommand(
      "trace", "A request's trace: per-layer timeline and load overlap, its JSON, or Chrome trace-event JSON");
  bs::tools::TraceOptions tropt;
  bool trace_json = false;
  auto* trace_id = trace->add_option(
      "ID", tropt.id, "Request id: <data dir>/traces/<ID>.json (the last trace_history requests), or the server's");
  auto* trace_last = trace->add_flag("--last", tropt.last, "The newest trace (<data dir>/traces/last.json)")
                         ->excludes(trace_id);
  trace->add_option("--file", tropt.file, "A trace JSON file")->excludes(trace_id)->excludes(trace_last);
  auto* trace_data_dir =
      trace->add_option("--data-dir", tropt.data_dir, "Data dir (default: as the runtime resolves it)");
  trace->add_option("--url", tropt.url, "Fetch from a running server's /v1/inspect/traces (http://HOST:PORT)")
      ->excludes(trace_data_dir)
      ->excludes("--file");
  trace->add_option("--api-key", tropt.api_key, "--url: Bearer token (default: $BLENDSERVE_API_KEY)")
      ->envname("BLENDSERVE_API_KEY");
  trace->add_option("--timeout", tropt.timeout_s, "--url: seconds to wait for the server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* trace_format =
      trace->add_option("--format", tropt.format,
                        "text (per-layer timeline), json (the trace), chrome (trace-event JSON for Perfetto, "
                        "chrome://tracing)")
          ->check(CLI::IsMember({"text", "json", "chrome"}))
          ->capture_default_str();
  trace->add_flag("--json", trace_json, "Same as --format json")->excludes(trace_format);
  trace->add_option("--out", tropt.out, "Write to this file instead of stdout");

  // cluster init|up|status|down F (tools/cluster/cluster_ctl.h), cluster render (tools/cluster/cluster_render.h).
  bs::tools::ClusterCtlOptions cluster_opt;
  auto* cluster = app.add_subcommand(
      "cluster",
      "A cluster's certificates (init); every member of a cluster config as processes on this host (development "
      "and tests): up, status, down; the config for Kubernetes or Slurm: render");
  cluster->require_subcommand(1);
  const auto cluster_action = [&](const char* name, const char* help) {
    auto* a = cluster->add_subcommand(name, help);
    a->add_option("F", cluster_opt.config, "The cluster config")->required();
    a->add_option("--data-dir", cluster_opt.data_dir,
                  "$BLENDSERVE_DATA_DIR for the members (the cluster's files under D/<cluster name>; not with "
                  "cluster.data_dir in F)");
    return a;
  };
  auto* cluster_init = cluster_action(
      "init", "Make the cluster's CA and each member's TLS certificate where missing (cluster.tls.dir), check those "
              "there; one JSON line per member");
  auto* cluster_up = cluster_action(
      "up", "Start every member (storage, workers, frontend), each ready within cluster.startup_timeout; logs and pids "
            "under the cluster's data dir; exit 1 with the failing member's log, having stopped the others");
  auto* cluster_status = cluster_action("status", "Each member's pid, alive, ready (JSON lines); exit 1 unless all are up");
  auto* cluster_down = cluster_action(
      "down", "SIGTERM every member (frontend first, storage last), SIGKILL after --timeout; pid files removed");
  for (auto* a : {cluster_up, cluster_down})
    a->add_option("--timeout", cluster_opt.timeout_s, "Seconds members get to exit after SIGTERM before SIGKILL")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
  bs::tools::RenderOptions render_opt;
  auto* cluster_render = cluster_action(
      "render", "Kubernetes manifests (kubernetes.yaml, secret.yaml) or a Slurm batch script (blendserve.sbatch) "
                "from F, into --out; the members take what differs per machine from BLENDSERVE_* variables");
  cluster_render->add_option("--target", render_opt.target, "kubernetes or slurm")
      ->required()
      ->check(CLI::IsMember({"kubernetes", "slurm"}));
  cluster_render->add_option("--out", render_opt.out_dir, "Directory for the files (made if missing)")->required();
  cluster_render->add_option("--image", render_opt.image, "kubernetes: the container image")->capture_default_str();
  cluster_render->add_option("--namespace", render_opt.namespace_name, "kubernetes: the namespace")
      ->capture_default_str();
  cluster_render->add_option("--cluster-domain", render_opt.cluster_domain, "kubernetes: the cluster's DNS domain")
      ->capture_default_str();
  cluster_render->add_option("--storage-class", render_opt.storage_class,
                             "kubernetes: the volume claims' storage class (default: the cluster's)");
  cluster_render->add_option("--nodes", render_opt.nodes,
                             "slurm: machines to ask for (default: one per distinct host of F; groups share "
                             "machines round-robin when fewer)")
      ->check(CLI::Range(1, 100000));
  cluster_render->add_option("--partition", render_opt.partition, "slurm: #SBATCH --partition");
  cluster_render->add_option("--time", render_opt.time_limit, "slurm: #SBATCH --time");
  cluster_render->add_option("--bin-dir", render_opt.bin_dir,
                             "slurm: where blendserve and blendctl are on the job's machines (default: this blendctl's "
                             "directory)");
  cluster_render->add_flag("--submit", render_opt.submit,
                           "slurm: sbatch the script, then wait until the frontend answers /health (JSON line with "
                           "its URL)");

  bs::tools::TopOptions top_opt;
  if (const char* k = std::getenv("BLENDSERVE_API_KEY")) top_opt.api_key = k;
  auto* top = app.add_subcommand("top", "A server's actors and requests, live in the terminal (q quits, s sorts, / filters)");
  top->add_option("--url", top_opt.url, "The server (http://HOST:PORT)")->capture_default_str();
  top->add_option("--api-key", top_opt.api_key, "Bearer token (default: $BLENDSERVE_API_KEY)");
  top->add_option("--interval", top_opt.interval_s, "Seconds between snapshots")->capture_default_str()->check(
      CLI::Range(0.1, 3600.0));
  top->add_option("--timeout", top_opt.timeout_s, "Seconds to wait for one snapshot")->capture_default_str()->check(
      CLI::Range(0.1, 600.0));
  top->add_flag("--once", top_opt.once, "Print one snapshot and exit (exit 1 if the server cannot be read)");
  top->add_flag("--json", top_opt.json, "With --once: the snapshot as one JSON line");

  bs::tools::EvalOptions eopt;
  auto* eval = app.add_subcommand("eval", "RAG quality of full/prefix/reuse/blend on a QA set (JSON lines)");
  std::string modes = "blend";
  eval->add_option("--dataset", eopt.dataset, "JSON lines {id, documents, question, answers}")->required();
  eval->add_option("--chat-template", eopt.chat_template,
                   "Jinja chat template file to render the chats with instead of the model's own");
  eval->add_option("--mode", modes, "full|prefix|reuse|blend, or a comma list (the full reference runs once)");
  auto* eval_ratio =
      eval->add_option("--ratio", eopt.ratio, "Blend recompute ratio")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  eval->add_option("--sweep-ratio", eopt.sweep_ratios,
                   "Blend recompute ratios, comma separated, each in (0,1]: the blend runs at each beside one full run "
                   "per case (full and blend are added to --mode); a summary per ratio and a final sweep line")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              size_t used = 0;
              const double r = std::stod(v, &used);
              if (used == v.size() && r > 0 && r <= 1) return std::string();
            } catch (const std::exception&) {
            }
            return "ratio '" + v + "' is not a number in (0,1]";
          },
          "RATIO in (0,1]"))
      ->excludes(eval_ratio);
  eval->add_option("--plot", eopt.plot_path,
                   "Write the ratio trade-off chart (quality and TTFT vs ratio, full dashed) as SVG; without "
                   "--sweep-ratio one point at --ratio");
  eval->add_option("--check-layers", eopt.check_layers, "Blend check layers (several = gradual filtering)")->capture_default_str();
  eval->add_option("--schedule", eopt.schedule, "Kept fractions after each check layer but the last");
  eval->add_option("--deviation", eopt.deviation, "What the blend compares: k, v or kv")
      ->check(CLI::IsMember({"k", "v", "kv"}))
      ->capture_default_str();
  eval->add_option("--quota", eopt.quota, "Recompute budget: global top-k or per-chunk shares")
      ->check(CLI::IsMember({"global", "per-chunk"}))
      ->capture_default_str();
  eval->add_option("--filtering", eopt.filtering, "single-pass (fresh KV kept while scoring) or two-pass")
      ->check(CLI::IsMember({"single-pass", "two-pass"}))
      ->capture_default_str();
  eval->add_option("--selection", eopt.selection,
                   "What ranks the candidates: deviation (loaded vs fresh KV), attention (the question's), impact (both), "
                   "query-first (the question's attention over every layer, in a pass of its own rows first)")
      ->check(CLI::IsMember({"deviation", "attention", "impact", "query-first"}))
      ->capture_default_str();
  eval->add_option("--sink-tokens", eopt.sink_tokens, "First tokens of each cached chunk always recomputed")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  eval->add_option("--query-first-from-layer", eopt.query_first_from_layer,
                   "First layer whose attention query-first sums (the last layer if past it)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  eval->add_option("--chunk-prelude", eopt.chunk_prelude,
                   "Text every chunk is computed behind and dropped (special tokens parsed)");
  eval->add_option("--reference-dir", eopt.reference_dir,
                   "Keep full's teacher-forced reference and greedy answer per case here and read them in later runs");
  eval->add_option("--forced-rows", eopt.forced_rows_path,
                   "Write each gold-answer row of each run here (JSON lines): the gold token, full's and its lead, the mode's");
  eval->add_option("--resume", eopt.resume_path,
                   "Case log: finished runs are read back from it (same settings only), new ones appended");
  eval->add_option("--max-cases", eopt.max_cases, "Evaluate at most N cases")->check(CLI::NonNegativeNumber);
  eval->add_option("--skip-cases", eopt.skip_cases, "Skip the first N cases")->check(CLI::NonNegativeNumber);
  eval->add_option("--max-tokens", eopt.max_tokens, "Answer length limit")->check(CLI::Range(1, 512));
  eval->add_flag("!--no-cases", eopt.print_cases, "Print only the summary lines");
  auto* pasted_flag = eval->add_flag(
      "--pasted", eopt.pasted,
      "Send each case's stored documents pasted into the message (no documents field): the runs use the chunks "
      "the pasted-chunk index finds; case lines say how much was found");
  eval->add_option("--paste-lead", eopt.paste_lead, "Text before the pasted passages (with --pasted)")->needs(pasted_flag);
  eval->add_flag("--match-only", eopt.match_only, "With --pasted: only report what was found, run no model pass")
      ->needs(pasted_flag);
  eval->add_flag("--reverse-documents", eopt.reverse_documents,
                 "Each case's documents in the reverse order (as a request after one that sent them in order)");
  eval->add_flag("--stored-in-context", eopt.stored_in_context,
                 "Store each chunk as the runtime's provisional entry is: its rows of a full prefill of the case in "
                 "its own order (K rotated back), not its KV computed alone");
  eval->add_option("--precision", precision)->check(CLI::IsMember({"auto", "bf16", "f32"}));
  eval->add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(kv_dtypes);

  CLI11_PARSE(app, argc, argv);
  opt.precision = topt.precision = eopt.precision = precision;
  opt.kv_dtype = topt.kv_dtype = eopt.kv_dtype = kv_dtype;
  topt.model_path = eopt.model_path = opt.model_path;
  topt.device = opt.device;
  if (opt.device.kind != "cpu" && !prefill->parsed() && !ttft->parsed() && !decode->parsed()) {
    std::cerr << "error: --device " << opt.device.kind << " applies to bench prefill, ttft and decode\n";
    return 2;
  }
  try {
    if (prefill->parsed()) return bs::tools::bench_prefill(opt);
    if (ttft->parsed() && !tiers.empty()) {
      ropt.ttft = topt;
      ropt.tiers = tiers;
      ropt.throttle_bytes_per_s = throttle_mbps * 1e6;
      return bs::tools::bench_ttft_runtime(ropt);
    }
    if (ttft->parsed()) return bs::tools::bench_ttft(topt);
    if (decode->parsed()) {
      dopt.model_path = opt.model_path;
      dopt.device = opt.device;
      dopt.precision = precision;
      dopt.kv_dtype = kv_dtype;
      return bs::tools::bench_decode(dopt);
    }
    if (tp->parsed()) {
      tpopt.model_path = opt.model_path;
      tpopt.precision = precision;
      tpopt.kv_dtype = kv_dtype;
      return bs::tools::bench_tp(tpopt);
    }
    if (memory->parsed()) {
      mopt.model_path = opt.model_path;
      mopt.device = opt.device;
      mopt.precision = precision;
      mopt.kv_dtype = kv_dtype;
      return bs::tools::bench_memory(mopt);
    }
    if (gemv->parsed()) {
      if (!gemv_shapes.empty()) gopt.shapes.clear();
      for (const auto& sh : gemv_shapes) {
        const auto x = sh.find('x');
        size_t used_rows = 0, used_in = 0;
        int64_t rows = 0, in = 0;
        try {
          rows = std::stoll(sh.substr(0, x), &used_rows);
          in = std::stoll(sh.substr(x + 1), &used_in);
        } catch (const std::exception&) {
        }
        if (x == std::string::npos || used_rows != x || used_in != sh.size() - x - 1 || rows <= 0 || in <= 0)
          throw std::invalid_argument("--shapes: '" + sh + "' is not ROWSxIN with positive numbers");
        gopt.shapes.emplace_back(rows, in);
      }
      return bs::tools::bench_gemv(gopt);
    }
    if (text->parsed()) {
      xopt.model_path = opt.model_path;
      return bs::tools::bench_text(xopt);
    }
    if (make_random->parsed()) {
      const auto type = random_weights == "q4_0"   ? bs::kernels::TensorType::Q4_0
                        : random_weights == "bf16" ? bs::kernels::TensorType::BF16
                                                   : bs::kernels::TensorType::Q4_K;
      bs::write_random_llama(bs::random_llama_shape(random_shape), random_out, 1, type);
      std::cerr << "wrote " << random_out << "\n";
      return 0;
    }
    if (remote->parsed()) return bs::tools::bench_remote(remote_opt);
    if (control->parsed()) return bs::tools::bench_control(control_opt);
    if (serve->parsed()) {
      sopt.model_path = opt.model_path;
      return bs::tools::bench_serve(sopt);
    }
    if (top->parsed()) return bs::tools::run_top(top_opt);
    if (cluster_init->parsed()) return bs::tools::cluster_init(cluster_opt);
    if (cluster_up->parsed()) return bs::tools::cluster_up(cluster_opt);
    if (cluster_status->parsed()) return bs::tools::cluster_status(cluster_opt);
    if (cluster_down->parsed()) return bs::tools::cluster_down(cluster_opt);
    if (cluster_render->parsed()) return bs::tools::cluster_render(cluster_opt, render_opt);
    if (trace->parsed()) {
      if (trace_json) tropt.format = "json";
      return bs::tools::print_trace(tropt);
    }
    if (eval->parsed()) {
      eopt.modes.clear();
      std::string m;
      for (char ch : modes + ",") {
        if (ch == ',') {
          if (!m.empty()) eopt.modes.push_back(m);
          m.clear();
        } else {
          m += ch;
        }
      }
      return bs::tools::eval_rag(eopt);
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
