#!/usr/bin/env python3
"""A soak of the real server (tools/bench/soak.sh starts it and runs this).

Drives `blendserve serve` at twice its admission limit (limits.max_requests +
limits.max_queue concurrent clients, times two) for --minutes with a seeded mix of
requests: non-streaming and streaming chats, requests with documents, streams the
client cancels after the first token, clients that disconnect before it, and hostile
ones (malformed JSON, a wrong model, an unknown role, an over-long prompt, a body over
server.max_body, bytes that are not UTF-8). Every request has a client deadline: one
without an answer by then is a hang. Every answer is checked: 200 with a valid body
(or a complete SSE stream ending in [DONE]), or the status that request must get with
the OpenAI error body ({"error": {"message", "type", ...}}); 429 and 503 (the
admission limit) are refusals, not failures.

A refused client waits as the server says (Retry-After, at most 2 s) before its next
request, as the OpenAI SDKs do. First every document the requests send is stored
(POST /v1/documents), so the RAM tier holds its working set. Around the load: a warm-up (a tenth of the time, at
least 60 s: the RAM tier, the KV pages and the allocator's arenas fill), then a quiet moment
where the server's RSS and open descriptors are read (/proc/PID) as the baseline, the
load with a sample of both every 5 s, and a quiet moment at the end read again. The
same greedy request is answered before and after: its text must not change. Then the
server gets SIGTERM and must exit within its drain time plus 30 s.

stdout: one JSON object (requests by outcome, p50/p99 TTFT, the RSS and descriptor
series, the targets and whether each held); progress on stderr. Exit 1 when a target
is missed: a hang, a crash, an unexpected answer, RSS after warm-up not within 5% of
the baseline, descriptors not back to the baseline, the answer changed, or a slow stop.
Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time

REFUSED = {429, 503}


def log(msg):
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def is_error_body(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e.get("message"), str) and e["message"] != "" and isinstance(e.get("type"), str)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


class Driver:
    def __init__(self, args, model, documents):
        self.args = args
        self.model = model
        self.documents = documents
        self.lock = threading.Lock()
        self.outcomes = {}
        self.ttfts = []
        self.unexpected = []  # (kind, status, body start)
        self.stop_at = 0.0

    def backoff(self, r):
        """A refused client waits as told (Retry-After, at most 2 s) before its next request."""
        try:
            wait = float(r.getheader("Retry-After") or 1)
        except ValueError:
            wait = 1.0
        time.sleep(min(2.0, max(0.2, wait)) * random.uniform(0.5, 1.0))

    def count(self, outcome, ttft=None, detail=None):
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if ttft is not None:
                self.ttfts.append(ttft)
            if detail is not None and len(self.unexpected) < 50:
                self.unexpected.append(detail)

    def conn(self):
        return http.client.HTTPConnection(self.args.host, self.args.port, timeout=self.args.request_timeout)

    def chat_body(self, rng, stream, docs=False, max_tokens=None):
        q = rng.choice(["Say hello.", "What is the capital of France?", "Count to five.",
                        "Name a colour.", "What do these documents say? Answer briefly."])
        b = {"model": self.model, "messages": [{"role": "user", "content": q}],
             "max_tokens": max_tokens or rng.choice([4, 8, 16, 24]), "temperature": rng.choice([0, 0.7])}
        if docs:
            b["documents"] = rng.choice(self.documents)
        if stream:
            b["stream"] = True
        return json.dumps(b).encode()

    # -- one request of each kind; each returns after counting its outcome ----------

    def plain(self, rng, stream, docs=False):
        kind = ("stream" if stream else "chat") + ("+docs" if docs else "")
        c = self.conn()
        t0 = time.monotonic()
        try:
            c.request("POST", "/v1/chat/completions", self.chat_body(rng, stream, docs),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status in REFUSED:
                body = r.read()
                if is_error_body(body):
                    self.backoff(r)
                    return self.count("refused")
                return self.count("unexpected", detail=(kind, r.status, body[:200].decode(errors="replace")))
            if r.status != 200:
                body = r.read()
                return self.count("unexpected", detail=(kind, r.status, body[:200].decode(errors="replace")))
            if not stream:
                body = r.read()
                j = json.loads(body)
                if j.get("object") == "chat.completion" and j["choices"][0]["message"]["content"] is not None:
                    return self.count("ok", ttft=j["usage"]["blendserve"]["ttft_seconds"])
                return self.count("unexpected", detail=(kind, 200, body[:200].decode(errors="replace")))
            first, done, error = None, False, False
            buf = b""
            while True:
                line = r.fp.readline()
                if not line:
                    break
                buf = line.strip()
                if not buf.startswith(b"data: "):
                    continue
                payload = buf[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                j = json.loads(payload)
                if "error" in j:
                    error = True
                    continue
                delta = j["choices"][0]["delta"] if j.get("choices") else {}
                if first is None and delta.get("content"):
                    first = time.monotonic() - t0
            if done and not error:
                return self.count("ok", ttft=first)
            return self.count("unexpected", detail=(kind, 200, f"stream ended done={done} error={error}"))
        except socket.timeout:
            return self.count("hang", detail=(kind, 0, f"no answer in {self.args.request_timeout} s"))
        except (ConnectionError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
            return self.count("unexpected", detail=(kind, 0, repr(e)[:200]))
        finally:
            c.close()

    def cancelled(self, rng):
        """A stream the client closes after its first event with text."""
        c = self.conn()
        try:
            c.request("POST", "/v1/chat/completions", self.chat_body(rng, True, max_tokens=64),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status in REFUSED:
                r.read()
                self.backoff(r)
                return self.count("refused")
            if r.status != 200:
                return self.count("unexpected", detail=("cancel", r.status, r.read()[:200].decode(errors="replace")))
            while True:
                line = r.fp.readline()
                if not line or b'"content"' in line:
                    break
            return self.count("cancelled_by_client")
        except socket.timeout:
            return self.count("hang", detail=("cancel", 0, "no first token"))
        except (ConnectionError, http.client.HTTPException) as e:
            return self.count("unexpected", detail=("cancel", 0, repr(e)[:200]))
        finally:
            c.close()

    def disconnect(self, rng):
        """The whole request sent, the connection closed at once."""
        body = self.chat_body(rng, rng.random() < 0.5, docs=rng.random() < 0.5)
        s = socket.create_connection((self.args.host, self.args.port), timeout=10)
        try:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        finally:
            s.close()
        time.sleep(0.2)  # the server is still answering it; the client does not know
        self.count("disconnected_by_client")

    def hostile(self, rng):
        """A request the server must refuse with a 4xx and the OpenAI error body."""
        kinds = [
            ("malformed_json", b'{"model": "x", "messages": [', 400),
            ("wrong_model", json.dumps({"model": "no-such-model",
                                        "messages": [{"role": "user", "content": "hi"}]}).encode(), 404),
            ("unknown_role", json.dumps({"model": self.model,
                                         "messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400),
            ("too_long", json.dumps({"model": self.model,
                                     "messages": [{"role": "user", "content": "word " * 40000}]}).encode(), 400),
            ("over_max_body", b'{"model": "' + b"x" * (self.args.max_body + 1024) + b'"}', 413),
            ("not_utf8", b'{"model": "' + self.model.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
             400),
            ("negative_tokens", json.dumps({"model": self.model, "max_tokens": -3,
                                            "messages": [{"role": "user", "content": "hi"}]}).encode(), 400),
        ]
        name, body, want = rng.choice(kinds)
        c = self.conn()
        try:
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            got = r.read()
            if (r.status == want or r.status in REFUSED) and is_error_body(got):
                if r.status in REFUSED:
                    self.backoff(r)
                time.sleep(0.05)  # a client that sends garbage still waits for its answer to sink in
                return self.count("refused" if r.status in REFUSED else "rejected")
            return self.count("unexpected", detail=(name, r.status, got[:200].decode(errors="replace")))
        except socket.timeout:
            return self.count("hang", detail=(name, 0, "no answer"))
        except (ConnectionError, http.client.HTTPException) as e:
            # A body over max_body may be refused before it is all sent: the server
            # answers 413 and closes; the client may see the reset instead.
            if name == "over_max_body":
                return self.count("rejected")
            return self.count("unexpected", detail=(name, 0, repr(e)[:200]))
        finally:
            c.close()

    def client(self, seed):
        rng = random.Random(seed)
        while time.monotonic() < self.stop_at:
            x = rng.random()
            if x < 0.30:
                self.plain(rng, stream=False)
            elif x < 0.55:
                self.plain(rng, stream=True)
            elif x < 0.70:
                self.plain(rng, stream=rng.random() < 0.5, docs=True)
            elif x < 0.80:
                self.cancelled(rng)
            elif x < 0.85:
                self.disconnect(rng)
            else:
                self.hostile(rng)

    def run(self, seconds, clients, seed):
        self.stop_at = time.monotonic() + seconds
        threads = [threading.Thread(target=self.client, args=(seed * 1000 + i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        return threads


def greedy_answer(args, model):
    c = http.client.HTTPConnection(args.host, args.port, timeout=args.request_timeout)
    body = {"model": model, "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
            "max_tokens": 24, "temperature": 0}
    c.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    return r.status, j.get("choices", [{}])[0].get("message", {}).get("content")


def get(args, path):
    c = http.client.HTTPConnection(args.host, args.port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (RSS, descriptors, SIGTERM)")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--admission", type=int, required=True, help="limits.max_requests + limits.max_queue")
    ap.add_argument("--max-body", type=int, required=True, help="server.max_body in bytes")
    ap.add_argument("--drain-seconds", type=float, default=10)
    ap.add_argument("--documents", required=True, help="a JSON-lines QA set whose documents the requests send")
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    docs = []
    with open(args.documents) as f:
        for line in f:
            d = json.loads(line)["documents"]
            docs.append(d[:3])
            if len(docs) == 8:
                break
    status, body = get(args, "/v1/models")
    model = json.loads(body)["data"][0]["id"]
    total = args.minutes * 60
    warm = max(60.0, total / 10)
    clients = 2 * args.admission
    drv = Driver(args, model, docs)

    # The documents the requests send are stored first: the RAM tier holds its working
    # set before the baseline is read (a cache filling up is not a leak).
    for d in sorted({doc for ds in docs for doc in ds}):
        c = http.client.HTTPConnection(args.host, args.port, timeout=args.request_timeout)
        c.request("POST", "/v1/documents", json.dumps({"text": d}).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            log(f"storing a document got {r.status}")
            return 1
    status, before = greedy_answer(args, model)
    if status != 200:
        log(f"the first greedy request got {status}")
        return 1
    log(f"warm-up {warm:.0f} s with {clients} clients")
    for t in drv.run(warm, clients, args.seed):
        t.join()
    time.sleep(3)
    base_rss, base_fds = rss_bytes(args.pid), open_fds(args.pid)
    log(f"baseline after warm-up: RSS {base_rss / 2**20:.1f} MiB, {base_fds} descriptors")
    with drv.lock:
        drv.outcomes.clear()
        drv.ttfts.clear()

    samples = []
    t_start = time.monotonic()
    threads = drv.run(total, clients, args.seed + 1)
    while any(t.is_alive() for t in threads):
        time.sleep(5)
        try:
            rss, fds = rss_bytes(args.pid), open_fds(args.pid)
        except FileNotFoundError:
            log("the server process is gone")
            break
        elapsed = time.monotonic() - t_start
        samples.append({"t_s": round(elapsed, 1), "rss_mib": round(rss / 2**20, 1), "fds": fds})
        with drv.lock:
            done = sum(drv.outcomes.values())
        log(f"{elapsed:.0f}/{total:.0f} s: {done} requests, RSS {rss / 2**20:.1f} MiB, {fds} descriptors")
    for t in threads:
        t.join(timeout=args.request_timeout + 10)
    alive = os.path.exists(f"/proc/{args.pid}")
    time.sleep(3)
    end_rss, end_fds = (rss_bytes(args.pid), open_fds(args.pid)) if alive else (0, 0)
    health = get(args, "/health")[0] if alive else 0
    after = greedy_answer(args, model)[1] if alive else None

    t_stop = time.monotonic()
    stopped_in = None
    if alive:
        os.kill(args.pid, signal.SIGTERM)
        while os.path.exists(f"/proc/{args.pid}") and time.monotonic() - t_stop < args.drain_seconds + 30:
            try:
                if os.waitpid(args.pid, os.WNOHANG)[0] == args.pid:
                    break
            except ChildProcessError:  # not our child (soak.sh started it): poll /proc
                pass
            time.sleep(0.1)
        if not os.path.exists(f"/proc/{args.pid}") or open(f"/proc/{args.pid}/stat").read().split()[2] == "Z":
            stopped_in = round(time.monotonic() - t_stop, 2)

    rss_max = max((s["rss_mib"] for s in samples), default=0) * 2**20
    targets = {
        "no_hang": drv.outcomes.get("hang", 0) == 0,
        "no_crash": alive and health == 200,
        "every_answer_expected": drv.outcomes.get("unexpected", 0) == 0,
        "rss_flat_5pct": alive and end_rss <= 1.05 * base_rss and rss_max <= 1.05 * base_rss,
        "descriptors_flat": alive and end_fds <= base_fds,
        "same_answer_after": after == before,
        "stopped_in_time": stopped_in is not None,
    }
    report = {
        "soak": {"minutes": args.minutes, "clients": clients, "admission_limit": args.admission, "seed": args.seed},
        "requests": dict(sorted(drv.outcomes.items())),
        "requests_total": sum(drv.outcomes.values()),
        "ttft_s": {"p50": percentile(drv.ttfts, 50), "p99": percentile(drv.ttfts, 99), "n": len(drv.ttfts)},
        "rss_mib": {"baseline": round(base_rss / 2**20, 1), "max": round(rss_max / 2**20, 1),
                    "end": round(end_rss / 2**20, 1)},
        "fds": {"baseline": base_fds, "max": max((s["fds"] for s in samples), default=0), "end": end_fds},
        "stop_s": stopped_in,
        "samples": samples,
        "unexpected": drv.unexpected,
        "targets": targets,
        "passed": all(targets.values()),
    }
    print(json.dumps(report))
    for k, v in targets.items():
        if not v:
            log(f"target missed: {k}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
