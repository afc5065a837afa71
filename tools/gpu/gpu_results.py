#!/usr/bin/env python3
"""Issue 39's GPU targets from one tools/gpu/gpu_ab.sh run, and the README table from them.

    gpu_results.py collect BENCH.jsonl --summary GPU_AB.json --date 2026-11-27 [--out-dir tools/gpu/results]
                   [--commit C] [--ours ENGINE] [--name NAME]
        one JSON line per target into <out-dir>/<date>_<NAME or gpu>.jsonl (printed too);
        --ours: the engine tag whose lines are "ours" (a variant's, e.g. after_gemm)
    gpu_results.py render RESULTS.jsonl [--readme README.md [--block NAME]]
        the markdown table (stdout), or written into README.md between the lines
        <!-- gpu-table:begin --> and <!-- gpu-table:end --> (with --block NAME:
        <!-- gpu-table:NAME:begin --> and <!-- gpu-table:NAME:end -->)

BENCH.jsonl holds gpu_ab.sh's lines: each benchmark line of `blendctl bench ...` and of
tools/gpu/peer_torch.py with "run" (decode_1b, prefill_8b, ttft_8b_6, ttft_8b_20) and
"engine" (after: the commit measured; before: the build before the change; torch;
torch_graphs: PyTorch with the decode step captured as a CUDA graph). A target line:
{"target", "commit", "gpu", "driver", "ours", "peer", "peer_name", "ratio", "aim",
"met", "unit", "before"} — ratio is ours/peer (or ours alone where the target is a
ratio of ours: decode_1b_32_vs_1, the blend TTFTs as a fraction of full prefill, both
through the runtime); "before" is the before build's value of "ratio" for those and of
"ours" for the others (null when it did not run). A target
whose numbers are missing from the run is written with null values and "met": null,
never left out, so a missing benchmark shows in the table.

Only the standard library. Progress and errors on stderr.
"""
import argparse
import json
import re
import sys

# target -> (aim, lower_is_better, unit, what it is, for the table)
TARGETS = {
    "prefill_8b_3072": (1.0, False, "tok/s", "prefill 8B, 3072 tokens vs PyTorch"),
    "prefill_8b_8192": (1.0, False, "tok/s", "prefill 8B, 8192 tokens vs PyTorch"),
    "decode_1b_1_vs_graphs": (1.0, False, "tok/s", "decode 1B, 1 stream vs PyTorch + CUDA graphs"),
    "decode_1b_1_vs_eager": (3.0, False, "tok/s", "decode 1B, 1 stream vs PyTorch eager"),
    "decode_1b_32": (1.0, False, "tok/s", "decode 1B, 32 streams vs PyTorch (best of eager, graphs)"),
    "decode_1b_32_vs_1": (12.0, False, "x", "decode 1B, 32 streams over our 1 stream"),
    "blend_8b_6x512": (0.30, True, "x full", "blend TTFT 8B, 6 x 512 in RAM, of full prefill"),
    "blend_8b_20x512": (0.25, True, "x full", "blend TTFT 8B, 20 x 512 in RAM, of full prefill"),
}


def load_lines(path):
    out = []
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                print(f"gpu_results: {path}:{n}: not JSON, skipped", file=sys.stderr)
    return out


def pick(lines, run, engine, **fields):
    """The first line of that run and engine whose fields equal the given ones."""
    for j in lines:
        if j.get("run") == run and j.get("engine") == engine and all(j.get(k) == v for k, v in fields.items()):
            return j
    return None


def value(line, key):
    return None if line is None else line.get(key)


def prefill_rate(lines, engine, tokens):
    return value(pick(lines, "prefill_8b", engine, bench="prefill", tokens=tokens), "tokens_per_s")


def decode_rate(lines, engine, streams):
    return value(pick(lines, "decode_1b", engine, bench="decode", streams=streams), "decode_tok_s")


def ttft(lines, run, engine, mode):
    """The runtime's TTFT of that mode (`blendctl bench ttft --tier ...`: path "runtime")."""
    return value(pick(lines, run, engine, bench="ttft_runtime", path="runtime", mode=mode), "ttft_s")


def ratio(a, b):
    return a / b if a is not None and b else None


