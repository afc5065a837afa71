#!/usr/bin/env python3
"""The official OpenAI Python client against a cluster's frontend, real processes.

`blendctl cluster up` starts a storage node, two workers (remote tier with
write-back) and the frontend on loopback (round-robin routing, so consecutive
requests go to both workers); a plain `blendserve serve` is the single-node
reference. Documents are stored once through the frontend (POST /v1/documents): each
is computed by one worker and pushed to the storage node; a worker that did not
compute it answers with its KV from the storage node's remote tier
(`usage.blendserve.chunks_remote`), and every answer equals the single node's.
"warm" loads a document onto the other worker from the node, DELETE removes it from
every worker and the node, and the client's own exception types surface the
frontend's errors.

Every node runs with `blend: {adaptive_ratio: false}`: the controller otherwise picks
the ratio and the selection rule from each node's measured load and compute speeds,
so two nodes (or one, a request later) may blend the same prompt by another rule and
answer another text (CI saw "324.5" against "330 meters tall"); the test is about
the stored KV and the frontend, not the controller.

    .venv-test/bin/python tests/openai_cluster_test.py --bin build --model models/X.gguf
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import openai

from serve_process import ServeProcess

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "ci"))
from free_ports import free_ports  # noqa: E402

ARGS = None
CLUSTER = None
SINGLE = None
MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-cluster-users-key-0123"
SECRET = "cluster-test-secret-0123456789"
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 and is 330 "
    "metres tall.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak is 5895 metres above sea level.",
]
WARM_DOC = "The Danube flows through ten countries and four capital cities before it reaches the Black Sea."
QUESTION = "How tall is the Eiffel Tower?"


def call(base, method, path, body=None, key=KEY):
    """(status, headers, parsed JSON body) of one HTTP call."""
    req = urllib.request.Request(
        base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + key},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"{}")


class Cluster:
    """`blendctl cluster up` of storage + 2 workers + frontend in a temp dir."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bs_openai_cluster_")
        # Every port of the cluster picked together (distinct), the way the processes bind them.
        picked = free_ports(8)
        self.http = dict(zip(("frontend", "worker-1", "worker-2"), picked[:3]))
        control = iter(picked[3:])
        ports = lambda: next(control)
        self.config = os.path.join(self.dir, "cluster.yaml")
        with open(self.config, "w") as f:
            f.write(
                "cluster: {name: t, secret: %s, data_dir: %s, startup_timeout: 120s, heartbeat_interval: 500ms,\n"
                "          connection_timeout: 2s, routing: round_robin}\n"
                "defaults:\n"
                "  model: {path: %s}\n"
                "  device: {threads: 1}\n"
                "  limits: {max_requests: 2, max_queue: 4, max_prompt_tokens: 1024}\n"
                "  tiers: {ram: {budget: 64MiB}, ssd: {budget: 64MiB}}\n"
                "  blend: {adaptive_ratio: false}\n"
                "nodes:\n"
                "  - {name: frontend, role: frontend, host: 127.0.0.1, port: %d, http_port: %d,\n"
                "     server: {api_keys: [%s]}}\n"
                "  - {name: worker-1, role: worker, host: 127.0.0.1, port: %d, http_port: %d,\n"
                "     tiers: {remote: {enabled: true, write_back: true}}}\n"
                "  - {name: worker-2, role: worker, host: 127.0.0.1, port: %d, http_port: %d,\n"
                "     tiers: {remote: {enabled: true, write_back: true}}}\n"
                "  - {name: storage, role: storage, host: 127.0.0.1, port: %d, data_port: %d}\n"
                % (SECRET, os.path.join(self.dir, "data"), ARGS.model, ports(), self.http["frontend"], KEY,
                   ports(), self.http["worker-1"], ports(), self.http["worker-2"], ports(), ports())
            )
        self.ctl([ "up"])
        self.base = "http://127.0.0.1:%d" % self.http["frontend"]

    def ctl(self, action):
        r = subprocess.run([os.path.join(ARGS.bin, "blendctl"), "cluster"] + action + [self.config],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("blendctl cluster %s: exit %d\n%s\n%s" % (action, r.returncode, r.stdout, r.stderr))
        return r.stdout

    def logs(self):
        out = ""
        logs = os.path.join(self.dir, "data", "t", "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                out += "---- %s ----\n%s\n" % (name, f.read()[-3000:])
        return out

    def stop(self):
        try:
            self.ctl(["down"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def single_node():
    """`blendserve serve` with the same model: what one node answers."""
    return ServeProcess(os.path.join(ARGS.bin, "blendserve"),
                        "model: {path: %s}\ndevice: {threads: 1}\nblend: {adaptive_ratio: false}\nserver:\n  api_keys: [%s]\n" % (ARGS.model, KEY),
                        prefix="bs_openai_single_")


def client(base, key=KEY):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)


def ask(base, documents, key=KEY, **kw):
    """The raw response (headers) and the parsed completion."""
    raw = client(base, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0,
        extra_body={"documents": documents}, **kw)
    return raw.headers, raw.parse()


def blend_usage(r):
    return r.usage.model_extra["blendserve"]


class ClusterThroughTheOpenAIClient(unittest.TestCase):
    def test_1_documents_stored_once_are_answered_from_the_remote_tier_as_one_node_answers(self):
        stored = []
        for d in DOCS:
            status, headers, body = call(CLUSTER.base, "POST", "/v1/documents", {"text": d})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["source"], "computed", body)
            self.assertTrue(body["on_storage_node"], body)
            self.assertEqual(headers["X-Blendserve-Worker"], body["worker"])
            stored.append(body)
        # The single node's answer over the same stored documents.
        for d in DOCS:
            self.assertEqual(call(SINGLE.base, "POST", "/v1/documents", {"text": d})[0], 200)
        _, reference = ask(SINGLE.base, DOCS)
        self.assertEqual(blend_usage(reference).get("chunks_ram"), 2)
        # Round robin: two requests, two workers; each document was computed on one
        # of them, so the other loads it from the storage node.
        workers, remote = set(), 0
        for _ in range(2):
            headers, r = ask(CLUSTER.base, DOCS)
            workers.add(headers["X-Blendserve-Worker"])
            u = blend_usage(r)
            self.assertEqual(u.get("chunks_ram", 0) + u.get("chunks_remote", 0), 2, u)
            remote += u.get("chunks_remote", 0)
            self.assertEqual(r.choices[0].message.content, reference.choices[0].message.content)
            # At least the documents (the second also finds the prompt's prefix that
            # the first wrote back to the node).
            self.assertGreaterEqual(r.usage.prompt_tokens_details.cached_tokens,
                                    reference.usage.prompt_tokens_details.cached_tokens)
        self.assertEqual(workers, {"worker-1", "worker-2"})
        self.assertEqual(remote, 2, "each worker loaded the document it did not compute from the node")

    def test_2_stream_through_the_frontend_equals_the_whole_answer(self):
        _, whole = ask(CLUSTER.base, DOCS)
        stream = client(CLUSTER.base).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0,
            extra_body={"documents": DOCS}, stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
                continue
            text += chunk.choices[0].delta.content or ""
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_2b_text_completions_and_tokenize_through_the_frontend_equal_one_node(self):
        prompt = "Question: " + QUESTION + "\nAnswer:"
        kw = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"documents": DOCS})
        reference = client(SINGLE.base).completions.create(**kw)
        r = client(CLUSTER.base).completions.create(**kw)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].text, reference.choices[0].text)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)
        streamed = "".join(c.choices[0].text for c in client(CLUSTER.base).completions.create(stream=True, **kw)
                           if c.choices)
        self.assertEqual(streamed, reference.choices[0].text)
        for path, body in (("/tokenize", {"prompt": prompt}), ("/detokenize", {"tokens": [1, 2, 3]})):
            status, _, here = call(CLUSTER.base, "POST", path, body)
            self.assertEqual(status, 200, here)
            self.assertEqual(here, call(SINGLE.base, "POST", path, body)[2])

    def test_3_warm_loads_a_document_on_the_other_worker_from_the_node_and_delete_removes_it_everywhere(self):
        status, _, body = call(CLUSTER.base, "POST", "/v1/documents", {"text": WARM_DOC, "warm": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["source"], "computed", body)
        self.assertTrue(body["on_storage_node"], body)
        self.assertEqual(len(body["warmed"]), 1, body)
        other = body["warmed"][0]
        self.assertNotEqual(other["worker"], body["worker"])
        self.assertEqual(other.get("source"), "remote", body)
        # Stored again: nobody computes it.
        status, _, again = call(CLUSTER.base, "POST", "/v1/documents", {"text": WARM_DOC})
        self.assertEqual(status, 200, again)
        self.assertTrue(again["already_stored"], again)
        self.assertEqual(again["id"], body["id"])
        # DELETE through the frontend: every worker held it.
        status, _, deleted = call(CLUSTER.base, "DELETE", "/v1/documents/" + body["id"])
        self.assertEqual(status, 200, deleted)
        self.assertEqual(sorted(deleted["workers"]), ["worker-1", "worker-2"])
        self.assertNotIn("not_reached", deleted)
        status, _, gone = call(CLUSTER.base, "DELETE", "/v1/documents/" + body["id"])
        self.assertEqual(status, 404, gone)
        self.assertEqual(gone["error"]["code"], "document_not_found")
        # Gone from the storage node too: the next store computes it again.
        status, _, fresh = call(CLUSTER.base, "POST", "/v1/documents", {"text": WARM_DOC})
        self.assertEqual(status, 200, fresh)
        self.assertEqual(fresh["source"], "computed", fresh)

    def test_4_errors_are_the_clients_exception_types(self):
        with self.assertRaises(openai.AuthenticationError):
            ask(CLUSTER.base, DOCS, key="sk-wrong-key-0000")
        with self.assertRaises(openai.BadRequestError) as e:
            client(CLUSTER.base).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=5)
        self.assertEqual(e.exception.param, "temperature")
        with self.assertRaises(openai.NotFoundError) as e:
            client(CLUSTER.base).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(e.exception.code, "model_not_found")
        status, _, body = call(CLUSTER.base, "POST", "/v1/documents", {"text": "x", "warm": "yes"})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "warm")
        self.assertEqual([m.id for m in client(CLUSTER.base).models.list()], [MODEL])


def main():
    global ARGS, CLUSTER, SINGLE
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the build directory with blendserve and blendctl")
    ap.add_argument("--model", required=True, help="the GGUF model file")
    ARGS, rest = ap.parse_known_args()
    ok = False
    try:
        SINGLE = single_node()
        CLUSTER = Cluster()
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        ok = prog.result.wasSuccessful()
    finally:
        if not ok and CLUSTER is not None:
            sys.stderr.write(CLUSTER.logs())
        if not ok and SINGLE is not None:
            sys.stderr.write("---- single node ----\n" + SINGLE.stderr()[-3000:])
        if CLUSTER is not None:
            CLUSTER.stop()
        if SINGLE is not None:
            SINGLE.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
