#!/usr/bin/env python3
"""`blendctl cluster render` (tools/cluster/cluster_render.h) with the real tools.

Kubernetes: the manifests of the shipped example and of a GPU cluster pass the
offline schema validation of several Kubernetes versions (PyPI kubernetes-validate,
strict: no unknown field), and a golden check of what they say: object names, the
members' stable DNS names, ports, probes, GPUs, volumes, the grace period, the
Secret's items per pod. Slurm: the batch script passes `bash -n` and places the
members as the file groups them. Mistakes are refused with the key and line.

    .venv-test/bin/python tests/cluster_render_test.py --bin build
"""
import argparse
import base64
import os
import stat
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "ci"))
from free_ports import free_ports  # noqa: E402

ARGS = None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "configs", "cluster.example.yaml")
SECRET = "render-test-secret-0123456789"
# Kubernetes minor versions the manifests must validate against (the validator's
# newest, and the ones before it that are still supported).
VERSIONS = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"]

CUDA_MISSING = "backend is not in this build"
GPU_CLUSTER = """cluster:
  name: gpu
  secret: env:BLENDSERVE_CLUSTER_SECRET
  drain_timeout: 50s
hosts:
  - {host: 10.0.0.2, gpus: 8}
defaults:
  device: {kind: cuda, threads: 4}
  tiers: {ram: {budget: 8GiB}, ssd: {budget: 100GiB}, remote: {enabled: true}}
nodes:
  - {name: fe, role: frontend, host: 10.0.0.1, port: 7100, http_port: 8000}
  - {name: big, role: worker, host: 10.0.0.2, port: 7101, http_port: 8101, probe_port: 8201,
     device: {tp: 2, gpus: [0, 1]}}
  - {name: small, role: worker, host: 10.0.0.2, port: 7102, http_port: 8102, probe_port: 8202,
     device: {gpus: [5]}}
  - {name: kv, role: storage, host: 10.0.0.3, port: 7103, data_port: 7203, tiers: {ssd: {budget: 1TiB}}}
"""


def env():
    e = dict(os.environ)
    e["BLENDSERVE_CLUSTER_SECRET"] = SECRET
    for k in ("BLENDSERVE_HOSTS", "BLENDSERVE_BIND", "BLENDSERVE_CLUSTER_DATA_DIR", "BLENDSERVE_TLS_DIR",
              "BLENDSERVE_GPUS"):
        e.pop(k, None)
    return e


def render(config, out, target="kubernetes", *extra, data_dir=None):
    cmd = [os.path.join(ARGS.bin, "blendctl"), "cluster", "render", "--target", target, config, "--out", out]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    return subprocess.run(cmd + list(extra), capture_output=True, text=True, env=env(), timeout=120)


def validate(test, files):
    for v in VERSIONS:
        r = subprocess.run([os.path.join(ROOT, ".venv-test", "bin", "kubernetes-validate"), "--strict", "--quiet",
                            "-k", v] + files, capture_output=True, text=True, timeout=300)
        test.assertEqual(r.returncode, 0, f"Kubernetes {v}:\n{r.stdout}\n{r.stderr}")


def by_kind(docs):
    out = {}
    for d in docs:
        out[(d["kind"], d["metadata"]["name"])] = d
    return out


def container(sts):
    return sts["spec"]["template"]["spec"]["containers"][0]


def env_of(sts):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(sts)["env"]}


