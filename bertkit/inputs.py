"""Reading the user's input files, with errors that name the file, line or byte.

`encode` and `predict` take a .txt file (one text per line) or JSONL with `text` (and
`text_pair`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import BertkitError


def read_text(path: str | Path) -> str:
    """A whole file as UTF-8; a bad byte is reported with its offset and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BertkitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BertkitError(f"{path}: is a folder, expected a file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BertkitError(f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset "
                           f"{e.start} (line {line}) is invalid") from None


def lines(content: str) -> list[str]:
    """Lines split at newlines only: str.splitlines would also split at U+2028 and other
    separators that may sit unescaped inside a JSON string or a text."""
    return [line.removesuffix("\r") for line in content.split("\n")]


def read_lines(path: str | Path) -> list[str]:
    # spreadsheet programs start UTF-8 files with a byte-order mark
    return lines(read_text(path).removeprefix("\ufeff"))


def jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file."""
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BertkitError(f"{path}, line {lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise BertkitError(f"{path}, line {lineno}: expected a JSON object, found {type(row).__name__}")
        yield lineno, row


@dataclass
class TextInputs:
    texts: list[str]
    pairs: list[str] | None  # set when the JSONL rows carry text_pair


def read_text_inputs(path: str | Path) -> TextInputs:
    """Texts from a .txt file (one per line, blank lines skipped) or a .jsonl file."""
    path = Path(path)
    if path.suffix == ".jsonl":
        texts, pairs = [], []
        for lineno, row in jsonl_rows(path):
            if not isinstance(row.get("text"), str):
                raise BertkitError(f"{path}, line {lineno}: expected an object with a string field 'text'")
            pair = row.get("text_pair")
            if pair is not None and not isinstance(pair, str):
                raise BertkitError(f"{path}, line {lineno}: field 'text_pair' must be a string")
            texts.append(row["text"])
            pairs.append(pair)
        given = [p is not None for p in pairs]
        if any(given) and not all(given):
            lineno = given.index(False) + 1
            raise BertkitError(f"{path}: some rows have 'text_pair' and some do not "
                               f"(row {lineno} has none); give it on every row or on none")
        result = TextInputs(texts, pairs if any(given) else None)
    else:
        result = TextInputs([line for line in read_lines(path) if line.strip()], None)
    if not result.texts:
        raise BertkitError(f"{path}: no texts in this file")
    return result
