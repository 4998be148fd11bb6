"""wordnet-definitions: a WordNet 3.0 gloss -> one of its synset's words ("a domesticated
carnivorous mammal ..." -> "dog"), split as Hill et al. 2016 built their reverse-dictionary
tests: held-out definitions of words that train ("seen"), and definitions of words that are never
a training target ("unseen"); with the candidate vocabulary, every one-word lemma."""
from __future__ import annotations

import random

from ..inputs import read_text
from .common import SEED, Built, jsonl
from .wordnet_attributes import _TARGET_WORD, wordnet_dir, wordnet_file, wordnet_synset

PARTS = ("noun", "verb", "adj", "adv")
HELD_OUT = 500  # definitions in each test split, as Hill et al.'s


def gloss(line: str) -> str:
    """A synset line's definition: its gloss without the quoted usage examples that follow it."""
    text = line.split(" | ", 1)[1].strip() if " | " in line else ""
    return text.split('; "', 1)[0].split(' "', 1)[0].strip().rstrip(";").strip()


def definition_pairs() -> list[dict]:
    """Every (definition, one-word lowercase lemma) pair of WordNet, in file order, once each."""
    wordnet_file()  # names the install command when WordNet is missing
    seen: dict[tuple[str, str], None] = {}
    for part in PARTS:
        for line in read_text(wordnet_dir() / f"data.{part}").split("\n"):
            if not line or line.startswith(" "):  # the licence header lines start with two spaces
                continue
            text = gloss(line)
            if not text:
                continue
            for word in wordnet_synset(line)[0]:
                if _TARGET_WORD.fullmatch(word):
                    seen.setdefault((text, word))
    return [{"text": text, "word": word} for text, word in seen]


def splits(rows: list[dict], held_out: int = HELD_OUT, seed: int = SEED) -> dict[str, list[dict]]:
    """train, eval_seen (definitions held out, their words trained by other definitions) and
    eval_unseen (one definition each of `held_out` words none of whose definitions trains)."""
    rng = random.Random(seed)
    by_word: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_word.setdefault(r["word"], []).append(i)
    words = sorted(by_word)
    rng.shuffle(words)
    unseen_words = set(words[:held_out])
    unseen = [rows[rng.choice(by_word[w])] for w in sorted(unseen_words)]
    # seen: a definition of a word with two or more, so one still trains
    candidates = [i for w in words[held_out:] if len(by_word[w]) > 1 for i in by_word[w][1:]]
    seen_ids = set(rng.sample(candidates, min(held_out, len(candidates))))
    seen = [rows[i] for i in sorted(seen_ids)]
    train = [r for i, r in enumerate(rows) if i not in seen_ids and r["word"] not in unseen_words]
    return {"train": train, "eval_seen": seen, "eval_unseen": unseen}


def build() -> Built:
    rows = definition_pairs()
    folds = splits(rows)
    vocabulary = sorted({r["word"] for r in rows})
    files = {f"{name}.jsonl": jsonl(fold) for name, fold in folds.items()}
    files["candidates.txt"] = "".join(w + "\n" for w in vocabulary)
    counts = {**{name: len(fold) for name, fold in folds.items()}, "pairs": len(rows),
              "definitions": len({r["text"] for r in rows}), "candidates": len(vocabulary),
              "train_words": len({r["word"] for r in folds["train"]})}
    notes = [
        "Task: word (JSONL rows `{\"text\", \"word\"}`: a definition and a word it defines). A reverse",
        "dictionary ranks every word of `candidates.txt` for each definition.",
        "",
        "## Pairs (WordNet 3.0, `man 5 wndb`)",
        "- Every synset of data.noun, data.verb, data.adj and data.adv: its gloss up to the quoted usage "
        "examples, paired with each of its lemmas that is one lowercase word (no `_`, no capital).",
        f"- {len(rows):,} distinct pairs over {counts['definitions']:,} definitions; "
        f"{len(vocabulary):,} words (`candidates.txt`).",
        "",
        "## Splits",
        f"Seeded (random.Random({SEED})), as Hill et al. (2016) built their WordNet tests; the published",
        "test sets themselves are another sample of the same construction.",
        f"- `eval_unseen`: {HELD_OUT} words drawn at random; one definition of each is tested, and no definition",
        "  of any of them is in train: these words are never a training target.",
        f"- `eval_seen`: {HELD_OUT} definitions held out of train, each of a word that keeps another definition in",
        "  train.",
        "",
        "| file | pairs |",
        "|---|---|",
        *(f"| {name}.jsonl | {len(fold):,} |" for name, fold in folds.items()),
    ]
    return Built(files, counts, [], "WordNet 3.0 (Debian wordnet-base), files data.noun, data.verb, data.adj, "
                 "data.adv", notes)
