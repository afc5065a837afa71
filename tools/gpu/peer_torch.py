#!/usr/bin/env python3
"""The PyTorch peer of blendctl's GPU benchmarks (issue 19): the same Llama shapes in
the same precision, run by PyTorch eager on the same machine, printing the same JSON
lines as `blendctl bench prefill` / `blendctl bench decode` (one object per line on
stdout, progress on stderr), plus "engine": "torch" and "torch_version".

    peer_torch.py gemm-peak [--gemm-size 8192]
    peer_torch.py prefill --model random:llama-3.1-8b --tokens 3072 8192 --repeats 3
    peer_torch.py decode --model random:llama-3.2-1b --streams 1 32 --tokens 64 \
        --prompt-tokens 256 --repeats 2 [--cuda-graphs]
    peer_torch.py check                  # the tiny shape on the CPU: cache and batch paths agree

The model: a Llama decoder in bf16 (default) with random weights (seeded; uniform with
standard deviation 1/sqrt(fan-in) and unit norm weights, as model/random_model.cpp
writes them, so activations stay finite): RMSNorm, rotate-half RoPE, fused QKV and
gate/up projections (the same GEMM shapes as our LlamaModel), GQA attention through
torch.nn.functional.scaled_dot_product_attention (is_causal for the prefill; a decode
step folds each KV head's query group into the query axis and attends over the cache,
so K/V are never repeated), SwiGLU, an LM head tied to the embedding, and logits of the
last token only for a prefill (as Transformer::forward without all_logits). KV caches
are preallocated static tensors [streams, kv_heads, max_len, head_dim] per layer.
Speed only: the tokens it writes mean nothing.

What each mode prints (the fields of bench_prefill.cpp / bench_decode.cpp, "isa" and
"kernel" saying torch-eager/sdpa, then the peer's own):
- gemm-peak: {"bench":"gemm","shape":"square","m","k","n","gflops",...} (+ "tflops",
  "seconds": the best of --repeats after a warm-up, on the constant operands ours uses).
- prefill: that square GEMM (on a GPU; MFU's denominator), the model-shape GEMMs at
  --gemm-rows rows ("qkv", "o", "gate_up", "down", "layer_mix"), then per length
  {"bench":"prefill","tokens","seconds" (median),"tokens_per_s","mfu",...}
  (+ "seconds_min", "tokens_per_s_best", "mfu_best", "flops_per_token" (GEMMs, no LM
  head, plus causal attention, as ours counts), "achieved_tflops", "peak_gflops").
- decode: per stream count {"bench":"decode","streams","decode_tok_s" (the best
  repeat),"window_tokens" (streams x (tokens - 1): the decode steps after every first
  token),...} (+ "decode_tok_s_median", "host_sync_each_step"), then "decode_summary".
  The greedy tokens stay on the device between steps unless --sync-each-step.
  "kernel" says torch-eager/sdpa, or torch-cudagraph/sdpa with --cuda-graphs; every
  decode line carries "cuda_graphs" (false or true), so eager and graph lines pair.
- check: prefill vs cached decode vs batched decode, and the static decode step (the
  body --cuda-graphs captures; replayed as a CUDA graph where the device is a GPU)
  against eager steps: {"bench":"check","ok",...}.

--cuda-graphs (decode on a GPU only; on a CPU it exits 2): the strongest PyTorch decode,
a step of all streams captured once per stream count as a torch.cuda.CUDAGraph and
replayed, one graph launch per step with no host work between steps. Everything the
graph touches is static: the token ids [streams, 1], the step's position (a device
tensor [1]), the KV caches, the RoPE tables, the logits and the greedy argmax (written
in place, then copied into the ids, and the position incremented, inside the graph: a
replay is the whole step). The position is never a Python int in the graph: RoPE reads
cos/sin rows by index_select at it, the new K/V go into the cache by index_copy_ at it,
and attention runs over the whole static cache [.., max_len, ..] with a mask
(key position <= the step's) built from it on the device, so a replay attends to
exactly the tokens an eager step at that position would. The price of static shapes:
each step reads max_len cached positions (prompt + tokens + 1, rounded up to 16),
where eager reads the ones so far. Capture follows torch.cuda's docs: three warm-up
steps on a side stream first (cuBLAS, SDPA's choice, the allocator), then the capture;
the warm-up's cache writes are overwritten by the prompts' prefill and later steps
(the mask never lets a step read a position not yet written). The prompts are
prefilled eagerly into the graph's cache rows, as in eager mode.

Only torch and the standard library. `--device cpu` runs anywhere (slowly: use
`--model random:tiny`, a shape of this script's own for smoke tests); `--dtype f32`
where bf16 matmuls on a CPU are too slow.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the caller (tests/peer_torch_test.py, gpu_check.sh) checks first
    print(f"peer_torch.py: PyTorch is not importable: {e}", file=sys.stderr)
    sys.exit(2)

# The model itself (torch_llama.py, beside this file).
from torch_llama import (KvCache, Llama, StaticDecoder, attention_flops,  # noqa: E402
                         gemm_flops_per_token, random_ids)

# The shapes by the names blendctl takes as --model random:NAME: a copy of the table in
# model/random_model.cpp (known()); keep the two in step. "tiny" is this script's own
# (not in random_model.cpp): two layers for smoke tests on a CPU.
SHAPES = {
    "smollm2-135m": dict(layers=30, dim=576, ff=1536, heads=9, kv_heads=3, vocab=49152, rope_theta=100000.0),
    "llama-3.2-1b": dict(layers=16, dim=2048, ff=8192, heads=32, kv_heads=8, vocab=128256, rope_theta=500000.0),
    "llama-3.1-8b": dict(layers=32, dim=4096, ff=14336, heads=32, kv_heads=8, vocab=128256, rope_theta=500000.0),
    "tiny": dict(layers=2, dim=128, ff=256, heads=4, kv_heads=2, vocab=512, rope_theta=10000.0),
}
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
KERNEL = "torch-eager/sdpa"  # what "isa" / "kernel" say for the peer
KERNEL_GRAPHS = "torch-cudagraph/sdpa"  # decode --cuda-graphs


def shape_of(model):
    prefix = "random:"
    if not model.startswith(prefix) or model[len(prefix):] not in SHAPES:
        known = ", ".join(prefix + n for n in SHAPES)
        raise SystemExit(f"peer_torch.py: --model {model}: unknown (known: {known})")
    return SHAPES[model[len(prefix):]]


def emit(obj):
    print(json.dumps(obj), flush=True)


class Progress:
    """tools/cli/progress.h's line on stderr: "label: done/total, E s elapsed, ETA R s"."""

    def __init__(self, label, total):
        self.label, self.total, self.done, self.t0 = label, total, 0, time.perf_counter()

    def tick(self, n=1):
        self.done += n
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        print(f"{self.label}: {self.done}/{self.total}, {elapsed:.0f} s elapsed, ETA {eta:.0f} s",
              file=sys.stderr, flush=True)


