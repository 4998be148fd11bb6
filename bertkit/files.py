"""Writing a file whole or not at all, readable as any file the user makes; a file's digest; the
weight files of a model folder (without torch: the ONNX path reads them too)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import BertkitError

# the umask can only be read by setting it: once, at import, before any threads write files
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """write(tmp) into a temporary file beside `path`, then rename it over `path`: a reader
    never sees half a file, and an interrupted write leaves the old one. mkstemp creates the
    file for its owner only (0600); the rename would carry that to a model folder that other
    users and containers read, so the file gets the mode a plain open() would give it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256(path: Path) -> str:
    """The file's SHA-256, read a MiB at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint, as transformers saves a large model


def read_shard_index(folder: Path) -> dict[str, list[str]]:
    """A sharded checkpoint's index: shard file name -> the tensors it holds, checked: each
    shard a plain file name in the folder (an index naming ../x is not followed), each one there."""
    path = folder / WEIGHTS_INDEX
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise BertkitError(f"{path}: not a safetensors index (a JSON object with a 'weight_map' of "
                           "tensor name -> shard file)") from None
    shards: dict[str, list[str]] = {}
    for tensor, name in weight_map.items():
        if Path(name).name != name or not name.endswith(".safetensors"):
            raise BertkitError(f"{path}: tensor {tensor!r} is mapped to {name!r}, not a .safetensors file "
                               "in this folder")
        shards.setdefault(name, []).append(tensor)
    if missing := [n for n in shards if not (folder / n).is_file()]:
        raise BertkitError(f"{path}: names shard {missing[0]!r}, which is not in the folder")
    return shards


def weight_files(folder: str | Path) -> list[str]:
    """The names of the folder's weight files: model.safetensors, or the index and its shards."""
    folder = Path(folder)
    if (folder / WEIGHTS).is_file() or not (folder / WEIGHTS_INDEX).is_file():
        return [WEIGHTS]
    return [WEIGHTS_INDEX, *sorted(read_shard_index(folder))]


def weights_path(folder: str | Path) -> Path:
    """The file that errors about the weights name: model.safetensors or the shards' index."""
    return Path(folder) / weight_files(folder)[0]
