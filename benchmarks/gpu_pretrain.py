"""BERT-base pretraining steps on one GPU: bertkit beside transformers, side by side.

Both get the base preset (12 layers, hidden 768), length 128, the same initial weights and the
same random batches (MLM at 20 positions per sequence + NSP), bf16 autocast, fused AdamW and
flash attention through SDPA; each is also run under torch.compile. Steps alternate between the
implementations so that both see the same machine. Prints sequences/s and MFU (model FLOPs per
step, counted by FlopCounterMode, over the time taken, against the measured bf16 matmul peak).

    benchmarks/gpu.sh            # exits 0 with a message where there is no GPU
    .venv/bin/python benchmarks/gpu_pretrain.py --device cpu --preset tiny --batch-size 8 --steps 2
                                 # a smoke run of the script itself, where there is no GPU
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from common import matmul_peak, save_result  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def batch(vocab: int, B: int, T: int, P: int, device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    positions = torch.sort(torch.rand(B, T - 2, generator=g).argsort(1)[:, :P] + 1, dim=1).values
    labels = ids.gather(1, positions)
    ids.scatter_(1, positions, 4)  # [MASK]
    hf_labels = torch.full_like(ids, -100).scatter_(1, positions, labels)
    out = {"input_ids": ids, "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T).contiguous(),
           "attention_mask": torch.ones(B, T, dtype=torch.long), "mlm_positions": positions,
           "mlm_labels": labels, "hf_labels": hf_labels, "nsp_labels": torch.randint(0, 2, (B,), generator=g)}
    return {k: v.to(device) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script where there is no GPU")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu_pretrain.py: no GPU visible to torch here; nothing to measure")
        return
    from transformers import BertForPreTraining as HF

    from bertkit import BertConfig, BertForPreTraining
    from bertkit.folders import save_model
    from bertkit.model import init_weights
    from bertkit.optim import adamw

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = BertConfig.preset(args.preset)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    init_weights(ours, cfg)
    work = Path(tempfile.mkdtemp(prefix="bertkit-gpu-"))
    save_model(ours, work)
    theirs = HF.from_pretrained(str(work), attn_implementation="sdpa")
    B, T, P = args.batch_size, args.max_len, round(args.max_len * 0.15)
    batches = [batch(cfg.vocab_size, B, T, P, device, s) for s in range(args.steps + 3)]

    def bertkit_step(model, opt, b):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"],
                        mlm_labels=b["mlm_labels"], nsp_labels=b["nsp_labels"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def hf_step(model, opt, b):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                        attention_mask=b["attention_mask"], labels=b["hf_labels"], next_sentence_label=b["nsp_labels"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    runs = {}
    for name, model, step in (("bertkit", ours, bertkit_step), ("transformers", theirs, hf_step)):
        model.to(device).train()
        runs[name] = (model, adamw(model, 1e-4, 0.01), step)
        t = time.perf_counter()
        compiled = torch.compile(model)
        runs[name + " + compile"] = (compiled, adamw(model, 1e-4, 0.01), step)
        step(compiled, runs[name + " + compile"][1], batches[0])  # compile now, timed apart
        sync(device)
        runs[name + " + compile"] += (time.perf_counter() - t,)
    flops = {}
    for name, (model, opt, step, *_) in runs.items():
        if name.endswith("compile"):  # the same model FLOPs as eager
            flops[name] = flops[name.removesuffix(" + compile")]
            step(model, opt, batches[1])
        else:
            with FlopCounterMode(display=False) as counter:
                step(model, opt, batches[1])
            flops[name] = counter.get_total_flops()
        step(model, opt, batches[2])  # warm-up
    times = {name: [] for name in runs}
    for b in batches[3:]:
        for name, (model, opt, step, *_) in runs.items():
            sync(device)
            t = time.perf_counter()
            step(model, opt, b)
            sync(device)
            times[name].append(time.perf_counter() - t)
    peak = matmul_peak(8192 if device.type == "cuda" else 1024, 20, torch.bfloat16, device=device) / 1000  # TFLOP/s
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    rows = {}
    print(f"{device_name}: bf16 matmul peak {peak:.1f} TFLOP/s (measured); {args.preset} preset, "
          f"batch {B}, length {T}, bf16 autocast, fused AdamW, SDPA")
    print(f"{'':26}{'seq/s':>9}{'ms/step':>9}{'TFLOP/step':>12}{'MFU':>7}{'compile s':>11}")
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"sequences_per_s": B / med, "step_ms": 1000 * med, "tflop_per_step": flops[name] / 1e12,
                      "mfu": flops[name] / med / 1e12 / peak,
                      "compile_s": runs[name][3] if len(runs[name]) > 3 else None,
                      "step_ms_min": 1000 * min(ts), "step_ms_max": 1000 * max(ts)}
        r = rows[name]
        print(f"{name:26}{r['sequences_per_s']:9.0f}{r['step_ms']:9.1f}{r['tflop_per_step']:12.2f}{r['mfu']:7.1%}"
              f"{'' if r['compile_s'] is None else format(r['compile_s'], '11.0f')}")
    save_result("gpu_pretrain", {
        "device": device_name, "preset": args.preset, "torch": torch.__version__, "peak_tflop_s": peak,
        "batch_size": B, "max_len": T, "results": rows}, args.out)


if __name__ == "__main__":
    sys.exit(main())