class Env:
    """The device, dtype and the fields every JSON line carries."""

    def __init__(self, args):
        want = args.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("peer_torch.py: --device cuda: no CUDA device visible to PyTorch")
            self.device = torch.device("cuda", args.gpu)
            torch.cuda.set_device(self.device)
            self.device_name = torch.cuda.get_device_name(self.device)
        else:
            self.device = torch.device("cpu")
            self.device_name = "cpu"
        self.dtype_name = args.dtype
        self.dtype = DTYPES[args.dtype]
        if getattr(args, "threads", 0):
            torch.set_num_threads(args.threads)

    def is_cuda(self):
        return self.device.type == "cuda"

    def sync(self):
        if self.is_cuda():
            torch.cuda.synchronize(self.device)

    def now(self):
        self.sync()
        return time.perf_counter()

    def common(self):
        return {"engine": "torch", "torch_version": torch.__version__, "device": self.device_name}


def square_gemm(env, n, repeats):
    """bench_prefill.cpp's square_gemm_gflops: an n^3 bf16 product, one warm-up then the
    best of `repeats`; the same constant operands (weights bf16 0x3c00, inputs 0.5)."""
    a = torch.full((n, n), 0.5, dtype=env.dtype, device=env.device)
    w = torch.full((n, n), 0.0078125, dtype=env.dtype, device=env.device)
    out = torch.empty((n, n), dtype=env.dtype, device=env.device)
    best = math.inf
    for rep in range(repeats + 1):
        t0 = env.now()
        torch.matmul(a, w.t(), out=out)
        t = env.now() - t0
        if rep > 0:
            best = min(best, t)
    del a, w, out
    return 2.0 * n * n * n / best / 1e9, best


