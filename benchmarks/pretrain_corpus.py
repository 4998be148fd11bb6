"""Does more text help the default 10-minute run? The default recipe (`bertkit pretrain`) on the
built-in Wikipedia sample alone and with Debian's documentation added as training-only text
("wiki+python-docs": the held-out documents stay the same Wikipedia articles).

Each run trains its own vocabulary on its text, as a user's run would; "same vocabulary" runs reuse
the wiki run's vocabulary, so their held-out token ids are exactly the wiki run's and the figures
compare like for like. Needs `apt-get install python3.11-doc` (`make bench-corpus` installs it).
The held-out set is 5 articles (about 3,700 predictions at [MASK]: a standard error of about 0.7
points on the top-1 figure); one seed per corpus.

Adds a run (per CPU and date) to benchmarks/results/pretrain_corpus.json (final figures, the
train/held-out gap, held-out curves) and draws docs/pretrain-corpus.png; about 11 minutes per
run (35 in all).

    .venv/bin/python benchmarks/pretrain_corpus.py [--only NAME ...] [--table-only]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_name, figure, latest_result, save_figure, save_result

RESULT = Path("benchmarks/results/pretrain_corpus.json")
PLOT = Path("docs/pretrain-corpus.png")
WORK = Path("runs/pretrain-corpus")
# name -> (--corpus, reuse the wiki run's vocabulary)
RUNS = {
    "wiki": ("wiki", False),
    "wiki+python-docs, same vocabulary": ("wiki+python-docs", True),
    "wiki+python-docs": ("wiki+python-docs", False),
}


def run_one(name: str, corpus: str, same_vocab: bool) -> dict:
    out = WORK / name.replace(" ", "").replace(",", "-")
    shutil.rmtree(out, ignore_errors=True)  # this script's own work folder
    cmd = [sys.executable, "-m", "bertkit", "pretrain", "--corpus", corpus, "--out", str(out)]
    if same_vocab:
        cmd += ["--vocab", str(WORK / "wiki")]
    subprocess.run(cmd, check=True)
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = summary["corpus"]["train"]
    return {
        "command": "bertkit " + " ".join(cmd[3:]), "date": time.strftime("%Y-%m-%d"),
        "train_tokens": train.get("tokens"), "train_documents": train.get("documents"),
        "steps": summary["steps"], "pairs_seen": summary["pairs_seen"], "elapsed_s": summary["elapsed_s"],
        "final_train": summary["final_train"], "final_eval": summary["final_eval"],
        # (elapsed s, step, top-1 at [MASK], top-5 at [MASK], held-out MLM loss)
        "eval_curve": [(r["elapsed_s"], r["step"], r["eval_mlm_acc"], r["eval_mlm_top5"], r["eval_mlm_loss"])
                       for r in records if "eval_mlm_acc" in r],
    }


def table(results: dict) -> str:
    rows = ["| corpus | training tokens | epoch reached | steps | held-out top-1 at [MASK] | top-5 | held-out MLM loss "
            "| training top-1 at [MASK] (last steps) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        e, t = r["final_eval"], r["final_train"]
        rows.append(f"| {name} | {r['train_tokens'] / 1e6:.2f} M | {t.get('epoch', '?')} | {r['steps']} | {100 * e['eval_mlm_acc']:.1f}% "
                    f"| {100 * e['eval_mlm_top5']:.1f}% | {e['eval_mlm_loss']:.2f} | {100 * t['mlm_acc']:.1f}% |")
    return "\n".join(rows)


def plot(results: dict, path: Path) -> None:
    fig, ax = figure(figsize=(7, 4.2))
    for name, r in results.items():
        curve = r["eval_curve"]
        ax.plot([c[0] / 60 for c in curve], [100 * c[2] for c in curve], label=name)
    ax.set_xlabel("wall time (minutes, 2 CPU cores)")
    ax.set_ylabel("held-out top-1 at [MASK] (%)")
    ax.set_title("default recipe, 10 minutes: more training text")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", choices=list(RUNS), help="run these (the others are kept from the JSON)")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    saved = latest_result(RESULT.stem, RESULT.parent, **({} if args.table_only else {"cpu": cpu_name()}))
    results = saved["corpora"] if saved else {}
    if not args.table_only:
        for name in args.only or RUNS:
            corpus, same_vocab = RUNS[name]
            results[name] = run_one(name, corpus, same_vocab)
            save_result(RESULT.stem, {"corpora": results}, RESULT.parent)
    results = {name: results[name] for name in RUNS if name in results}
    plot(results, PLOT)
    print(table(results))


if __name__ == "__main__":
    main()
