#!/usr/bin/env bash
# KV-aware against round-robin routing on a real cluster on this host, in one run:
# for each policy, `blendctl cluster up` of a frontend and two workers (each its own
# process, RAM tier only, a budget that holds about half of the document pool, no
# storage node: what a worker holds is what routing can use), `blendctl bench serve`
# against the frontend (every document POSTed through it first, then a closed loop
# of RAG requests over a Zipf-skewed pool), the frontend's routing counters, then
# `cluster down`. stdout: bench serve's JSON lines tagged with the policy, then one
# summary line: per policy the cached-token fraction and TTFT p50/p99 (KV-aware: the
# share of document tokens the chosen worker held), and kv_aware against round_robin. Progress on
# stderr.
#
#   tools/bench/bench_cluster_routing.sh [--documents 100] [--doc-tokens 128] [--retrieve 4]
#       [--requests 48] [--clients 2] [--ram-budget 160MiB] [--zipf 1.0] [--threads 1]
#
# Needs build/blendserve and build/blendctl (tools/test.sh or cmake --build build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/build"
DOCUMENTS=100 DOC_TOKENS=128 RETRIEVE=4 REQUESTS=48 CLIENTS=2 RAM_BUDGET=160MiB ZIPF=1.0 THREADS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --documents) DOCUMENTS="$2"; shift 2 ;;
    --doc-tokens) DOC_TOKENS="$2"; shift 2 ;;
    --retrieve) RETRIEVE="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --ram-budget) RAM_BUDGET="$2"; shift 2 ;;
    --zipf) ZIPF="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    *) echo "usage: $0 [--documents N] [--doc-tokens N] [--retrieve N] [--requests N] [--clients N]" \
            "[--ram-budget SIZE] [--zipf S] [--threads N]" >&2; exit 2 ;;
  esac
done
for b in blendserve blendctl; do
  [ -x "$BIN/$b" ] || { echo "$0: no $BIN/$b: build first (cmake --build build)" >&2; exit 2; }
done
MODEL="${BLENDSERVE_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$MODEL" ] || { echo "$0: no model at $MODEL (tools/setup.sh fetches it)" >&2; exit 2; }

WORK="$(mktemp -d -t bs_bench_routing.XXXXXX)"
CONFIG=""
cleanup() {
  [ -n "$CONFIG" ] && "$BIN/blendctl" cluster down "$CONFIG" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(date +%s)
progress() { echo "[bench routing] $1/2 policies done, $(( $(date +%s) - START )) s elapsed${2:+, $2}" >&2; }

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
done_policies=0
for policy in kv_aware round_robin; do
  progress "$done_policies" "starting the $policy cluster"
  # The cluster's six ports, picked together so they are distinct (tools/ci/free_ports.py).
  mapfile -t P < <(python3 "$ROOT/tools/ci/free_ports.py" 6)
  http=${P[0]}
  CONFIG="$WORK/$policy.yaml"
  cat >"$CONFIG" <<EOF
cluster: {name: routing-$policy, secret: bench-routing-secret-0123456789, data_dir: $WORK/data,
          startup_timeout: 180s, heartbeat_interval: 500ms, routing: $policy}
defaults:
  model: {path: $MODEL}
  device: {threads: $THREADS}
  limits: {max_requests: 4, max_queue: 64}
  tiers: {ram: {budget: $RAM_BUDGET}, ssd: {enabled: false}}
nodes:
  - {name: frontend, role: frontend, host: 127.0.0.1, port: ${P[1]}, http_port: $http}
  - {name: worker-1, role: worker, host: 127.0.0.1, port: ${P[2]}, http_port: ${P[3]}}
  - {name: worker-2, role: worker, host: 127.0.0.1, port: ${P[4]}, http_port: ${P[5]}}
EOF
  "$BIN/blendctl" cluster up "$CONFIG" >/dev/null
  progress "$done_policies" "$policy cluster up; bench serve (documents, warm-up, $REQUESTS requests)"
  "$BIN/blendctl" --model "$MODEL" bench serve --url "http://127.0.0.1:$http" --documents "$DOCUMENTS" \
    --doc-tokens "$DOC_TOKENS" --retrieve "$RETRIEVE" --zipf "$ZIPF" --requests "$REQUESTS" \
    --clients "$CLIENTS" --rates 0 --modes blend --seed 1 |
    python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"):
        j=json.loads(l); j["routing"]=sys.argv[1]; print(json.dumps(j))' "$policy" | tee -a "$RESULTS"
  curl -sf "http://127.0.0.1:$http/metrics" | python3 -c 'import json,sys
m={}
for l in sys.stdin:
    if l.startswith("blendserve_frontend_routed"):
        k,v=l.rsplit(" ",1); m[k]=float(v)
print(json.dumps({"routing": sys.argv[1], "frontend_metrics": m}))' "$policy" | tee -a "$RESULTS"
  "$BIN/blendctl" cluster down "$CONFIG" >/dev/null
  CONFIG=""
  done_policies=$((done_policies + 1))
  progress "$done_policies"
done

python3 - "$RESULTS" "$DOCUMENTS" "$DOC_TOKENS" "$RETRIEVE" "$REQUESTS" "$CLIENTS" "$RAM_BUDGET" <<'EOF'
import json, sys
path, documents, doc_tokens, retrieve, requests, clients, budget = sys.argv[1:]
point, metrics = {}, {}
for l in open(path):
    j = json.loads(l)
    if "frontend_metrics" in j:
        metrics[j["routing"]] = j["frontend_metrics"]
    elif j.get("mode") == "blend" and "clients" in j and "ttft_p50_s" in j:
        point[j["routing"]] = j
out = {"summary": "cluster_routing", "documents": int(documents), "doc_tokens": int(doc_tokens),
       "retrieve": int(retrieve), "requests": int(requests), "clients": int(clients), "ram_budget": budget,
       "workers": 2}
for p, j in point.items():
    out[p + "_cached_fraction"] = round(j["cached_tokens_mean"] / j["prompt_tokens_mean"], 4) if j["prompt_tokens_mean"] else 0
    out[p + "_ttft_p50_s"] = j["ttft_p50_s"]
    out[p + "_ttft_p99_s"] = j["ttft_p99_s"]
    out[p + "_errors"] = j["errors"] + j["rejected"]
    # Only KV-aware routing looks at what the workers hold (round robin never asks).
    m = metrics.get(p, {})
    held, total = m.get("blendserve_frontend_routed_held_tokens_total", 0), m.get("blendserve_frontend_routed_document_tokens_total", 0)
    if p == "kv_aware":
        out[p + "_routed_held_fraction"] = round(held / total, 4) if total else 0
if "kv_aware" in point and "round_robin" in point:
    out["cached_fraction_kv_aware_minus_round_robin"] = round(out["kv_aware_cached_fraction"] - out["round_robin_cached_fraction"], 4)
    rr = out["round_robin_ttft_p50_s"]
    out["ttft_p50_kv_aware_vs_round_robin"] = round(out["kv_aware_ttft_p50_s"] / rr, 4) if rr else None
print(json.dumps(out))
EOF
