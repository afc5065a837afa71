#!/usr/bin/env bash
# A cluster file under a real Slurm on this host, end to end (issue 44's check):
#   1. starts a one-node Slurm of its own in a scratch directory: munged, slurmctld
#      and slurmd (Debian's slurm-wlm and munge) with a generated slurm.conf on
#      ports of their own, as root (slurmd launches the job's tasks);
#   2. `blendctl cluster render --target slurm F --submit`: one command from the file
#      to a frontend that answers (its time is printed: target < 2 min);
#   3. the official OpenAI client (.venv-test) stores a document through the
#      frontend and asks with it; the storage node must hold the chunk afterwards;
#   4. scancel: every member must be gone within the drain time, no process left.
# Exit 0 on success, 77 when Slurm, munge or root are missing (a skip), 1 otherwise.
# Progress on stderr; one JSON line of results on stdout.
#   tools/cluster/slurm_one_node.sh [build-dir]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
PY="$ROOT/.venv-test/bin/python"
log() { echo "[slurm] $*" >&2; }

for tool in slurmctld slurmd munged sbatch scancel squeue scontrol; do
  command -v "$tool" >/dev/null 2>&1 || { log "skip: $tool is not installed (Debian slurm-wlm, munge)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { log "skip: slurmd must run as root to launch the job's tasks"; exit 77; }
[ -x "$PY" ] || { log "skip: no $PY (tools/setup.sh makes it)"; exit 77; }

D="$(mktemp -d /tmp/bs-slurm.XXXXXX)"
chmod 755 "$D"
PIDS=()
cleanup() {
  [ -n "${JOB:-}" ] && scancel "$JOB" >/dev/null 2>&1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -9 -f "$D/cluster.yaml" 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || rm -rf "$D"
}
trap cleanup EXIT

# Every port this script needs, picked together so they are distinct (tools/ci/free_ports.py):
# 2 for Slurm, 8 for the cluster.
mapfile -t PORTS < <(python3 "$ROOT/tools/ci/free_ports.py" 10)

# --- munge: a key of its own, its own socket --------------------------------------
mkdir -p "$D/munge" "$D/state" "$D/spool" "$D/log"
chmod 700 "$D/munge"
dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$D/munge/munge.key"
munged --force --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/seed" ||
  { log "munged did not start"; exit 1; }
PIDS+=("$(cat "$D/munge/munged.pid")")

# --- slurm.conf: this host as the one node ------------------------------------------
NODE="$(hostname -s)"
CTLD_PORT="${PORTS[0]}"
SLURMD_PORT="${PORTS[1]}"
DRAIN=10
export SLURM_CONF="$D/slurm.conf"
cat > "$SLURM_CONF" <<EOF
ClusterName=bstest
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# scancel: SIGTERM, then SIGKILL after KillWait, which stays above the drain time.
KillWait=$((DRAIN + 5))
InactiveLimit=0
NodeName=$NODE CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
slurmctld -D -i > "$D/log/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -N "$NODE" > "$D/log/slurmd.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 60); do
  state="$(sinfo -h -N -o '%T' 2>/dev/null | head -1)"
  [ "$state" = idle ] && break
  sleep 0.5
done
if [ "${state:-}" != idle ]; then
  log "Slurm did not come up (node state '${state:-none}')"
  tail -20 "$D/log/slurmctld.log" "$D/log/slurmd.log" >&2
  exit 1
fi
log "Slurm up: node $NODE idle (slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT)"

# --- the cluster file: frontend, two workers, a storage node, TLS ------------------
P=("${PORTS[@]:2}")
export BLENDSERVE_CLUSTER_SECRET="slurm-test-secret-0123456789"
cat > "$D/cluster.yaml" <<EOF
cluster:
  name: slurmtest
  secret: env:BLENDSERVE_CLUSTER_SECRET
  data_dir: $D/data
  drain_timeout: ${DRAIN}s
  startup_timeout: 90s
  routing: round_robin
defaults:
  model: {path: "${BLENDSERVE_MODEL:-}"}
  device: {threads: 1}
  tiers: {ram: {budget: 256MiB}, ssd: {budget: 512MiB}, remote: {enabled: true, write_back: true}}
  limits: {max_requests: 2}
