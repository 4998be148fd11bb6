"""Reading the user's input files, with errors that name the file, line or byte.

`encode` and `predict` take a .txt file (one text per line) or JSONL with `text` (and
`text_pair`).
"""
from __future__ import annotations

import json
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import BertkitError


def read_bytes(path: str | Path) -> bytes:
    """A whole file's bytes; a missing, unreadable or folder path is one line naming it."""
    with open_binary(path) as f:
        return f.read()


def open_binary(path: str | Path):
    """The file opened for reading bytes; a missing, unreadable or folder path is one line naming it."""
    path = Path(path)
    try:
        if stat.S_ISFIFO(path.stat().st_mode):  # opening one blocks until a writer comes: said, not silent
            print(f"bertkit: {path} is a named pipe (FIFO): reading it once a writer opens it", file=sys.stderr,
                  flush=True)
        return path.open("rb")
    except FileNotFoundError:
        raise BertkitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BertkitError(f"{path}: is a folder, expected a file") from None
    except PermissionError:
        raise BertkitError(f"{path}: permission denied: cannot read the file") from None
    except OSError as e:
        raise BertkitError(f"{path}: cannot read the file ({e.strerror or e})") from None


_UTF16_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


def _utf16_without_bom(data: bytes) -> bool:
    """ASCII text saved as UTF-16 without a byte-order mark: every other byte is NUL. It is
    valid UTF-8 (NUL is a character), so it only shows as text full of NULs."""
    head = data[:2000]
    if len(head) < 4 or b"\0" not in head:
        return False
    even, odd = head[0::2], head[1::2]
    for zeros, chars in ((even, odd), (odd, even)):
        # and the other half mostly characters: a run of NULs alone is binary, not UTF-16
        if zeros.count(0) > 0.9 * len(zeros) and chars.count(0) < 0.5 * len(chars):
            return True
    return False


def check_not_utf16(path: str | Path, head: bytes) -> None:
    """UTF-16 named as such, from a file's first bytes (2000 are enough)."""
    for bom, name in _UTF16_BOMS.items():
        if head.startswith(bom):
            raise BertkitError(f"{path}: the file is {name} text (it starts with the byte-order mark "
                               f"0x{bom.hex()}); save it as UTF-8")
    if _utf16_without_bom(head):
        raise BertkitError(f"{path}: the file looks like UTF-16 text without a byte-order mark (every other "
                           "byte is NUL); save it as UTF-8")