class Kubernetes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "example")
        r = render(EXAMPLE, cls.out, data_dir=os.path.join(cls.tmp.name, "data"))
        assert r.returncode == 0, r.stderr
        with open(os.path.join(cls.out, "kubernetes.yaml")) as f:
            cls.text = f.read()
        cls.docs = by_kind(yaml.safe_load_all(cls.text))
        with open(os.path.join(cls.out, "secret.yaml")) as f:
            cls.secret = yaml.safe_load(f)
        gpu_file = os.path.join(cls.tmp.name, "gpu.yaml")
        with open(gpu_file, "w") as f:
            f.write(GPU_CLUSTER)
        cls.gpu_out = os.path.join(cls.tmp.name, "gpu")
        r = render(gpu_file, cls.gpu_out, "kubernetes", "--namespace", "rag", "--image", "registry.example/bs:1.0",
                   "--storage-class", "fast-ssd", data_dir=os.path.join(cls.tmp.name, "data"))
        cls.gpu = None  # a build without the CUDA backend refuses cuda workers
        if r.returncode == 2 and CUDA_MISSING in r.stderr:
            return
        assert r.returncode == 0, r.stderr
        with open(os.path.join(cls.gpu_out, "kubernetes.yaml")) as f:
            cls.gpu = by_kind(yaml.safe_load_all(f))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_both_clusters_pass_the_schemas_of_several_kubernetes_versions(self):
        files = [os.path.join(self.out, "kubernetes.yaml"), os.path.join(self.out, "secret.yaml")]
        if self.gpu:
            files += [os.path.join(self.gpu_out, "kubernetes.yaml"), os.path.join(self.gpu_out, "secret.yaml")]
        validate(self, files)
        if not self.gpu:
            self.skipTest("the GPU cluster: no CUDA backend in this build")

    def test_the_objects_and_their_names(self):
        self.assertEqual(sorted(self.docs), sorted([
            ("ConfigMap", "demo-config"),
            ("Service", "demo-frontend"), ("Service", "demo-worker"), ("Service", "demo-storage"),
            ("Service", "demo-api"),
            ("StatefulSet", "demo-frontend"), ("StatefulSet", "demo-worker-1"), ("StatefulSet", "demo-worker-2"),
            ("StatefulSet", "demo-storage")]))
        for (kind, name), d in self.docs.items():
            self.assertEqual(d["metadata"]["namespace"], "default", name)
            self.assertEqual(d["metadata"]["labels"]["app.kubernetes.io/instance"], "demo", name)
        # The file as written, in the ConfigMap; the secret itself nowhere but the Secret.
        with open(EXAMPLE) as f:
            self.assertEqual(self.docs[("ConfigMap", "demo-config")]["data"]["cluster.yaml"], f.read())
        self.assertNotIn(SECRET, self.text)
        self.assertNotIn(base64.b64encode(SECRET.encode()).decode(), self.text)

    def test_headless_services_give_every_member_a_stable_dns_name(self):
        for role in ("frontend", "worker", "storage"):
            svc = self.docs[("Service", "demo-" + role)]["spec"]
            self.assertEqual(svc["clusterIP"], "None")
            self.assertTrue(svc["publishNotReadyAddresses"])
            self.assertEqual(svc["selector"]["app.kubernetes.io/component"], role)
        self.assertEqual(sorted(p["port"] for p in self.docs[("Service", "demo-worker")]["spec"]["ports"]),
                         [7101, 7103, 8101, 8102])
        hosts = "frontend=demo-frontend-0.demo-frontend.default.svc.cluster.local," \
                "worker-1=demo-worker-1-0.demo-worker.default.svc.cluster.local," \
                "worker-2=demo-worker-2-0.demo-worker.default.svc.cluster.local," \
                "storage=demo-storage-0.demo-storage.default.svc.cluster.local"
        for node in ("frontend", "worker-1", "worker-2", "storage"):
            sts = self.docs[("StatefulSet", "demo-" + node)]
            self.assertEqual(sts["spec"]["replicas"], 1)
            e = env_of(sts)
            self.assertEqual(e["BLENDSERVE_NODE"], node)
            self.assertEqual(e["BLENDSERVE_HOSTS"], hosts)
            self.assertEqual(e["BLENDSERVE_BIND"], "0.0.0.0")
            self.assertEqual(e["BLENDSERVE_CONFIG"], "/etc/blendserve/config/cluster.yaml")
            self.assertEqual(e["BLENDSERVE_CLUSTER_DATA_DIR"], "/var/lib/blendserve")
            self.assertEqual(e["BLENDSERVE_TLS_DIR"], "/etc/blendserve/tls")
            self.assertEqual(e["BLENDSERVE_CLUSTER_SECRET"],
                             {"secretKeyRef": {"name": "demo-secret", "key": "cluster-secret"}})
            self.assertEqual(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 40)  # 30 s + 10
        api = self.docs[("Service", "demo-api")]["spec"]
        self.assertEqual(api["ports"][0]["port"], 8000)
        self.assertEqual(api["selector"]["blendserve.io/node"], "frontend")

    def test_ports_and_probes(self):
        def ports(node):
            return {p["name"]: p["containerPort"] for p in container(self.docs[("StatefulSet", "demo-" + node)])["ports"]}
        self.assertEqual(ports("frontend"), {"control": 7100, "http": 8000})
        self.assertEqual(ports("worker-1"), {"control": 7101, "http": 8101, "probe": 8201})
        self.assertEqual(ports("storage"), {"control": 7102, "data": 7202})
        fe = container(self.docs[("StatefulSet", "demo-frontend")])
        self.assertEqual(fe["readinessProbe"]["httpGet"], {"path": "/ready", "port": "http", "scheme": "HTTP"})
        self.assertEqual(fe["livenessProbe"]["httpGet"]["path"], "/live")
        w = container(self.docs[("StatefulSet", "demo-worker-1")])
        # The worker's http_port is HTTPS for the frontend's certificate only: the probes use probe_port.
        self.assertEqual(w["readinessProbe"]["httpGet"], {"path": "/ready", "port": "probe", "scheme": "HTTP"})
        self.assertEqual(w["livenessProbe"]["httpGet"], {"path": "/live", "port": "probe", "scheme": "HTTP"})
        self.assertEqual(w["startupProbe"]["failureThreshold"] * w["startupProbe"]["periodSeconds"], 120)
        s = container(self.docs[("StatefulSet", "demo-storage")])
        self.assertEqual(s["readinessProbe"]["tcpSocket"], {"port": "data"})
        self.assertEqual(s["livenessProbe"]["tcpSocket"], {"port": "control"})

    def test_volumes_and_the_secret(self):
        w = self.docs[("StatefulSet", "demo-worker-1")]
        claims = w["spec"]["volumeClaimTemplates"]
        self.assertEqual(claims[0]["metadata"]["name"], "data")
        self.assertEqual(claims[0]["spec"]["resources"]["requests"]["storage"], "4762Mi")  # 4 GiB + 10% + 256 MiB
        self.assertNotIn("volumeClaimTemplates", self.docs[("StatefulSet", "demo-frontend")]["spec"])
        vols = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(sorted(i["key"] for i in vols["tls"]["secret"]["items"]),
                         ["ca.pem", "worker-1.key", "worker-1.pem"])  # its own key only
        self.assertEqual(vols["tls"]["secret"]["defaultMode"], 0o440)
        # The image's user, not root; the volumes its group's.
        self.assertEqual(w["spec"]["template"]["spec"]["securityContext"],
                         {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001, "runAsNonRoot": True})
        self.assertEqual(self.secret["kind"], "Secret")
        data = self.secret["data"]
        self.assertEqual(base64.b64decode(data["cluster-secret"]).decode(), SECRET)
        self.assertNotIn("ca.key", data)
        self.assertEqual(sorted(data), sorted(["cluster-secret", "ca.pem"] + [
            f"{n}.{e}" for n in ("frontend", "worker-1", "worker-2", "storage") for e in ("pem", "key")]))
        self.assertIn("BEGIN CERTIFICATE", base64.b64decode(data["worker-1.pem"]).decode())
        mode = stat.S_IMODE(os.stat(os.path.join(self.out, "secret.yaml")).st_mode)
        self.assertEqual(mode, 0o600)

    def test_gpu_workers_get_their_gpus_numbered_in_their_pod(self):
        if not self.gpu:
            self.skipTest("no CUDA backend in this build")
        big = self.gpu[("StatefulSet", "gpu-big")]
        small = self.gpu[("StatefulSet", "gpu-small")]
        self.assertEqual(container(big)["resources"]["limits"], {"nvidia.com/gpu": 2})
        self.assertEqual(container(small)["resources"]["limits"], {"nvidia.com/gpu": 1})
        self.assertEqual(env_of(big)["BLENDSERVE_GPUS"], "0,1")
        self.assertEqual(env_of(small)["BLENDSERVE_GPUS"], "0")  # its GPU 5 is the pod's 0
        self.assertEqual(container(big)["resources"]["requests"], {"cpu": "4", "memory": "9216Mi"})
        self.assertNotIn("limits", container(self.gpu[("StatefulSet", "gpu-fe")])["resources"])
        self.assertEqual(container(big)["image"], "registry.example/bs:1.0")
        self.assertEqual(big["metadata"]["namespace"], "rag")
        self.assertEqual(env_of(big)["BLENDSERVE_HOSTS"].split(",")[1],
                         "big=gpu-big-0.gpu-worker.rag.svc.cluster.local")
        kv = self.gpu[("StatefulSet", "gpu-kv")]["spec"]["volumeClaimTemplates"][0]["spec"]
        self.assertEqual(kv["storageClassName"], "fast-ssd")
        self.assertEqual(big["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 60)

    def test_what_cannot_be_rendered_is_refused_with_the_key(self):
        if not self.gpu:
            self.skipTest("its cluster has CUDA workers: no CUDA backend in this build")
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.yaml")
            with open(bad, "w") as f:
                f.write(GPU_CLUSTER.replace(", probe_port: 8202", ""))
            r = render(bad, os.path.join(d, "out"), data_dir=d)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("nodes[2].probe_port: missing (line 14)", r.stderr)
            with open(bad, "w") as f:
                f.write(GPU_CLUSTER.replace("name: small", "name: Small_1"))
            r = render(bad, os.path.join(d, "out"), data_dir=d)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("nodes[2].name: 'Small_1'", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "out", "kubernetes.yaml")))
            # check-config places GPUs: a worker on a GPU its host lacks.
            with open(bad, "w") as f:
                f.write(GPU_CLUSTER.replace("gpus: 8", "gpus: 4"))
            r = subprocess.run([os.path.join(ARGS.bin, "blendserve"), "check-config", bad], capture_output=True,
                               text=True, env=env(), timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("nodes[2].device.gpus: worker 'small' needs GPU 5 of 10.0.0.2, but hosts lists 4 GPUs", r.stderr)
            self.assertIn("(line 15, column 21)", r.stderr)


class Slurm(unittest.TestCase):
    def test_the_batch_script_places_the_members_by_the_files_hosts(self):
        with tempfile.TemporaryDirectory() as d:
            r = render(EXAMPLE, os.path.join(d, "job"), "slurm", "--partition", "gpu", "--time", "2:00:00",
                       data_dir=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            script = os.path.join(d, "job", "blendserve.sbatch")
            with open(script) as f:
                text = f.read()
            self.assertEqual(subprocess.run(["bash", "-n", script]).returncode, 0)
            sbatch = [l for l in text.splitlines() if l.startswith("#SBATCH")]
            self.assertIn("#SBATCH --nodes=3", sbatch)  # three distinct hosts in the file
            self.assertIn("#SBATCH --ntasks=4", sbatch)
            self.assertIn("#SBATCH --partition=gpu", sbatch)
            self.assertIn("#SBATCH --time=2:00:00", sbatch)
            self.assertFalse(any("gres" in l for l in sbatch))  # CPU workers
            self.assertIn("MEMBERS=('frontend' 'worker-1' 'worker-2' 'storage')", text)
            self.assertIn("GROUP_OF=(0 1 1 2)", text)  # both workers share 127.0.0.2's machine
            self.assertIn("srun --distribution=arbitrary --ntasks=4 --kill-on-bad-exit=1", text)
            self.assertIn("cluster init", text)
            # Fewer machines than hosts: the groups share them.
            r = render(EXAMPLE, os.path.join(d, "one"), "slurm", "--nodes", "1", data_dir=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "one", "blendserve.sbatch")) as f:
                self.assertIn("#SBATCH --nodes=1", f.read())

    def test_gpus_per_machine_from_the_workers(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = os.path.join(d, "gpu.yaml")
            with open(cfg, "w") as f:
                f.write(GPU_CLUSTER)
            r = render(cfg, os.path.join(d, "job"), "slurm", data_dir=d)
            if r.returncode == 2 and CUDA_MISSING in r.stderr:
                self.skipTest("no CUDA backend in this build")
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "job", "blendserve.sbatch")) as f:
                text = f.read()
            self.assertIn("#SBATCH --gres=gpu:6", text)  # 'small' uses GPU 5 of the workers' machine
            self.assertIn("#SBATCH --cpus-per-task=4", text)