def emit_square(env, n, repeats):
    gflops, best = square_gemm(env, n, repeats)
    emit({"bench": "gemm", "isa": KERNEL, "device": env.device_name, "precision": env.dtype_name,
          "shape": "square", "m": n, "k": n, "n": n, "gflops": gflops, "tflops": gflops / 1e3,
          "seconds": best, "repeats": repeats, **env.common()})
    return gflops


def cmd_gemm_peak(args):
    env = Env(args)
    print(f"peer_torch gemm-peak: {args.gemm_size}^3 {env.dtype_name} on {env.device_name}", file=sys.stderr)
    with torch.inference_mode():
        emit_square(env, args.gemm_size, args.repeats)
    return 0


# ---------------------------------------------------------------------------------------
# prefill


def layer_gemms(env, model, rows):
    """bench_prefill.cpp's GEMMs on the model's shapes at `rows` rows (5 timed runs after a
    warm-up each), and their mix: the layer's GEMM FLOPs over their summed times."""
    L = model.layers[0]
    flops = secs = 0.0
    for name in ("wqkv", "wo", "w_gate_up", "w_down"):
        w = L[name]
        out_f, in_f = w.shape
        x = torch.full((rows, in_f), 0.5, dtype=env.dtype, device=env.device)
        F.linear(x, w)
        reps = 5
        t0 = env.now()
        for _ in range(reps):
            F.linear(x, w)
        t = (env.now() - t0) / reps
        f = 2.0 * rows * in_f * out_f
        flops += f
        secs += t
        emit({"bench": "gemm", "isa": KERNEL, "device": env.device_name, "precision": env.dtype_name,
              "shape": {"wqkv": "qkv", "wo": "o", "w_gate_up": "gate_up", "w_down": "down"}[name],
              "m": rows, "k": in_f, "n": out_f, "gflops": f / t / 1e9, **env.common()})
    mix = flops / secs / 1e9
    emit({"bench": "gemm", "isa": KERNEL, "device": env.device_name, "precision": env.dtype_name,
          "shape": "layer_mix", "m": rows, "gflops": mix, **env.common()})
    return mix


def cmd_prefill(args):
    env = Env(args)
    shape = shape_of(args.model)
    print(f"peer_torch prefill: {args.model} {env.dtype_name} on {env.device_name}, torch {torch.__version__}",
          file=sys.stderr, flush=True)
    with torch.inference_mode():
        peak = args.peak_gflops
        gemm_size = args.gemm_size if args.gemm_size is not None else (8192 if env.is_cuda() else 0)
        if not peak and gemm_size > 0:
            peak = emit_square(env, gemm_size, 5)
        model = Llama(shape, env.device, env.dtype, seed=args.seed)
        mix = layer_gemms(env, model, args.gemm_rows) if args.gemm_rows > 0 else 0.0
        gemm_per_token = gemm_flops_per_token(shape)
        progress = Progress("peer_torch prefill", len(args.tokens) * (args.warmup + args.repeats))
        for i, n in enumerate(args.tokens):
            ids = random_ids((1, n), shape["vocab"], args.seed + 1000 + i, env.device)
            cache = KvCache(model, 1, n)
            model.rope_tables(n)
            times = []
            for rep in range(args.warmup + args.repeats):
                t0 = env.now()
                logits = model.forward(ids, cache)
                t = env.now() - t0
                if rep >= args.warmup:
                    times.append(t)
                progress.tick()
            finite = bool(torch.isfinite(logits).all())
            t = statistics.median(times)
            t_min = min(times)
            flops = gemm_per_token * n + attention_flops(shape, n)
            gemm_gflops = gemm_per_token * n / t / 1e9
            emit({"bench": "prefill", "isa": KERNEL, "device": env.device_name, "model": args.model,
                  "precision": env.dtype_name, "kv_dtype": env.dtype_name, "tokens": n,
                  "seconds": t, "tokens_per_s": n / t,
                  "gemm_gflops_effective": gemm_gflops,
                  "gemm_share_of_layer_mix": gemm_gflops / mix if mix > 0 else None,
                  # Model FLOPs utilization against the square GEMM's rate (as bench_prefill).
                  "mfu": flops / t / 1e9 / peak if peak else None,
                  "threads": torch.get_num_threads(), "breakdown_last_run": None,
                  # The peer's own: min and median over the repeats, the FLOPs counted.
                  "seconds_median": t, "seconds_min": t_min, "tokens_per_s_best": n / t_min,
                  "mfu_best": flops / t_min / 1e9 / peak if peak else None,
                  "flops_per_token": flops / n, "achieved_tflops": flops / t / 1e12,
                  "peak_gflops": peak or None, "repeats": args.repeats, "warmup": args.warmup,
                  "logits_finite": finite, **env.common()})
            del cache
    return 0


