#!/usr/bin/env python3
"""KV reuse without `documents`, through the HTTP API: automatic prefix caching.

Starts `blendserve serve` on the given model (and, with --llama-server, llama.cpp's
own llama-server on the same GGUF with its prompt cache and `--cache-reuse 256`), then
drives each with the official OpenAI client, streaming, greedy:

  chat       a conversation of --turns turns over a long system prompt (notes of ~650
             tokens); each turn's time to first token (TTFT) on the server that ran
             the turns before, and, for blendserve, on a cold server (a fresh one per
             turn, the same messages: what no reuse costs)
  identical  one request, then the same request again --identical-repeats times: the
             median of those TTFTs (one sample scatters by as much as the two engines
             differ: ~10 ms on 2 vCPUs)
  pasted     six retrieved passages (MuSiQue-like, from tests/data/rag_qa_small.jsonl)
             pasted into a plain message, then, --learn-wait seconds later (blendserve
             learns pasted passages in the background), the same passages reversed
             with another question: the second's TTFT

Progress on stderr, one JSON object per measurement on stdout:
  {"engine":"blendserve","workload":"chat","turn":4,"prompt_tokens":...,"cached_tokens":...,"ttft_s":...}
  {"engine":"blendserve","workload":"chat","turn":4,"cold":true,"ttft_s":...}
  {"ratio":"blendserve/llama-server","workload":"chat","turn":4,"value":...}
Medians of --repeats runs (each run on fresh servers, the engines one after the other).
--workloads picks some of them; --server given twice compares two blendserve binaries
in the same runs (an A/B of a change: each is named by its path).

    .venv-test/bin/python tools/bench/bench_prefix_cache.py --server build/blendserve \
        [--llama-server build-llamacpp/build/bin/llama-server] [--model models/X.gguf]
    .venv-test/bin/python tools/bench/bench_prefix_cache.py --server A/blendserve --server B/blendserve \
        --llama-server build-llamacpp/build/bin/llama-server --workloads identical --identical-repeats 20
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from serve_process import ServeProcess  # noqa: E402

QUESTIONS = ["Which shelf holds item 91?", "And which row is it in?", "Which item is on shelf 3, row 1?",
             "List two items on shelf 5.", "Which note mentions item 140?", "Thank you. Which row holds item 7?"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def notes_prompt():
    notes = "\n".join("Note %d: the archive lists item %d under shelf %d, row %d." % (i, 7 * i, i % 9, i % 4)
                      for i in range(48))
    return {"role": "system", "content": "You answer from these notes.\n" + notes}


class BlendServe(ServeProcess):
    def __init__(self, binary, model, block_tokens):
        args = ("--model", model) if model else ()
        config = "limits:\n  max_requests: 1\n"
        if block_tokens is not None:
            config += "blend:\n  prefix_block_tokens: %d\n" % block_tokens
        super().__init__(binary, config, prefix="bs_bench_prefix_", args=args)


def pasted_cases():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "rag_qa_small.jsonl")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    docs = [d.replace("\n\n", "\n") for d in rows[0]["documents"][:6]]
    return docs, rows[0]["question"], rows[1]["question"]


def pasted_message(docs, question):
    return [{"role": "user", "content": "Use these passages.\n\n" + "".join(d + "\n\n" for d in docs) + question}]


class LlamaServer:
    """llama.cpp's llama-server: one slot, its prompt cache on, --cache-reuse 256."""

    def __init__(self, binary, model, threads):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        # The port is free between close and llama-server's bind; a collision is a failed
        # start below (this is a benchmark, run alone), never a wrong number.
        self.proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t",
                                      str(threads), "-c", "4096", "-np", "1", "--cache-reuse", "256"],
                                     stdout=self.log, stderr=self.log)
        self.base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("llama-server exited: " + self.log.read().decode(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def ask(base, model, messages, max_tokens):
    """Streams one greedy answer; returns (ttft_s, text, usage)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    stream = c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    return (ttft if ttft is not None else time.perf_counter() - t0), text, usage


def model_id(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def cached_of(usage):
    d = getattr(usage, "prompt_tokens_details", None) if usage else None
    return getattr(d, "cached_tokens", None) if d else None


def run_engine(name, start, turns, max_tokens, cold, learn_wait, identical_repeats, workloads):
    """One run of the workloads on fresh servers: {(workload, turn): row}."""
    rows = {}
    server = start()
    try:
        model = model_id(server.base)
        conversation = [notes_prompt()]
        for t in range(turns if "chat" in workloads else 0):
            conversation.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            ttft, text, usage = ask(server.base, model, conversation, max_tokens)
            rows[("chat", t + 1)] = {"ttft_s": ttft, "prompt_tokens": usage.prompt_tokens if usage else None,
                                     "cached_tokens": cached_of(usage)}
            conversation.append({"role": "assistant", "content": text})
        one = [notes_prompt(), {"role": "user", "content": QUESTIONS[-1]}]
        if "identical" in workloads:
            ask(server.base, model, one, max_tokens)
            again = [ask(server.base, model, one, max_tokens) for _ in range(identical_repeats)]
            usage = again[-1][2]
            rows[("identical", 2)] = {"ttft_s": statistics.median(a[0] for a in again),
                                      "ttft_each_s": [round(a[0], 4) for a in again],
                                      "prompt_tokens": usage.prompt_tokens if usage else None,
                                      "cached_tokens": cached_of(usage)}
        if "pasted" in workloads:
            docs, q1, q2 = pasted_cases()
            ask(server.base, model, pasted_message(docs, q1), max_tokens)
            time.sleep(learn_wait)
            ttft, _, usage = ask(server.base, model, pasted_message(list(reversed(docs)), q2), max_tokens)
            rows[("pasted", 2)] = {"ttft_s": ttft, "prompt_tokens": usage.prompt_tokens if usage else None,
                                   "cached_tokens": cached_of(usage)}
    finally:
        server.stop()
    if cold and "chat" in workloads:
        # The same turns on a fresh server each: nothing to reuse (what they cost cold).
        conversation = [notes_prompt()]
        for t in range(turns):
            conversation.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            fresh = start()
            try:
                model = model_id(fresh.base)
                ttft, text, _ = ask(fresh.base, model, conversation, max_tokens)
            finally:
                fresh.stop()
            rows[("chat-cold", t + 1)] = {"ttft_s": ttft}
            conversation.append({"role": "assistant", "content": text})
    log("%s: %s" % (name, ", ".join("%s %d %.3f s" % (w, t, r["ttft_s"]) for (w, t), r in sorted(rows.items()))))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, action="append",
                    help="the blendserve binary (twice: an A/B of two binaries, named by their paths)")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (optional)")
    ap.add_argument("--model", help="GGUF (default: blendserve's embedded default, SmolLM2)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--block-tokens", type=int, help="blendserve's blend.prefix_block_tokens (default: its own)")
    ap.add_argument("--identical-repeats", type=int, default=10,
                    help="times the identical request is sent again (default 10; the median is reported)")
    ap.add_argument("--workloads", nargs="+", choices=["chat", "identical", "pasted"],
                    default=["chat", "identical", "pasted"])
    ap.add_argument("--learn-wait", type=float, default=2.0,
                    help="seconds between the pasted workload's two requests (default 2)")
    args = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    model = args.model or os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    names = ["blendserve"] if len(args.server) == 1 else args.server
    engines = [(name, lambda b=binary: BlendServe(b, args.model, args.block_tokens), True)
               for name, binary in zip(names, args.server)]
    if args.llama_server:
        engines.append(("llama-server", lambda: LlamaServer(args.llama_server, model, args.threads), False))
    results = {}
    for rep in range(args.repeats):
        for name, start, cold in engines:
            log("run %d/%d: %s" % (rep + 1, args.repeats, name))
            for key, row in run_engine(name, start, args.turns, args.max_tokens, cold, args.learn_wait,
                                       args.identical_repeats, args.workloads).items():
                results.setdefault((name,) + key, []).append(row)
    medians = {}
    for (name, workload, turn), rows in sorted(results.items()):
        out = {"engine": name, "workload": workload.replace("-cold", ""), "turn": turn}
        if workload.endswith("-cold"):
            out["cold"] = True
        out["ttft_s"] = statistics.median(r["ttft_s"] for r in rows)
        for k in ("prompt_tokens", "cached_tokens"):
            if rows[0].get(k) is not None:
                out[k] = rows[-1][k]
        if "ttft_each_s" in rows[0]:
            out["ttft_each_s"] = [r["ttft_each_s"] for r in rows]
        out["repeats"] = len(rows)
        medians[(name, workload, turn)] = out["ttft_s"]
        print(json.dumps(out), flush=True)
    for (name, workload, turn), v in sorted(medians.items()):
        if name not in names:
            continue
        if ("llama-server", workload, turn) in medians:
            print(json.dumps({"ratio": name + "/llama-server", "workload": workload, "turn": turn,
                              "value": v / medians[("llama-server", workload, turn)]}), flush=True)
        if workload == "chat" and (name, "chat-cold", turn) in medians:
            print(json.dumps({"ratio": "warm/cold", "engine": name, "workload": "chat", "turn": turn,
                              "value": v / medians[(name, "chat-cold", turn)]}), flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(json.dumps({"cpu": cpu, "threads": args.threads, "model": os.path.basename(model),
                      "block_tokens": args.block_tokens, "learn_wait_s": args.learn_wait,
                      "identical_repeats": args.identical_repeats}), flush=True)


if __name__ == "__main__":
    main()
