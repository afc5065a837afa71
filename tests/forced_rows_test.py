#!/usr/bin/env python3
"""tools/eval/forced_rows.py on rows shaped as `blendctl eval --forced-rows` writes them:
two runs (reuse; blend at 0.16) over two cases, the case-weighted agreement the eval's
summary gives, the splits by row, by gold against full and by full's lead, the flips'
median deficit; and a clear failure on a file that holds no rows or a foreign line.

    python3 tests/forced_rows_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "eval", "forced_rows.py")


def row(mode, case, r, gold, full, lead, token, deficit, ratio=None):
    line = {"id": f"c{case}", "case": case, "mode": mode, "row": r, "answer_tokens": 0, "gold_token": gold,
            "gold_text": str(gold), "full_token": full, "full_text": str(full), "full_lead": lead, "token": token,
            "text": str(token), "deficit": deficit}
    if ratio is not None:
        line["ratio"] = ratio
    return line


# Case 0: 4 rows (gold = full on rows 0, 2, 3); case 1: 2 rows (gold = full on row 0).
ROWS = [
    # reuse: case 0 agrees on rows 0, 1; case 1 on row 0.
    row("reuse", 0, 0, 10, 10, 3.0, 10, 0.0),
    row("reuse", 0, 1, 11, 12, 0.2, 12, 0.0),
    row("reuse", 0, 2, 13, 13, 5.0, 14, 2.0),
    row("reuse", 0, 3, 15, 15, 1.5, 16, 1.0),
    row("reuse", 1, 0, 20, 20, 0.7, 20, 0.0),
    row("reuse", 1, 1, 21, 22, 4.0, 23, 3.0),
    # blend 0.16: case 0 agrees on rows 0, 1, 2; case 1 on both.
    row("blend", 0, 0, 10, 10, 3.0, 10, 0.0, 0.16),
    row("blend", 0, 1, 11, 12, 0.2, 12, 0.0, 0.16),
    row("blend", 0, 2, 13, 13, 5.0, 13, 0.0, 0.16),
    row("blend", 0, 3, 15, 15, 1.5, 16, 0.5, 0.16),
    row("blend", 1, 0, 20, 20, 0.7, 20, 0.0, 0.16),
    row("blend", 1, 1, 21, 22, 4.0, 22, 0.0, 0.16),
]


def run(*paths):
    return subprocess.run([sys.executable, SCRIPT, *paths], capture_output=True, text=True, timeout=60)


class ForcedRows(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, lines):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return path

    def test_splits_and_case_weighted_agreement(self):
        # Two files (a run split over two invocations) read as one.
        a = self.write("a.jsonl", [json.dumps(r) for r in ROWS[:3]] + [""])
        b = self.write("b.jsonl", [json.dumps(r) for r in ROWS[3:]])
        p = run(a, b)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = [json.loads(line) for line in p.stdout.splitlines()]
        self.assertEqual([(s["mode"], s.get("ratio")) for s in out], [("reuse", None), ("blend", 0.16)])
        reuse, blend = out
        self.assertEqual(reuse["cases"], 2)
        self.assertAlmostEqual(reuse["agreement"], (2 / 4 + 1 / 2) / 2)
        self.assertAlmostEqual(blend["agreement"], (3 / 4 + 2 / 2) / 2)
        self.assertEqual(reuse["rows"], 6)
        self.assertAlmostEqual(reuse["row_agreement"], 3 / 6)
        self.assertEqual(reuse["first_row"], {"rows": 2, "agreement": 1.0})
        self.assertEqual(reuse["later_rows"], {"rows": 4, "agreement": 0.25})
        self.assertEqual(reuse["gold_is_full"], {"rows": 4, "agreement": 0.5})
        self.assertEqual(reuse["gold_is_not_full"], {"rows": 2, "agreement": 0.5})
        self.assertEqual(blend["gold_is_full"], {"rows": 4, "agreement": 0.75})
        self.assertEqual(blend["gold_is_not_full"], {"rows": 2, "agreement": 1.0})
        bands = {(b["lead_from"], b["lead_to"]): (b["rows"], b["agreement"]) for b in reuse["by_lead"]}
        self.assertEqual(bands[(0.0, 0.5)], (1, 1.0))
        self.assertEqual(bands[(0.5, 1.0)], (1, 1.0))
        self.assertEqual(bands[(1.0, 2.0)], (1, 0.0))
        self.assertEqual(bands[(2.0, 4.0)], (1, 1.0))
        self.assertEqual(bands[(4.0, None)], (2, 0.0))  # 4.0 falls in the top band
        self.assertAlmostEqual(reuse["flip_deficit_median"], 2.0)  # of 2.0, 1.0, 3.0
        self.assertAlmostEqual(blend["flip_deficit_median"], 0.5)
        self.assertIn("blend 0.16: 2 cases, agreement 0.875", p.stderr)

    def test_no_agreeing_or_no_flipping_rows(self):
        path = self.write("one.jsonl", [json.dumps(ROWS[6])])
        p = run(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        s = json.loads(p.stdout)
        self.assertIsNone(s["flip_deficit_median"])
        self.assertIsNone(s["gold_is_not_full"]["agreement"])
        self.assertEqual(s["gold_is_not_full"]["rows"], 0)

    def test_refuses_what_is_not_rows(self):
        empty = self.write("empty.jsonl", [""])
        p = run(empty)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no rows in", p.stderr)
        summary = self.write("summary.jsonl", [json.dumps(ROWS[0]), json.dumps({"summary": True, "mode": "blend"})])
        p = run(summary)
        self.assertEqual(p.returncode, 1)
        self.assertIn("summary.jsonl:2: not a row of blendctl eval --forced-rows", p.stderr)
        p = run(self.write("bad.jsonl", ["{not json"]))
        self.assertEqual(p.returncode, 1)
        self.assertIn("bad.jsonl:1:", p.stderr)


if __name__ == "__main__":
    unittest.main()