# ---------------------------------------------------------------------------------------
# decode


def run_streams(env, model, streams, tokens, prompt_tokens, seed, sync_each_step, decoder=None):
    """bench_decode.cpp's run_streams: `streams` greedy sequences, each after its own
    prompt of `prompt_tokens` random ids. The prompts are prefilled one after another
    (each token brought to the host: its first token), then all streams step together,
    `tokens` - 1 decode steps; the window is from the last first token to the end.
    With `decoder` (a StaticDecoder of `streams` rows, a CUDA graph) the prompts go into
    its cache and each decode step is one replay; else eager Llama.forward steps."""
    shape = model.shape
    ids = random_ids((streams, prompt_tokens), shape["vocab"], seed, env.device)
    if decoder is not None:
        cache = decoder.cache
        if cache.k[0].shape[0] != streams or cache.max_len < prompt_tokens + tokens:
            raise ValueError("the graph decoder's cache does not fit this run")
    else:
        cache = KvCache(model, streams, prompt_tokens + tokens + 1)
    model.rope_tables(cache.max_len)  # built here, not inside the timed window
    first = []
    t_submit = env.now()
    t_first = None
    for b in range(streams):
        logits = model.forward(ids[b:b + 1], cache, rows=slice(b, b + 1))
        first.append(logits.argmax(-1))
        first[-1].item()  # on the host, as a server's first token is
        if t_first is None:
            t_first = time.perf_counter()
    t_start = time.perf_counter()
    ttft_max = t_start - t_submit
    nxt = torch.cat(first)
    if decoder is not None:
        decoder.begin(nxt, prompt_tokens)
        for i in range(tokens - 1):
            nxt = decoder.step()
            if sync_each_step:
                nxt.tolist()
    else:
        for i in range(tokens - 1):
            logits = model.forward(nxt[:, None], cache, start=prompt_tokens + i)
            nxt = logits.argmax(-1)
            if sync_each_step:
                nxt.tolist()
    t_end = env.now()
    window_s = t_end - t_start
    window_tokens = streams * (tokens - 1)
    span = t_end - t_first
    return {"decode_tok_s": window_tokens / window_s if window_s > 0 else 0.0, "window_s": window_s,
            "window_tokens": window_tokens, "span_tok_s": window_tokens / span if span > 0 else 0.0,
            "mean_batch": float(streams), "ttft_max_s": ttft_max}


def graph_cache_len(prompt_tokens, tokens):
    """A graph decoder's cache: the eager run's length rounded up to 16 (SDPA's
    memory-efficient kernel wants the mask's last dimension aligned)."""
    return (prompt_tokens + tokens + 1 + 15) // 16 * 16


def cmd_decode(args):
    env = Env(args)
    if args.cuda_graphs and not env.is_cuda():
        print(f"peer_torch.py: decode --cuda-graphs needs a CUDA device (torch.cuda.CUDAGraph); the device is "
              f"{env.device_name} (--device {args.device})", file=sys.stderr)
        return 2
    shape = shape_of(args.model)
    if args.tokens < 2:
        raise SystemExit("peer_torch.py: --tokens: at least 2")
    kernel = KERNEL_GRAPHS if args.cuda_graphs else KERNEL
    print(f"peer_torch decode: {args.model} {env.dtype_name} on {env.device_name}, torch {torch.__version__}"
          f"{', CUDA graphs' if args.cuda_graphs else ''}", file=sys.stderr, flush=True)
    most = max(args.streams)
    rates = []
    with torch.inference_mode():
        model = Llama(shape, env.device, env.dtype, seed=args.seed)
        progress = Progress("peer_torch decode", len(args.streams) * args.repeats)
        for n in args.streams:
            # The graph of this stream count (warm-up and capture, outside every window).
            decoder = None
            if args.cuda_graphs:
                decoder = StaticDecoder(model, n, graph_cache_len(args.prompt_tokens, args.tokens), graph=True)
            # Warm-up at this stream count: cuBLAS heuristics, the allocator's pools.
            run_streams(env, model, n, min(args.tokens, 8), args.prompt_tokens, 99, args.sync_each_step, decoder)
            runs = []
            for rep in range(args.repeats):
                runs.append(run_streams(env, model, n, args.tokens, args.prompt_tokens,
                                        args.seed + 1 + rep * most, args.sync_each_step, decoder))
                progress.tick()
            del decoder
            best = max(runs, key=lambda r: r["decode_tok_s"])
            rates.append(best["decode_tok_s"])
            emit({"bench": "decode", "streams": n, "tokens": args.tokens, "prompt_tokens": args.prompt_tokens,
                  "decode_tok_s": best["decode_tok_s"], "per_stream_tok_s": best["decode_tok_s"] / n,
                  "window_s": best["window_s"], "window_tokens": best["window_tokens"],
                  "span_tok_s": best["span_tok_s"], "mean_batch": best["mean_batch"], "interleaved_steps": 0,
                  "ttft_max_s": best["ttft_max_s"], "early_stops": 0, "max_decode_batch": most,
                  "repeats": args.repeats, "kernel": kernel, "device": env.device_name, "model": args.model,
                  "kv_dtype": env.dtype_name, "threads": torch.get_num_threads(),
                  # The peer's own: the median over the repeats, precision, host syncs, graphs.
                  "decode_tok_s_median": statistics.median(r["decode_tok_s"] for r in runs),
                  "precision": env.dtype_name, "host_sync_each_step": args.sync_each_step,
                  "cuda_graphs": args.cuda_graphs, **env.common()})
    emit({"bench": "decode_summary", "streams": args.streams, "decode_tok_s": rates,
          "ratio_last_vs_first": rates[-1] / rates[0] if rates[0] > 0 else 0, "kernel": kernel,
          "device": env.device_name, "model": args.model, "target": None, "cuda_graphs": args.cuda_graphs,
          **env.common()})
    return 0


