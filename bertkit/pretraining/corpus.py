"""Raw text to documents for pretraining: a document is its list of sentences.

Next sentence prediction needs both: sentences to pair, document boundaries to draw
random "not next" sentences from elsewhere. Sources are a .txt file, a folder of them
(documents separated by blank lines), `wiki` (the Wikipedia sample shipped with gensim),
`python-docs` or `linux-docs` (Debian's reST documentation sources), `wordnet` (WordNet's
glosses, from Debian's wordnet-base), `gcide` (the Collaborative International Dictionary of
English, from Debian's dict-gcide), a task's data file (.jsonl,
.csv, .tsv: the texts of its rows, for task-adaptive pretraining), or several joined by "+".
"""
from __future__ import annotations

import bz2
import gzip
import html
import importlib.util
import itertools
import json
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import BertkitError
from ..inputs import _utf16_without_bom, check_not_utf16, decode_text, open_binary, read_bytes, read_text
from ..text import split_sentences
from .split_workers import map_texts

Document = list[str]

WIKI_SAMPLE = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# Sections that are link lists and citations, not prose.
_SKIP_SECTIONS = {"see also", "references", "external links", "further reading", "notes",
                  "footnotes", "bibliography", "sources", "citations", "works cited"}


def read_text_file(path: Path) -> str:
    """A whole text file; a binary one is named with the offset of its first NUL byte."""
    data = read_bytes(path)
    try:
        text = decode_text(path, data)
    except BertkitError:
        nul = data.find(b"\0")
        if nul < 0 or data.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_without_bom(data):
            raise  # UTF-16 is named as such, not as binary
        raise BertkitError(f"{path}: looks binary: NUL byte at byte offset {nul}") from None
    nul = text.find("\0")
    if nul >= 0:  # NUL is valid UTF-8, but no text file holds one
        offset = len(text[:nul].encode("utf-8"))
        raise BertkitError(f"{path}: looks binary: NUL byte at byte offset {offset}")
    return text


def file_lines(path: Path) -> Iterator[str]:
    """The lines of a text file as read_text_file(path).splitlines() gives them, and the same
    errors, but read a line at a time: a corpus file may be larger than memory."""
    with open_binary(path) as f:
        # a byte-order mark or UTF-16 without one: named from the head, read without consuming it (a
        # named pipe cannot seek back)
        check_not_utf16(path, f.peek(2000)[:2000])
        offset, lineno = 0, 1
        for raw in f:  # split at b"\n" only: no byte of a multi-byte UTF-8 character is 0x0a
            nul = raw.find(b"\0")
            if nul >= 0:
                raise BertkitError(f"{path}: looks binary: NUL byte at byte offset {offset + nul}")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # a NUL anywhere later makes the file binary rather than text with a bad byte
                rest, at = offset + len(raw), -1
                for later in f:
                    if (at := later.find(b"\0")) >= 0:
                        raise BertkitError(f"{path}: looks binary: NUL byte at byte offset {rest + at}") from None
                    rest += len(later)
                raise BertkitError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset "
                                   f"{offset + e.start} (line {lineno}) is invalid") from None
            yield from text.splitlines()  # "\n" alone gives one empty line: a document break
            offset += len(raw)
            lineno += 1


def _lines(text: str) -> list[str]:
    """Each non-blank line one sentence already (the input format of Google's
    create_pretraining_data.py), kept as it is but for surrounding spaces."""
    return [s for s in map(str.strip, text.splitlines()) if s]


def _document_texts(path: Path) -> Iterator[str]:
    lines: list[str] = []
    for line in itertools.chain(file_lines(path), [""]):  # the sentinel flushes the last document
        if line.strip():
            lines.append(line)
        elif lines:
            yield "\n".join(lines)
            lines = []


# A task's data file as a corpus: its texts without the labels, one document per row. Continued
# pretraining on a task's own unlabelled text is task-adaptive pretraining (Gururangan et al. 2020).
TASK_FILE_SUFFIXES = (".jsonl", ".csv", ".tsv")


def is_task_file(path: Path) -> bool:
    return path.suffix.lower() in TASK_FILE_SUFFIXES


