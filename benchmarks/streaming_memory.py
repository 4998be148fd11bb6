"""Memory of pretraining on corpora of growing size: tokenized once into memory-mapped shards,
then streamed, so the process's own (anonymous) memory stays flat as the corpus grows.

Corpus: the Python 3.11 documentation sources from Debian (`apt-get install python3.11-doc`,
/usr/share/doc/python3.11/html/_sources, 497 reST files, 11 MB), one document per file, read
1x and 4x (a folder of links to the same files: four times the tokens to shard and stream).
Each size runs in a fresh process: vocabulary given (trained once), tokenizing into 1 M-token
shards, then 30 steps of the tiny preset at batch 256, length 64.

    .venv/bin/python benchmarks/streaming_memory.py [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path("/usr/share/doc/python3.11/html/_sources")

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from bertkit.pretraining.train import PretrainConfig, pretrain

def rss_anon_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
corpus, vocab, out = sys.argv[1:4]
samples = []
t = time.perf_counter()
summary = pretrain(PretrainConfig(corpus=corpus, doc_per_file=True, vocab=vocab, out=out, steps=30,
                                  batch_size=256, max_len=64, shard_tokens=1_000_000, eval_every=30,
                                  save_every=0, log_every=10, progress=False),
                   on_step=lambda step, model: samples.append(rss_anon_mb()))
print(json.dumps({"tokens": summary["corpus"]["train"]["tokens"], "shards": summary["corpus"]["train"]["shards"],
                  "documents": summary["corpus"]["train"]["documents"],
                  "train_rss_anon_mb_first": samples[0], "train_rss_anon_mb_max": max(samples),
                  "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "wall_s": time.perf_counter() - t, "pairs_per_s": summary["pairs_per_s"]}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args()
    if not DOCS.is_dir():
        sys.exit(f"{DOCS} is missing: apt-get install python3.11-doc")
    work = Path(tempfile.mkdtemp(prefix="bertkit-stream-"))
    files = sorted(DOCS.rglob("*.rst.txt"))
    vocab = work / "vocab"
    subprocess.run([sys.executable, "-m", "bertkit", "tokenizer", "train", "--corpus", str(DOCS),
                    "--vocab-size", "8192", "--out", str(vocab)], check=True)
    rows = []
    for copies in args.copies:
        corpus = work / f"docs_x{copies}"
        for c in range(copies):
            for f in files:
                link = corpus / f"copy{c}" / f.relative_to(DOCS)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(f)
        res = subprocess.run([sys.executable, "-c", CHILD, str(corpus), str(vocab), str(work / f"run_x{copies}")],
                             check=True, capture_output=True, text=True)
        row = {"copies": copies, **json.loads(res.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    from common import save_result
    save_result("streaming_memory", {"rows": rows}, args.out)
    print(f"{'copies':>6}{'tokens':>12}{'shards':>8}{'anon MB (train)':>17}{'peak RSS MB':>13}")
    for r in rows:
        print(f"{r['copies']:>6}{r['tokens']:>12,}{r['shards']:>8}{r['train_rss_anon_mb_max']:>17.0f}"
              f"{r['process_peak_rss_mb']:>13.0f}")


if __name__ == "__main__":
    main()
