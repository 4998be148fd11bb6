"""Text utilities, below every other layer: sentence splitting, the same for pretraining's
corpora and for the summarize task's documents."""
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache


@lru_cache(maxsize=1)
def sentence_segmenter():
    import pysbd  # building the segmenter compiles its rules once
    return pysbd.Segmenter(language="en", clean=False)


# pysbd's time grows about quadratically with the length of what it is given (a 250 KB line took
# 107 s) and it misses more boundaries in long inputs: a longer paragraph goes to it in chunks.
MAX_CHUNK_CHARS = 5_000
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s+")
_SPACE = re.compile(r"\s+")


def bounded_chunks(paragraph: str, size: int = MAX_CHUNK_CHARS) -> Iterator[str]:
    """`paragraph` in pieces of at most `size` characters, cut after the last sentence end in
    the second half of each piece, else at its last whitespace, else (one giant word) at `size`."""
    start = 0
    while len(paragraph) - start > size:
        window = paragraph[start:start + size]
        cut = None
        for pattern in (_SENTENCE_END, _SPACE):
            ends = [m.end() for m in pattern.finditer(window, size // 2)]
            if ends:
                cut = ends[-1]
                break
        cut = cut or size
        yield paragraph[start:start + cut]
        start += cut
    yield paragraph[start:]


def _squeeze(text: str) -> str:
    return "".join(text.split())


def _faithful(chunk: str, sentences: list[str]) -> list[str]:
    """pysbd's sentences as the text of `chunk` itself. pysbd stands placeholder characters in
    for punctuation it protects ("∯" for a period that ends no sentence, "&ᓴ&" for "!", "ȸ" ...)
    and turns them back on the way out, so a text that holds such a character comes back changed
    ("∯" as "."). Then each sentence is cut from the chunk by its count of non-space characters:
    the boundaries stay pysbd's, the text is the input's."""
    if _squeeze("".join(sentences)) == _squeeze(chunk):
        return sentences
    positions = [i for i, c in enumerate(chunk) if not c.isspace()]
    out, k = [], 0
    for j, sentence in enumerate(sentences):
        end = len(positions) if j == len(sentences) - 1 else min(k + len(_squeeze(sentence)), len(positions))
        if end > k:
            out.append(chunk[positions[k]:positions[end - 1] + 1])
        k = end
    if k < len(positions):  # no sentences at all
        out.append(chunk[positions[k]:positions[-1] + 1])
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`; every line is a paragraph of its own."""
    seg = sentence_segmenter()
    sentences = []
    # pysbd is superlinear in its input length: feed it one paragraph (or chunk of a very long
    # one) at a time.
    for paragraph in text.split("\n"):
        if paragraph.strip():
            for chunk in bounded_chunks(paragraph, MAX_CHUNK_CHARS):
                # The processor is what segment() runs; segment() then maps every sentence back
                # to the text with a fresh regex each (a third of the time) for spans we drop.
                found = [s.strip() for s in seg.processor(chunk).process() if s.strip()]
                sentences.extend(_faithful(chunk, found))
    return sentences