def task_file_texts(path: Path) -> Iterator[str]:
    """Each row's text, its parts on lines of their own: `text` (and `text_pair`) of a classify,
    word or encode file, or a summarize row's `sentences` or `document`."""
    from ..data.readers import _table_rows
    for lineno, row in _table_rows(path, ()):
        if "text" in row:
            parts = [row["text"], row.get("text_pair")]
        elif "sentences" in row:
            parts = row["sentences"] if isinstance(row["sentences"], list) else [row["sentences"]]
        elif "document" in row:
            parts = [row["document"]]
        else:
            raise BertkitError(f"{path}, line {lineno}: no text to pretrain on: expected a field 'text' "
                               f"(classify, word), 'sentences' or 'document' (summarize); the row has "
                               f"{', '.join(map(repr, row)) or 'no fields'}")
        parts = [p for p in parts if p is not None]
        bad = next((p for p in parts if not isinstance(p, str)), None)
        if bad is not None:
            raise BertkitError(f"{path}, line {lineno}: a text must be a string, found {json.dumps(bad)}")
        text = "\n".join(p for p in parts if p.strip())
        if text:
            yield text


def _files_documents(files: Iterable[Path], per_file: bool = False, per_line: bool = False) -> Iterator[Document]:
    # read a file at a time; with per_file a file is one text; a task file's rows are its texts
    texts = (t for p in files for t in (task_file_texts(p) if is_task_file(p) else
                                         [read_text_file(p)] if per_file else _document_texts(p)))
    documents = map(_lines, texts) if per_line else map_texts(split_sentences, texts)
    return (sentences for sentences in documents if sentences)


def documents_up_to_two(source: str | Path, per_file: bool = False) -> int | None:
    """0, 1 or 2 (two or more): the documents of a file or folder corpus (blocks between blank
    lines; with per_file, files with text), counted from its lines alone and stopping at the
    second; None for the built-in corpora. Splitting a 5 MB one-line corpus into sentences took
    26 s before the run said it needs two."""
    if str(source) in BUILT_IN or _is_joined(source):
        for part in str(source).split("+"):
            if part in BUILT_IN:  # a package not installed is named before the run writes its --out
                _built_in_reader(part)
        return None
    found = 0
    files = corpus_files(Path(source))
    if any(stat.S_ISFIFO(f.stat().st_mode) for f in files):  # a named pipe is read once: by the run itself
        return None
    for f in files:
        if is_task_file(f):
            found += sum(1 for _ in itertools.islice(task_file_texts(f), 2 - found))
            if found >= 2:
                return 2
            continue
        inside = False  # each file's last document ends with the file
        for line in file_lines(f):
            if line.strip() and not inside:
                found, inside = found + 1, True
                if per_file:
                    break
            elif not line.strip() and not per_file:
                inside = False
            if found >= 2:
                return 2
    return found


class TrainOnly(list):
    """A document of an added source ("wiki+python-docs": python-docs): trained on, never held
    out, so the evaluation stays on the first source's text whatever is added to it."""


# Built-in text from Debian's documentation packages: (files, the package that installs them).
DOC_SOURCES = {
    "python-docs": ("/usr/share/doc/python3.11/html/_sources", "**/*.rst.txt", "python3.11-doc"),
    "linux-docs": ("/usr/share/doc/linux-doc-6.1/Documentation", "**/*.rst.gz", "linux-doc-6.1"),
}


def _doc_files(name: str) -> list[Path]:
    folder, pattern, package = DOC_SOURCES[name]
    files = sorted(p for p in Path(folder).glob(pattern) if p.is_file())
    if not files:
        raise BertkitError(f"{name}: no documentation sources in {folder}; install them with "
                           f"`apt-get install {package}`")
    return files


def rest_documents(files: Iterable[Path]) -> Iterator[Document]:
    """One document per reST file (plain or .gz): its prose, in sentences."""
    def texts():
        for path in files:
            if path.suffix == ".gz":
                try:
                    yield gzip.decompress(read_bytes(path)).decode("utf-8")
                except (OSError, EOFError, UnicodeDecodeError) as e:
                    raise BertkitError(f"{path}: not gzip-compressed UTF-8 text ({e})") from None
            else:
                yield read_text_file(path)
    return (sentences for sentences in map_texts(_rest_sentences, texts()) if len(sentences) >= 2)


