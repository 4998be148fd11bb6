"""`bertkit encode` on a corpus of any size: streamed, resumable, and shared among torchrun's
processes.

The input is scanned once, in constant memory, with every check a small file gets
(inputs.scan_text_inputs). Then it is encoded chunk by chunk (CHUNK_TEXTS texts, or
--chunk-texts; length-sorted within the chunk, as Encoder.encode does), and each chunk's rows go
straight to their place in OUTPUT.partial/vectors.npy. They are written with pwrite, not through
a memory map: on a full disk a write to a mapped page kills the process with SIGBUS, where pwrite
returns ENOSPC; the file's space is reserved up front, so a full disk shows before any work.

Once a chunk's rows are on disk (fdatasync) its number is appended to OUTPUT.partial/done-RANK.
An interrupted run, even by SIGKILL, loses at most the chunks in flight, and --resume encodes
the others: the same chunks in the same batches, so the file ends equal to an uninterrupted
run's. When every chunk is done the file is renamed to OUTPUT: an OUTPUT that exists is whole.

Under torchrun the ranks share the chunks that are left (the i-th to rank i mod N) and write
into the one file, which must sit on a filesystem every node sees. Rank 0 scans the input, makes
the file, and renames it at the end. The chunks done are counted over every done-* file, so a
run may resume in another number of processes.
"""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import threading
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BertkitError, Interrupted, check_int
from ..files import folder_digest
from ..inputs import InputScan, read_chunk, scan_text_inputs
from .encode import CHUNK_TEXTS, POOLINGS

if TYPE_CHECKING:
    from ..training.distributed import Processes
    from .encode import Encoder

DTYPES = ("float32", "float16")


@dataclass
class EncodeOptions:
    """What shapes the vectors: a resumed run must ask for the same as the run it continues."""
    model: str
    pooling: str
    normalize: bool
    max_len: int | None
    truncation: bool
    batch_size: int
    dtype: str
    backend: str
    precision: str


def _option(key: str, value) -> str:
    """An option as the flag that sets it, for the resume refusal."""
    if key == "truncation":
        return "truncation" if value else "--no-truncation"
    if key == "normalize":
        return "--normalize" if value else "--no-normalize"
    if key == "max_len" and value is None:
        return "the default --max-len"
    return f"--{key.replace('_', '-')} {value}"


def partial_folder(output: Path) -> Path:
    """Where an unfinished OUTPUT lives: OUTPUT.partial/ (vectors.npy, run.json, done-RANK)."""
    return output.with_name(output.name + ".partial")


def done_chunks(folder: Path) -> set[int]:
    """The chunks whose rows are on disk, over every rank's done file of every launch (a line
    torn by a kill is not counted: its chunk is encoded again)."""
    done = set()
    for path in folder.glob("done-*"):
        for line in path.read_bytes().split(b"\n")[:-1]:  # the last piece has no newline: torn or empty
            if line.isdigit():
                done.add(int(line))
    return done


def _header(rows: int, hidden: int, dtype: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (rows, hidden)})
    return buf.getvalue()


def _create_vectors(path: Path, rows: int, hidden: int, dtype: str) -> None:
    """An .npy file of rows x hidden with its space reserved: a disk too small fails here."""
    header = _header(rows, hidden, dtype)
    size = len(header) + rows * hidden * np.dtype(dtype).itemsize
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, header)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without it: grown as written
                raise
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Plan:
    """What rank 0 prepared, handed to every rank: the input's scan, the file and the chunks left."""
    scan: InputScan
    folder: Path
    header: int
    hidden: int
    dtype: str
    todo: list[int]
    fresh: bool  # made by this run, not resumed


class WriteError(BertkitError):
    """The disk refused a write: what was written before it stays."""


def _write_error(path: Path, e: OSError, kept: bool) -> BertkitError:
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    what = "no space left on device" if full else f"cannot write ({e.strerror or e})"
    then = ("the chunks written before it are kept: free space, then --resume continues" if kept
            else "nothing was written there")
    return WriteError(f"{what} while writing {path}; {then}")


