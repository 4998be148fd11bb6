"""Writing a file whole or not at all, readable as any file the user makes; a file's digest; the
weight files of a model folder (without torch: the ONNX path reads them too)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


def write_file(path: str | Path, content: str | bytes) -> None:
    """A file written whole (atomic_write): a link at `path` is replaced by the file, never
    written through, so nothing outside the folder being written changes."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(data))


def copy_into(src: Path, dst: Path) -> None:
    """A file or a folder's files copied to `dst` as write_file writes: links there replaced."""
    if src.is_dir():
        Path(dst).mkdir(exist_ok=True)
        for f in src.iterdir():
            copy_into(f, Path(dst) / f.name)
    else:
        atomic_write(Path(dst), lambda tmp: shutil.copy2(src, tmp))


@contextmanager
def output_lock(path: str | Path, holder: str, flag: str = "--out") -> Iterator[None]:
    """Hold `path` (a run's --out folder, encode's --output file) for one process while it writes
    there: a second bertkit process given the same path is refused by name. Two fine-tunes into one
    --out both ended 'saved' with the second's model and their metrics interleaved; a second
    pretraining crashed on the first's shards. The lock is a file beside the path, `.NAME.lock`,
    held with flock (released by the kernel if the process dies) and removed at the end."""
    path = Path(path)
    lock = path.parent / f".{path.name}.lock"
    while True:
        try:  # a parent that does not exist yet is made by the command itself, after its checks
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # no lock can be made there: the command's own checks say what is wrong
            fd = None
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 200).decode("utf-8", "replace").strip() or "another bertkit process"
            os.close(fd)
            raise BertkitError(f"{path} is being written by another bertkit process ({other}); wait for it "
                               f"to end, or choose another {flag}") from None
        try:  # the holder before us may have removed the file after we opened it: lock the one at the path
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.write(fd, f"{holder}, process {os.getpid()}".encode())
    try:
        yield
    finally:
        if fd is not None:
            try:
                os.unlink(lock)
            except OSError:
                pass
            os.close(fd)


def sha256(path: Path) -> str:
    """The file's SHA-256, read a MiB at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


MODEL_SUFFIXES = (".safetensors", ".onnx", ".json", ".txt")  # weights, ONNX graphs, config and vocabulary


def folder_digest(folder: str | Path) -> str:
    """One SHA-256 over a model folder's files that shape its outputs (its weights, ONNX graphs,
    config and vocabulary, by name): a run resumed on other weights at the same path is told apart."""
    h = hashlib.sha256()
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and f.suffix in MODEL_SUFFIXES and not f.name.startswith("."):
            h.update(f"{f.name}\0{sha256(f)}\0".encode())
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