# ---------------------------------------------------------------------------------------
# check


def cmd_check(args):
    """The paths agree on one model: a prefill of n tokens against a prefill of n-1 and a
    decode step of the last (causal SDPA vs attention over the cache), two streams
    decoded together against each alone (the batched step), and the static step of
    decode --cuda-graphs (position and attention length from device tensors; replayed
    as a CUDA graph on a GPU, run eagerly on a CPU) against eager steps over three
    positions (a length frozen at capture would differ from the second on)."""
    env = Env(args)
    shape = shape_of(args.model)
    n = args.prompt_tokens
    tol = 1e-3 if env.dtype == torch.float32 else 5e-2
    with torch.inference_mode():
        model = Llama(shape, env.device, env.dtype, seed=args.seed)
        ids = random_ids((2, n), shape["vocab"], args.seed + 7, env.device)
        full = model.forward(ids[:1], KvCache(model, 1, n)).float()
        scale = full.abs().max().item()
        cache = KvCache(model, 1, n)
        model.forward(ids[:1, :n - 1], cache)
        stepped = model.forward(ids[:1, n - 1:], cache, start=n - 1).float()
        d_prefill = (full - stepped).abs().max().item()
        # Two streams: prefill each into its row, then three decode steps together.
        both = KvCache(model, 2, n + 4)
        alone = [KvCache(model, 1, n + 4) for _ in range(2)]
        nxt, nxt_alone = [], []
        for b in range(2):
            nxt.append(model.forward(ids[b:b + 1], both, rows=slice(b, b + 1)).argmax(-1))
            nxt_alone.append(model.forward(ids[b:b + 1], alone[b]).argmax(-1))
        nxt = torch.cat(nxt)
        d_batch = 0.0
        for i in range(3):
            lb = model.forward(nxt[:, None], both, start=n + i).float()
            la = torch.cat([model.forward(nxt_alone[b][:, None], alone[b], start=n + i) for b in range(2)]).float()
            d_batch = max(d_batch, (lb - la).abs().max().item())
            nxt = lb.argmax(-1)
            nxt_alone = [nxt[b:b + 1] for b in range(2)]  # the same tokens on both paths
        # The static step against eager steps, fed the same tokens (the static path's
        # argmax, so a near tie cannot make the two diverge).
        dec = StaticDecoder(model, 2, graph_cache_len(n, 4), graph=env.is_cuda())
        eager = KvCache(model, 2, n + 4)
        first = []
        for b in range(2):
            model.forward(ids[b:b + 1], dec.cache, rows=slice(b, b + 1))
            first.append(model.forward(ids[b:b + 1], eager, rows=slice(b, b + 1)).argmax(-1))
        nxt = torch.cat(first)
        dec.begin(nxt, n)
        d_static = 0.0
        for i in range(3):
            le = model.forward(nxt[:, None], eager, start=n + i).float()
            nxt = dec.step().clone()
            d_static = max(d_static, (dec.logits.float() - le).abs().max().item())
        static_pos = int(dec.pos.item())
        finite = bool(torch.isfinite(full).all())
    ok = (finite and scale > 0 and d_prefill <= tol * scale and d_batch <= tol * scale and
          d_static <= tol * scale and static_pos == n + 3)
    emit({"bench": "check", "model": args.model, "precision": env.dtype_name, "prompt_tokens": n,
          "logit_max_abs": scale, "prefill_vs_decode_max_abs_diff": d_prefill,
          "batch_vs_single_max_abs_diff": d_batch, "static_vs_eager_max_abs_diff": d_static,
          "static_step_cuda_graph": env.is_cuda(), "tolerance": tol * scale, "logits_finite": finite,
          "ok": ok, **env.common()})
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------