def _rest_sentences(text: str) -> list[str]:
    from .restructured_text import rest_paragraphs
    return split_sentences("\n".join(rest_paragraphs(text)))


_QUOTED = re.compile(r'"([^"]+)"')


def wordnet_documents() -> Iterator[Document]:
    """WordNet 3.0's synsets, one document each: its words and definition as one sentence
    ("ice cream, icecream: frozen dessert containing cream and sugar and flavoring."), then each
    usage example ("the awful war"). Everyday English with its synonyms side by side: 117,659
    synsets, 1.75 M words."""
    from ..data.wordnet_attributes import wordnet_file, wordnet_synset
    folder = wordnet_file().parent
    for pos in ("adj", "adv", "noun", "verb"):
        for line in read_text(folder / f"data.{pos}").split("\n"):  # a bad byte is named with its line
            if line.startswith(" ") or " | " not in line:  # the licence header
                continue
            words, _ = wordnet_synset(line)
            gloss = line.split(" | ", 1)[1].strip()
            cut = gloss.find('"')
            definition = (gloss if cut < 0 else gloss[:cut]).strip().rstrip(";").strip()
            examples = _QUOTED.findall(gloss[cut:]) if cut >= 0 else []
            head = ", ".join(dict.fromkeys(w.replace("_", " ") for w in words))
            yield [f"{head}: {definition}.", *(e.strip() for e in examples if e.strip())]


# Debian's dict-gcide: the dictionary (dictzip, which gzip reads) and its index (headword, offset, length)
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
_DICTD_DIGITS = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_PRONUNCIATION = re.compile(r" *\\[^\\]{0,200}\\")  # \Ab*do"men\ (a long headword's wraps)
_BRACKETED = re.compile(r"\[[^\[\]]*\]")       # etymology, [1913 Webster], [Obs.]
_CITATION = re.compile(r"\s*--\s?[A-Z].*")     # "--Shak." to the end of the line
_SENTENCE_END = re.compile(r"(?<=[a-z)][.!?])\s+(?=[A-Z\"])")
_SPACES = re.compile(r"\s+")


def _gcide_files() -> tuple[Path, Path]:
    index = GCIDE.with_name("gcide.index")
    if not (GCIDE.is_file() and index.is_file()):
        raise BertkitError(f"{GCIDE}: GCIDE is not installed; install it with `apt-get install dict-gcide`")
    return GCIDE, index


def _dictd_number(digits: str) -> int:
    n = 0
    for c in digits:
        n = n * 64 + _DICTD_DIGITS[c]
    return n


def _gcide_sentences(entry: str) -> list[str]:
    """One entry's text: its headword line and senses, without pronunciations, etymologies,
    source tags and the authors of its quotations; its paragraphs split at sentence ends."""
    lines = entry.split("\n")
    heads = [i for i, line in enumerate(lines) if line[:1].strip()]
    kept, citing = [], False
    for line in lines[heads[0] if heads else 0:]:  # from the headword (the first entry holds the preface's end)
        if citing and len(line) - len(line.lstrip()) >= 30:  # an author's name wrapped in the right-hand column
            continue
        cut = _CITATION.search(line, 1)
        citing = cut is not None
        kept.append(line[:cut.start()] if cut else line)
    text = _BRACKETED.sub("", _BRACKETED.sub("", "\n".join(kept)))  # twice: [a [b] c]
    text = _PRONUNCIATION.sub("", text).replace("{", "").replace("}", "")  # {Cess}: a cross-reference
    return [s for paragraph in re.split(r"\n\s*\n", text)
            for s in _SENTENCE_END.split(_SPACES.sub(" ", paragraph).strip()) if len(s) > 1]