def collect(lines, summary, ours="after"):
    """The target lines of one run: (target, ours, peer, peer_name, ratio, before). `ours`:
    the engine tag of the build measured (another than "after" for a variant's run)."""
    lines = [dict(j, engine="after") if j.get("engine") == ours else j for j in lines] if ours != "after" else lines
    rows = []
    for n in (3072, 8192):
        ours = prefill_rate(lines, "after", n)
        peer = prefill_rate(lines, "torch", n)
        rows.append((f"prefill_8b_{n}", ours, peer, "torch eager (sdpa)", ratio(ours, peer),
                     prefill_rate(lines, "before", n)))
    one, thirty_two = decode_rate(lines, "after", 1), decode_rate(lines, "after", 32)
    g1, e1 = decode_rate(lines, "torch_graphs", 1), decode_rate(lines, "torch", 1)
    rows.append(("decode_1b_1_vs_graphs", one, g1, "torch + CUDA graphs", ratio(one, g1),
                 decode_rate(lines, "before", 1)))
    rows.append(("decode_1b_1_vs_eager", one, e1, "torch eager", ratio(one, e1), decode_rate(lines, "before", 1)))
    peers32 = [(r, name) for r, name in ((decode_rate(lines, "torch_graphs", 32), "torch + CUDA graphs"),
                                         (decode_rate(lines, "torch", 32), "torch eager")) if r is not None]
    best32 = max(peers32) if peers32 else (None, None)
    rows.append(("decode_1b_32", thirty_two, best32[0], best32[1], ratio(thirty_two, best32[0]),
                 decode_rate(lines, "before", 32)))
    before_32_vs_1 = ratio(decode_rate(lines, "before", 32), decode_rate(lines, "before", 1))
    rows.append(("decode_1b_32_vs_1", thirty_two, one, "ours, 1 stream", ratio(thirty_two, one), before_32_vs_1))
    for run, target in (("ttft_8b_6", "blend_8b_6x512"), ("ttft_8b_20", "blend_8b_20x512")):
        full, blend = ttft(lines, run, "after", "full"), ttft(lines, run, "after", "blend")
        before = ratio(ttft(lines, run, "before", "blend"), ttft(lines, run, "before", "full"))
        rows.append((target, blend, full, "ours, full prefill", ratio(blend, full), before))
    out = []
    for target, ours, peer, peer_name, r, before in rows:
        aim, lower, unit, _ = TARGETS[target]
        met = None if r is None else (r <= aim if lower else r >= aim)
        out.append({"target": target, "commit": summary.get("commit"), "gpu": summary.get("gpu"),
                    "driver": summary.get("driver"), "ours": ours, "peer": peer, "peer_name": peer_name,
                    "ratio": r, "aim": aim, "lower_is_better": lower, "met": met, "unit": unit, "before": before})
    return out


def fmt(x, unit=""):
    if x is None:
        return "—"
    if unit == "tok/s" or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def render(results):
    head = results[0] if results else {}
    lines = [f"GPU {head.get('gpu', '?')}, driver {head.get('driver', '?')}, commit {str(head.get('commit', '?'))[:7]} "
             "(`tools/gpu/gpu_results.py render`, from the JSON lines in `tools/gpu/results/`):", "",
             "| target | ours | before the change | peer | ratio | aim | met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        aim, lower, unit, what = TARGETS.get(r["target"], (r.get("aim"), False, r.get("unit", ""), r["target"]))
        ours_unit = "s" if r["target"].startswith("blend_") else unit
        peer = "—" if r.get("peer") is None else f"{fmt(r['peer'], ours_unit)} ({r.get('peer_name')})"
        before_unit = "x full" if r["target"].startswith("blend_") else unit
        before = fmt(r.get("before"), before_unit)
        if r["target"].startswith("blend_") and r.get("before") is not None:
            before += " of full"
        elif r["target"] == "decode_1b_32_vs_1" and r.get("before") is not None:
            before += "x"
        met = {True: "yes", False: "no", None: "not measured"}[r.get("met")]
        sign = "<=" if lower else ">="
        lines.append(f"| {what} | {fmt(r.get('ours'), ours_unit)} | {before} | {peer} | {fmt(r.get('ratio'))} | "
                     f"{sign} {aim} | {met} |")
    return "\n".join(lines) + "\n"


def markers(block):
    tag = f"gpu-table:{block}:" if block else "gpu-table:"
    return f"<!-- {tag}begin -->", f"<!-- {tag}end -->"


def write_readme(path, table, block=None):
    BEGIN, END = markers(block)
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"gpu_results: {path} has no {BEGIN} ... {END} block")
    pre, rest = text.split(BEGIN, 1)
    _, post = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(pre + BEGIN + "\n" + table + END + post)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("bench")
    c.add_argument("--summary", required=True, help="gpu_ab.json of the same run")
    c.add_argument("--date", required=True)
    c.add_argument("--out-dir", default="tools/gpu/results")
    c.add_argument("--commit", help="the commit measured (default: the summary's; a dirty tree's is the one after)")
    c.add_argument("--ours", default="after", help="the engine tag of the build measured (default: after)")
    c.add_argument("--name", help="the file's name after the date (default: the GPU's)")
    r = sub.add_parser("render")
    r.add_argument("results")
    r.add_argument("--readme")
    r.add_argument("--block", help="which table of the README: the lines <!-- gpu-table:BLOCK:begin --> and "
                                   "<!-- gpu-table:BLOCK:end --> (default: <!-- gpu-table:begin --> ...)")
    a = ap.parse_args()
    if a.cmd == "collect":
        with open(a.summary) as f:
            summary = json.load(f)
        if a.commit:
            summary["commit"] = a.commit
        results = collect(load_lines(a.bench), summary, a.ours)
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", summary.get("gpu") or "unknown-gpu").strip("-").lower()
        path = f"{a.out_dir}/{a.date}_{a.name or gpu}.jsonl"
        with open(path, "w") as f:
            for row in results:
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row))
        print(f"gpu_results: {len(results)} targets into {path}", file=sys.stderr)
    else:
        table = render(load_lines(a.results))
        if a.readme:
            write_readme(a.readme, table, a.block)
            print(f"gpu_results: table written into {a.readme}", file=sys.stderr)
        else:
            sys.stdout.write(table)


if __name__ == "__main__":
    main()