def prepare(input: str | Path, output: Path, options: EncodeOptions, hidden: int, resume: bool,
            overwrite: bool, chunk: int | None = None) -> Plan:
    """Rank 0: scan the input and make OUTPUT.partial, or check the one to resume. chunk: texts
    per chunk (None: CHUNK_TEXTS, or on --resume the size the run began with)."""
    folder = partial_folder(output)
    record = folder / "run.json"
    chunk_rows = chunk or CHUNK_TEXTS
    if chunk is None and resume and record.is_file():  # a run of an earlier default size resumes as it began
        try:
            recorded = int(json.loads(record.read_text())["chunk_rows"])
            chunk_rows = recorded if recorded >= 1 else chunk_rows
        except (OSError, ValueError, KeyError, TypeError):
            pass  # _check_same_run says what is wrong with the record
    if folder.exists() and not resume and not overwrite:
        try:
            before = json.loads(record.read_text())
            rows, size = before["rows"], before["chunk_rows"]
            held = f" ({sum(min(size, rows - c * size) for c in done_chunks(folder))} of {rows} texts encoded)"
        except (OSError, ValueError, KeyError, TypeError):
            held = ""
        raise BertkitError(f"{folder} holds an interrupted encode{held}: --resume continues it, "
                           "--overwrite starts over")
    vectors = folder / "vectors.npy"
    if Path(input).is_file():
        scan = scan_text_inputs(input, chunk_rows)
    else:  # a pipe or /dev/stdin is read once: its texts are read back, chunk by chunk, from a copy
        if resume:
            raise BertkitError(f"--resume: {input} is not a regular file; a resumed run must read the file it began with")
        scan = _spooled(Path(input), folder, chunk_rows)
    run = {"input": str(Path(input).resolve()), "sha256": scan.digest, "rows": scan.rows, "hidden": hidden,
           "chunk_rows": chunk_rows, "options": asdict(options), "model_sha256": folder_digest(options.model)}
    resumed = resume and record.is_file()
    if resumed:
        _check_same_run(folder, json.loads(record.read_text()), run)
        if not vectors.is_file() or vectors.stat().st_size != len(_header(scan.rows, hidden, options.dtype)) + \
                scan.rows * hidden * np.dtype(options.dtype).itemsize:
            raise BertkitError(f"--resume: {vectors} is missing or not of the size the run began with: "
                               "--overwrite starts over")
    else:
        if resume:
            print(f"bertkit: --resume: no interrupted encode at {folder}; starting from the first text", flush=True)
        if folder.exists() and scan.path.parent != folder:
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            _create_vectors(vectors, scan.rows, hidden, options.dtype)
        except OSError as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise _write_error(output, e, kept=False) from None
        (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    done = done_chunks(folder)
    return Plan(scan, folder, len(_header(scan.rows, hidden, options.dtype)), hidden, options.dtype,
                [c for c in range(scan.chunks) if c not in done], fresh=not resumed)


def _spooled(source: Path, folder: Path, chunk_rows: int) -> InputScan:
    """A pipe's bytes copied into the (new) partial folder, then scanned under the pipe's name."""
    from ..inputs import open_binary
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    copy = folder / f"input{source.suffix}"
    try:
        with open_binary(source) as f, open(copy, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        return scan_text_inputs(copy, chunk_rows, name=source)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _check_same_run(folder: Path, before: dict, now: dict) -> None:
    start_over = "give the same input and options, or --overwrite to start over"
    if before.get("sha256") != now["sha256"] or before.get("rows") != now["rows"]:
        raise BertkitError(f"--resume: the input differs from the one {folder} was begun with ({before.get('input')}, "
                           f"{before.get('rows')} texts; its bytes differ): {start_over}")
    old = before.get("options", {})
    for key, value in now["options"].items():
        if old.get(key) != value:
            raise BertkitError(f"--resume: {folder} was begun with {_option(key, old.get(key))}, this run asks for "
                               f"{_option(key, value)}: {start_over}")
    if before.get("chunk_rows") != now["chunk_rows"]:
        raise BertkitError(f"--resume: {folder} was begun with --chunk-texts {before.get('chunk_rows')}, this run "
                           f"asks for --chunk-texts {now['chunk_rows']}: {start_over}")
    if before.get("model_sha256", now["model_sha256"]) != now["model_sha256"]:
        raise BertkitError(f"--resume: the model at {now['options']['model']} is not the one {folder} was begun "
                           f"with (its weights, config or vocabulary differ): {start_over}")
    if before.get("hidden") != now["hidden"]:
        raise BertkitError(f"--resume: {folder} was begun with another model shape: {start_over}")


class Stop:
    """SIGTERM as an exception between writes, as Ctrl-C is: the chunks on disk are kept either way."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Interrupted("stopped by SIGTERM", signal.SIGTERM)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def encode_chunks(encoder: Encoder, plan: Plan, options: EncodeOptions, rank: int = 0, world: int = 1,
                  progress: bool = True) -> tuple[int, int | None]:
    """This rank's share of the chunks left, each written and recorded as it completes. Returns
    how many texts were truncated, and the line of the first."""
    from ..training.log import progress_bar

    scan, mine = plan.scan, plan.todo[rank::world]
    row_bytes = plan.hidden * np.dtype(plan.dtype).itemsize
    truncated, first_cut = 0, None
    fd = os.open(plan.folder / "vectors.npy", os.O_WRONLY)
    log = open(plan.folder / f"done-{rank}", "ab")
    bar = progress_bar(progress, total=sum(map(scan.chunk_size, mine)), unit=" texts", desc="encode" if world == 1 else
                       f"encode (rank 0 of {world})", smoothing=0.1)
    try:
        for c in mine:
            first = c * scan.chunk_rows
            inputs = read_chunk(scan, c)
            where = lambda i, first=first: f"{scan.name}, line {first + i + 1}"  # noqa: E731
            cut: list[int] = []
            # a text with no tokens is refused by line (and field, where the rows are pairs) from the
            # chunk's own encodings
            vectors = encoder.encode_chunk(inputs.texts, inputs.pairs, options.pooling, options.batch_size,
                                           options.max_len, options.truncation, options.normalize, where, cut,
                                           refuse_tokenless=True)
            bad = np.flatnonzero(~np.isfinite(vectors).all(1))
            if bad.size:  # broken weights or config: never written as results
                raise BertkitError(f"{bad.size} of {len(vectors)} output row(s) are not finite (NaN or inf; first: "
                                   f"{scan.name}, line {first + bad[0] + 1}): the model's weights or config.json "
                                   "are broken")
            if cut:
                truncated += len(cut)
                first_cut = min(first_cut or first + cut[0] + 1, first + cut[0] + 1)
            data = vectors.astype(plan.dtype, copy=False).tobytes()
            try:
                written, at = 0, plan.header + first * row_bytes
                while written < len(data):
                    written += os.pwrite(fd, data[written:], at + written)
                os.fdatasync(fd)
                log.write(f"{c}\n".encode())
                log.flush()
                os.fsync(log.fileno())
            except OSError as e:
                raise _write_error(plan.folder / "vectors.npy", e, kept=True) from None
            bar.update(len(vectors))
    finally:
        bar.close()
        log.close()
        os.close(fd)
    return truncated, first_cut


def run_chunks(encoder: Encoder, plan: Plan, options: EncodeOptions, rank: int = 0, world: int = 1,
               progress: bool = True) -> tuple[int, int | None]:
    """encode_chunks with its stops: Ctrl-C and SIGTERM keep the chunks done and say how to go on.
    A bad line (a text too long without truncation, one without tokens) leaves nothing of a fresh
    run behind: the input must change before the run can finish. A resumed run's chunks stay."""
    with Stop():
        try:
            return encode_chunks(encoder, plan, options, rank, world, progress)
        except (KeyboardInterrupt, Interrupted) as e:
            raise interrupted(plan, e) from None
        except BertkitError as e:
            if plan.fresh and not isinstance(e, WriteError):
                shutil.rmtree(plan.folder, ignore_errors=True)
            raise


def finish(plan: Plan, output: Path) -> None:
    """Rank 0, after every rank: the file becomes OUTPUT if every chunk is on disk."""
    missing = set(range(plan.scan.chunks)) - done_chunks(plan.folder)
    if missing:
        raise BertkitError(f"{len(missing)} chunk(s) of {plan.folder} were not encoded (a rank stopped): "
                           "--resume encodes them")
    try:
        os.replace(plan.folder / "vectors.npy", output)
        dir_fd = os.open(output.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise _write_error(output, e, kept=True) from None
    shutil.rmtree(plan.folder)


def encode_file(encoder: Encoder, input: str | Path, output: str | Path, pooling: str | None = None,
                batch_size: int = 32, max_len: int | None = None, truncation: bool = True,
                normalize: bool | None = None, dtype: str = "float32", resume: bool = False,
                overwrite: bool = False, progress: bool = True, model: str = "", backend: str = "torch",
                procs: Processes | None = None, chunk: int | None = None) -> int:
    """Vectors of every text of a .txt or .jsonl file, row i for line i, into the .npy `output`.
    procs (training.distributed.init_processes under torchrun): the ranks share the chunks and
    rank 0 writes OUTPUT. model, backend: recorded, so that a resumed run must name the same.
    chunk: texts sorted by length together (None: CHUNK_TEXTS, or a resumed run's own size).
    Returns the number of rows."""
    from ..outputs import check_output_file
    output = check_output_file(output, overwrite)
    options = EncodeOptions(model, pooling or encoder.default_pooling,
                            encoder.default_normalize if normalize is None else normalize,
                            max_len, truncation, batch_size, dtype, backend, encoder.precision)
    check_options(options)
    if chunk is not None:
        check_int(chunk, "chunk")
    rank, world = (procs.rank, procs.world) if procs else (0, 1)
    plan = None
    if rank == 0:
        try:
            plan = prepare(input, output, options, encoder.hidden_size, resume, overwrite, chunk)
        except BertkitError as e:
            if procs:
                procs.broadcast(str(e))
            raise
    if procs:
        plan = procs.broadcast(plan)
        if isinstance(plan, str):  # rank 0 refused the input or the output, and says why
            raise SystemExit(2)
    # a bar for a corpus, not for a few texts (one chunk: seconds)
    truncated, first_cut = run_chunks(encoder, plan, options, rank, world, progress and rank == 0 and plan.scan.chunks > 1)
    if procs:  # every rank's chunks are on disk before rank 0 renames the file
        with Stop():
            try:
                procs.barrier(long=True)
                counts = procs.gather((truncated, first_cut))
            except (KeyboardInterrupt, Interrupted) as e:
                raise interrupted(plan, e) from None
            except RuntimeError as e:
                raise BertkitError(f"rank {rank} of {world}: lost the other processes ({str(e).splitlines()[0][:160]}); "
                                   f"a rank or node stopped. The chunks done are kept in {plan.folder}: "
                                   "--resume encodes the rest (in as many processes, or another count)") from None
            truncated = sum(n for n, _ in counts)
            first_cut = min((line for _, line in counts if line), default=None)
    if rank == 0:
        warn_truncated(truncated, first_cut, plan.scan, encoder.tokens_per_text(max_len))
        finish(plan, output)
    return plan.scan.rows


def check_options(options: EncodeOptions) -> None:
    if options.pooling not in POOLINGS:
        raise BertkitError(f"unknown pooling {options.pooling!r}; choose one of {', '.join(POOLINGS)}")
    if options.dtype not in DTYPES:
        raise BertkitError(f"unknown dtype {options.dtype!r}; choose one of {', '.join(DTYPES)}")


def interrupted(plan: Plan, e: BaseException) -> Interrupted:
    """One line for a stopped run: what is kept, and how to continue."""
    signum = e.exit_code - 128 if isinstance(e, Interrupted) else signal.SIGINT
    rows = sum(map(plan.scan.chunk_size, done_chunks(plan.folder)))
    return Interrupted(f"stopped by {signal.Signals(signum).name}; {rows} of {plan.scan.rows} texts are kept in "
                       f"{plan.folder}: rerun with --resume to continue", signum)


def warn_truncated(truncated: int, first_line: int | None, scan: InputScan, max_len: int) -> None:
    """One warning for the whole file (resumed runs count the texts of their own chunks)."""
    if truncated:
        warnings.warn(f"{truncated} of {scan.rows} text(s) longer than {max_len} tokens were truncated "
                      f"(first: {scan.name}, line {first_line})", stacklevel=2)