def gcide_documents() -> Iterator[Document]:
    """The Collaborative International Dictionary of English (Webster's of 1913 with later
    additions), one document per entry: "Abdomen, n. 1. (Anat.) The belly, ...", then its other
    senses and quotations. 126,236 entries, 4.0 M words: definitions in plain English of a
    wider vocabulary than WordNet's, in older prose."""
    dictionary, index = _gcide_files()
    try:
        data = gzip.decompress(read_bytes(dictionary))
    except (OSError, EOFError) as e:
        raise BertkitError(f"{dictionary}: not a dictzip (gzip) file ({e})") from None
    rows = []
    for lineno, line in enumerate(read_text(index).split("\n"), 1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 3 or not set(fields[1] + fields[2]) <= _DICTD_DIGITS.keys():
            raise BertkitError(f"{index}:{lineno}: not a dictd index line (headword, offset, length)")
        rows.append((fields[0], _dictd_number(fields[1]), _dictd_number(fields[2])))
    start = max((o + n for head, o, n in rows if head.startswith("00-")), default=0)  # the database's own notes
    for offset, length in sorted({(o, n) for _, o, n in rows if o >= start}):  # headwords that share an entry once
        # three stray Windows-1252 bytes in Debian's file ("market\x92s") read as U+FFFD, not as an error
        sentences = _gcide_sentences(data[offset:offset + length].decode("utf-8", errors="replace"))
        if sentences:
            yield sentences


BUILT_IN = ("wiki", *DOC_SOURCES, "wordnet", "gcide")  # the corpora named, not read from a path


def _built_in_reader(name: str) -> Callable[[], Iterator[Document]]:
    """The reader of a built-in corpus, once its files are found: a package that is not installed is
    named here, before anything is read."""
    if name == "wiki":
        wiki_dump_path()
        return wiki_documents
    if name in DOC_SOURCES:
        files = _doc_files(name)
        return lambda: rest_documents(files)
    if name == "wordnet":
        from ..data.wordnet_attributes import wordnet_file
        wordnet_file()
        return wordnet_documents
    _gcide_files()
    return gcide_documents


def iter_documents(source: str | Path, per_file: bool = False, per_line: bool = False) -> Iterator[Document]:
    """Stream the documents of `source`: "wiki", "python-docs", "linux-docs", "wordnet", "gcide", a text file, or a
    folder of *.txt files; or several joined by "+" ("wiki+python-docs"), where the documents of
    all but the first are TrainOnly. Documents are separated by blank lines, or with per_file each
    file is one document (its blank lines then only end paragraphs), as for a folder of articles
    or manual pages. Text files are split into sentences, or with per_line each line is one
    (the built-in corpora are always split here)."""
    if str(source) in BUILT_IN:
        return _built_in_reader(str(source))()
    if _is_joined(source):
        first, *added = (iter_documents(part, per_file, per_line) for part in str(source).split("+"))
        return itertools.chain(first, *(map(TrainOnly, docs) for docs in added))
    # Checked here, not lazily, so a bad path fails at the call rather than the first batch.
    return _files_documents(corpus_files(Path(source)), per_file, per_line)


def _is_joined(source: str | Path) -> bool:
    return "+" in str(source) and not Path(source).exists()


def check_corpus_name(source: str | Path) -> None:
    """An empty --corpus (an unset $CORPUS) or an empty part of A+B is refused: as a path it is the
    current folder, and every .txt file under it (twice, for "+") would be trained on."""
    parts = str(source).split("+") if _is_joined(source) else [str(source)]
    if not str(source).strip():
        raise BertkitError("--corpus is empty; give a .txt file, a folder of them, a task file, wiki, "
                           "python-docs, linux-docs, wordnet or gcide")
    if any(not part.strip() for part in parts):
        raise BertkitError(f"--corpus {str(source)!r}: a source joined by '+' is empty; write A+B with both named")


def check_sentence_per_line(source: str | Path) -> None:
    """--sentence-per-line reads the user's text files: refused, not ignored, for a corpus that is
    built in only (those are always split by bertkit)."""
    parts = str(source).split("+") if _is_joined(source) else [str(source)]
    if all(p in BUILT_IN for p in parts):
        raise BertkitError(f"--sentence-per-line is for text files; corpus {str(source)!r} is built in and "
                           "split into sentences by bertkit")


def corpus_files(path: Path) -> list[Path]:
    """A corpus file, or a folder's .txt files."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise BertkitError(f"{path}: folder holds no .txt files")
        return files
    if not path.exists():
        raise BertkitError(f"{path}: no such file or folder")
    return [path]


def load_documents(source: str | Path) -> list[Document]:
    """All documents of `source`, checked to be usable for next sentence prediction."""
    docs = list(iter_documents(source))
    if not docs:
        raise BertkitError(f"{source}: the corpus is empty (no sentences)")
    if len(docs) < 2:
        raise BertkitError(f"{source}: next sentence prediction needs at least two documents, "
                           f"found {len(docs)} (separate documents with a blank line)")
    return docs


def corpus_stats(docs: Iterable[Document]) -> dict[str, int]:
    stats = {"documents": 0, "sentences": 0, "words": 0, "characters": 0}
    for doc in docs:
        stats["documents"] += 1
        stats["sentences"] += len(doc)
        stats["words"] += sum(len(s.split()) for s in doc)
        stats["characters"] += sum(len(s) for s in doc)
    return stats


_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1$")
_BULLET = re.compile(r"^[*#:;]+\s*")
# Image residue: "thumb|", "upright|", "220px"; a line naming an image file is a caption.
_IMAGE = re.compile(r"\b(?:thumb(?:nail)?|upright|frame|left|right|center)\s*\||\b\d+(?:x\d+)?px(?![a-z])")
_CAPTION = re.compile(r"alt=|\.(?:jpe?g|png|gif|svg|tiff?)\b", re.IGNORECASE)
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]*\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)])")
_PROSE_END = re.compile(r"[.!?:;][\"'”’)]*$")


def _clean_article(text: str) -> list[str]:
    """Prose paragraphs of an article after filter_wiki, one per line."""
    text = html.unescape(text).replace("\xa0", " ")
    text = text.replace("'''", "").replace("''", "")  # bold and italic quotes
    paragraphs, skipping = [], False
    for line in text.split("\n"):
        line = line.strip()
        heading = _HEADING.match(line)
        if heading:  # headings are not sentences; reference sections are not prose
            skipping = heading[2].lower() in _SKIP_SECTIONS
            continue
        if skipping or line.startswith(("|", "!", "{|")):  # table residue
            continue
        bullet = _BULLET.match(line)
        line = line[bullet.end():] if bullet else line
        if _CAPTION.search(line):
            continue
        line = _IMAGE.sub("", line).replace("|thumb", "")
        for bracket in "[]{}|":  # leftovers of templates, links and tables
            line = line.replace(bracket, " ")
        line = _EMPTY_PARENS.sub("", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(line.split()))
        # Prose ends a sentence; captions, table cells and list items of names do not.
        words = len(line.split())
        if _PROSE_END.search(line) and words >= (5 if bullet else 3):
            paragraphs.append(line)
    return paragraphs


def wiki_dump_path() -> Path:
    spec = importlib.util.find_spec("gensim")
    path = Path(spec.origin).parent / WIKI_SAMPLE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise BertkitError("wiki: the Wikipedia sample ships with gensim; install it with `pip install gensim`")
    return path


def wiki_documents() -> Iterator[Document]:
    """The English Wikipedia sample shipped with gensim: one document per article."""
    def articles():
        from gensim.corpora.wikicorpus import extract_pages
        with bz2.open(wiki_dump_path()) as f:
            # Namespace "0" is articles: drops Wikipedia:, Template:, Category:, File: pages.
            for _title, raw, _pageid in extract_pages(f, filter_namespaces=("0",)):
                if raw.strip() and not raw.lstrip().upper().startswith("#REDIRECT"):
                    yield raw
    return (sentences for sentences in map_texts(wiki_article_sentences, articles()) if sentences)


def wiki_article_sentences(raw: str) -> list[str]:
    from gensim.corpora.wikicorpus import filter_wiki
    sentences = split_sentences("\n".join(_clean_article(filter_wiki(raw))))
    # Lone quotes, brackets and years split off by pysbd carry nothing to learn.
    return [s for s in sentences if any(c.isalpha() for c in s)]

