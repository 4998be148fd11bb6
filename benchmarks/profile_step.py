"""Where the time of one pretraining step goes: torch.profiler over bertkit's step on the textbook
workload (tiny, batch 512, length 64, MLM + NSP, AdamW, CPU, fp32 or with the forward pass under
bf16 autocast as bertkit trains on a native bf16 CPU), with the textbook's dropout 0.1 and with the
default recipe's dropout 0. Prints Markdown tables for benchmarks/README.md.

    .venv/bin/python benchmarks/profile_step.py [--vocab-size 8192] [--precision bf16]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.model import init_weights
from bertkit.optim import adamw
from bertkit.pretraining.batches import PretrainingBatches
from bertkit.pretraining.corpus import iter_documents
from bertkit.pretraining.masking import MaskingConfig
from bertkit.pretraining.shards import tokenize_corpus
from bertkit.training.memory import keep_freed_memory

# aten operators grouped by what they do in a BERT step
GROUPS = [("matmul (linear layers, vocabulary projection)", ("aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise")),
          ("attention kernel (SDPA)", ("scaled_dot_product",)),
          ("softmax (spelled-out attention; the MLM loss's, which is its gradient)", ("aten::_softmax",)),
          ("MLM loss: max, log and the rest", ("aten::exp", "aten::sub", "aten::max", "aten::amax", "aten::log",
                                               "aten::nll_loss", "aten::logsumexp")),
          ("dropout masks", ("aten::bernoulli", "aten::native_dropout", "bertkit::keep_mask")),
          ("GELU", ("aten::gelu",)),
          ("LayerNorm", ("aten::native_layer_norm",)),
          ("embeddings", ("aten::embedding", "aten::index_select")),
          ("copies, fills, sums and casts", ("aten::copy_", "aten::fill_", "aten::sum", "aten::cat", "aten::mul",
                                             "aten::add", "aten::zero_", "aten::div", "aten::where",
                                             "aten::_to_copy")),
          ("optimizer (AdamW)", ("aten::_foreach", "aten::addcdiv", "aten::lerp", "aten::sqrt"))]


def group_of(name: str) -> str:
    for label, prefixes in GROUPS:
        if any(name.startswith(p) or p in name for p in prefixes):
            return label
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--top", type=int, default=0, help="also print the N operators with the most self time")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bertkit-profile-"))
    tok = WordPieceTokenizer.train((s for d in iter_documents("wiki") for s in d), args.vocab_size)
    train, _ = tokenize_corpus(iter_documents("wiki"), tok, work / "shards", holdout_every=0)
    data = PretrainingBatches(train, tok, 64, 512, MaskingConfig(max_predictions=10), seed=0)
    it = data.iterate()
    batches = [next(it)[1] for _ in range(6)]
    keep_freed_memory()  # as bertkit's training runtime runs a step (bertkit/training/memory.py)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.precision}")
    for dropout in (0.1, 0.0):
        cfg = BertConfig.preset("tiny", vocab_size=tok.vocab_size, hidden_dropout_prob=dropout,
                                attention_probs_dropout_prob=dropout)
        torch.manual_seed(0)
        model = BertForPreTraining(cfg)
        init_weights(model, cfg)
        model.train()
        opt = adamw(model, 1e-4, 0.01)

        def step(b):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"],
                            mlm_labels=b["mlm_labels"], nsp_labels=b["nsp_labels"])
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for b in batches[:2]:
            step(b)
        t = time.perf_counter()
        for b in batches[2:5]:
            step(b)
        per_step = (time.perf_counter() - t) / 3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(batches[5])
        totals: dict[str, float] = {}
        for e in prof.key_averages():
            if e.key.startswith(("aten::", "bertkit::")):
                totals[group_of(e.key)] = totals.get(group_of(e.key), 0.0) + e.self_cpu_time_total / 1e3
        whole = sum(totals.values())
        print(f"\ndropout {dropout}: {per_step:.3f} s/step unprofiled ({512 / per_step:.0f} pairs/s)\n")
        print("| where | ms | share |\n|---|---|---|")
        for label, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"| {label} | {ms:.0f} | {ms / whole:.0%} |")
        if args.top:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
