"""What the benchmarks share: the machine they ran on (machine.cpu_name), a matmul's peak speed
to take shares of, timing, figures as median with min and max, results as JSON (one file per
benchmark, its runs keyed by CPU and date: save_result), and plots (matplotlib without a
display)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from machine import cpu_name  # noqa: F401 - re-exported: one import for a benchmark

RESULTS = Path(__file__).parent / "results"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(n: int = 2048, repeats: int = 10, dtype=torch.float32, kernel: str = "mm",
                device: str | torch.device = "cpu") -> float:
    """Best GFLOP/s of an n x n matmul in dtype on this machine, now: torch's mm (MKL for fp32
    on a CPU, cuBLAS on a GPU), or kernel="onednn", oneDNN's inner product, which bertkit's fp32
    linear layers run on CPUs with AVX-512 (kernels.AUTO.onednn_linear)."""
    device = torch.device(device)
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    run = (lambda: a @ b) if kernel == "mm" else (lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    for _ in range(2):
        run()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def spread(values: list[float]) -> dict:
    """A figure as the benchmarks report it: the median, with min and max, of its runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def result_runs(name: str, folder: str | Path = RESULTS) -> list[dict]:
    """The runs in results/NAME.json, oldest first ([] when there is no such file)."""
    path = Path(folder) / f"{name}.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def latest_result(name: str, folder: str | Path = RESULTS, **fields) -> dict | None:
    """The newest run in results/NAME.json whose fields equal these (e.g. cpu=cpu_name()), or None."""
    return next((r for r in reversed(result_runs(name, folder)) if all(r.get(k) == v for k, v in fields.items())),
                None)


def save_result(name: str, record: dict, folder: str | Path = RESULTS) -> Path:
    """One run into results/NAME.json, {"runs": [...]}, with the CPU it was measured on and the date
    (the record's own, where it has them). A run is keyed by CPU, date and `variant` (where a
    benchmark keeps kinds of run apart, e.g. pretrain_throughput's workloads): a new run replaces
    the one with its key and the others stay, oldest first."""
    path = Path(folder) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), **record}
    key = lambda r: (r.get("cpu"), r.get("date"), r.get("variant"))
    runs = [r for r in result_runs(name, folder) if key(r) != key(run)] + [run]
    runs.sort(key=lambda r: r.get("date") or "")  # stable: same-day runs keep their order, the new one last
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return path


def median_time(fn, repeats: int = 15, warmup: int = 3) -> float:
    """The median seconds of fn() over `repeats` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def figure(*args, **kwargs):
    """(fig, axes) of plt.subplots(*args, **kwargs), drawn without a display."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: str | Path, title: str | None = None) -> Path:
    """The figure as a PNG at path (110 dpi, laid out tight), then closed."""
    import matplotlib.pyplot as plt
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def encode_texts(work: Path, n: int = 20000) -> list[str]:
    """The encode benchmarks' texts: rotten-tomatoes' training reviews, then the tweets' training
    tweets, the first n of those with no line separator inside (one text per line for every peer)."""
    from bertkit.data.registry import export
    rows = []
    for name in ("rotten-tomatoes", "tweets"):
        export(name, work / name)
        # split on "\n" only: a JSON line may hold U+2028, which splitlines() would cut at
        rows += [json.loads(line) for line in (work / name / "train.jsonl").read_text().split("\n") if line.strip()]
    return [r["text"] for r in rows if len(r["text"].splitlines()) == 1][:n]
