"""What `bertkit pretrain` says at the end of a run: the closing figures beside their bars
(the unigram plateau, the majority labels), and samples.json (fill-mask on held-out text,
context-sensitivity and the downstream probe)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..files import write_file
from ..folders import load_model
from ..tokenizer import WordPieceTokenizer
from .probe import PROBE_MIN_RUN_S, report
from .recipes import PretrainConfig
from .samples import show
from .shards import TokenStore

# held-out top-1 at [MASK] below this many times always answering the most common token: the run
# is still on the unigram plateau (a run past it: 0.159 against 0.044)
PLATEAU_FACTOR = 1.5
# a student's held-out cosine this far below its best: it learned its corpus's texts, not the
# teacher (an hour on 42,800 texts: 0.66 in the 11th minute, 0.55 at the end)
OVERFIT_DROP = 0.02


def print_report(cfg: PretrainConfig, summary: dict) -> None:
    """The run's closing lines on stdout (a warning on stderr when it never left the plateau)."""
    out = Path(cfg.out)
    print(f"bertkit: pretrained {summary['steps']} steps; model in {out}, curves in {out / 'loss.png'}")
    train, ev = summary["final_train"], summary["final_eval"]
    if cfg.objective == "distill":
        _print_distill(cfg, summary, train, ev)
        return
    electra = cfg.objective == "electra"
    if electra:
        print(f"  train: generator mlm loss {train['mlm_loss']:.3f}, accuracy at [MASK] {train['mlm_acc']:.3f}; "
              f"detection loss {train['rtd_loss']:.3f}, accuracy {train['rtd_acc']:.3f}; "
              f"{summary['pairs_per_s']:.0f} sentence pairs/s over {summary['elapsed_s']:.0f} s")
    else:
        print(f"  train: mlm loss {train['mlm_loss']:.3f}, accuracy at [MASK] {train['mlm_acc']:.3f}, "
              f"nsp loss {train['nsp_loss']:.3f}, nsp acc {train['nsp_acc']:.3f}; "
              f"{summary['pairs_per_s']:.0f} sentence pairs/s over {summary['elapsed_s']:.0f} s")
    if ev:
        print(f"  held out: {'generator ' if electra else ''}mlm loss {ev['eval_mlm_loss']:.3f} "
              f"(ln vocab = {summary['ln_vocab_size']:.3f}); "
              f"at [MASK]: top-1 {ev['eval_mlm_acc']:.3f}, top-5 {ev['eval_mlm_top5']:.3f} "
              f"(always the most common token: {ev['eval_majority_token_acc']:.3f}); "
              f"random-token positions {ev['eval_mlm_acc_random']:.3f}, unchanged {ev['eval_mlm_acc_unchanged']:.3f}; "
              + (f"detection accuracy {ev['eval_rtd_acc']:.3f} (always \"original\": {ev['eval_rtd_original_acc']:.3f}), "
                 f"replaced tokens found {ev['eval_rtd_replaced_recall']:.3f}" if electra else
                 f"nsp acc {ev['eval_nsp_acc']:.3f} (always the more common label: {ev['eval_nsp_majority_acc']:.3f})"))
        if ev["eval_mlm_acc"] < PLATEAU_FACTOR * ev["eval_majority_token_acc"]:
            # a mini run of 10 minutes on a slow CPU ended so: fine-tuned, it answered one label at every lr
            print(f"bertkit: warning: the model has not left the unigram plateau (top-1 at [MASK] "
                  f"{ev['eval_mlm_acc']:.3f}, no better than always the most common token): it ignores its "
                  "input, a worse start for fine-tuning than random weights; give it a longer --budget or a "
                  "smaller --model", file=sys.stderr)


def _print_distill(cfg: PretrainConfig, summary: dict, train: dict, ev: dict | None) -> None:
    logits = f", logits {train['logit_loss']:.4f}" if cfg.distill_logits else ""
    print(f"  train: loss {train['loss']:.4f} (sentence {train['sentence_loss']:.4f}{logits}), cosine to the teacher's "
          f"sentence vectors {train['cosine']:.3f}; {summary['pairs_per_s']:.0f} texts/s over "
          f"{summary['elapsed_s']:.0f} s")
    if ev:
        print(f"  held out: cosine to the teacher's sentence vectors {ev['eval_cosine']:.3f} over {ev['eval_texts']} "
              f"texts (through the projection to the teacher's width)"
              + (f"; the teacher's label given {ev['eval_agreement']:.3f}" if "eval_agreement" in ev else ""))
        if cfg.distill_sentence:  # the cosine is what the sentence signal trains
            _warn_if_memorised(Path(cfg.out), summary, ev)


def _warn_if_memorised(out: Path, summary: dict, ev: dict) -> None:
    """A warning on stderr where the held-out cosine fell well below its best: more passes over the
    same texts fit the teacher's vectors of those texts and lose the rest."""
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_cosine" in r]
    best = max(evals, key=lambda r: r["eval_cosine"], default=None)
    if best is None or best["eval_cosine"] - ev["eval_cosine"] < OVERFIT_DROP:
        return
    passes = summary["pairs_seen"] / max(1, summary["train_pairs_per_epoch"])
    print(f"bertkit: warning: the held-out cosine to the teacher peaked at {best['eval_cosine']:.3f} (step "
          f"{best['step']}, {best['elapsed_s'] / 60:.0f} min in) and ended at {ev['eval_cosine']:.3f} after "
          f"{passes:.1f} passes over the corpus: the student learns the teacher's vectors of these texts rather "
          "than the teacher; more text, or a shorter --budget, makes a better student", file=sys.stderr)


def write_samples(cfg: PretrainConfig, summary: dict) -> None:
    """OUT/samples.json: what the model learned, shown on held-out text (fill-mask by ELECTRA's
    generator, whose embeddings are the model's)."""
    out, electra = Path(cfg.out), cfg.objective == "electra"
    model, _ = load_model(out / "generator" if electra else out)
    tokenizer = WordPieceTokenizer.from_folder(out)
    shown = show(model, tokenizer, TokenStore(out / "data" / "shards" / "eval"))
    if summary["elapsed_s"] >= PROBE_MIN_RUN_S:  # seconds of probing: worth it after minutes of training
        shown["downstream_probe"] = report(load_model(out, heads=False)[0] if electra else model.bert, tokenizer)
    write_file(out / "samples.json", json.dumps(shown, indent=2) + "\n")
