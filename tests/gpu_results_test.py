#!/usr/bin/env python3
"""tools/gpu/gpu_results.py on a bench.jsonl shaped as tools/gpu/gpu_ab.sh writes it (lines of
`blendctl bench decode|prefill|ttft` and of tools/gpu/peer_torch.py, tagged with run and
engine): each target's ours / peer / ratio / met / before, nulls for a benchmark that
did not run (never dropped), the file name from the date and the GPU, and the README
block rewritten between its markers and nowhere else.

    python3 tests/gpu_results_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "gpu", "gpu_results.py")


def read(path):
    with open(path) as f:
        return f.read()


def line(run, engine, **fields):
    return json.dumps({"run": run, "engine": engine, **fields})


BENCH = "\n".join([
    line("decode_1b", "after", bench="decode", streams=1, decode_tok_s=400.0),
    line("decode_1b", "after", bench="decode", streams=32, decode_tok_s=6000.0),
    line("decode_1b", "after", bench="decode_summary", streams=[1, 32]),
    line("decode_1b", "before", bench="decode", streams=1, decode_tok_s=120.0),
    line("decode_1b", "before", bench="decode", streams=32, decode_tok_s=540.0),
    line("decode_1b", "torch", bench="decode", streams=1, decode_tok_s=150.0),
    line("decode_1b", "torch", bench="decode", streams=32, decode_tok_s=4760.0),
    line("decode_1b", "torch_graphs", bench="decode", streams=1, decode_tok_s=500.0),
    line("decode_1b", "torch_graphs", bench="decode", streams=32, decode_tok_s=9000.0),
    line("prefill_8b", "after", bench="gemm", shape="square", gflops=780000.0),
    line("prefill_8b", "after", bench="prefill", tokens=3072, tokens_per_s=33000.0),
    line("prefill_8b", "after", bench="prefill", tokens=8192, tokens_per_s=25000.0),
    line("prefill_8b", "before", bench="prefill", tokens=3072, tokens_per_s=23200.0),
    line("prefill_8b", "torch", bench="prefill", tokens=3072, tokens_per_s=32380.0),
    line("prefill_8b", "torch", bench="prefill", tokens=8192, tokens_per_s=30756.0),
    line("ttft_8b_6", "after", bench="ttft_runtime", path="runtime", mode="full", ttft_s=0.160),
    line("ttft_8b_6", "after", bench="ttft_runtime", path="engine", mode="blend", ttft_s=0.150),
    line("ttft_8b_6", "after", bench="ttft_runtime", path="runtime", mode="blend", ttft_s=0.040),
    line("ttft_8b_6", "before", bench="ttft_runtime", path="runtime", mode="blend", ttft_s=0.132),
    line("ttft_8b_6", "before", bench="ttft_runtime", path="runtime", mode="full", ttft_s=0.2),
    "not json at all",
])
SUMMARY = {"gpu": "NVIDIA H200", "driver": "580.159.04", "commit": "abc1234def"}


class GpuResults(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.bench = os.path.join(d, "bench.jsonl")
        self.summary = os.path.join(d, "gpu_ab.json")
        with open(self.bench, "w") as f:
            f.write(BENCH + "\n")
        with open(self.summary, "w") as f:
            json.dump(SUMMARY, f)

    def tearDown(self):
        self.dir.cleanup()

    def collect(self):
        p = subprocess.run([sys.executable, SCRIPT, "collect", self.bench, "--summary", self.summary,
                            "--date", "2026-11-27", "--out-dir", self.dir.name],
                           capture_output=True, text=True, check=True)
        path = os.path.join(self.dir.name, "2026-11-27_nvidia-h200.jsonl")
        rows = [json.loads(l) for l in read(path).splitlines()]
        self.assertEqual(rows, [json.loads(l) for l in p.stdout.splitlines()])
        return path, {r["target"]: r for r in rows}

    def test_targets(self):
        _, t = self.collect()
        self.assertEqual(len(t), 8)
        for r in t.values():
            self.assertEqual((r["commit"], r["gpu"], r["driver"]), ("abc1234def", "NVIDIA H200", "580.159.04"))
        p = t["prefill_8b_3072"]
        self.assertAlmostEqual(p["ratio"], 33000.0 / 32380.0)
        self.assertTrue(p["met"])
        self.assertEqual(p["before"], 23200.0)
        self.assertFalse(t["prefill_8b_8192"]["met"])
        self.assertIsNone(t["prefill_8b_8192"]["before"])  # the before build's 8192 line is missing
        self.assertAlmostEqual(t["decode_1b_1_vs_graphs"]["ratio"], 0.8)
        self.assertFalse(t["decode_1b_1_vs_graphs"]["met"])
        self.assertAlmostEqual(t["decode_1b_1_vs_eager"]["ratio"], 400.0 / 150.0)
        self.assertFalse(t["decode_1b_1_vs_eager"]["met"])  # aim 3x
        d32 = t["decode_1b_32"]
        self.assertEqual((d32["peer"], d32["peer_name"]), (9000.0, "torch + CUDA graphs"))  # the stronger peer
        self.assertAlmostEqual(t["decode_1b_32_vs_1"]["ratio"], 15.0)
        self.assertTrue(t["decode_1b_32_vs_1"]["met"])
        self.assertAlmostEqual(t["decode_1b_32_vs_1"]["before"], 4.5)
        b6 = t["blend_8b_6x512"]
        self.assertAlmostEqual(b6["ratio"], 0.25)
        self.assertTrue(b6["met"])  # lower is better, aim 0.30; the engine path's line is not the runtime's
        self.assertAlmostEqual(b6["before"], 0.66)
        b20 = t["blend_8b_20x512"]  # did not run: kept, with nulls
        self.assertIsNone(b20["ratio"])
        self.assertIsNone(b20["met"])

    def test_a_variants_run_and_a_named_block(self):
        # The lines of a variant (engine after_gemm) as ours; no peer in that run: nulls.
        variant = "\n".join([line("decode_1b", "after_gemm", bench="decode", streams=1, decode_tok_s=444.0),
                               line("decode_1b", "after_gemm", bench="decode", streams=32, decode_tok_s=6943.0),
                               line("decode_1b", "after", bench="decode", streams=1, decode_tok_s=505.0)])
        with open(self.bench, "w") as f:
            f.write(variant + "\n")
        p = subprocess.run([sys.executable, SCRIPT, "collect", self.bench, "--summary", self.summary, "--date",
                            "2026-11-27", "--name", "run2", "--ours", "after_gemm", "--out-dir", self.dir.name],
                           capture_output=True, text=True, check=True)
        t = {json.loads(l)["target"]: json.loads(l) for l in p.stdout.splitlines()}
        self.assertEqual(t["decode_1b_32_vs_1"]["ours"], 6943.0)
        self.assertAlmostEqual(t["decode_1b_32_vs_1"]["ratio"], 6943.0 / 444.0)
        self.assertIsNone(t["decode_1b_1_vs_eager"]["peer"])
        self.assertIsNone(t["decode_1b_1_vs_eager"]["met"])
        path = os.path.join(self.dir.name, "2026-11-27_run2.jsonl")
        readme = os.path.join(self.dir.name, "README.md")
        with open(readme, "w") as f:
            f.write("<!-- gpu-table:begin -->\nA\n<!-- gpu-table:end -->\n"
                    "<!-- gpu-table:run2:begin -->\nB\n<!-- gpu-table:run2:end -->\n")
        subprocess.run([sys.executable, SCRIPT, "render", path, "--readme", readme, "--block", "run2"], check=True,
                       capture_output=True)
        text = read(readme)
        self.assertIn("<!-- gpu-table:begin -->\nA\n<!-- gpu-table:end -->", text)  # the other block untouched
        self.assertNotIn("\nB\n", text)
        self.assertIn("| decode 1B, 32 streams over our 1 stream | 6,943 |", text)

    def test_render_into_readme(self):
        path, _ = self.collect()
        readme = os.path.join(self.dir.name, "README.md")
        with open(readme, "w") as f:
            f.write("before\n<!-- gpu-table:begin -->\nold table\n<!-- gpu-table:end -->\nafter\n")
        subprocess.run([sys.executable, SCRIPT, "render", path, "--readme", readme], check=True,
                       capture_output=True)
        text = read(readme)
        self.assertTrue(text.startswith("before\n<!-- gpu-table:begin -->\n"))
        self.assertTrue(text.endswith("<!-- gpu-table:end -->\nafter\n"))
        self.assertNotIn("old table", text)
        self.assertIn("| decode 1B, 1 stream vs PyTorch + CUDA graphs | 400 | 120 | 500 (torch + CUDA graphs) | 0.800 "
                      "| >= 1.0 | no |", text)
        self.assertIn("| blend TTFT 8B, 20 x 512 in RAM, of full prefill | — | — | — | — | <= 0.25 | not measured |",
                      text)
        self.assertIn("commit abc1234", text)
        # A README without the markers is an error, not a silent append.
        with open(readme, "w") as f:
            f.write("no markers\n")
        p = subprocess.run([sys.executable, SCRIPT, "render", path, "--readme", readme], capture_output=True,
                           text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(read(readme), "no markers\n")


if __name__ == "__main__":
    unittest.main()