def positive(v):
    i = int(v)
    if i < 1:
        raise argparse.ArgumentTypeError(f"{v}: must be at least 1")
    return i


def main(argv=None):
    def add_common(parser, device="auto", dtype="bf16"):
        # Added to each subcommand's parser on its own (not argparse parents, whose
        # actions the subcommands would share, defaults included).
        parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default=device,
                            help=f"where to run (default {device}: auto is cuda when PyTorch sees a GPU, else cpu)")
        parser.add_argument("--gpu", type=int, default=0, help="CUDA device index")
        parser.add_argument("--dtype", choices=sorted(DTYPES), default=dtype,
                            help=f"weights, activations and KV (default {dtype}; f32 where a CPU's bf16 is too slow)")
        parser.add_argument("--threads", type=int, default=0, help="CPU threads (torch.set_num_threads; 0: torch's)")
        parser.add_argument("--seed", type=int, default=1, help="weights and prompts")
        return parser

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = add_common(sub.add_parser("gemm-peak", help="the bf16 GEMM peak: a square n^3 product, TFLOP/s"))
    g.add_argument("--gemm-size", type=positive, default=8192)
    g.add_argument("--repeats", type=positive, default=5, help="timed products after a warm-up (the best)")

    pf = add_common(sub.add_parser("prefill", help="full prefill tokens/s and MFU (bench prefill)"))
    pf.add_argument("--model", default="random:llama-3.1-8b", help="random:NAME (" + ", ".join(SHAPES) + ")")
    pf.add_argument("--tokens", "--lengths", type=positive, nargs="+", default=[3072, 8192], dest="tokens")
    pf.add_argument("--repeats", type=positive, default=3, help="timed prefills per length (min and median)")
    pf.add_argument("--warmup", type=int, default=1, help="untimed prefills per length first")
    pf.add_argument("--gemm-size", type=int, default=None,
                    help="square GEMM for the peak (MFU); default 8192 on a GPU, 0 (none) on the CPU")
    pf.add_argument("--peak-gflops", type=float, default=0.0, help="a peak measured before (skips the square GEMM)")
    pf.add_argument("--gemm-rows", type=int, default=3072, help="rows of the model-shape GEMMs (0: none)")

    d = add_common(sub.add_parser("decode", help="N concurrent greedy streams, tokens/s (bench decode)"))
    d.add_argument("--model", default="random:llama-3.2-1b", help="random:NAME (" + ", ".join(SHAPES) + ")")
    d.add_argument("--streams", type=positive, nargs="+", default=[1, 32])
    d.add_argument("--tokens", type=positive, default=64, help="generated per stream")
    d.add_argument("--prompt-tokens", type=positive, default=256, help="prompt per stream")
    d.add_argument("--repeats", type=positive, default=1, help="runs per stream count (the fastest is reported)")
    d.add_argument("--sync-each-step", action="store_true",
                   help="bring each step's tokens to the host (as a server streaming text must)")
    d.add_argument("--cuda-graphs", action="store_true",
                   help="each decode step a replay of a CUDA graph captured per stream count (a GPU only)")

    c = add_common(sub.add_parser("check", help="prefill, cached decode and batched decode agree"),
                   device="cpu", dtype="f32")
    c.add_argument("--model", default="random:tiny")
    c.add_argument("--prompt-tokens", type=positive, default=17)

    args = p.parse_args(argv)
    if args.cmd == "prefill" and args.warmup < 0:
        p.error("--warmup: at least 0")
    return {"gemm-peak": cmd_gemm_peak, "prefill": cmd_prefill, "decode": cmd_decode, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
