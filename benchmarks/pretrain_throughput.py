"""Sentence pairs per second of the textbook pretraining workload: bertkit beside HF transformers
and the textbook's own PyTorch BERT (the `d2l` package's BERTModel).

All get the same configuration (the tiny preset: 2 layers, hidden 128, 2 heads, FFN 256, or
--preset), the same batches (batch 512, max length 64, from the built-in Wikipedia sample,
MLM + NSP, dropout 0.1 as the textbook trains); bertkit and transformers also share their
initial weights. Steps alternate between the implementations so that all see the same machine
noise; each figure is the median step with its min and max. bertkit is timed five times in fp32: with the
textbook's dropout 0.1 (the like-for-like figure), with its default recipe's dropout 0, with
dropout 0.1 through torch's own dropout (as before its bulk-drawn CPU masks), with the last
layer at every position (as before its training path ran it at [CLS] and the predicted slots
only: the same loss, a fifth fewer FLOPs on the tiny preset), and with glibc's
default malloc settings (as before bertkit's training runtime kept freed memory for reuse,
bertkit/training/memory.py); on a CPU with AVX-512 also with its linear layers on torch's
F.linear (MKL), as before they ran on oneDNN there. The peers run with glibc's defaults, as their users run them, and
d2l once more with bertkit's malloc setting, which shows how much of the lead is the allocator.
Switching to the defaults hands the free memory back to the kernel, so the first bertkit step
after a peer's faults its memory in again (the page faults of each step are recorded): the
alternation understates what a run of bertkit alone gets, most for the first bertkit row of
each round (bertkit's rows with its setting run one after another), the fp32 "bertkit" row.
It also reports the FLOPs of one step (counted by torch's FlopCounterMode) over the time it
took, as a share of this machine's measured fp32 matmul peak, and for bertkit's two fp32 rows
the ceiling their own matmul shapes put on that share: the step's matmuls replayed alone, back to
back, on inputs of the same shapes and strides (matmul_ceiling). On a CPU with native bf16 (AMX or AVX512_BF16), where
bertkit trains in bf16 autocast by default, bertkit, d2l and transformers also run with their
forward passes under bf16 autocast, and those rows' MFU is given against the bf16 matmul peak too.

    .venv/bin/python benchmarks/pretrain_throughput.py [--steps 10] [--preset mini --max-len 128]

d2l is installed for this benchmark only (`make bench` does it: pip install d2l --no-deps); its
module imports plotting and vision packages that BERTModel never uses, stubbed here.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import resource
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from common import matmul_peak, save_result
from machine import cpu_name
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer, kernels
from bertkit.folders import save_model
from bertkit.model import init_weights, set_dropout
from bertkit.optim import adamw
from bertkit.precision import native_bf16
from bertkit.pretraining.batches import PretrainingBatches
from bertkit.pretraining.corpus import iter_documents
from bertkit.pretraining.masking import MaskingConfig
from bertkit.pretraining.shards import tokenize_corpus
from bertkit.training.memory import keep_freed_memory


def forward_in(bf16: bool):
    """The forward pass under bf16 autocast (as bertkit's training steps run on a native bf16 CPU), or fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def bertkit_step(model, opt, batch, bf16=False):
    with forward_in(bf16):
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], mlm_positions=batch["mlm_positions"],
                    mlm_labels=batch["mlm_labels"], nsp_labels=batch["nsp_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def torchs_dropout():
    """bertkit's model as it was before its CPU dropout: torch's F.dropout, and SDPA's own
    dropout in attention (the comparison row for the fast path)."""
    return kernels.use(dataclasses.replace(kernels.current(), bulk_dropout=False))


def bertkit_step_torchs_dropout(model, opt, batch):
    with torchs_dropout():
        return bertkit_step(model, opt, batch)


def full_last_layer():
    """bertkit's model as it was before its training path ran the last layer at [CLS] and the
    predicted slots only: every layer at every position, the rows picked afterwards."""
    return kernels.use(dataclasses.replace(kernels.current(), last_layer_rows=False))


def bertkit_step_full_last_layer(model, opt, batch):
    with full_last_layer():
        return bertkit_step(model, opt, batch)


def mkl_linear():
    """bertkit's fp32 linear layers on torch's F.linear (MKL), as before they ran on oneDNN on
    CPUs with AVX-512 (kernels.AUTO.onednn_linear; the comparison row for that path)."""
    return kernels.use(dataclasses.replace(kernels.current(), onednn_linear=False))


def bertkit_step_mkl_linear(model, opt, batch):
    with mkl_linear():
        return bertkit_step(model, opt, batch)


def hf_step(model, opt, batch, bf16=False):
    # HF takes MLM labels per position (-100 elsewhere) and projects every position
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["mlm_labels"] != -100
    rows = torch.arange(labels.size(0))[:, None].expand_as(valid)
    labels[rows[valid], batch["mlm_positions"][valid]] = batch["mlm_labels"][valid]
    with forward_in(bf16):
        out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"], labels=labels, next_sentence_label=batch["nsp_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def import_d2l():
    """d2l's torch module imports packages BERTModel never touches (torchvision, IPython,
    pandas, ...): empty stand-ins for the missing ones."""
    import importlib
    import sys
    import types

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub(f"{self.__name__}.{name}")

    for name in ("torchvision", "torchvision.transforms", "IPython", "IPython.display", "matplotlib_inline",
                 "matplotlib_inline.backend_inline", "pandas", "requests", "scipy", "scipy.spatial", "PIL",
                 "PIL.Image"):
        try:
            importlib.import_module(name)
        except Exception:
            sys.modules[name] = Stub(name)
    from d2l import torch as d2l
    return d2l


def d2l_step(model, opt, batch, bf16=False):
    # the textbook's loss: cross-entropy at the predicted positions (weights 0 for unused slots) + NSP
    valid_lens = batch["attention_mask"].sum(1)
    positions = batch["mlm_positions"]
    labels = batch["mlm_labels"]
    weights = (labels != -100).float()
    with forward_in(bf16):
        _, mlm_hat, nsp_hat = model(batch["input_ids"], batch["token_type_ids"], valid_lens, positions)
    mlm_hat, nsp_hat = mlm_hat.float(), nsp_hat.float()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    mlm_l = loss_fn(mlm_hat.reshape(-1, mlm_hat.size(-1)), labels.clamp(min=0).reshape(-1)) * weights.reshape(-1)
    loss = mlm_l.sum() / (weights.sum() + 1e-8) + loss_fn(nsp_hat, batch["nsp_labels"]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def count_flops(step, model, opt, batch) -> int:
    # on F.linear and SDPA's math path: FlopCounterMode counts aten's matmuls, not oneDNN's
    # kernel nor SDPA's fused CPU kernel (the same FLOPs; the fused kernel counted as 0 before)
    with mkl_linear(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step(model, opt, batch)
    return counter.get_total_flops()


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default)


class RecordMatmuls(TorchDispatchMode):
    """Records each matmul a step runs (forward and backward): the op, its tensors' shapes,
    strides and dtypes, and its other arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMULS:
            self.calls.append((func, [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                                      for a in args], kwargs))
        return func(*args, **kwargs)


def matmul_ceiling(step, model, opt, batch, repeats: int = 5) -> dict:
    """The step's matmuls alone: every mm/addmm/bmm one fp32 step runs (on F.linear and SDPA's
    math path, as count_flops), replayed back to back on inputs of the same shapes and strides
    (one tensor per shape, shared). Their time bounds the step from below, so step FLOPs over it bounds its MFU from
    above: what the step's own matmul shapes allow, whatever else it did. They run on torch's mm
    (MKL); where the step's linear layers run oneDNN's kernel, the bound is MKL's at those shapes."""
    with mkl_linear(), sdpa_kernel(SDPBackend.MATH), RecordMatmuls() as rec:
        step(model, opt, batch)
    inputs = {}  # one tensor per shape, stride and dtype, shared by the calls that take it (all
    # the step's inputs at once took 24 GB on mini at length 128)

    def made(a):
        if a not in inputs:
            inputs[a] = torch.empty_strided(a[0], a[1], dtype=a[2]).uniform_(-1, 1)
        return inputs[a]
    calls = [(func, [made(a) if isinstance(a, tuple) else a for a in args], kwargs) for func, args, kwargs in rec.calls]
    with FlopCounterMode(display=False) as counter:
        for func, made, kwargs in calls:
            func(*made, **kwargs)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t = time.perf_counter()
        for func, made, kwargs in calls:
            func(*made, **kwargs)
        times.append(time.perf_counter() - t)
    best = min(times[1:])
    return {"matmuls": len(calls), "matmul_gflop": counter.get_total_flops() / 1e9, "matmul_s": best,
            "matmul_s_median": statistics.median(times[1:])}


FP32_CEILING_ROWS = ("bertkit", "bertkit, dropout 0 (its recipe)")


def print_ceilings(rows):
    for name, r in rows.items():
        if "matmuls_alone" in r:
            c = r["matmuls_alone"]
            print(f"{name}: its {c['matmuls']} matmuls alone {c['matmul_s']:.3f} s ({c['matmul_gflop']:.1f} GFLOP, "
                  f"{c['gflop_s']:.0f} GFLOP/s, {c['share_of_matmul_peak']:.0%} of the peak), {c['share_of_step']:.0%} "
                  f"of the step; MFU ceiling at these shapes {c['mfu_ceiling']:.0%}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--only", nargs="+", metavar="ROW", help="time only these rows (exact names; a quick check: "
                                                            "nothing is written)")
    args = ap.parse_args()
    from transformers import BertForPreTraining as HFPreTraining
    d2l = import_d2l()

    work = Path(tempfile.mkdtemp(prefix="bertkit-bench-"))
    print("preparing the wiki corpus ...", flush=True)
    tok = WordPieceTokenizer.train((s for d in iter_documents("wiki") for s in d), args.vocab_size)
    train, _ = tokenize_corpus(iter_documents("wiki"), tok, work / "shards", holdout_every=0)
    data = PretrainingBatches(train, tok, args.max_len, args.batch_size,
                              MaskingConfig(max_predictions=round(args.max_len * 0.15 + 0.5)), seed=0)
    it = data.iterate()
    batches = [next(it)[1] for _ in range(args.steps + 2)]

    cfg = BertConfig.preset(args.preset, vocab_size=tok.vocab_size)  # dropout 0.1, the textbook's
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    init_weights(ours, cfg)
    save_model(ours, work / "init")  # the same initial weights for bertkit and transformers
    theirs = HFPreTraining.from_pretrained(str(work / "init"), attn_implementation="sdpa")
    ours_no_dropout = BertForPreTraining(cfg)
    ours_no_dropout.load_state_dict(ours.state_dict())
    set_dropout(ours_no_dropout, 0.0)
    textbook = d2l.BERTModel(tok.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                             cfg.num_hidden_layers, cfg.hidden_dropout_prob, max_len=512)
    ours_torchs_dropout = BertForPreTraining(cfg)
    ours_torchs_dropout.load_state_dict(ours.state_dict())
    ours_default_malloc = BertForPreTraining(cfg)
    ours_default_malloc.load_state_dict(ours.state_dict())
    ours_full_last_layer = BertForPreTraining(cfg)
    ours_full_last_layer.load_state_dict(ours.state_dict())
    textbook_kept = d2l.BERTModel(tok.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                                  cfg.num_hidden_layers, cfg.hidden_dropout_prob, max_len=512)
    textbook_kept.load_state_dict(textbook.state_dict())
    # name: (step, model, whether freed memory is kept for reuse as bertkit's training runtime sets it)
    runs = {"bertkit": (bertkit_step, ours, True),
            "bertkit, dropout 0 (its recipe)": (bertkit_step, ours_no_dropout, True),
            "bertkit with torch's dropout (before)": (bertkit_step_torchs_dropout, ours_torchs_dropout, True),
            "bertkit with the full last layer (before)": (bertkit_step_full_last_layer, ours_full_last_layer, True),
            "bertkit with glibc's default malloc (before)": (bertkit_step, ours_default_malloc, False),
            "d2l BERTModel (textbook)": (d2l_step, textbook, False),
            "d2l BERTModel with bertkit's malloc setting": (d2l_step, textbook_kept, True),
            "transformers": (hf_step, theirs, False)}
    if kernels.AUTO.onednn_linear:
        ours_mkl = BertForPreTraining(cfg)
        ours_mkl.load_state_dict(ours.state_dict())
        runs["bertkit with F.linear, MKL (before)"] = (bertkit_step_mkl_linear, ours_mkl, True)
    if native_bf16():
        # bf16 autocast, as bertkit's training runs on a CPU with native bf16, and the peers given the same
        ours_bf16, ours_bf16_no_dropout = BertForPreTraining(cfg), BertForPreTraining(cfg)
        for model in (ours_bf16, ours_bf16_no_dropout):
            model.load_state_dict(ours.state_dict())
        set_dropout(ours_bf16_no_dropout, 0.0)
        textbook_bf16 = d2l.BERTModel(tok.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                                      cfg.num_hidden_layers, cfg.hidden_dropout_prob, max_len=512)
        textbook_bf16.load_state_dict(textbook.state_dict())
        theirs_bf16 = HFPreTraining.from_pretrained(str(work / "init"), attn_implementation="sdpa")
        runs |= {"bertkit, bf16 autocast": (partial(bertkit_step, bf16=True), ours_bf16, True),
                 "bertkit, bf16 autocast, dropout 0 (its recipe)": (partial(bertkit_step, bf16=True),
                                                                    ours_bf16_no_dropout, True),
                 "d2l BERTModel, bf16 autocast": (partial(d2l_step, bf16=True), textbook_bf16, False),
                 "transformers, bf16 autocast": (partial(hf_step, bf16=True), theirs_bf16, False)}
    # bertkit's rows with its malloc setting one after another, then the rows with glibc's defaults:
    # only the first bertkit row of a round follows a peer's trimmed heap
    runs = {name: runs[name] for name in sorted(runs, key=lambda n: not (n.startswith("bertkit") and runs[n][2]))}
    if args.only:
        runs = {name: runs[name] for name in args.only}
    opts = {}
    for name, (_step, model, _) in runs.items():
        model.train()
        # each side's own training step: bertkit's AdamW (fused, no decay on biases and LayerNorm),
        # torch's default AdamW for the peers, as their users write it
        opts[name] = adamw(model, 1e-4, 0.01) if name.startswith("bertkit") else torch.optim.AdamW(model.parameters(), lr=1e-4)
    flops = {name: count_flops(step, model, opts[name], batches[0]) for name, (step, model, _) in runs.items()}
    for name, (step, model, keep) in runs.items():
        keep_freed_memory(keep)
        step(model, opts[name], batches[1])  # warm-up
    times, faults = {name: [] for name in runs}, {name: [] for name in runs}
    for b in batches[2:]:
        for name, (step, model, keep) in runs.items():
            keep_freed_memory(keep)
            f, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            step(model, opts[name], b)
            times[name].append(time.perf_counter() - t)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
    # the fp32 rows' matmuls alone, with bertkit's malloc setting (a bound on their MFU)
    keep_freed_memory(True)
    ceilings = {name: matmul_ceiling(step, model, opts[name], batches[0])
                for name, (step, model, _) in runs.items() if name in FP32_CEILING_ROWS}
    keep_freed_memory(False)
    mm_peak = matmul_peak()
    onednn_peak = matmul_peak(kernel="onednn") if kernels.AUTO.onednn_linear else None
    peak = max(mm_peak, onednn_peak or 0.0)
    bf16_peak = matmul_peak(dtype=torch.bfloat16) if native_bf16() else None

    rows = {}
    for name in times:
        med = statistics.median(times[name])
        rows[name] = {"pairs_per_s": args.batch_size / med, "step_s": med, "step_s_min": min(times[name]),
                      "step_s_max": max(times[name]), "page_faults_per_step": statistics.median(faults[name]),
                      "gflop_per_step": flops[name] / 1e9,
                      "achieved_gflop_s": flops[name] / med / 1e9,
                      "share_of_matmul_peak": flops[name] / med / 1e9 / peak}
        if "bf16" in name:
            rows[name]["share_of_bf16_matmul_peak"] = flops[name] / med / 1e9 / bf16_peak
        if name in ceilings:
            c = ceilings[name]
            rows[name]["matmuls_alone"] = c | {"gflop_s": c["matmul_gflop"] / c["matmul_s"],
                                               "share_of_matmul_peak": c["matmul_gflop"] / c["matmul_s"] / peak,
                                               "mfu_ceiling": flops[name] / c["matmul_s"] / 1e9 / peak,
                                               "share_of_step": c["matmul_s"] / med}
    if args.only:
        for name, r in rows.items():
            print(f"{name}: {r['step_s']:.3f} s/step ({r['step_s_min']:.3f}-{r['step_s_max']:.3f}), "
                  f"{r['page_faults_per_step']:.0f} page faults, {r['gflop_per_step']:.1f} GFLOP, "
                  f"{r['achieved_gflop_s']:.1f} GFLOP/s, MFU {r['share_of_matmul_peak']:.0%} of {peak:.0f}")
        print(f"fp32 matmul peak: mm {mm_peak:.0f}, oneDNN {onednn_peak or 0:.0f} GFLOP/s")
        print_ceilings(rows)
        return
    speed = lambda a, b: rows[a]["pairs_per_s"] / rows[b]["pairs_per_s"]
    result = {"workload": f"{args.preset} preset, batch {args.batch_size}, max length {args.max_len}, vocab "
                          f"{tok.vocab_size}, MLM + NSP, AdamW, fp32 on CPU (bf16 autocast where a row says so)",
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
              "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
              "matmul_peak_gflop_s": peak, "mm_peak_gflop_s": mm_peak, "onednn_peak_gflop_s": onednn_peak,
              "bf16_matmul_peak_gflop_s": bf16_peak, "steps": args.steps, "results": rows,
              "speedup_vs_transformers": speed("bertkit", "transformers"),
              "speedup_vs_d2l": speed("bertkit", "d2l BERTModel (textbook)"),
              "speedup_vs_d2l_with_recipe_dropout": speed("bertkit, dropout 0 (its recipe)", "d2l BERTModel (textbook)"),
              "speedup_vs_d2l_with_the_same_malloc": speed("bertkit", "d2l BERTModel with bertkit's malloc setting")}
    if bf16_peak:
        result |= {"bf16_speedup_vs_d2l_fp32": speed("bertkit, bf16 autocast", "d2l BERTModel (textbook)"),
                   "bf16_speedup_vs_d2l_bf16": speed("bertkit, bf16 autocast", "d2l BERTModel, bf16 autocast"),
                   "bf16_speedup_vs_transformers_fp32": speed("bertkit, bf16 autocast", "transformers"),
                   "bf16_speedup_vs_transformers_bf16": speed("bertkit, bf16 autocast", "transformers, bf16 autocast")}
    save_result("pretrain_throughput", {"variant": f"{args.preset}, length {args.max_len}", **result}, args.out)
    print(f"{result['workload']}; {torch.get_num_threads()} threads; medians of {args.steps} alternating steps")
    print(f"| | pairs/s | s/step (min-max) | GFLOP/step | GFLOP/s | MFU (of {peak:.0f} GFLOP/s) |\n|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['pairs_per_s']:.0f} | {r['step_s']:.3f} ({r['step_s_min']:.3f}-{r['step_s_max']:.3f}) | "
              f"{r['gflop_per_step']:.1f} | {r['achieved_gflop_s']:.1f} | {r['share_of_matmul_peak']:.0%} |")
    print(f"bertkit / transformers {result['speedup_vs_transformers']:.2f}x; bertkit / d2l {result['speedup_vs_d2l']:.2f}x "
          f"(same dropout), {result['speedup_vs_d2l_with_recipe_dropout']:.2f}x with bertkit's recipe dropout 0, "
          f"{result['speedup_vs_d2l_with_the_same_malloc']:.2f}x against d2l with bertkit's malloc setting")
    print_ceilings(rows)
    if bf16_peak:
        print(f"bf16 autocast (bf16 matmul peak {bf16_peak:.0f} GFLOP/s): bertkit / d2l {result['bf16_speedup_vs_d2l_fp32']:.2f}x "
              f"(d2l in fp32), {result['bf16_speedup_vs_d2l_bf16']:.2f}x (both bf16); bertkit / transformers "
              f"{result['bf16_speedup_vs_transformers_fp32']:.2f}x (fp32), {result['bf16_speedup_vs_transformers_bf16']:.2f}x "
              "(both bf16); MFU of the bf16 peak: " + ", ".join(f"{n} {r['share_of_bf16_matmul_peak']:.0%}"
                                                           for n, r in rows.items() if "bf16" in n))


if __name__ == "__main__":
    main()
