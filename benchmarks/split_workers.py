"""Sentence splitting in worker processes against this process alone (bertkit/pretraining/split_workers.py).

Two corpora: the built-in Wikipedia sample (the default run's text: wiki markup cleaned, then
split) and a plain .txt corpus of the same articles as paragraphs (2.7 M characters, what a
user's corpus is). Each is read whole by iter_documents, alternating one process and one worker
per core, for --rounds rounds; the documents are checked equal. Writes
results/split_workers.json.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

from bertkit.pretraining import split_workers  # noqa: E402
from bertkit.pretraining.corpus import iter_documents  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "split_workers.json"))
    args = ap.parse_args()
    workers = split_workers.worker_count()
    real_count = split_workers.worker_count
    docs = list(iter_documents("wiki"))
    text_file = Path(tempfile.mkdtemp(prefix="split_workers_")) / "wiki_paragraphs.txt"
    text_file.write_text("\n\n".join(" ".join(doc) for doc in docs) + "\n")
    corpora = {"wiki (built in)": "wiki", "a .txt of the same articles as paragraphs": str(text_file)}
    times = {name: {"one process": [], f"{workers} workers": []} for name in corpora}
    for _ in range(args.rounds):
        for name, source in corpora.items():
            got = {}
            for mode, count in (("one process", lambda: 1), (f"{workers} workers", real_count)):
                split_workers.worker_count = count
                t = time.perf_counter()
                got[mode] = list(iter_documents(source))
                times[name][mode].append(time.perf_counter() - t)
            assert got["one process"] == got[f"{workers} workers"], name
    split_workers.worker_count = real_count
    result = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), "workers": workers, "rounds": args.rounds,
              "characters": {"a .txt of the same articles as paragraphs": text_file.stat().st_size}, "corpora": {}}
    for name, by_mode in times.items():
        one, many = by_mode["one process"], by_mode[f"{workers} workers"]
        result["corpora"][name] = {
            mode: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "rounds_s": v}
            for mode, v in by_mode.items()}
        result["corpora"][name]["speedup_by_round"] = [a / b for a, b in zip(one, many)]
        print(f"{name}: one process {statistics.median(one):.1f} s ({min(one):.1f}-{max(one):.1f}), "
              f"{workers} workers {statistics.median(many):.1f} s ({min(many):.1f}-{max(many):.1f}), "
              f"by round {min(a / b for a, b in zip(one, many)):.2f}-{max(a / b for a, b in zip(one, many)):.2f}x")
    from common import save_result
    save_result(Path(args.out).stem, result, Path(args.out).parent)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