nodes:
  - {name: frontend, role: frontend, host: 127.0.0.1, port: ${P[0]}, http_port: ${P[1]}}
  - {name: worker-1, role: worker, host: 127.0.0.2, port: ${P[2]}, http_port: ${P[3]}}
  - {name: worker-2, role: worker, host: 127.0.0.2, port: ${P[4]}, http_port: ${P[5]}}
  - {name: storage, role: storage, host: 127.0.0.3, port: ${P[6]}, data_port: ${P[7]}}
EOF

START=$SECONDS
OUT_LINE="$("$BUILD/blendctl" cluster render --target slurm "$D/cluster.yaml" --out "$D/job" --nodes 1 --submit)"
RC=$?
READY_S=$((SECONDS - START))
JOB="$(echo "$OUT_LINE" | sed -n 's/.*"job":"\([0-9]*\)".*/\1/p' | tail -1)"
if [ $RC -ne 0 ] || [ -z "$JOB" ]; then
  log "render --submit failed (exit $RC): $OUT_LINE"
  cat "$D"/job/job-*.out "$D"/job/logs-*/*.log 2>/dev/null | tail -40 >&2
  exit 1
fi
URL="$(echo "$OUT_LINE" | tail -1 | sed -n 's/.*"frontend":"\([^"]*\)".*/\1/p')"
log "job $JOB: frontend $URL ready $READY_S s after the command started"

# --- the official client through the frontend -------------------------------------
if ! "$PY" - "$URL" <<'EOF' >&2
import json, sys, time, urllib.request
import openai
url = sys.argv[1]
doc = ("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 "
       "and is 330 metres tall.")
req = urllib.request.Request(url + "/v1/documents", method="POST", data=json.dumps({"text": doc}).encode(),
                             headers={"Content-Type": "application/json"})
stored = json.load(urllib.request.urlopen(req, timeout=120))
print("stored:", json.dumps(stored))
assert stored.get("on_storage_node"), "the document's KV did not reach the storage node"
client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
for attempt in range(2):  # round robin: both workers answer once
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", max_tokens=12, temperature=0,
        messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}],
        extra_body={"documents": [doc]})
    print("answer:", repr(r.choices[0].message.content), "usage:", r.usage.model_dump_json())
    assert r.choices[0].message.content.strip(), "empty answer"
    usage = r.usage.model_extra["blendserve"]
    assert usage.get("chunks_ram", 0) + usage.get("chunks_ssd", 0) + usage.get("chunks_remote", 0) == 1, usage
# The storage node holds the chunk (the frontend's view of its members).
deadline = time.time() + 30
while True:
    members = json.load(urllib.request.urlopen(url + "/v1/inspect/cluster", timeout=10))["members"]
    storage = [m for m in members if m.get("role") == "storage"]
    if storage and storage[0].get("up") and storage[0].get("report", {}).get("entries", 0) > 0:
        print("storage node:", json.dumps(storage[0])[:300])
        break
    assert time.time() < deadline, "the storage node never reported the chunk: " + json.dumps(members)[:2000]
    time.sleep(1)
EOF
then
  log "the client's check failed; member logs:"
  tail -n 20 "$D"/job/logs-"$JOB"/*.log >&2
  exit 1
fi

# --- scancel: every member drains and exits ---------------------------------------
STOP=$SECONDS
scancel "$JOB"
while squeue -h -j "$JOB" 2>/dev/null | grep -q .; do
  [ $((SECONDS - STOP)) -gt $((DRAIN + 30)) ] && { log "job $JOB still listed $((SECONDS - STOP)) s after scancel"; exit 1; }
  sleep 0.5
done
STOPPED_S=$((SECONDS - STOP))
if pgrep -f "$D/cluster.yaml" >/dev/null; then
  log "processes left after the job ended:"; pgrep -af "$D/cluster.yaml" >&2
  exit 1
fi
grep -h "stopped\|draining\|stopping" "$D"/job/logs-"$JOB"/*.log >&2
JOB_DONE="$JOB"
JOB=""
log "job $JOB_DONE: scancel to no member left: $STOPPED_S s (drain_timeout $DRAIN s)"
echo "{\"slurm\":\"$(slurmctld -V)\",\"members\":4,\"ready_s\":$READY_S,\"stopped_s\":$STOPPED_S,\"drain_timeout_s\":$DRAIN}"
