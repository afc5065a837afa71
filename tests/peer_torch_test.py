#!/usr/bin/env python3
"""tools/gpu/peer_torch.py, the PyTorch peer of the GPU benchmarks, on the CPU with its tiny
shape: every mode runs and prints the JSON lines blendctl's benchmarks print (the
field names of tools/bench/bench_prefill.cpp and tools/bench/bench_decode.cpp, plus the peer's
"engine" and "torch_version"), progress on stderr; the shape table equals
model/random_model.cpp's; `check` (prefill vs cached decode vs batched decode, and the
static decode step of --cuda-graphs, run eagerly here) passes; `decode --cuda-graphs`
on the CPU is refused with exit 2. Where PyTorch sees a GPU, `check` runs there too, in
bf16 (the static step then replayed as a CUDA graph). Exit 77 (CTest: skipped) when
torch is not importable by this interpreter.

    python3 tests/peer_torch_test.py
"""
import json
import os
import re
import subprocess
import sys
import unittest

try:
    import torch  # noqa: F401  (only whether it imports)
except ImportError:
    print("torch is not importable by " + sys.executable + ": skipped", file=sys.stderr)
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "gpu", "peer_torch.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
import peer_torch  # noqa: E402

# The fields blendctl prints (tools/bench/bench_prefill.cpp, tools/bench/bench_decode.cpp).
GEMM_FIELDS = {"bench", "isa", "device", "precision", "shape", "m", "gflops"}
PREFILL_FIELDS = {"bench", "isa", "device", "model", "precision", "kv_dtype", "tokens", "seconds", "tokens_per_s",
                  "gemm_gflops_effective", "gemm_share_of_layer_mix", "mfu", "threads", "breakdown_last_run"}
DECODE_FIELDS = {"bench", "streams", "tokens", "prompt_tokens", "decode_tok_s", "per_stream_tok_s", "window_s",
                 "window_tokens", "span_tok_s", "mean_batch", "interleaved_steps", "ttft_max_s", "early_stops",
                 "max_decode_batch", "repeats", "kernel", "device", "model", "kv_dtype", "threads"}
SUMMARY_FIELDS = {"bench", "streams", "decode_tok_s", "ratio_last_vs_first", "kernel", "device", "model", "target"}
PEER_FIELDS = {"engine", "torch_version", "device"}


