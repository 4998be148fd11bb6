"""Readers of bertkit's training file formats (classify tables, CoNLL, summarize and word
files). They never skip data silently: a malformed row is a BertkitError naming the file, the
1-based line and the problem."""
from __future__ import annotations

import csv
import io
import json
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from ..errors import BertkitError
from ..inputs import jsonl_rows, read_lines, read_text


def _table_rows(path: Path, required: tuple[str, ...], headerless: tuple[str, ...] | None = None
                ) -> Iterator[tuple[int, dict]]:
    """(line, row) of a CSV/TSV/JSONL file; rows of a table are dicts by header. A table whose
    first row lacks the required columns is read as `headerless` columns if its width matches."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        for lineno, row in jsonl_rows(path):
            missing = [c for c in required if c not in row]
            if missing:
                raise BertkitError(f"{path}, line {lineno}: missing field {missing[0]!r} "
                                   f"(the row has {', '.join(map(repr, row)) or 'no fields'})")
            yield lineno, row
        return
    if suffix not in (".csv", ".tsv"):
        raise BertkitError(f"{path}: expected a .csv, .tsv or .jsonl file")
    # strict: a file that ends inside a quoted field (cut short) is an error, not a last row
    # holding half its value; so is text after a closing quote (`"abc"def`)
    # The csv module refuses fields over 128 KiB by default; a long document is one field.
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    reader = csv.reader(io.StringIO(read_text(path).removeprefix("\ufeff"), newline=""),
                        delimiter="\t" if suffix == ".tsv" else ",", strict=True)
    header, end = None, 0
    while True:
        start = end + 1
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            why = (f"{e}: the file ends inside a quoted field (a quote not closed, or the file is cut short)"
                   if "unexpected end of data" in str(e) else str(e))
            raise BertkitError(f"{path}, line {reader.line_num}: malformed {suffix[1:].upper()} ({why})") from None
        end = reader.line_num
        if not fields or fields == [""]:
            continue  # a blank line is no row
        if header is None:
            columns = [c.strip() for c in fields]
            if all(c in columns for c in required):
                twice = next((c for i, c in enumerate(columns) if c and c in columns[:i]), None)
                if twice is not None:  # dict(zip(...)) would keep the last column of the name alone
                    raise BertkitError(f"{path}, line {start}: the header names column {twice!r} twice")
                header = columns
                continue
            # a first row naming a column is a header, even a broken one (`text,wor` of a file cut
            # short): never a row of data
            if headerless is None or len(fields) != len(headerless) or any(c in required for c in columns):
                raise BertkitError(f"{path}, line {start}: the header needs columns {', '.join(required)}; "
                                   f"it has {', '.join(c if c.isprintable() else repr(c) for c in columns)}")
            header = list(headerless)
        if len(fields) != len(header):
            raise BertkitError(f"{path}, line {start}: expected {len(header)} fields ({', '.join(header)}), "
                               f"found {len(fields)}")
        yield start, dict(zip(header, fields))


def _nonempty_string(path, lineno, row: dict, key: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise BertkitError(f"{path}, line {lineno}: {key!r} must be a string, found {json.dumps(value)}")
    if not value.strip():
        raise BertkitError(f"{path}, line {lineno}: {key!r} is empty")
    return value


def read_classify(path: str | Path) -> list[dict]:
    """Rows {"text", "label", "line"} (and "text_pair" where the file has it) of a CSV, TSV or
    JSONL file, "line" the row's line number.
    A label is a string or an int; a table's labels become ints when all of them are integers
    as an int prints them ("01" stays a string: its int would print as "1")."""
    path = Path(path)
    rows, has_pair, kinds = [], None, {}
    for lineno, row in _table_rows(path, ("text", "label")):
        example = {"text": _nonempty_string(path, lineno, row, "text"), "line": lineno}  # for later errors
        pair = "text_pair" in row and row["text_pair"] is not None
        if has_pair is None:
            has_pair = pair
        elif pair != has_pair:
            raise BertkitError(f"{path}, line {lineno}: " + ("has a text_pair but earlier rows do not" if pair else
                               "has no text_pair but earlier rows do"))
        if pair:
            example["text_pair"] = _nonempty_string(path, lineno, row, "text_pair")
        label = row["label"]
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise BertkitError(f"{path}, line {lineno}: 'label' must be a string or an integer, "
                               f"found {json.dumps(label)}")
        if isinstance(label, str):
            label = label.strip()
            if not label:
                raise BertkitError(f"{path}, line {lineno}: 'label' is empty")
        kinds.setdefault(type(label), lineno)
        if len(kinds) > 1:
            raise BertkitError(f"{path}, line {lineno}: 'label' mixes strings and integers "
                               f"(line {min(kinds.values())} has the other kind)")
        example["label"] = label
        rows.append(example)
    if not rows:
        raise BertkitError(f"{path}: no examples")
    if path.suffix.lower() != ".jsonl" and all(re.fullmatch(r"-?(0|[1-9]\d*)", r["label"]) for r in rows):
        for r in rows:
            r["label"] = int(r["label"])
    return rows


def read_conll(path: str | Path, lines: bool = False) -> list[tuple[list[str], list[str]]]:
    """Sentences (tokens, tags) of a CoNLL file: `token<whitespace>tag` per line with the tag
    last (middle columns, as in CoNLL-2003, are ignored), a blank line between sentences; a line
    with tabs is split at its tabs alone (a token may hold spaces).
    `-DOCSTART-` lines are document markers, not tokens. lines=True: (tokens, tags, line
    numbers), each token's line in the file, for errors that name it."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json", ".csv"):  # classify rows were read as one sentence of "tokens"
        raise BertkitError(f"{path}: a {path.suffix[1:].upper()} file is not CoNLL; ner and tag read CoNLL files: "
                           "one `token tag` per line, a blank line between sentences")
    sentences, tokens, tags, numbers = [], [], [], []
    wide = None  # the first line with more than two columns: its last is the tag, as the user is told
    for lineno, line in enumerate(read_lines(path) + [""], 1):
        line = line.rstrip()
        # a tab-separated line keeps each column whole: "New York<TAB>B-LOC" is one token (split at
        # any whitespace it was "New", its label on one word of two)
        fields = [f.strip() for f in line.split("\t")] if "\t" in line else line.split()
        if not fields or not line:
            if tokens:
                sentences.append((tokens, tags, numbers) if lines else (tokens, tags))
                tokens, tags, numbers = [], [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2:
            raise BertkitError(f"{path}, line {lineno}: expected 'token tag', found one field {fields[0]!r} "
                               "(the tag is missing)")
        if not fields[0] or not fields[-1]:
            raise BertkitError(f"{path}, line {lineno}: an empty {'token' if not fields[0] else 'tag'} column")
        if len(fields) > 2 and wide is None:
            wide = (lineno, len(fields))
        tokens.append(fields[0])
        tags.append(fields[-1])
        numbers.append(lineno)
    if not sentences:
        raise BertkitError(f"{path}: no sentences")
    if wide is not None:  # CoNLL-2003's token POS chunk NER is read right; a token tag POS file would not be
        warnings.warn(f"{path}: line {wide[0]} has {wide[1]} columns; the first is read as the token and the last "
                      "as its tag, the others are ignored", stacklevel=2)
    return sentences


@lru_cache(maxsize=1)
def _rouge():
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise BertkitError("deriving extractive labels from a summary needs rouge-score: "
                           "pip install rouge-score==0.1.2") from None
    return rouge_scorer.RougeScorer(["rouge1", "rouge2"])


class _WordCharacters(dict):
    """str.translate's table: a space for every character that is not a letter, digit or mark
    (a mark: Devanagari's vowel signs and viramas belong to their word), looked up once each."""

    def __missing__(self, code: int):
        self[code] = chr(code) if unicodedata.category(chr(code))[0] in "LNM" else " "
        return self[code]


_WORD_CHARACTERS = _WordCharacters()
# scripts written without spaces between words: each character a token (CJK ideographs, kana, Thai)
_CHARACTER_WORDS = re.compile(r"([\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])")


class RougeTokenizer:
    """rouge-score's tokenizer for text in any script. rouge-score keeps only a-z and 0-9, so a
    Russian or Chinese summary had no tokens: its greedy labels were all 0 and its ROUGE 0.
    Text in ASCII goes to rouge-score's own tokenizer unchanged (the usual English figures);
    otherwise letters and digits of every script make words, characters of unspaced scripts one
    each, and ASCII words are stemmed as rouge-score stems them."""

    def __init__(self, use_stemmer: bool = False):
        from rouge_score.tokenizers import DefaultTokenizer
        self._ascii = DefaultTokenizer(use_stemmer=use_stemmer)

    def tokenize(self, text: str) -> list[str]:
        if text.isascii():
            return self._ascii.tokenize(text)
        words = _CHARACTER_WORDS.sub(r" \1 ", text.lower().translate(_WORD_CHARACTERS)).split()
        return [t for w in words for t in (self._ascii.tokenize(w) if w.isascii() else [w])]


def greedy_labels(sentences: list[str], summary: str) -> list[int]:
    """Extractive labels by greedy ROUGE matching: add the sentence that most improves
    ROUGE-1 F + ROUGE-2 F of the selection against the summary, while the score improves.

    rouge-score's tokenizer (RougeTokenizer: any script), n-gram counts and F formula, but each
    sentence tokenized once and a candidate's counts added to the selection's (scoring every
    candidate selection whole took 55 s for a 20,000-sentence document); tested equal to
    `RougeScorer.score`."""
    _rouge()  # rouge-score installed, or a clear error
    tokenize = RougeTokenizer(use_stemmer=True).tokenize  # as summarize's ROUGE scores: the labels aim at it
    ref = tokenize(summary)
    ref1, ref2 = Counter(ref), Counter(zip(ref, ref[1:]))
    toks = [tokenize(s) for s in sentences]
    # only n-grams of the summary can overlap: each sentence's, counted once
    unigrams = [Counter(g for g in t if g in ref1) for t in toks]
    bigrams = [Counter(g for g in zip(t, t[1:]) if g in ref2) for t in toks]  # inside each sentence
    sel1, sel2 = Counter(), Counter()  # the selection's n-grams that the summary has
    hit1 = hit2 = n1 = n2 = 0  # overlaps with the summary's n-grams; the selection's n-gram counts
    chosen: list[int] = []
    best = 0.0

    def f(hit, n_pred, n_ref):  # rouge_score's precision, recall and F
        p, r = hit / max(n_pred, 1), hit / max(n_ref, 1)
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    def joins(i):
        """The bigrams joining sentence i to its neighbours in the selection (document order),
        less the one between those neighbours that it breaks."""
        t = toks[i]
        prev = max((j for j in chosen if j < i and toks[j]), default=None)
        nxt = min((j for j in chosen if j > i and toks[j]), default=None)
        delta = Counter()
        if prev is not None:
            delta[(toks[prev][-1], t[0])] += 1
        if nxt is not None:
            delta[(t[-1], toks[nxt][0])] += 1
        if prev is not None and nxt is not None:
            delta[(toks[prev][-1], toks[nxt][0])] -= 1
        return delta

    while True:
        step = None
        for i in range(len(sentences)):
            if i in chosen or not toks[i]:  # no tokens: the same selection, never an improvement
                continue
            h1 = hit1 + sum(min(sel1[g] + c, ref1[g]) - min(sel1[g], ref1[g]) for g, c in unigrams[i].items())
            delta = joins(i)
            added = len(toks[i]) - 1 + sum(delta.values())  # the selection's bigrams gained
            delta.update(bigrams[i])
            h2 = hit2 + sum(min(sel2[g] + c, ref2[g]) - min(sel2[g], ref2[g]) for g, c in delta.items() if g in ref2)
            score = f(h1, n1 + len(toks[i]), len(ref)) + f(h2, n2 + added, max(0, len(ref) - 1))
            if score > best and (step is None or score > step[1]):
                step = (i, score, h1, h2, delta, added)
        if step is None:
            return [int(i in chosen) for i in range(len(sentences))]
        i, best, hit1, hit2, delta, added = step
        sel1.update(unigrams[i])
        sel2.update({g: c for g, c in delta.items() if g in ref2})
        n1, n2 = n1 + len(toks[i]), n2 + added
        chosen.append(i)


def read_summarize(path: str | Path) -> list[dict]:
    """Documents {"sentences", "labels"} of a JSONL file whose rows hold either "sentences" and
    0/1 "labels", or "document" and "summary": the document is split into sentences and labelled
    by greedy ROUGE matching against the summary (rows then keep "summary" too)."""
    from ..text import split_sentences
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        raise BertkitError(f"{path}: expected a .jsonl file")
    docs = []
    for lineno, row in jsonl_rows(path):
        where = f"{path}, line {lineno}"
        if "sentences" in row:
            sentences, labels = row["sentences"], row.get("labels")
            if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
                raise BertkitError(f"{where}: 'sentences' must be a list of strings")
            if not sentences:
                raise BertkitError(f"{where}: the document has no sentences")
            empty = next((i for i, s in enumerate(sentences) if not s.strip()), None)
            if empty is not None:
                raise BertkitError(f"{where}: sentence {empty + 1} is empty")
            if not isinstance(labels, list) or not all(v in (0, 1) and not isinstance(v, float) for v in labels):
                raise BertkitError(f"{where}: 'labels' must be a list of 0/1 integers")
            if len(labels) != len(sentences):
                raise BertkitError(f"{where}: {len(sentences)} sentences but {len(labels)} labels")
            docs.append({"sentences": sentences, "labels": [int(v) for v in labels]})
        elif "document" in row:
            if "summary" not in row:
                raise BertkitError(f"{where}: a 'document' needs a 'summary' to derive labels from")
            document = row["document"]
            summary = _nonempty_string(path, lineno, row, "summary")
            if not isinstance(document, str):
                raise BertkitError(f"{where}: 'document' must be a string")
            sentences = split_sentences(document)
            if not sentences:
                raise BertkitError(f"{where}: the document has no sentences")
            docs.append({"sentences": sentences, "labels": greedy_labels(sentences, summary), "summary": summary})
        else:
            raise BertkitError(f"{where}: expected 'sentences' and 'labels', or 'document' and 'summary'; "
                               f"the row has {', '.join(map(repr, row)) or 'no fields'}")
    if not docs:
        raise BertkitError(f"{path}: no documents")
    return docs


def read_word(path: str | Path) -> list[dict]:
    """Rows {"text", "word"} of a CSV/TSV (header `text,word`, or no header and two columns)
    or JSONL file; the word must be one token: no spaces."""
    path = Path(path)
    rows = []
    for lineno, row in _table_rows(path, ("text", "word"), headerless=("text", "word")):
        text = _nonempty_string(path, lineno, row, "text")
        word = _nonempty_string(path, lineno, row, "word").strip()
        if any(c.isspace() for c in word):
            raise BertkitError(f"{path}, line {lineno}: the word must be one token without spaces, found {word!r}")
        rows.append({"text": text, "word": word})
    if not rows:
        raise BertkitError(f"{path}: no examples")
    return rows
