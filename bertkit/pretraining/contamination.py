"""A corpus must not hold the texts a model is later scored on: `--exclude-from DEV,TEST` names a
task's evaluation files, and a corpus document that is one of their texts, or holds one as a run
of up to WINDOW of its sentences, is refused by its number and the file and line of the text.

(Packages that ship rotten-tomatoes snippets hold its dev and test reviews, and a teacher labels
any text: a student distilled on them would have seen the test set.)
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import BertkitError
from .corpus import task_file_texts

WINDOW = 4  # consecutive sentences compared as one text: an evaluation text split into sentences


def normalized(text: str) -> str:
    """Lower case, whitespace collapsed: the same text however it was spaced or split."""
    return re.sub(r"\s+", " ", text).strip().lower()


def evaluation_texts(files: Iterable[str | Path]) -> dict[str, str]:
    """normalized text -> where it is ("FILE line N") for every text of the files."""
    where: dict[str, str] = {}
    for f in files:
        for n, text in enumerate(task_file_texts(Path(f)), 1):
            key = normalized(text)
            if key:
                where.setdefault(key, f"{f} text {n}")
    return where


def check_documents(documents: Iterable[list[str]], held: dict[str, str], corpus: str) -> Iterator[list[str]]:
    """The documents, unchanged, each checked first: an evaluation text in one is refused."""
    for d, doc in enumerate(documents, 1):
        sentences = [normalized(s) for s in doc]
        for i in range(len(sentences)):
            for j in range(i + 1, min(i + WINDOW, len(sentences)) + 1):
                hit = held.get(" ".join(sentences[i:j]))
                if hit is not None:
                    raise BertkitError(f"{corpus}: document {d} holds an evaluation text ({hit}: "
                                       f"{' '.join(doc[i:j])[:80]!r}); remove it from the corpus")
        yield doc
