"""Sentence pairs per second of the textbook pretraining workload, bertkit beside HF transformers.

Both models get the same configuration (the tiny preset: 2 layers, hidden 128, 2 heads, FFN 256),
the same initial weights and the same batches (batch 512, max length 64, from the built-in
Wikipedia sample, MLM + NSP). Steps alternate between the two so that both see the same machine
noise. It also reports the FLOPs of one step (counted by torch's FlopCounterMode) over the time
it took, as a share of this machine's measured fp32 matmul peak.

    .venv/bin/python benchmarks/pretrain_throughput.py [--steps 10] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.checkpoint import save_model
from bertkit.model import init_weights
from bertkit.pretraining.batches import PretrainingBatches
from bertkit.pretraining.corpus import iter_documents
from bertkit.pretraining.masking import MaskingConfig
from bertkit.pretraining.shards import tokenize_corpus


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
    """Best fp32 GFLOP/s of an n x n matmul on this machine, now."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def bertkit_step(model, opt, batch):
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                mlm_positions=batch["mlm_positions"], mlm_labels=batch["mlm_labels"], nsp_labels=batch["nsp_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def hf_step(model, opt, batch):
    # HF takes MLM labels per position (-100 elsewhere) and projects every position
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["mlm_labels"] != -100
    rows = torch.arange(labels.size(0))[:, None].expand_as(valid)
    labels[rows[valid], batch["mlm_positions"][valid]] = batch["mlm_labels"][valid]
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=labels, next_sentence_label=batch["nsp_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def count_flops(step, model, opt, batch) -> int:
    with FlopCounterMode(display=False) as counter:
        step(model, opt, batch)
    return counter.get_total_flops()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from transformers import BertForPreTraining as HFPreTraining

    work = Path(tempfile.mkdtemp(prefix="bertkit-bench-"))
    print("preparing the wiki corpus ...", flush=True)
    tok = WordPieceTokenizer.train((s for d in iter_documents("wiki") for s in d), args.vocab_size)
    train, _ = tokenize_corpus(iter_documents("wiki"), tok, work / "shards", holdout_every=0)
    data = PretrainingBatches(train, tok, args.max_len, args.batch_size,
                              MaskingConfig(max_predictions=round(args.max_len * 0.15 + 0.5)), seed=0)
    it = data.iterate()
    batches = [next(it)[1] for _ in range(args.steps + 2)]

    cfg = BertConfig.preset("tiny", vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    init_weights(ours, cfg)
    save_model(ours, work / "init")  # the same initial weights for both
    theirs = HFPreTraining.from_pretrained(str(work / "init"), attn_implementation="sdpa")
    ours.train()
    theirs.train()
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-4)

    flops = {"bertkit": count_flops(bertkit_step, ours, opt_ours, batches[0]),
             "transformers": count_flops(hf_step, theirs, opt_theirs, batches[0])}
    bertkit_step(ours, opt_ours, batches[1])  # warm-up
    hf_step(theirs, opt_theirs, batches[1])
    times = {"bertkit": [], "transformers": []}
    for b in batches[2:]:
        for name, step, model, opt in (("bertkit", bertkit_step, ours, opt_ours),
                                       ("transformers", hf_step, theirs, opt_theirs)):
            t = time.perf_counter()
            step(model, opt, b)
            times[name].append(time.perf_counter() - t)
    peak = matmul_peak()

    rows = {}
    for name in times:
        med = statistics.median(times[name])
        rows[name] = {"pairs_per_s": args.batch_size / med, "step_s": med,
                      "gflop_per_step": flops[name] / 1e9,
                      "achieved_gflop_s": flops[name] / med / 1e9,
                      "share_of_matmul_peak": flops[name] / med / 1e9 / peak}
    result = {"workload": f"tiny preset, batch {args.batch_size}, max length {args.max_len}, vocab "
                          f"{tok.vocab_size}, MLM + NSP, AdamW, fp32 on CPU",
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
              "matmul_peak_gflop_s": peak, "steps": args.steps, "results": rows,
              "speedup_vs_transformers": rows["bertkit"]["pairs_per_s"] / rows["transformers"]["pairs_per_s"]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pretrain_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':14}{'pairs/s':>10}{'s/step':>9}{'GFLOP/step':>12}{'GFLOP/s':>9}{'of peak':>9}")
    for name, r in rows.items():
        print(f"{name:14}{r['pairs_per_s']:10.1f}{r['step_s']:9.3f}{r['gflop_per_step']:12.1f}"
              f"{r['achieved_gflop_s']:9.1f}{r['share_of_matmul_peak']:9.1%}")
    print(f"matmul peak {peak:.1f} GFLOP/s; bertkit / transformers = {result['speedup_vs_transformers']:.2f}x")


if __name__ == "__main__":
    main()
