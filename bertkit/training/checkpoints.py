"""Durable checkpoints: OUT/checkpoints/step_NNNNNNN/ holds the model folder, trainer.pt
(optimizer, scheduler, every rank's RNG) and trainer.json (where the run stood, its options,
and each file's size and SHA-256). Written to a temporary folder, every file and the folder
flushed to disk, renamed, and only then are older checkpoints dropped; a damaged checkpoint is
recognised when it is loaded, and the one before it used."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from ..files import sha256
from .log import write_json


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(out: Path, step: int, write_model: Callable[[Path], None], tensors: dict, state: dict,
                    keep: int) -> Path:
    """write_model(folder) writes the model files; `tensors` (optimizer state, RNG ...) go to
    trainer.pt and `state` (JSON) to trainer.json. Keeps the newest `keep` checkpoints."""
    root = out / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f".step_{step:07d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_model(tmp)
        torch.save(tensors, tmp / "trainer.pt")
        # every file, in subfolders too (ELECTRA's generator/), by its path inside the checkpoint
        written = sorted(f for f in tmp.rglob("*") if f.is_file())
        files = {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size, "sha256": sha256(f)} for f in written}
        write_json(tmp / "trainer.json", {"step": step, **state, "files": files})
        for f in sorted(tmp.rglob("*"), reverse=True):  # files, then the folders that hold them
            _fsync(f)
        _fsync(tmp)
    except BaseException:  # a full disk, a kill signal's exception: no half-written folder left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    kept = _by_step(root)
    for old in kept[:-keep]:
        shutil.rmtree(old)
    return final


def _by_step(root: Path) -> list[Path]:
    """The checkpoint folders, oldest first: by their step's number (past 9,999,999 steps the
    names no longer sort as the numbers do)."""
    folders = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(folders, key=lambda p: int(p.name[5:]))


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why a checkpoint cannot be used (missing or damaged file), or None if it is whole."""
    try:
        state = json.loads((ckpt / "trainer.json").read_text())
    except (OSError, ValueError) as e:
        return f"trainer.json unreadable ({e})"
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict) or not all(isinstance(w, dict) and {"bytes", "sha256"} <= w.keys()
                                              for w in files.values()):
        return "trainer.json does not list the checkpoint's files"
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"trainer.json's step is not a count of steps ({step!r})"
    for name, want in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, {want['bytes']} were written"
        if sha256(f) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def latest_checkpoint(out: Path, log=lambda msg: None) -> Path | None:
    """The newest whole checkpoint; a damaged one is reported and the one before it used."""
    candidates = _by_step(out / "checkpoints")[::-1]
    for ckpt in candidates:
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt
        log(f"checkpoint {ckpt} is damaged: {problem}; trying the one before it")
    return None


def has_checkpoint(out: Path) -> bool:
    return any((out / "checkpoints").glob("step_*/trainer.json"))


def read_state(ckpt: Path) -> tuple[dict, dict]:
    """(trainer.json, trainer.pt) of a checkpoint."""
    return json.loads((ckpt / "trainer.json").read_text()), torch.load(ckpt / "trainer.pt", weights_only=True)


def restore_rng(tensors: dict, rank: int, device) -> None:
    """This rank's RNG as it was: dropout continues exactly where it stopped."""
    torch.set_rng_state(tensors["torch_rng"][rank])
    if tensors.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda_rng"][rank], device)
