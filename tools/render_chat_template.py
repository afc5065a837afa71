#!/usr/bin/env python3
"""Chat templates rendered by Python's jinja2 the way transformers' apply_chat_template
renders them (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loop
controls extension, transformers' tojson filter, raise_exception and strftime_now).
The reference tests/test_jinja_template.cpp compares blendserve's renderer with.

stdin:  {"cases": [{"template": PATH, "context": {...variables...}}, ...]}
stdout: {"results": [{"text": STR} | {"error": STR}, ...]}  (one per case, in order)
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    req = json.load(sys.stdin)
    env = environment()
    compiled = {}
    out = []
    for case in req["cases"]:
        path = case["template"]
        try:
            if path not in compiled:
                with open(path, encoding="utf-8") as f:
                    compiled[path] = env.from_string(f.read())
            out.append({"text": compiled[path].render(**case["context"])})
        except Exception as e:  # a template jinja2 cannot parse or that raises
            out.append({"error": "%s: %s" % (type(e).__name__, e)})
    json.dump({"results": out}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
