"""aclsum: ACL papers with human extractive highlights, from the aclsum package."""
from __future__ import annotations

from pathlib import Path

from ..errors import BertkitError
from ..inputs import jsonl_rows
from .common import Built, jsonl, package_file, package_source

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


def build() -> Built:
    docs = {}
    for ours, theirs in ACLSUM_SPLITS.items():
        path = package_file("aclsum", "0.1.2", f"dataset/{theirs}.jsonl")
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
    return Built({f"{name}.jsonl": jsonl(rows) for name, rows in docs.items()}, counts, [0, 1],
                  package_source("aclsum", "dataset/{train,val,test}.jsonl"), notes)