POD_CLUSTER = """cluster: {name: pods, secret: env:BLENDSERVE_CLUSTER_SECRET, drain_timeout: 60s,
          heartbeat_interval: 0.5s, connection_timeout: 2s}
defaults: {device: {threads: 1}, tiers: {ram: {budget: 256MiB}, ssd: {budget: 256MiB}, remote: {enabled: true}}}
nodes:
  - {name: fe, role: frontend, host: 10.9.0.1, port: %d, http_port: %d}
  - {name: w1, role: worker, host: 10.9.0.2, port: %d, http_port: %d, probe_port: %d}
  - {name: kv, role: storage, host: 10.9.0.3, port: %d, data_port: %d}
"""


def get(url, timeout=5):
    import json
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
    except OSError:
        return None, None


def until(test, what, fn, timeout=60):
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.25)
    test.fail("timed out waiting for " + what)


@unittest.skipUnless(os.environ.get("BLENDSERVE_PODS_TEST") == "1", "the model test (cluster_pods) runs it")
class PodsAsProcesses(unittest.TestCase):
    """Each member started as its rendered pod starts it: `blendserve` with no
    arguments, the environment of its StatefulSet, the ConfigMap's file and only its
    own items of the Secret; the cluster DNS names resolved to loopback. Then a
    restart: the frontend marks the member down, then up, nothing else restarts."""

    def test_members_run_from_their_manifests_and_a_restarted_member_rejoins(self):
        with tempfile.TemporaryDirectory() as d:
            ports = free_ports(7)
            cfg = os.path.join(d, "pods.yaml")
            with open(cfg, "w") as f:
                f.write(POD_CLUSTER % tuple(ports))
            r = render(cfg, os.path.join(d, "out"), data_dir=os.path.join(d, "made"))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "out", "kubernetes.yaml")) as f:
                docs = by_kind(yaml.safe_load_all(f))
            with open(os.path.join(d, "out", "secret.yaml")) as f:
                secret = yaml.safe_load(f)["data"]
            procs = {}

            def start(node):
                sts = docs[("StatefulSet", "pods-" + node)]
                pod = os.path.join(d, "pod-" + node)
                spec = sts["spec"]["template"]["spec"]
                e = {"PATH": os.environ.get("PATH", ""), "HOME": d}
                for item in container(sts)["env"]:
                    if "value" in item:
                        e[item["name"]] = item["value"]
                    else:
                        key = item["valueFrom"]["secretKeyRef"]["key"]
                        e[item["name"]] = base64.b64decode(secret[key]).decode()
                # The cluster's DNS: every member's name resolves to this host.
                e["BLENDSERVE_HOSTS"] = ",".join(h.split("=")[0] + "=127.0.0.1"
                                                 for h in e["BLENDSERVE_HOSTS"].split(","))
                # The volumes, where the pod has them.
                vols = {v["name"]: v for v in spec["volumes"]}
                os.makedirs(os.path.join(pod, "config"), exist_ok=True)
                with open(os.path.join(pod, "config", "cluster.yaml"), "w") as f:
                    f.write(docs[("ConfigMap", "pods-config")]["data"]["cluster.yaml"])
                os.makedirs(os.path.join(pod, "tls"), exist_ok=True)
                for item in vols["tls"]["secret"]["items"]:
                    path = os.path.join(pod, "tls", item["path"])
                    with open(path, "wb") as f:
                        f.write(base64.b64decode(secret[item["key"]]))
                    os.chmod(path, 0o400)
                self.assertEqual(sorted(os.listdir(os.path.join(pod, "tls"))),
                                 sorted(["ca.pem", node + ".pem", node + ".key"]))
                e["BLENDSERVE_CONFIG"] = os.path.join(pod, "config", "cluster.yaml")
                e["BLENDSERVE_TLS_DIR"] = os.path.join(pod, "tls")
                e["BLENDSERVE_CLUSTER_DATA_DIR"] = os.path.join(pod, "data")
                with open(os.path.join(d, node + ".log"), "ab") as log:
                    procs[node] = subprocess.Popen([os.path.join(ARGS.bin, "blendserve")], env=e, stdout=log,
                                                   stderr=subprocess.STDOUT)

            def stop(node, sig=15):
                procs[node].send_signal(sig)
                return procs[node].wait(timeout=30)

            fe, w1_probe = f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[4]}"
            try:
                start("w1")
                until(self, "w1 live", lambda: get(w1_probe + "/live")[0] == 200)
                self.assertEqual(get(w1_probe + "/health")[0], 200)  # serves (recomputes) without storage
                code, body = get(w1_probe + "/ready")
                self.assertEqual(code, 503)
                self.assertEqual(body["status"], "storage_unreachable")
                start("kv")
                until(self, "w1 ready with its storage node", lambda: get(w1_probe + "/ready")[0] == 200)
                start("fe")
                until(self, "the frontend ready", lambda: get(fe + "/ready")[0] == 200)
                # A chat through the frontend: the worker's HTTPS with the frontend's certificate.
                import json
                import urllib.error
                import urllib.request
                req = urllib.request.Request(fe + "/v1/chat/completions", method="POST", data=json.dumps({
                    "model": "SmolLM2-135M-Instruct", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "Hi"}]}).encode(),
                    headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        self.assertEqual(r.status, 200)
                except urllib.error.HTTPError as e:
                    self.fail(f"chat through the frontend: {e.code} {e.read()!r}")
                # The worker dies as a pod does (SIGKILL): down; its restart: up again.
                stop("w1", 9)
                until(self, "the frontend to mark w1 down", lambda: get(fe + "/ready")[0] == 503)
                start("w1")
                until(self, "the frontend to mark w1 up again", lambda: get(fe + "/ready")[0] == 200)
                members = {m["name"]: m for m in get(fe + "/v1/inspect/cluster")[1]["members"]}
                self.assertTrue(members["w1"]["up"])
                self.assertEqual(members["w1"]["downs"], 1)
                self.assertEqual(procs["fe"].poll(), None)  # nothing else restarted
                self.assertEqual(procs["kv"].poll(), None)
                # SIGTERM to the frontend with a stream in flight: the stream ends whole,
                # a new request meanwhile gets 503 "draining", then it exits 0.
                import http.client
                import threading
                started, result = threading.Event(), {}

                def stream():
                    conn = http.client.HTTPConnection("127.0.0.1", ports[1], timeout=120)
                    conn.request("POST", "/v1/chat/completions", body=json.dumps({
                        "model": "SmolLM2-135M-Instruct", "max_tokens": 200, "temperature": 0, "stream": True,
                        "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]}),
                        headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    result["status"] = r.status
                    first = r.readline()
                    started.set()
                    result["body"] = first + r.read()

                t = threading.Thread(target=stream)
                t.start()
                self.assertTrue(started.wait(60), "no first chunk")
                procs["fe"].send_signal(15)
                code, body = until(self, "the frontend to drain", lambda: (lambda r: r if r[0] == 503 else None)(
                    get(fe + "/ready")), timeout=10)
                self.assertEqual(body["status"], "draining")
                try:
                    with urllib.request.urlopen(req, timeout=30):
                        self.fail("a request was taken while draining")
                except urllib.error.HTTPError as e:
                    self.assertEqual(e.code, 503)
                    self.assertEqual(json.load(e)["error"]["code"], "draining")
                t.join(120)
                self.assertEqual(result.get("status"), 200)
                self.assertTrue(result["body"].rstrip().endswith(b"data: [DONE]"), result["body"][-300:])
                self.assertEqual(procs["fe"].wait(timeout=90), 0)
                # SIGTERM: the others exit 0 (the worker after its drain).
                for node in ("w1", "kv"):
                    self.assertEqual(stop(node), 0, node)
            finally:
                for p in procs.values():
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                for node in ("fe", "w1", "kv"):
                    if os.path.exists(os.path.join(d, node + ".log")):
                        with open(os.path.join(d, node + ".log")) as f:
                            sys.stderr.write(f"--- {node}\n" + f.read()[-1500:])


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True, help="the build directory (blendctl, blendserve)")
    ARGS, rest = p.parse_known_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
