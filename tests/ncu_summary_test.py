#!/usr/bin/env python3
"""tools/gpu/ncu_summary.py on rows of a real Nsight Compute log (random:llama-3.2-1b decode
on an H200, 2026-11-26) mixed with the profiled program's own output: the sums per
(kernel, grid), largest first, and a clear failure on a log without ncu rows.

    python3 tests/ncu_summary_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "gpu", "ncu_summary.py")

HEADER = ('"Process ID","Process Name","Host Name","Kernel Name","Block Size","Grid Size","Device","CC",'
          '"Invocations","Section Name","Metric Name","Metric Unit","Minimum","Maximum","Average"')


def row(kernel, grid, calls, mean_ns, unit="ns"):
    return (f'"3458","blendctl","127.0.0.1","{kernel}","(256, 1, 1)","{grid}","0","9.0","{calls}",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","1.00","2.00","{mean_ns}"')


LOG = "\n".join([
    "==WARNING== Note: Running with unmodified GPU clocks.",
    "==PROF== Connected to process 3458 (/work/main/build-gpu/blendctl)",
    '{"bench":"decode","decode_tok_s":0.43,"streams":1}',
    HEADER,
    row("unnamed>::argmax_rows(const float *, long, const SampleRow *, int *)", "(1, 1, 1)", 22, "195,524.36"),
    row("unnamed>::gemv_rows(const __nv_bfloat16 *, const float *, float *, const float *, long, long, long, bool)",
        "(2048, 1, 1)", 384, "82,738.42"),
    row("unnamed>::gemv_rows(const __nv_bfloat16 *, const float *, float *, const float *, long, long, long, bool)",
        "(256, 1, 1)", 768, "29,220.33"),
    row("void unnamed>::dequant_to_bf16<30>(const unsigned char *, __nv_bfloat16 *, long, long, long)",
        "(65535, 1, 1)", 33, "96.2", unit="us"),
    "==PROF== Disconnected from process 3458",
]) + "\n"


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        return subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)


class NcuSummary(unittest.TestCase):
    def test_sums_per_kernel_and_grid_largest_first(self):
        p = run(LOG)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        rows, total = lines[:-1], lines[-1]
        self.assertEqual([(r["kernel"], r["grid"]) for r in rows],
                         [("gemv_rows", "(2048, 1, 1)"), ("gemv_rows", "(256, 1, 1)"),
                          ("argmax_rows", "(1, 1, 1)"), ("dequant_to_bf16<30>", "(65535, 1, 1)")])
        self.assertAlmostEqual(rows[0]["total_ms"], 384 * 82738.42 / 1e6, places=3)
        self.assertAlmostEqual(rows[0]["mean_us"], 82.74, places=2)
        self.assertEqual(rows[2]["calls"], 22)
        self.assertAlmostEqual(rows[3]["total_ms"], 33 * 96.2 / 1e3, places=3)  # a row in us
        self.assertAlmostEqual(total["total_ms"], sum(r["total_ms"] for r in rows), places=2)
        self.assertEqual(total["kernels"], 4)
        self.assertIn("gemv_rows grid(2048, 1, 1)", p.stderr)  # the table

    def test_top_limits_the_rows_not_the_total(self):
        p = run(LOG, "--top", "1")
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        self.assertEqual(len(lines), 2)
        self.assertEqual(lines[-1]["kernels"], 4)

    def test_a_log_without_ncu_rows_fails_saying_so(self):
        p = run('{"bench":"decode"}\n==PROF== Connected\n')
        self.assertEqual(p.returncode, 1)
        self.assertIn("no gpu__time_duration rows", p.stderr)
        self.assertEqual(p.stdout, "")


if __name__ == "__main__":
    unittest.main()
