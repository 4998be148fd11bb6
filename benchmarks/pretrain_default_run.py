"""What `bertkit pretrain` with no arguments (so `make demo`) gives: one run of the default recipe
on the built-in Wikipedia sample, its 10-minute budget covering data preparation too.

Runs `bertkit pretrain --out DIR` (nothing else), or reads a finished run of that command
(--from DIR), and adds the run to benchmarks/results/pretrain_default_run.json (the final
figures, the held-out curve, the fill-mask and "crane" examples; one run per CPU and date, the
earlier runs kept) and draws docs/pretrain-default-10min.png (held-out accuracy at [MASK] and MLM
loss against wall time, the switch to full-length pairs marked). `--pretrain-args` probes another
recipe the same way (whole command, data preparation in the budget; the run is keyed by those
options too), `--result` and `--plot` put it elsewhere.

    .venv/bin/python benchmarks/pretrain_default_run.py [--from runs/pretrain-...] [--result J] [--plot P]
        [--pretrain-args "--batch-size 32"]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import figure, save_figure, save_result
from machine import cpu_name

RESULT = "benchmarks/results/pretrain_default_run.json"
PLOT = "docs/pretrain-default-10min.png"


def plot(records: list[dict], path: Path) -> None:
    evals = [r for r in records if "eval_mlm_acc" in r]
    train = [r for r in records if "mlm_loss" in r]
    minutes = [r["elapsed_s"] / 60 for r in evals]
    fig, (acc, loss) = figure(1, 2, figsize=(12, 4.2))
    acc.plot(minutes, [100 * r["eval_mlm_acc"] for r in evals], label="top-1 at [MASK]")
    acc.plot(minutes, [100 * r["eval_mlm_top5"] for r in evals], label="top-5 at [MASK]")
    acc.axhline(100 * evals[-1]["eval_majority_token_acc"], color="gray", linestyle=":",
                label="always the most common token")
    loss.plot(minutes, [r["eval_mlm_loss"] for r in evals], label="held-out MLM loss")
    loss.plot([r["elapsed_s"] / 60 for r in train], [r["mlm_loss"] for r in train], label="training MLM loss",
              alpha=0.6)
    switch = next((r for r in train if r.get("phase") == 1), None)
    if switch is not None and train[0].get("phase") == 0:
        for ax in (acc, loss):
            ax.axvline(switch["elapsed_s"] / 60, color="black", linewidth=0.8, linestyle="--")
        acc.text(switch["elapsed_s"] / 60, acc.get_ylim()[1] * 0.97, f" pairs of {switch['max_len']} tokens from here",
                 va="top", fontsize=8)
    acc.set_ylabel("held-out accuracy (%)")
    loss.set_ylabel("nats")
    for ax in (acc, loss):
        ax.set_xlabel("wall time (minutes, 2 CPU cores)")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, path, "bertkit pretrain (defaults): tiny BERT, wiki sample, 10 minutes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="run", help="a finished `bertkit pretrain --out DIR` run to read, on the machine "
                                                  "that ran it (its CPU is recorded)")
    ap.add_argument("--result", default=RESULT, help="the JSON to add the run to (the runs it holds are kept)")
    ap.add_argument("--plot", default=PLOT)
    ap.add_argument("--pretrain-args", default="", help="options for `bertkit pretrain` beyond --out (a probe of "
                                                        "another recipe; with --from, the options that run had)")
    args = ap.parse_args()
    result_path, plot_path = Path(args.result), Path(args.plot)
    run = Path(args.run) if args.run else Path(time.strftime("runs/default-%Y%m%d-%H%M%S"))
    if not args.run:
        subprocess.run([sys.executable, "-m", "bertkit", "pretrain", "--out", str(run),
                        *shlex.split(args.pretrain_args)], check=True)
    config = json.loads((run / "pretrain_config.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    result = {
        **({"variant": args.pretrain_args} if args.pretrain_args else {}),
        "command": f"bertkit pretrain {args.pretrain_args}".strip() if args.pretrain_args
                   else "bertkit pretrain (no arguments)",
        "recipe": {k: config[k] for k in ("recipe", "budget", "batch_size", "max_len", "short_len", "short_share", "lr",
                                          "warmup", "mask_prob", "dropout", "nsp_weight")},
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),  # so read a run (--from) on the machine that made it
        "precision": summary["precision"],
        "elapsed_s": summary["elapsed_s"], "steps": summary["steps"], "pairs_seen": summary["pairs_seen"],
        "pairs_per_s": summary["pairs_per_s"],
        "final_train": summary["final_train"], "final_eval": summary["final_eval"],
        "samples": json.loads((run / "samples.json").read_text()) if (run / "samples.json").exists() else None,
        # (elapsed s, step, top-1 at [MASK], top-5 at [MASK], held-out MLM loss)
        "eval_curve": [(r["elapsed_s"], r["step"], r["eval_mlm_acc"], r["eval_mlm_top5"], r["eval_mlm_loss"])
                       for r in records if "eval_mlm_acc" in r],
    }
    save_result(result_path.stem, result, result_path.parent)
    plot(records, plot_path)
    e = summary["final_eval"]
    print(f"{summary['steps']} steps in {summary['elapsed_s']:.0f} s; held-out at [MASK]: top-1 {e['eval_mlm_acc']:.3f}, "
          f"top-5 {e['eval_mlm_top5']:.3f}, MLM loss {e['eval_mlm_loss_mask']:.3f}; "
          f"over every predicted position (copyable unchanged ones included) {e['eval_mlm_loss']:.3f}")


if __name__ == "__main__":
    main()
