"""Checking where a command will write before it does any work.

Every command that writes a folder (`finetune --out`, `data export --out`, `tokenizer train
--out`) refuses a folder that already holds anything unless `--overwrite` is given, and every
command that writes (those and `encode --output`) checks first that it can write there: a path
under /proc, a read-only mount, or a path whose parent is a file fails in one line before the
work starts, not after it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import BertkitError


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path, option: str, target: Path) -> None:
    """Create and remove a temporary folder in `folder`: the only sure test of writing there
    (os.access says yes to root under /proc and on read-only mounts)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".bertkit-write-test-"))
    except OSError as e:
        raise BertkitError(f"{option} {target}: cannot write in {folder} ({e.strerror or e})") from None


def _where_to_create(path: Path, option: str) -> Path:
    """For a path that does not exist yet: the existing folder it will be created in."""
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise BertkitError(f"{option} {path}: {anchor} is a file, not a folder, so nothing can be created under it")
    return anchor


def check_output_folder(path: str | Path, overwrite: bool = False, option: str = "--out") -> Path:
    """A folder the command may write into: new, empty, or (with overwrite) anything; writable."""
    path = Path(path)
    if path.is_symlink() and not path.exists():  # mkdir would raise FileExistsError on the link
        raise BertkitError(f"{option} {path}: a link to {os.readlink(path)}, which does not exist; "
                           "remove the link or make the folder it names")
    if path.exists():
        if not path.is_dir():
            raise BertkitError(f"{option} {path}: exists and is not a folder")
        try:
            held = sorted(p.name for p in path.iterdir())
        except OSError as e:
            raise BertkitError(f"{option} {path}: cannot list the folder ({e.strerror or e})") from None
        if held and not overwrite:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            raise BertkitError(f"{option} {path}: the folder is not empty (it already holds {shown}); "
                               "choose a new or empty folder, or pass --overwrite to replace files in it")
        _probe(path, option, path)
    else:
        _probe(_where_to_create(path, option), option, path)
    return path


def check_output_file(path: str | Path, overwrite: bool = False, option: str = "--output") -> Path:
    """A file the command may write: new, or (with overwrite) an existing file; its folder writable."""
    path = Path(path)
    if path.is_dir():
        raise BertkitError(f"{option} {path}: is a folder, expected a file name")
    if path.exists() and not overwrite:
        raise BertkitError(f"{option} {path}: already exists; choose another {option} or pass --overwrite")
    parent = path.parent
    if parent.is_dir():
        _probe(parent, option, path)
    elif parent.exists():
        raise BertkitError(f"{option} {path}: {parent} is a file, not a folder")
    else:
        _probe(_where_to_create(parent, option), option, path)
    return path