def decode_text(path: str | Path, data: bytes) -> str:
    """Bytes of `path` as UTF-8; UTF-16 is named as such, another bad byte by offset and line."""
    # before decoding: UTF-16 of non-ASCII text is seldom valid UTF-8, and is still UTF-16
    check_not_utf16(path, data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BertkitError(f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset "
                           f"{e.start} (line {line}) is invalid") from None


def read_text(path: str | Path) -> str:
    """A whole file as UTF-8; a bad byte is reported with its offset and line."""
    return decode_text(path, read_bytes(path))


def lines(content: str) -> list[str]:
    """Lines split at newlines only: str.splitlines would also split at U+2028 and other
    separators that may sit unescaped inside a JSON string or a text."""
    return [line.removesuffix("\r") for line in content.split("\n")]


def read_lines(path: str | Path) -> list[str]:
    # spreadsheet programs start UTF-8 files with a byte-order mark
    text = read_text(path).removeprefix("\ufeff")
    if "\r" in text.rstrip("\r") and "\n" not in text:  # split at newlines, it would be one line
        raise BertkitError(f"{path}: lines end in a carriage return alone (classic Mac line endings); "
                           "save it with LF or CRLF line endings")
    return lines(text)


def lone_surrogate(s: str) -> str | None:
    """The first lone UTF-16 surrogate in `s` as an escape ("\\ud800"), or None. JSON's
    "\\ud800" escape decodes to one: a string no UTF-8 text can hold, which the tokenizer
    refuses deep inside."""
    try:
        s.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return f"\\u{ord(s[e.start]):04x}"


# a high-surrogate escape not followed by a low one, or a low one not preceded by a high one (an
# escaped backslash before "u" may match too: it only makes the strings be checked)
_LONE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
                          r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _check_strings(value, where: str, text: str, at: re.Match) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            bad = lone_surrogate(v)
            if bad:
                if "\n" in text.strip():  # a whole JSON file: the line of the escape
                    line = text.count("\n", 0, at.start()) + 1
                    where += f", line {line}"
                raise BertkitError(f"{where}: a string holds the lone surrogate {bad} (half of a UTF-16 pair), "
                                   "which is not a character")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def parse_json(text: str, where: str):
    """`text` as JSON; anything json.loads refuses (bad syntax, an integer of more than 4,300
    digits, nesting deeper than the recursion limit) and strings with a lone surrogate escape
    are one line naming `where` (file, line)."""
    try:
        value = json.loads(text)
        at = _LONE_ESCAPE.search(text)
        if at:
            _check_strings(value, where, text, at)
        return value
    except json.JSONDecodeError as e:
        at = f" at line {e.lineno}, column {e.colno}" if "\n" in text else f" at column {e.colno}"
        raise BertkitError(f"{where}: not valid JSON ({e.msg}{at})") from None
    except ValueError as e:  # int('9' * 5000): Python refuses such integers
        raise BertkitError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise BertkitError(f"{where}: not valid JSON (nested too deeply)") from None


def jsonl_rows(path: str | Path, file_lines: list[str] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file (of its lines, if read
    already: a pipe or /dev/stdin can be read once only)."""
    for lineno, line in enumerate(read_lines(path) if file_lines is None else file_lines, 1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}, line {lineno}")
        if not isinstance(row, dict):
            raise BertkitError(f"{path}, line {lineno}: expected a JSON object, found {type(row).__name__}")
        yield lineno, row


@dataclass
class TextInputs:
    texts: list[str]
    pairs: list[str] | None  # set when the JSONL rows carry text_pair


def _refuse_blank_lines(path: Path, all_lines: list[str]) -> None:
    """One output row per line: a blank line before the last text would shift every later row."""
    last = max((i for i, line in enumerate(all_lines) if line.strip()), default=0)  # no text: 0, no gap
    blank = [i + 1 for i, line in enumerate(all_lines[:last]) if not line.strip()]
    if blank:
        raise BertkitError(f"{path}, line {blank[0]}: blank line ({len(blank)} in the file); row i of the "
                           "output is line i of the input, so remove blank lines")


def _check_input_suffix(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv", ".json"):  # as lines of text, a header and labels would become texts
        raise BertkitError(f"{path}: a {suffix[1:].upper()} file is not an input here; give a .txt file (one "
                           "text per line) or a .jsonl file (an object with 'text' per line)")


def _row_texts(path: Path, lineno: int, row: dict) -> tuple[str, str | None]:
    """A JSONL row's text and text_pair (None where it has none)."""
    if not isinstance(row.get("text"), str):
        raise BertkitError(f"{path}, line {lineno}: expected an object with a string field 'text'")
    pair = row.get("text_pair")
    if pair is not None and not isinstance(pair, str):
        raise BertkitError(f"{path}, line {lineno}: field 'text_pair' must be a string")
    return row["text"], pair


def _mixed_pairs(path: Path, lineno: int) -> BertkitError:
    return BertkitError(f"{path}: some rows have 'text_pair' and some do not "
                        f"(row {lineno} has none); give it on every row or on none")


def read_text_inputs(path: str | Path, blank_lines: str = "skip") -> TextInputs:
    """Texts from a .txt file (one per line) or a .jsonl file (one object per line).

    blank_lines="skip" passes over blank lines; "refuse" names the first blank line between
    texts (trailing blank lines are fine), for outputs whose row i must be line i (`encode`, `predict`)."""
    path = Path(path)
    if blank_lines not in ("skip", "refuse"):
        raise ValueError(f"blank_lines must be 'skip' or 'refuse', got {blank_lines!r}")
    _check_input_suffix(path)
    file_lines = read_lines(path)  # once: a named pipe or /dev/stdin has nothing left for a second read
    if blank_lines == "refuse":
        _refuse_blank_lines(path, file_lines)
    if path.suffix.lower() == ".jsonl":
        texts, pairs = [], []
        for lineno, row in jsonl_rows(path, file_lines):
            text, pair = _row_texts(path, lineno, row)
            texts.append(text)
            pairs.append(pair)
        given = [p is not None for p in pairs]
        if any(given) and not all(given):
            raise _mixed_pairs(path, given.index(False) + 1)
        result = TextInputs(texts, pairs if any(given) else None)
    else:
        result = TextInputs([line for line in file_lines if line.strip()], None)
    if not result.texts:
        raise BertkitError(f"{path}: no texts in this file")
    return result


# ---- a file of any size, in chunks: `bertkit encode` on a corpus ----
@dataclass
class InputScan:
    """What one pass over a .txt or .jsonl input found, holding none of its texts. Row i is line
    i; chunk c is rows c * chunk_rows onwards, read back with read_chunk."""
    path: Path
    rows: int
    pairs: bool
    chunk_rows: int
    offsets: list[int]  # the byte offset of each chunk's first line
    digest: str         # sha256 of the file's bytes: a resumed run reads the same file
    name: Path          # the file as errors name it (a pipe's texts are read from a copy)
    stamp: tuple | None = None  # (size, mtime_ns) as scanned: a chunk is read back only from that file

    @property
    def chunks(self) -> int:
        return len(self.offsets)

    def chunk_size(self, chunk: int) -> int:
        return min(self.chunk_rows, self.rows - chunk * self.chunk_rows)


def _decoded_lines(path: Path, f, start_line: int = 1, offset: int = 0) -> Iterator[tuple[int, int, bytes, str]]:
    """(line number, byte offset, raw bytes, text) of each line of an open binary file: split at
    newlines only, a CRLF's CR and the first line's byte-order mark dropped, a bad byte named
    by offset and line as decode_text names it."""
    for lineno, raw in enumerate(f, start_line):
        body = raw.removesuffix(b"\n")
        try:
            line = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BertkitError(f"{path}: not UTF-8 text: byte 0x{body[e.start]:02x} at byte offset "
                               f"{offset + e.start} (line {lineno}) is invalid") from None
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        yield lineno, offset, raw, line.removesuffix("\r")
        offset += len(raw)


def scan_text_inputs(path: str | Path, chunk_rows: int, name: str | Path | None = None) -> InputScan:
    """One pass over a .txt or .jsonl input, in constant memory, checking all that
    read_text_inputs(path, blank_lines="refuse") checks: the texts are read again chunk by chunk.
    name: the file as errors name it, where `path` is a copy of it (default: path)."""
    import hashlib
    reading, path = Path(path), Path(name or path)
    _check_input_suffix(path)
    jsonl = path.suffix.lower() == ".jsonl"
    digest = hashlib.sha256()
    rows, offsets, pairs = 0, [], None
    blank, blanks, gaps = None, 0, []  # the blank lines since the last text; those between texts
    with open_binary(reading) as f:
        check_not_utf16(path, f.read(2000))
        f.seek(0)
        for lineno, offset, raw, line in _decoded_lines(path, f):
            digest.update(raw)
            if lineno == 1 and not raw.endswith(b"\n") and "\r" in line.rstrip("\r"):
                raise BertkitError(f"{path}: lines end in a carriage return alone (classic Mac line endings); "
                                   "save it with LF or CRLF line endings")
            if not line.strip():
                blank, blanks = blank or lineno, blanks + 1
                continue
            if blank is not None:  # a text after blank lines: every later row would shift
                gaps.append((blank, blanks))
                blank, blanks = None, 0
            if gaps:  # refused below, by its first blank line; the rest of the file only counted
                continue
            if jsonl:
                row = parse_json(line, f"{path}, line {lineno}")
                if not isinstance(row, dict):
                    raise BertkitError(f"{path}, line {lineno}: expected a JSON object, found {type(row).__name__}")
                has_pair = _row_texts(path, lineno, row)[1] is not None
                if pairs is None:
                    pairs = has_pair
                elif has_pair != pairs:
                    raise _mixed_pairs(path, lineno if pairs else 1)
            if rows % chunk_rows == 0:
                offsets.append(offset)
            rows += 1
    if gaps:
        raise BertkitError(f"{path}, line {gaps[0][0]}: blank line ({sum(n for _, n in gaps)} in the file); row i "
                           "of the output is line i of the input, so remove blank lines")
    if not rows:
        raise BertkitError(f"{path}: no texts in this file")
    st = reading.stat()
    return InputScan(reading, rows, bool(pairs), chunk_rows, offsets, digest.hexdigest(), path,
                     (st.st_size, st.st_mtime_ns))


def read_chunk(scan: InputScan, chunk: int) -> TextInputs:
    """The texts of one chunk of a scanned input (checked by the scan)."""
    first, n = chunk * scan.chunk_rows, scan.chunk_size(chunk)
    texts, pairs = [], []
    st = scan.path.stat()
    if scan.stamp is not None and (st.st_size, st.st_mtime_ns) != scan.stamp:  # edited: rows would mix
        raise BertkitError(f"{scan.name}: the file changed while it was being encoded (its size or time are no "
                           "longer those it was read with); the chunks written before are kept: put the file "
                           "back and --resume, or --overwrite to start over")
    with open_binary(scan.path) as f:
        f.seek(scan.offsets[chunk])
        for lineno, _, _, line in _decoded_lines(scan.name, f, first + 1, scan.offsets[chunk]):
            if scan.name.suffix.lower() == ".jsonl":
                text, pair = _row_texts(scan.name, lineno, parse_json(line, f"{scan.name}, line {lineno}"))
                texts.append(text)
                pairs.append(pair)
            else:
                texts.append(line)
            if len(texts) == n:
                break
    if len(texts) != n:
        raise BertkitError(f"{scan.name}: the file changed while it was read (line {first + len(texts) + 1} is gone)")
    return TextInputs(texts, pairs if scan.pairs else None)


def read_single_texts(path: str | Path, task: str) -> list[str]:
    """Texts of a .txt or .jsonl --input for a task that reads one text at a time: rows with
    'text_pair' are refused, not read without it."""
    inputs = read_text_inputs(path, blank_lines="refuse")  # predict's row i is line i
    if inputs.pairs is not None:
        raise BertkitError(f"{path}: the rows have 'text_pair', but the {task} task reads single texts "
                           "(only classify takes pairs); give 'text' alone")
    return inputs.texts
