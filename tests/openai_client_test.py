#!/usr/bin/env python3
"""The official OpenAI Python client against `blendserve serve` on loopback.

Starts the real server binary (real model, a temporary data dir, a config with an
API key and one request slot), then drives it with `openai` (PyPI, pinned in
tools/setup.sh, installed in .venv-test): a completion, a stream with usage, RAG
documents (stored ahead through POST /v1/documents and sent with extra_body), and
errors surfacing as the client's own exception classes.

    .venv-test/bin/python tests/openai_client_test.py --server build/blendserve
"""
import argparse
import json
import sys
import threading
import time
import unittest
import urllib.request

import openai

from serve_process import ServeProcess

SERVER = None  # set in main()
SERVER_BINARY = None
MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-blendserve-test-key"
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 and is 330 "
    "metres tall.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak is 5895 metres above sea level.",
]


class Server(ServeProcess):
    """blendserve serve with an API key and one request slot; stderr is kept for failures."""

    def __init__(self, binary):
        super().__init__(binary, "server:\n  api_keys: [%s]\n"
                                 "limits:\n  max_requests: 1\n  max_queue: 0\n  max_prompt_tokens: 1024\n" % KEY,
                         prefix="bs_openai_")

    def post_json(self, path, body):
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())


def metric(server, name):
    """One unlabelled gauge or counter of the server's /metrics."""
    req = urllib.request.Request(server.base + "/metrics", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(name + " not in /metrics")


def client(key=KEY):
    # No retries: a 429 must surface as RateLimitError, not be retried away.
    return openai.OpenAI(base_url=SERVER.base + "/v1", api_key=key, max_retries=0, timeout=300)


class OpenAIClient(unittest.TestCase):
    def test_completion(self):
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0,
        )
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertIn("Paris", r.choices[0].message.content)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertGreater(r.usage.completion_tokens, 0)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_stream_with_usage_equals_the_completion(self):
        messages = [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "List three fruits."}]
        whole = client().chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        stream = client().chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        text, ids, finish, usage, roles = "", set(), None, None, []
        for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage
                self.assertEqual(chunk.choices, [])
                continue
            delta = chunk.choices[0].delta
            if delta.role:
                roles.append(delta.role)
            text += delta.content or ""
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        self.assertEqual(len(ids), 1)
        self.assertEqual(roles, ["assistant"])
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_text_completions(self):
        """/v1/completions through the client's completions API: text and token-id
        prompts give the same greedy text, streaming gives the whole text, documents
        stored ahead are served from stored KV."""
        prompt = "The capital of France is"
        whole = client().completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        self.assertEqual(whole.object, "text_completion")
        self.assertTrue(whole.id.startswith("cmpl-"))
        self.assertTrue(whole.choices[0].text)
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        tokens = SERVER.post_json("/tokenize", {"prompt": prompt})["tokens"]
        self.assertEqual(whole.usage.prompt_tokens, len(tokens))
        by_ids = client().completions.create(model=MODEL, prompt=tokens, max_tokens=12, temperature=0)
        self.assertEqual(by_ids.choices[0].text, whole.choices[0].text)
        stream = client().completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                             stream_options={"include_usage": True})
        text, finish, usage = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        self.assertEqual(text, whole.choices[0].text)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)
        stored = [SERVER.post_json("/v1/documents", {"text": d}) for d in DOCS]
        r = client().completions.create(model=MODEL, prompt="Question: how tall is the Eiffel Tower? Answer:",
                                        max_tokens=8, temperature=0, extra_body={"documents": DOCS})
        self.assertGreaterEqual(r.usage.prompt_tokens_details.cached_tokens, sum(s["tokens"] for s in stored))
        with self.assertRaises(openai.BadRequestError):
            client().completions.create(model=MODEL, prompt="x", echo=True)

    def test_documents_are_served_from_stored_kv(self):
        stored = [SERVER.post_json("/v1/documents", {"text": d}) for d in DOCS]
        for s in stored:
            self.assertRegex(s["id"], r"^[0-9a-f]{32}$")
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}],
            max_tokens=16, temperature=0, extra_body={"documents": DOCS},
        )
        details = r.usage.prompt_tokens_details
        doc_tokens = sum(s["tokens"] for s in stored)
        self.assertGreaterEqual(details.cached_tokens, doc_tokens)
        self.assertLess(details.cached_tokens, r.usage.prompt_tokens)
        self.assertTrue(r.choices[0].message.content)

    def test_prefix_caching(self):
        """Automatic prefix caching (blend.prefix_block_tokens, 16): an identical request
        loads all of its prompt but its last token and answers the same; turn 3 of
        a conversation loads at least 90% of turn 2's prompt (turn 2's prompt and the
        answer generated for it)."""
        notes = "\n".join("Note %d: the archive lists item %d under shelf %d, row %d." % (i, 7 * i, i % 9, i % 4)
                          for i in range(40))
        system = {"role": "system", "content": "You answer from these notes.\n" + notes}
        ask = [system, {"role": "user", "content": "Which shelf holds item 91?"}]
        first = client().chat.completions.create(model=MODEL, messages=ask, max_tokens=12, temperature=0)
        again = client().chat.completions.create(model=MODEL, messages=ask, max_tokens=12, temperature=0)
        prompt = again.usage.prompt_tokens
        self.assertGreater(prompt, 400)
        self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, 0.95 * prompt)
        self.assertEqual(again.choices[0].message.content, first.choices[0].message.content)
        conversation = list(ask)
        conversation.append({"role": "assistant", "content": first.choices[0].message.content})
        conversation.append({"role": "user", "content": "And which row?"})
        turn2 = client().chat.completions.create(model=MODEL, messages=conversation, max_tokens=12, temperature=0)
        conversation.append({"role": "assistant", "content": turn2.choices[0].message.content})
        conversation.append({"role": "user", "content": "Thank you. Which item is on shelf 3?"})
        turn3 = client().chat.completions.create(model=MODEL, messages=conversation, max_tokens=12, temperature=0)
        self.assertGreaterEqual(turn3.usage.prompt_tokens_details.cached_tokens, 0.9 * turn2.usage.prompt_tokens)
        self.assertGreaterEqual(turn3.usage.model_extra["blendserve"]["prefix_cached_tokens"],
                                0.9 * turn2.usage.prompt_tokens)

    def test_batch_invariant_prefix_caching_answers_as_a_cold_server(self):
        """model.batch_invariant: a request with all but its last token loaded from the
        prefix cache answers a cold server's greedy tokens, also in a near-tie (with the
        default products on an AVX2 EPYC, "Say hello." computed after a 16-token hit,
        then with 32 tokens stored, answered "Hello there, welcome..." where a cold
        server answers "Hello! I'm here..."). Two more servers: one reusing, one reusing
        nothing."""
        config = "model:\n  batch_invariant: true\nblend:\n  prefix_block_tokens: %d\n"
        warm = ServeProcess(SERVER_BINARY, config % 16, prefix="bs_openai_inv_")
        cold = None
        try:
            cold = ServeProcess(SERVER_BINARY, config % 0, prefix="bs_openai_cold_")
            def ask(server, question):
                c = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
                return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                 max_tokens=40, temperature=0)
            # "Name a colour." first: it stores the chat template's first block, so "Say
            # hello." is computed after a 16-token hit, then loaded with all but its last
            # token stored.
            for question in ["Name a colour.", "Say hello."]:
                first = ask(warm, question)
                deadline = time.time() + 60  # the blocks are stored after the first token
                blocks = first.usage.prompt_tokens - 1  # all but the last token (the last block partial)
                time.sleep(1)  # then they are mostly there: the first request's rows, not a retry's
                again = ask(warm, question)
                while again.usage.prompt_tokens_details.cached_tokens < blocks and time.time() < deadline:
                    time.sleep(0.2)
                    again = ask(warm, question)
                self.assertEqual(again.usage.prompt_tokens_details.cached_tokens, blocks, again.usage)
                reference = ask(cold, question)
                self.assertEqual(reference.usage.prompt_tokens_details.cached_tokens, 0)
                self.assertEqual(first.choices[0].message.content, reference.choices[0].message.content)
                self.assertEqual(again.choices[0].message.content, reference.choices[0].message.content)
        finally:
            warm.stop()
            if cold:
                cold.stop()

    def test_pasted_passages_are_learnt(self):
        """Passages pasted into a plain message (blank-line separated, as RAG frameworks
        paste them) are learnt in the background after the answer's first token; pasted
        again in the reverse order with another question they are blended: >= 80% of the
        prompt from stored KV. The learning is not instant: the reordered request is sent
        once the background computes are done (/metrics; a retry of the same request
        would load its own prefix blocks instead)."""
        passages = [
            "Passage %d. " % i + " ".join("The %s committee of district %d met on day %d and filed report %d."
                                          % (w, i, d, 10 * i + d) for d, w in enumerate(
                                              ["budget", "water", "roads", "schools", "parks", "health"]))
            for i in range(3)]
        def paste(order, question):
            text = "Use these passages.\n\n" + "".join(passages[i] + "\n\n" for i in order) + question
            return client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                                    max_tokens=8, temperature=0)
        first = paste([0, 1, 2], "Which committee met on day 3 in district 1?")
        # Nothing of it stored but prefix blocks (the default system prompt's).
        self.assertEqual(first.usage.model_extra["blendserve"].get("chunks_ram", 0), 0)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens,
                         first.usage.model_extra["blendserve"]["prefix_cached_tokens"])
        deadline = time.time() + 120
        while metric(SERVER, "blendserve_chunk_computes_in_flight") > 0 and time.time() < deadline:
            time.sleep(0.2)
        again = paste([2, 1, 0], "Which report did the parks committee of district 2 file?")
        found = again.usage.model_extra["blendserve"].get("chunks_ram", 0)
        self.assertEqual(found, 3, again.usage)
        self.assertGreater(again.usage.model_extra["blendserve"]["pasted_passage_tokens"], 0)
        self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, 0.8 * again.usage.prompt_tokens)

    def test_documents_are_reusable_at_once(self):
        """Documents never stored, sent with a request and then at once in the reverse
        order: the second request loads every chunk (the first request's rows of them,
        stored before its first token, serve until each is computed alone)."""
        docs = ["Archive note %d. " % i + " ".join("Shelf %d of hall %d holds the %s ledgers of year %d."
                                                  % (s, i, w, 1900 + 7 * s + i) for s, w in enumerate(
                                                      ["grain", "salt", "wool", "timber", "copper"]))
                for i in range(3)]
        ask = [{"role": "user", "content": "Which hall holds the salt ledgers of year 1911?"}]
        first = client().chat.completions.create(model=MODEL, messages=ask, max_tokens=4, temperature=0,
                                                 extra_body={"documents": docs})
        self.assertEqual(first.usage.model_extra["blendserve"]["chunks_missed"], 3)
        again = client().chat.completions.create(model=MODEL, messages=ask, max_tokens=4, temperature=0,
                                                 extra_body={"documents": docs[::-1]})
        self.assertEqual(again.usage.model_extra["blendserve"]["chunks_missed"], 0, again.usage)
        self.assertEqual(again.usage.model_extra["blendserve"].get("chunks_ram", 0), 3, again.usage)

    def test_eight_clients_at_once_compute_each_chunk_once(self):
        """Eight clients at once about the same new documents (a server with eight
        request slots): every one answered, each document's chunk computed alone once
        (single flight), read from /metrics."""
        server = ServeProcess(SERVER_BINARY, "limits:\n  max_requests: 8\n  max_queue: 8\n", prefix="bs_openai8_")
        try:
            docs = ["Harbour log %d. " % i + " ".join("Pier %d of port %d unloaded %d crates of %s on day %d."
                                                     % (p, i, 3 * p + i, w, p + 1) for p, w in enumerate(
                                                         ["tea", "iron", "cloth", "rice"]))
                    for i in range(3)]
            c = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
            answers = [None] * 8
            def ask(i):
                order = docs if i % 2 == 0 else docs[::-1]
                answers[i] = c.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Which pier unloaded tea? (%d)" % i}],
                    max_tokens=4, temperature=0, extra_body={"documents": order})
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertTrue(all(a is not None and a.choices[0].message.content is not None for a in answers))
            # Every request has ended, so every compute was claimed: wait until all ran.
            deadline = time.time() + 120
            while metric(server, "blendserve_chunk_computes_in_flight") > 0 and time.time() < deadline:
                time.sleep(0.5)
            self.assertEqual(metric(server, "blendserve_chunk_computes_in_flight"), 0)
            self.assertEqual(metric(server, "blendserve_chunks_computed"), 3)
        finally:
            server.stop()

    def test_errors_are_the_clients_exception_types(self):
        msgs = [{"role": "user", "content": "hi"}]
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model=MODEL, messages=msgs, temperature=5)
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.param, "temperature")
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 3000}])
        self.assertEqual(e.exception.code, "context_length_exceeded")
        with self.assertRaises(openai.NotFoundError) as e:
            client().chat.completions.create(model="gpt-4o", messages=msgs)
        self.assertEqual(e.exception.code, "model_not_found")
        with self.assertRaises(openai.AuthenticationError):
            client(key="sk-wrong-key-000").chat.completions.create(model=MODEL, messages=msgs)
        # The one request slot taken by a long stream: the next request is a 429.
        started = threading.Event()
        def long_stream():
            s = client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Write a long poem about the sea."}],
                max_tokens=120, temperature=0, stream=True)
            for _ in s:
                started.set()
        t = threading.Thread(target=long_stream)
        t.start()
        self.assertTrue(started.wait(60))
        with self.assertRaises(openai.RateLimitError) as e:
            client().chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
        self.assertGreaterEqual(int(e.exception.response.headers["retry-after"]), 1)
        t.join()
        # The server is still right afterwards.
        r = client().chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
        self.assertTrue(r.choices[0].message.content)

    def test_models(self):
        ids = [m.id for m in client().models.list()]
        self.assertEqual(ids, [MODEL])


def main():
    global SERVER, SERVER_BINARY
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="path to the blendserve binary")
    args, rest = ap.parse_known_args()
    SERVER_BINARY = args.server
    SERVER = Server(args.server)
    ok = False
    try:
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        ok = prog.result.wasSuccessful()
    finally:
        if not ok:
            sys.stderr.write("---- server stderr ----\n" + SERVER.stderr())
        SERVER.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
