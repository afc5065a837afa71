#!/usr/bin/env python3
"""What the loading controller measures and decides on a real two-worker cluster.

`blendctl cluster up` of a storage node, two workers (remote tier with write-back, one
compute thread each) and a round-robin frontend on loopback (TLS between members), in a
temp dir. Then, through the frontend: two small requests (two stored documents of ~30
tokens; each worker loads the one it did not compute from the storage node), and two
large ones (12 stored documents of ~400 tokens from tests/data/rag_qa_small.jsonl, 6 in
RAM and 6 from the node on each worker). For each request one JSON line on stdout: the
worker, its usage, the controller's decision (rule, ratio, predicted load and TTFT,
the profile it planned with), each loader's load in that request (bytes, busy seconds,
bytes/s: one profile sample), the measured load span, and the worker's profile after
it. Progress on stderr. Takes about a minute on 2 cores.

    python3 tools/cluster/controller_profiles.py --bin build --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import hashlib
import hmac
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ci"))
from free_ports import free_ports  # noqa: E402  (tools/ci/free_ports.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "controller-profiles-secret-0123456789"
MODEL = "SmolLM2-135M-Instruct"
SMALL = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 and is 330 "
    "metres tall.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak is 5895 metres above sea level.",
]


def log(msg):
    print("controller_profiles: " + msg, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    blendctl = os.path.join(os.path.abspath(args.bin), "blendctl")
    work = tempfile.mkdtemp(prefix="bs_controller_profiles_")
    picked = free_ports(8)  # together, so distinct (tools/ci/free_ports.py)
    http = dict(zip(("frontend", "worker-1", "worker-2"), picked[:3]))
    control = iter(picked[3:])
    free_port = lambda: next(control)
    config = os.path.join(work, "cluster.yaml")
    with open(config, "w") as f:
        f.write(
            "cluster: {name: t, secret: %s, data_dir: %s, startup_timeout: 120s, heartbeat_interval: 500ms,\n"
            "          connection_timeout: 2s, routing: round_robin}\n"
            "defaults:\n"
            "  model: {path: %s}\n"
            "  device: {threads: 1}\n"
            "  limits: {max_requests: 2, max_queue: 4, max_prompt_tokens: 8192}\n"
            "  tiers: {ram: {budget: 256MiB}, ssd: {budget: 256MiB}}\n"
            "nodes:\n"
            "  - {name: frontend, role: frontend, host: 127.0.0.1, port: %d, http_port: %d}\n"
            "  - {name: worker-1, role: worker, host: 127.0.0.1, port: %d, http_port: %d,\n"
            "     tiers: {remote: {enabled: true, write_back: true}}}\n"
            "  - {name: worker-2, role: worker, host: 127.0.0.1, port: %d, http_port: %d,\n"
            "     tiers: {remote: {enabled: true, write_back: true}}}\n"
            "  - {name: storage, role: storage, host: 127.0.0.1, port: %d, data_port: %d}\n"
            % (SECRET, os.path.join(work, "data"), os.path.abspath(args.model), free_port(), http["frontend"],
               free_port(), http["worker-1"], free_port(), http["worker-2"], free_port(), free_port()))
    log("cluster up in " + work)
    up = subprocess.run([blendctl, "cluster", "up", config], capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        sys.exit("blendctl cluster up: exit %d\n%s" % (up.returncode, up.stderr))
    try:
        run(work, http)
    finally:
        subprocess.run([blendctl, "cluster", "down", config], capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)


def run(work, http):
    base = "http://127.0.0.1:%d" % http["frontend"]
    tls = os.path.join(work, "data", "t", "tls")
    ctx = ssl.create_default_context(cafile=os.path.join(tls, "ca.pem"))
    ctx.load_cert_chain(os.path.join(tls, "frontend.pem"), os.path.join(tls, "frontend.key"))
    # What the frontend presents to workers (actors/config/cluster_secret.cpp: worker_api_key).
    key = hmac.new(SECRET.encode(), b"blendserve-worker-api-key", hashlib.sha256).hexdigest()

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.headers.get("X-Blendserve-Worker"), json.loads(r.read())

    def inspect(worker, what):
        req = urllib.request.Request("https://127.0.0.1:%d/v1/inspect/%s" % (http[worker], what),
                                     headers={"Authorization": "Bearer " + key})
        with urllib.request.urlopen(req, context=ctx, timeout=60) as r:
            return json.loads(r.read())

    def ask(kind, question, documents):
        worker, r = post("/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 4,
            "temperature": 0, "documents": documents})
        trace = inspect(worker, "traces")[0]
        loads = {}
        for e in trace["events"]:
            if e.get("what") == "load":
                s = loads.setdefault(e["actor"], {"bytes": 0, "busy_s": 0.0})
                s["bytes"] += e.get("bytes", 0)
                s["busy_s"] += e["end_s"] - e["begin_s"]
        for s in loads.values():
            s["bytes_per_s"] = s["bytes"] / s["busy_s"] if s["busy_s"] > 0 else None
        c = trace["controller"]
        print(json.dumps({
            "request": kind, "worker": worker, "prompt_tokens": r["usage"]["prompt_tokens"],
            "usage": r["usage"]["blendserve"],
            "decision": {k: c[k] for k in ("selection", "reason", "ratio", "est_load_s", "est_ttft_s")},
            "planned_with": {k: v for k, v in c["inputs"].items() if k.endswith("_per_s")},
            "loads": loads, "load_span_s": trace["load_span_s"], "first_token_s": trace["first_token_s"],
            "profile_after": inspect(worker, "profile")}), flush=True)

    for d in SMALL:
        post("/v1/documents", {"text": d})
    for _ in range(2):
        log("small request")
        ask("small", "How tall is the Eiffel Tower?", SMALL)
    with open(os.path.join(ROOT, "tests", "data", "rag_qa_small.jsonl")) as f:
        cases = [json.loads(line) for line in f]
    big = cases[1]["documents"][:6] + cases[2]["documents"][:6]
    log("storing 12 documents")
    for d in big:
        post("/v1/documents", {"text": d})
    for _ in range(2):
        log("large request")
        ask("large", cases[1]["question"], big)


if __name__ == "__main__":
    main()
