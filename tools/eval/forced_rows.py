#!/usr/bin/env python3
"""tools/eval/forced_rows.py — where the teacher-forced gold agreement is lost, from the
rows `blendctl eval --forced-rows F.jsonl` writes (one line per gold-answer row and run).

    python3 tools/eval/forced_rows.py ROWS.jsonl [ROWS.jsonl ...]

Per run (mode, and ratio for the blend), one JSON line on stdout:
  agreement        the mean over cases of each case's share of agreeing rows (what the
                   eval's summary calls top1_agreement, over the cases in these files)
  rows, row_agreement      rows and the share of them that agree
  first_row / later_rows   the same for each answer's first row and for the rows after it
  gold_is_full / gold_is_not_full   the rows where full's token is the gold token, and the
                   rows where full itself leaves the gold answer (its token is another)
  by_lead          per band of full's lead over its runner-up (logits): rows, agreement
  flip_deficit_median      the median deficit (the mode's top logit minus its logit of
                   full's token) over the rows that do not agree; null when none
Then the same as a table on stderr. A row agrees when the mode's token is full's.
"""
import argparse
import json
import statistics
import sys

LEAD_BANDS = [(0.0, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, float("inf"))]


def share(rows):
    return {"rows": len(rows),
            "agreement": (sum(r["token"] == r["full_token"] for r in rows) / len(rows)) if rows else None}


def summarize(rows):
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r["token"] == r["full_token"])
    flips = [r["deficit"] for r in rows if r["token"] != r["full_token"]]
    bands = []
    for lo, hi in LEAD_BANDS:
        band = share([r for r in rows if lo <= r["full_lead"] < hi])
        bands.append({"lead_from": lo, "lead_to": None if hi == float("inf") else hi, **band})
    return {
        "cases": len(by_case),
        "agreement": statistics.fmean(sum(v) / len(v) for v in by_case.values()),
        "rows": len(rows),
        "row_agreement": share(rows)["agreement"],
        "first_row": share([r for r in rows if r["row"] == 0]),
        "later_rows": share([r for r in rows if r["row"] > 0]),
        "gold_is_full": share([r for r in rows if r["gold_token"] == r["full_token"]]),
        "gold_is_not_full": share([r for r in rows if r["gold_token"] != r["full_token"]]),
        "by_lead": bands,
        "flip_deficit_median": statistics.median(flips) if flips else None,
    }


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="files written by blendctl eval --forced-rows")
    args = ap.parse_args()
    runs = {}  # (mode, ratio) -> rows, in the order first seen
    for path in args.rows:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    key = (r["mode"], r.get("ratio"))
                    for k in ("case", "row", "gold_token", "full_token", "full_lead", "token", "deficit"):
                        r[k]  # noqa: B018 (a KeyError names the missing field)
                except (ValueError, KeyError) as e:
                    print(f"{path}:{n}: not a row of blendctl eval --forced-rows ({e})", file=sys.stderr)
                    return 1
                runs.setdefault(key, []).append(r)
    if not runs:
        print("no rows in " + ", ".join(args.rows), file=sys.stderr)
        return 1
    for (mode, ratio), rows in runs.items():
        s = {"mode": mode, **({"ratio": ratio} if ratio is not None else {}), **summarize(rows)}
        print(json.dumps(s))
        name = mode if ratio is None else f"{mode} {ratio:g}"
        print(f"{name}: {s['cases']} cases, agreement {fmt(s['agreement'])}; {s['rows']} rows: "
              f"first {fmt(s['first_row']['agreement'])} ({s['first_row']['rows']}), "
              f"later {fmt(s['later_rows']['agreement'])} ({s['later_rows']['rows']}); "
              f"gold is full's {fmt(s['gold_is_full']['agreement'])} ({s['gold_is_full']['rows']}), "
              f"is not {fmt(s['gold_is_not_full']['agreement'])} ({s['gold_is_not_full']['rows']}); "
              f"flip deficit median {fmt(s['flip_deficit_median'])}", file=sys.stderr)
        print("  full's lead   " + "  ".join(
            f"[{b['lead_from']:g},{'inf' if b['lead_to'] is None else format(b['lead_to'], 'g')}): "
            f"{fmt(b['agreement'])} ({b['rows']})" for b in s["by_lead"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
