#!/usr/bin/env python3
"""Gemma 3 270M (the real Q4_K_M file tools/setup.sh installs) end to end through the
HTTP API with the official OpenAI client: its SentencePiece tokenizer and BOS over
/tokenize, /v1/completions with and without a stream, and a documents request whose
stored chunks are blended (cached_tokens > 0) in one order and then in the other.

Chat: the file is a base model and holds no chat template, so the server is started with
Gemma's turn template given by --chat-template (Gemma 2's, from llama.cpp's
models/templates: the same <start_of_turn> turns Gemma 3 is trained on). Chat answers,
streamed and not; a documents chat hits its stored chunks in either order; a system
message, which that template refuses, is a 400 with the template's own words.

    .venv-test/bin/python tests/openai_gemma_test.py --server build/blendserve \
        --model models/gemma-3-270m-q4_k_m.gguf \
        --chat-template models/llama.cpp/templates/google-gemma-2-2b-it.jinja
"""
import argparse
import json
import os
import sys
import unittest
import urllib.request

import openai

from serve_process import ServeProcess

SERVER = None  # set in main()
MODEL = None   # the id /v1/models names
HERE = os.path.dirname(os.path.abspath(__file__))
GEMMA_BOS = 2  # <bos> in Gemma 3's vocabulary


def post_json(path, body):
    req = urllib.request.Request(SERVER.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def client():
    return openai.OpenAI(base_url=SERVER.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def case():
    """The first case of tests/data/rag_qa.jsonl: its first two documents and question."""
    with open(os.path.join(HERE, "data", "rag_qa.jsonl")) as f:
        c = json.loads(f.readline())
    return c["documents"][:2], c["question"]


class Gemma(unittest.TestCase):
    def test_tokenizer_adds_bos_where_the_model_does(self):
        t = post_json("/tokenize", {"prompt": "The capital of France is"})
        self.assertEqual(t["tokens"][0], GEMMA_BOS)
        bare = post_json("/tokenize", {"prompt": "The capital of France is", "add_special_tokens": False})
        self.assertEqual(bare["tokens"], t["tokens"][1:])
        self.assertEqual(post_json("/detokenize", {"tokens": bare["tokens"]})["prompt"], "The capital of France is")

    def test_completion_and_stream(self):
        prompt = "The capital of France is"
        whole = client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        self.assertTrue(whole.choices[0].text.strip())
        # The BOS is counted: the prompt is what /tokenize gives.
        self.assertEqual(whole.usage.prompt_tokens, post_json("/tokenize", {"prompt": prompt})["count"])
        streamed = "".join(c.choices[0].text for c in client().completions.create(
            model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
        self.assertEqual(streamed, whole.choices[0].text)

    def test_documents_are_blended_in_either_order(self):
        docs, question = case()
        stored = [post_json("/v1/documents", {"text": d}) for d in docs]
        doc_tokens = sum(s["tokens"] for s in stored)
        prompt = "\nQuestion: " + question + "\nAnswer:"
        for order in (docs, docs[::-1]):
            r = client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                            extra_body={"documents": order, "mode": "blend"})
            details = r.usage.prompt_tokens_details
            self.assertGreater(details.cached_tokens, 0)
            self.assertGreaterEqual(details.cached_tokens + details.recomputed_tokens, doc_tokens // 2)
            self.assertLess(details.cached_tokens, r.usage.prompt_tokens)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length"))

    def test_chat_with_the_given_template(self):
        question = "What is the capital of France?"
        whole = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                 max_tokens=12, temperature=0)
        text = whole.choices[0].message.content
        self.assertTrue(text.strip())
        self.assertNotIn("<start_of_turn>", text)
        self.assertNotIn("<end_of_turn>", text)
        # The prompt is the template's: <bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n.
        rendered = "<bos><start_of_turn>user\n" + question + "<end_of_turn>\n<start_of_turn>model\n"
        ids = post_json("/tokenize", {"prompt": rendered, "add_special_tokens": False})
        self.assertEqual(ids["tokens"].count(GEMMA_BOS), 1)
        self.assertEqual(whole.usage.prompt_tokens, ids["count"])
        streamed = "".join(c.choices[0].delta.content or "" for c in client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0,
            stream=True) if c.choices)
        self.assertEqual(streamed, text)

    def test_chat_documents_hit_in_either_order(self):
        docs, question = case()
        for d in docs:
            post_json("/v1/documents", {"text": d})
        for order in (docs, docs[::-1]):
            r = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                 max_tokens=8, temperature=0,
                                                 extra_body={"documents": order, "mode": "blend"})
            self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)
            self.assertTrue(r.choices[0].message.content is not None)

    def test_a_conversation_the_template_refuses_is_a_400_in_its_words(self):
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model=MODEL, max_tokens=4, messages=[
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        self.assertIn("System role not supported", str(e.exception))

    def test_tools_to_a_template_without_them_are_a_400_saying_so(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model=MODEL, max_tokens=4, tools=tools,
                                             messages=[{"role": "user", "content": "Weather in Paris?"}])
        self.assertIn("does not take tools", str(e.exception))
        # tool_choice "none": the tools are not offered, and the chat is answered.
        r = client().chat.completions.create(model=MODEL, max_tokens=4, tools=tools, tool_choice="none",
                                             messages=[{"role": "user", "content": "Weather in Paris?"}])
        self.assertIsNotNone(r.choices[0].message.content)


def main():
    global SERVER, MODEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="path to the blendserve binary")
    ap.add_argument("--model", required=True, help="the Gemma 3 270M GGUF")
    ap.add_argument("--chat-template", required=True, help="Gemma's turn template (Jinja)")
    args, rest = ap.parse_known_args()
    if not os.path.exists(args.model):
        print("skipped: no " + args.model + " (tools/setup.sh installs it)")
        sys.exit(77)
    SERVER = ServeProcess(args.server, "model:\n  path: %s\n" % os.path.abspath(args.model), prefix="bs_gemma_",
                          args=("--chat-template", os.path.abspath(args.chat_template)))
    ok = False
    try:
        MODEL = [m.id for m in client().models.list()][0]
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        ok = prog.result.wasSuccessful()
    finally:
        if not ok:
            sys.stderr.write("---- server stderr ----\n" + SERVER.stderr())
        SERVER.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
