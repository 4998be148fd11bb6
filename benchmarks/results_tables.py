"""docs/benchmarks.md's per-CPU tables, printed as Markdown from benchmarks/results/: the latest
run on each CPU of encode_speed, pretrain_throughput, onednn_linear and pretrain_default_run.
Reads JSON only (no torch), so it runs anywhere:

    python benchmarks/results_tables.py [encode_speed|pretrain_throughput|onednn_linear|pretrain_default_run ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# the CPUs the machine kind has come with, as machine.cpu_name() and older result files name them
CPUS = [("family 6 model 167", "Intel Xeon with AMX"), ("Intel Xeon with AMX", "Intel Xeon with AMX"),
        ("Intel(R) Xeon(R) Processor (AMX)", "Intel Xeon with AMX"),
        ("family 6 model 207", "Intel Xeon, AVX-512 VNNI, no AMX"), ("family 26 model 2", "AMD EPYC Zen 5"),
        ("family 25 model 17", "AMD EPYC Zen 4"), ("family 23 model 49", "AMD EPYC Zen 2"),
        ("AMD EPYC (no AMX)", "AMD EPYC Zen 1")]


def short_cpu(cpu: str) -> str:
    return next((name for key, name in CPUS if key in cpu), cpu)


def latest_per_cpu(name: str, variant=None) -> list[dict]:
    """The newest run of results/NAME.json on each CPU (of the runs with this variant, where given), newest first."""
    runs = json.loads((RESULTS / f"{name}.json").read_text())["runs"]
    latest: dict[str, dict] = {}
    for run in runs:  # oldest first: a later run on a CPU replaces an earlier one
        if variant is None or run.get("variant") == variant:
            latest[short_cpu(run["cpu"])] = run
    return sorted(latest.values(), key=lambda r: r["date"], reverse=True)


def encode_speed() -> str:
    peers = ["bertkit", "bertkit --precision bf16", "bertkit --backend onnx", "bertkit --backend onnx-int8",
             "transformers, input order", "ONNX Runtime, sorted"]
    rows = ["| CPU (date) | texts | `bertkit encode` | `--precision bf16` | `--backend onnx` | `--backend onnx-int8` "
            "| `transformers` | ONNX Runtime | bertkit vs transformers | vs ONNX Runtime | int8 vs `--backend onnx` |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in latest_per_cpu("encode_speed"):
        s = {name: p["median_s"] for name, p in r["peers"].items()}
        cell = lambda name: f"{s[name]:.1f}" if name in s else "-"  # noqa: E731
        ratio = lambda a, b: f"{s[a] / s[b]:.2f}x" if a in s and b in s else "-"  # noqa: E731
        rows.append(f"| {short_cpu(r['cpu'])} ({r['date']}) | {r['sentences']:,} | "
                    + " | ".join(cell(p) for p in peers)
                    + f" | {ratio('transformers, input order', 'bertkit')} | {ratio('ONNX Runtime, sorted', 'bertkit')}"
                    f" | {ratio('bertkit --backend onnx', 'bertkit --backend onnx-int8')} |")
    return "\n".join(rows)


def pretrain_throughput() -> str:
    rows = ["| CPU (date) | workload | bertkit fp32 pairs/s | bertkit bf16 | d2l fp32 | transformers fp32 "
            "| x d2l (fp32) | x transformers (fp32) | bf16 bertkit x d2l fp32 | fp32 MFU, dropout 0.1 / 0 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for variant in ("tiny, length 64", "mini, length 128"):
        for r in latest_per_cpu("pretrain_throughput", variant):
            res = r["results"]
            pairs = lambda name: f"{res[name]['pairs_per_s']:,.0f}" if name in res else "-"  # noqa: E731
            mfu = " / ".join(f"{res[n]['share_of_matmul_peak']:.0%}"
                             for n in ("bertkit", "bertkit, dropout 0 (its recipe)"))
            bf16 = f"{r['bf16_speedup_vs_d2l_fp32']:.2f}x" if "bf16_speedup_vs_d2l_fp32" in r else "-"
            rows.append(f"| {short_cpu(r['cpu'])} ({r['date']}) | {variant} | {pairs('bertkit')} | "
                        f"{pairs('bertkit, bf16 autocast')} | {pairs('d2l BERTModel (textbook)')} | "
                        f"{pairs('transformers')} | {r['speedup_vs_d2l']:.2f}x | {r['speedup_vs_transformers']:.2f}x | "
                        f"{bf16} | {mfu} |")
    return "\n".join(rows)


def onednn_linear() -> str:
    rows = ["| CPU (date) | texts | MKL s | oneDNN s | oneDNN over MKL |", "|---|---|---|---|---|"]
    for r in latest_per_cpu("onednn_linear"):
        mkl, onednn = (r["encode_s"][k]["median"] for k in ("F.linear (MKL)", "bertkit.model.linear (oneDNN)"))
        rows.append(f"| {short_cpu(r['cpu'])} ({r['date']}) | {r['texts']:,} | {mkl:.2f} | {onednn:.2f} | "
                    f"{mkl / onednn:.2f}x |")
    return "\n".join(rows)


def pretrain_default_run() -> str:
    rows = ["| CPU (date) | command | precision | steps | held-out top-1 at `[MASK]` | top-5 | held-out MLM loss "
            "| held-out NSP |", "|---|---|---|---|---|---|---|---|"]
    runs = json.loads((RESULTS / "pretrain_default_run.json").read_text())["runs"]
    for r in sorted(runs, key=lambda r: r["date"], reverse=True):
        e = r["final_eval"]
        rows.append(f"| {short_cpu(r['cpu'])} ({r['date']}) | `{r['command']}` | {r.get('precision', '-').split()[0]} "
                    f"| {r['steps']:,} | {e['eval_mlm_acc']:.1%} | {e['eval_mlm_top5']:.1%} | {e['eval_mlm_loss']:.2f} "
                    f"| {e['eval_nsp_acc']:.1%} |")
    return "\n".join(rows)


TABLES = {"encode_speed": encode_speed, "pretrain_throughput": pretrain_throughput, "onednn_linear": onednn_linear,
          "pretrain_default_run": pretrain_default_run}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("tables", nargs="*", metavar="TABLE", help=f"of {', '.join(TABLES)} (default: all)")
    names = ap.parse_args().tables or list(TABLES)
    if unknown := [n for n in names if n not in TABLES]:
        ap.error(f"no table {unknown[0]!r}; choose from {', '.join(TABLES)}")
    for name in names:
        print(f"{name}:\n\n{TABLES[name]()}\n")


if __name__ == "__main__":
    main()
