"""wordnet-attributes: adjective -> attribute noun pairs (large -> size) from WordNet 3.0
(Debian's wordnet-base), in folds that measure generalisation."""
from __future__ import annotations

import os
import random
import re
from collections import Counter
from pathlib import Path

from ..errors import BertkitError
from ..inputs import read_text
from .common import SEED, Built, jsonl


def wordnet_dir() -> Path:
    # WNSEARCHDIR is WordNet's own variable for where its database lives.
    return Path(os.environ.get("WNSEARCHDIR", "/usr/share/wordnet"))


def wordnet_file() -> Path:
    path = wordnet_dir() / "data.adj"
    if not (path.is_file() and path.with_name("data.noun").is_file()):
        raise BertkitError(f"{path}: WordNet 3.0 is not installed; it ships this data set: "
                           "apt-get install -y wordnet-base (or set WNSEARCHDIR to a WordNet dict folder)")
    return path




_TARGET_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")
WORDNET_UNSEEN = 0.10  # share of pairs whose attribute is held out of training entirely
WORDNET_SEEN = 0.10    # share of pairs held out by adjective only


def wordnet_synset(line: str) -> tuple[list[str], list[tuple[str, str, str]]]:
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
    adj_path = wordnet_file()
    noun_path = adj_path.with_name("data.noun")
    adjectives = {}
    for line in read_text(adj_path).split("\n"):
        if line and not line.startswith(" "):  # the licence header lines start with two spaces
            adjectives[line[:8]] = wordnet_synset(line)
    stats = Counter()
    direct: dict[tuple[str, str], None] = {}  # dicts as ordered sets: the output order is the file's
    similar: dict[tuple[str, str], None] = {}
    with open(noun_path, "rb") as nouns:
        for words, pointers in adjectives.values():
            for symbol, target, _pos in pointers:
                if symbol != "=":
                    continue
                nouns.seek(int(target))  # a synset's offset is its byte offset in data.noun
                noun_words, _ = wordnet_synset(nouns.readline().decode("utf-8"))
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


def build() -> Built:
    rows, stats = wordnet_attribute_pairs()
    folds = _wordnet_folds(rows)
    dropped = folds.pop("dropped")
    files = {f"{name}.jsonl": jsonl(fold) for name, fold in folds.items()}
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
    return Built(files, counts, [], "WordNet 3.0 (Debian wordnet-base), files data.adj and data.noun", notes)
