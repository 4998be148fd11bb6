"""Writing a file whole or not at all, readable as any file the user makes; a file's digest."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

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