def run(*args, expect=0):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if p.returncode != expect:
        raise AssertionError(f"peer_torch.py {' '.join(args)}: exit {p.returncode}, expected {expect}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return lines, p.stderr


class PeerTorch(unittest.TestCase):
    def assert_fields(self, line, fields):
        missing = (fields | PEER_FIELDS) - set(line)
        self.assertFalse(missing, f"{line['bench']} line lacks {sorted(missing)}: {line}")
        self.assertEqual(line["engine"], "torch")
        self.assertEqual(line["torch_version"], torch.__version__)

    def test_shapes_equal_random_model_cpp(self):
        with open(os.path.join(ROOT, "model", "random_model.cpp")) as f:
            text = f.read()
        rows = re.findall(r'\{"([\w.-]+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*([\d.]+)f?\}', text)
        self.assertTrue(rows, "no shape table found in model/random_model.cpp")
        for name, *values in rows:
            self.assertIn(name, peer_torch.SHAPES, f"{name} of random_model.cpp is not in peer_torch.SHAPES")
            s = peer_torch.SHAPES[name]
            self.assertEqual([s[k] for k in ("layers", "dim", "ff", "heads", "kv_heads", "vocab")],
                             [int(v) for v in values[:6]], name)
            self.assertEqual(s["rope_theta"], float(values[6]), name)
        self.assertEqual(set(peer_torch.SHAPES) - {name for name, *_ in rows}, {"tiny"})

    def test_check_passes(self):
        lines, _ = run("check")
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["bench"], "check")
        self.assertTrue(lines[0]["ok"], lines[0])
        self.assertTrue(lines[0]["logits_finite"])
        self.assertEqual(lines[0]["device"], "cpu")
        # The static step (position and attention length from device tensors) against eager.
        self.assertLessEqual(lines[0]["static_vs_eager_max_abs_diff"], lines[0]["tolerance"])
        self.assertFalse(lines[0]["static_step_cuda_graph"])

    @unittest.skipUnless(torch.cuda.is_available(), "no CUDA device visible to PyTorch")
    def test_check_passes_on_cuda_in_bf16(self):
        lines, _ = run("check", "--device", "cuda", "--dtype", "bf16")
        self.assertTrue(lines[0]["ok"], lines[0])
        self.assertEqual(lines[0]["device"], torch.cuda.get_device_name())
        self.assertTrue(lines[0]["static_step_cuda_graph"])

    def test_prefill(self):
        lines, err = run("prefill", "--device", "cpu", "--model", "random:tiny", "--tokens", "16", "48",
                         "--repeats", "2", "--gemm-rows", "32", "--gemm-size", "64")
        gemms = [x for x in lines if x["bench"] == "gemm"]
        prefills = [x for x in lines if x["bench"] == "prefill"]
        self.assertEqual([g["shape"] for g in gemms], ["square", "qkv", "o", "gate_up", "down", "layer_mix"])
        self.assertEqual(len(lines), len(gemms) + len(prefills))
        for g in gemms:
            self.assert_fields(g, GEMM_FIELDS)
            self.assertGreater(g["gflops"], 0)
        peak = gemms[0]["gflops"]
        self.assertEqual((gemms[0]["m"], gemms[0]["k"], gemms[0]["n"]), (64, 64, 64))
        shape = peer_torch.SHAPES["tiny"]
        self.assertEqual([p["tokens"] for p in prefills], [16, 48])
        for p in prefills:
            self.assert_fields(p, PREFILL_FIELDS)
            n = p["tokens"]
            self.assertEqual((p["model"], p["precision"], p["device"]), ("random:tiny", "bf16", "cpu"))
            self.assertGreater(p["seconds"], 0)
            self.assertLessEqual(p["seconds_min"], p["seconds"])
            self.assertAlmostEqual(p["tokens_per_s"], n / p["seconds"], delta=1e-6 * p["tokens_per_s"])
            flops = peer_torch.gemm_flops_per_token(shape) * n + peer_torch.attention_flops(shape, n)
            self.assertAlmostEqual(p["flops_per_token"], flops / n)
            self.assertAlmostEqual(p["mfu"], flops / p["seconds"] / 1e9 / peak, delta=1e-9 + 1e-6 * p["mfu"])
            self.assertEqual(p["peak_gflops"], peak)
            self.assertGreater(p["gemm_share_of_layer_mix"], 0)
            self.assertTrue(p["logits_finite"])
        self.assertIn("peer_torch prefill: 6/6,", err)
        self.assertIn("ETA", err)

    def test_prefill_without_peak_on_cpu(self):
        lines, _ = run("prefill", "--device", "cpu", "--model", "random:tiny", "--tokens", "8", "--repeats", "1",
                       "--gemm-rows", "0", "--dtype", "f32")
        self.assertEqual([x["bench"] for x in lines], ["prefill"])
        self.assertIsNone(lines[0]["mfu"])
        self.assertEqual(lines[0]["precision"], "f32")

    def test_decode(self):
        lines, err = run("decode", "--device", "cpu", "--model", "random:tiny", "--streams", "1", "3",
                         "--tokens", "5", "--prompt-tokens", "8", "--repeats", "2")
        self.assertEqual([x["bench"] for x in lines], ["decode", "decode", "decode_summary"])
        for d, n in zip(lines[:2], (1, 3)):
            self.assert_fields(d, DECODE_FIELDS)
            self.assertEqual((d["streams"], d["tokens"], d["prompt_tokens"]), (n, 5, 8))
            self.assertEqual(d["window_tokens"], n * 4)
            self.assertAlmostEqual(d["decode_tok_s"], d["window_tokens"] / d["window_s"],
                                   delta=1e-6 * d["decode_tok_s"])
            self.assertAlmostEqual(d["per_stream_tok_s"], d["decode_tok_s"] / n)
            self.assertEqual(d["mean_batch"], n)
            self.assertEqual(d["max_decode_batch"], 3)
            self.assertLessEqual(d["decode_tok_s_median"], d["decode_tok_s"])
            self.assertEqual((d["kernel"], d["cuda_graphs"]), ("torch-eager/sdpa", False))
        s = lines[2]
        self.assert_fields(s, SUMMARY_FIELDS)
        self.assertFalse(s["cuda_graphs"])
        self.assertEqual(s["streams"], [1, 3])
        self.assertEqual(s["decode_tok_s"], [lines[0]["decode_tok_s"], lines[1]["decode_tok_s"]])
        self.assertAlmostEqual(s["ratio_last_vs_first"], s["decode_tok_s"][1] / s["decode_tok_s"][0])
        self.assertIn("peer_torch decode: 4/4,", err)

    def test_decode_cuda_graphs_on_cpu_exits_2(self):
        for device in (["--device", "cpu"], ["--device", "auto"]) if not torch.cuda.is_available() else (
                ["--device", "cpu"],):
            lines, err = run("decode", *device, "--model", "random:tiny", "--streams", "1", "--tokens", "3",
                             "--prompt-tokens", "4", "--cuda-graphs", expect=2)
            self.assertEqual(lines, [])
            self.assertIn("--cuda-graphs needs a CUDA device", err)
            self.assertNotIn("Traceback", err)

    def test_gemm_peak(self):
        lines, _ = run("gemm-peak", "--device", "cpu", "--gemm-size", "64", "--repeats", "2")
        self.assertEqual(len(lines), 1)
        self.assert_fields(lines[0], GEMM_FIELDS | {"k", "n", "tflops"})
        self.assertEqual((lines[0]["shape"], lines[0]["m"], lines[0]["precision"]), ("square", 64, "bf16"))
        self.assertAlmostEqual(lines[0]["tflops"], lines[0]["gflops"] / 1e3)

    def test_unknown_model_is_refused(self):
        _, err = run("prefill", "--device", "cpu", "--model", "random:nope", expect=1)
        self.assertIn("random:llama-3.1-8b", err)


if __name__ == "__main__":
    unittest.main()
