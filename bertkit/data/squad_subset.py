"""squad-subset: 434 SQuAD v1.1 questions over 9 Wikipedia articles, shipped inside bertkit
(squad-subset.json beside this file, CC BY-SA 4.0), split by article."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BertkitError
from ..inputs import read_text
from .common import SEED, Built, split_groups

SQUAD_FILE = "squad-subset.json"  # beside this file (package data), see README.md here


def squad_subset_file() -> Path:
    """The SQuAD subset that ships inside bertkit (CC BY-SA 4.0, see bertkit/data/README.md)."""
    path = Path(__file__).resolve().parent / SQUAD_FILE
    if not path.is_file():
        raise BertkitError(f"{path}: missing from the installed bertkit package (its package data); "
                           "reinstall bertkit")
    return path





SQUAD_SPLIT = {"train": 0.8, "eval": 0.2}


def _questions(article: dict) -> int:
    return sum(len(p["qas"]) for p in article["paragraphs"])


def build() -> Built:
    path = squad_subset_file()
    try:
        data = json.loads(read_text(path))
        articles = data["data"]
        total = sum(_questions(a) for a in articles)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise BertkitError(f"{path}: not SQuAD v1.1 JSON ({e})") from None
    # eval is cut first: it takes several small articles rather than one large one
    cut = split_groups(articles, dict(reversed(SQUAD_SPLIT.items())), key=lambda a: a["title"], size=_questions)
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
    source = f"bertkit/data/{SQUAD_FILE} (inside the bertkit package; ExpMRC's subset of the SQuAD 1.1 dev set)"
    return Built(files, counts, [], source, notes)
