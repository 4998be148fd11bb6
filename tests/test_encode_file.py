"""`bertkit encode` on a file: streamed chunk by chunk into OUTPUT.partial, resumable after any
stop, and shared among torchrun's processes, always equal to Encoder.encode on the same texts."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import one_thread, torchrun

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.inference.encode import Encoder
from bertkit.inference.encode_file import done_chunks, encode_file, partial_folder
from bertkit.inputs import read_chunk, read_text_inputs, scan_text_inputs

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
BATCH = 4
CHUNK = 128  # --chunk-texts: the 700 sentences below are 6 chunks (the default, 4,096, would make one)


@pytest.fixture(scope="module")
def sentences(tmp_path_factory, wiki_excerpt):
    """700 real Wikipedia sentences, one per line."""
    lines = [line for line in wiki_excerpt.read_text().splitlines() if line.strip()][:700]
    assert len(lines) == 700
    path = tmp_path_factory.mktemp("texts") / "sentences.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def reference(tiny_bert, sentences):
    """The in-memory result: Encoder.encode on every text at once."""
    texts = read_text_inputs(sentences).texts
    return Encoder.from_folder(tiny_bert, device="cpu").encode(texts, batch_size=BATCH, chunk=CHUNK)


def _encode(model, input, output, *extra, chunk=CHUNK):
    """`bertkit encode` in BATCH-text batches; chunk None: no --chunk-texts."""
    return main(["encode", "--model", str(model), "--input", str(input), "--output", str(output),
                 "--batch-size", str(BATCH), *(["--chunk-texts", str(chunk)] if chunk else []), *extra])


def test_the_scan_reads_back_every_line_in_chunks(sentences):
    scan = scan_text_inputs(sentences, 128)
    assert (scan.rows, scan.chunks) == (700, 6)
    texts = [t for c in range(scan.chunks) for t in read_chunk(scan, c).texts]
    assert texts == read_text_inputs(sentences).texts


def test_streamed_output_equals_the_in_memory_result(tmp_path, tiny_bert, sentences, reference, capsys):
    out = tmp_path / "v.npy"
    assert _encode(tiny_bert, sentences, out) == 0
    assert "wrote 700 vectors of size 32" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out), reference)
    assert not partial_folder(out).exists()  # the run's records go once the file is whole
    half = tmp_path / "h.npy"
    assert _encode(tiny_bert, sentences, half, "--dtype", "float16") == 0
    vectors = np.load(half, mmap_mode="r")
    assert vectors.dtype == np.float16 and half.stat().st_size < out.stat().st_size * 0.51
    np.testing.assert_array_equal(vectors, reference.astype(np.float16))


def test_pairs_stream_as_the_library_encodes_them(tmp_path, tiny_bert, sentences):
    texts = read_text_inputs(sentences).texts[:300]
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in zip(texts, texts[::-1])))
    out = tmp_path / "p.npy"
    assert _encode(tiny_bert, rows, out, "--pooling", "mean") == 0
    expected = Encoder.from_folder(tiny_bert, device="cpu").encode(texts, texts[::-1], pooling="mean", batch_size=BATCH,
                                                                   chunk=CHUNK)
    np.testing.assert_array_equal(np.load(out), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_stopped_at_a_random_moment_resumes_to_the_same_file(tmp_path, tiny_bert, sentences, reference,
                                                                   monkeypatch, seed, capsys):
    """Stopped after a random number of chunk writes, sometimes between a chunk's rows and its
    record (as a SIGKILL may): --resume ends with the uninterrupted run's file, in the chunks the
    run began with."""
    import bertkit.inference.encode_file as ef
    rng = random.Random(seed)
    out = tmp_path / "v.npy"
    real = os.fdatasync
    for stop in range(3):  # up to three stops, each after a random number of writes
        left = [rng.randint(1, 3)]

        def flaky(fd):
            left[0] -= 1
            if left[0] == 0:
                raise KeyboardInterrupt
            real(fd)
        monkeypatch.setattr(ef.os, "fdatasync", flaky)
        # the resumes name no --chunk-texts: they take the run's 128, not the default 4,096
        code = _encode(tiny_bert, sentences, out, *(["--resume"] if stop else []), chunk=None if stop else CHUNK)
        err = capsys.readouterr().err
        if code == 0:
            break
        assert code == 130 and "stopped by SIGINT" in err and "rerun with --resume" in err
        assert not out.exists()
    monkeypatch.setattr(ef.os, "fdatasync", real)
    if not out.exists():
        assert _encode(tiny_bert, sentences, out, "--resume") == 0
    np.testing.assert_array_equal(np.load(out), reference)


def test_a_killed_process_resumes_to_the_same_file(tmp_path, tiny_bert, sentences):
    """SIGKILL, SIGTERM and Ctrl-C to a real `bertkit encode` process, at moments that vary, then
    --resume; the texts run in 2-text batches so that a run lasts seconds."""
    out = tmp_path / "v.npy"
    cmd = [sys.executable, "-m", "bertkit", "encode", "--model", str(tiny_bert), "--input", str(sentences),
           "--output", str(out), "--batch-size", "2", "--chunk-texts", "64"]
    straight = tmp_path / "straight.npy"  # the same command, uninterrupted, here on the processes' one thread
    with one_thread():
        assert main([*cmd[3:-6], "--output", str(straight), "--batch-size", "2", "--chunk-texts", "64"]) == 0
    stops = 0
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        folder = partial_folder(out)
        before = len(done_chunks(folder)) if folder.is_dir() else 0
        proc = subprocess.Popen(cmd + (["--resume"] if stops else []), env=ENV, stderr=subprocess.PIPE, text=True)
        t = time.monotonic()  # the signal comes once this run has recorded a chunk of its own
        while time.monotonic() - t < 60 and proc.poll() is None and not (
                folder.is_dir() and len(done_chunks(folder)) > before):
            time.sleep(0.01)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        if proc.returncode == 0:
            break
        stops += 1
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig and f"stopped by {signal.Signals(sig).name}" in err, err[-500:]
        assert not out.exists()
    assert stops >= 1
    if not out.exists():  # else a resumed run finished before its signal came: the file is whole already
        with one_thread():
            assert main([*cmd[3:], "--resume"]) == 0
    np.testing.assert_array_equal(np.load(out), np.load(straight))


def test_an_interrupted_run_is_never_overwritten_or_mixed(tmp_path, tiny_bert, sentences, monkeypatch, capsys):
    import bertkit.inference.encode_file as ef
    out = tmp_path / "v.npy"
    monkeypatch.setattr(ef.os, "fdatasync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _encode(tiny_bert, sentences, out) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert _encode(tiny_bert, sentences, out) == 2  # neither resumed nor restarted unasked
    assert "holds an interrupted encode (0 of 700 texts encoded): --resume continues it" in capsys.readouterr().err
    assert _encode(tiny_bert, sentences, out, "--resume", "--pooling", "mean") == 2
    assert "was begun with --pooling cls, this run asks for --pooling mean" in capsys.readouterr().err
    assert _encode(tiny_bert, sentences, out, "--resume", chunk=256) == 2
    assert "was begun with --chunk-texts 128, this run asks for --chunk-texts 256" in capsys.readouterr().err
    changed = tmp_path / "other.txt"
    changed.write_text(sentences.read_text().replace("the", "a", 1))
    assert _encode(tiny_bert, changed, out, "--resume") == 2
    assert "the input differs from the one" in capsys.readouterr().err
    assert _encode(tiny_bert, sentences, out, "--overwrite") == 0  # starts over
    assert not partial_folder(out).exists()
    assert _encode(tiny_bert, sentences, out) == 2 and "already exists" in capsys.readouterr().err


def test_bad_lines_are_named_and_a_run_that_meets_one_leaves_nothing(tmp_path, tiny_bert, sentences, capsys):
    lines = read_text_inputs(sentences).texts
    out = tmp_path / "v.npy"
    cases = {
        "blank.txt": ("\n".join(lines[:200] + [""] + lines[200:]).encode(), "blank.txt, line 201: blank line (1 in the file)"),
        "latin1.txt": ("\n".join(lines[:300]).encode() + "\ncaf\xe9\n".encode("latin-1"),
                       "latin1.txt: not UTF-8 text: byte 0xe9 at byte offset"),
        "mixed.jsonl": (("".join(json.dumps({"text": t, "text_pair": t}) + "\n" for t in lines[:5])
                         + json.dumps({"text": "alone"}) + "\n").encode(),
                        "some rows have 'text_pair' and some do not (row 6 has none)"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert _encode(tiny_bert, tmp_path / name, out) == 2
        assert message in capsys.readouterr().err
        assert not partial_folder(out).exists()  # found by the scan, before any work
    assert "(line 301)" in str(_scan_error(tmp_path / "latin1.txt"))
    # too long and token-less texts show only when their chunk is tokenized, after chunk 0 was
    # written; the run's partial file goes with it, and no output file is made
    long = tmp_path / "long.txt"
    long.write_text("\n".join(lines[:200] + ["word " * 600] + lines[200:]) + "\n")
    assert _encode(tiny_bert, long, out, "--no-truncation") == 2
    assert "long.txt, line 201 is" in capsys.readouterr().err
    # the input must change before this run can end: nothing of it is left behind
    assert not partial_folder(out).exists() and not out.exists()
    with pytest.warns(UserWarning, match=r"1 of 701 text\(s\) longer than 512 tokens were truncated \(first: .*long"
                                         r"\.txt, line 201\)"):
        assert _encode(tiny_bert, long, out, "--overwrite") == 0
    empty = tmp_path / "zw.txt"
    empty.write_text("\n".join(lines[:140] + ["\u200b"]) + "\n")
    assert _encode(tiny_bert, empty, tmp_path / "z.npy") == 2
    assert "zw.txt, line 141: no tokens in" in capsys.readouterr().err


def _scan_error(path):
    with pytest.raises(BertkitError) as e:
        scan_text_inputs(path, 128)
    return e.value


def test_the_library_writes_a_file_too(tmp_path, tiny_bert, sentences, reference):
    encoder = Encoder.from_folder(tiny_bert, device="cpu")
    assert encode_file(encoder, sentences, tmp_path / "v.npy", batch_size=BATCH, progress=False, chunk=CHUNK) == 700
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), reference)


# ---- several processes ----
def _torchrun(nproc, *args, nodes=None):
    return torchrun(nproc, nodes, "bertkit-encode-test") + ["-m", "bertkit", "encode", *args]


def test_two_launches_on_loopback_write_one_file(tmp_path, tiny_bert, sentences, reference):
    """Two torchrun launches, one rank each, meet through the c10d rendezvous: the ranks share the
    texts, rank 0 alone writes and reports."""
    out = tmp_path / "v.npy"
    cmd = _torchrun(1, "--model", str(tiny_bert), "--input", str(sentences), "--output", str(out),
                    "--batch-size", str(BATCH), "--chunk-texts", str(CHUNK), nodes=2)
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for _ in range(2)]
    results = [n.communicate(timeout=300) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), [err[-2000:] for _, err in results]
    assert "".join(stdout for stdout, _ in results).count("wrote 700 vectors") == 1
    np.testing.assert_allclose(np.load(out), reference, atol=1e-6)


def test_a_rank_that_dies_stops_the_job_and_a_resume_finishes_it(tmp_path, tiny_bert, sentences):
    """Rank 1 is killed once it has recorded a chunk: the job stops, and --resume in one process
    ends with the file an uninterrupted run writes."""
    out = tmp_path / "v.npy"
    args = ["--model", str(tiny_bert), "--input", str(sentences), "--output", str(out), "--batch-size", "2",
            "--chunk-texts", "64"]
    proc = subprocess.Popen(_torchrun(2, *args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = partial_folder(out) / "done-1"
    t = time.monotonic()
    while time.monotonic() - t < 120 and not (rank1.is_file() and rank1.read_bytes().count(b"\n") >= 1):
        time.sleep(0.02)
    workers = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    ranks = {int(dict(line.split("=", 1) for line in open(f"/proc/{pid}/environ").read().split("\0")
                      if "=" in line).get("RANK", -1)): pid for pid in workers}
    os.kill(ranks[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not out.exists()
    assert "-9" in err  # torchrun names the rank that died
    assert main(["encode", *args, "--resume"]) == 0
    expected = Encoder.from_folder(tiny_bert, device="cpu").encode(read_text_inputs(sentences).texts, batch_size=2,
                                                                   chunk=64)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


def test_a_second_process_on_the_same_output_is_refused_and_the_first_ends_as_if_alone(tmp_path, tiny_bert,
                                                                                        sentences, capsys):
    """A real process writes OUTPUT; a second run into it (new, --resume or --overwrite; here, in
    this process) is refused by name while the first writes."""
    texts = read_text_inputs(sentences).texts * 3  # 2,100 texts in 2-text batches: seconds of work
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(texts) + "\n")
    out = tmp_path / "v.npy"
    cmd = [sys.executable, "-m", "bertkit", "encode", "--model", str(tiny_bert), "--input", str(src),
           "--output", str(out), "--batch-size", "2", "--chunk-texts", "64"]
    first = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = time.monotonic()
    while time.monotonic() - t < 60 and not (partial_folder(out) / "run.json").is_file():
        time.sleep(0.02)
    for extra in ([], ["--resume"], ["--overwrite"]):
        assert main([*cmd[3:], *extra]) == 2
        err = capsys.readouterr().err
        assert "is being written by another bertkit process" in err, err[-500:]
    assert first.poll() is None  # still writing: the refusals came while it ran
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-500:]
    expected = Encoder.from_folder(tiny_bert, device="cpu").encode(texts, batch_size=2, chunk=64)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)  # one thread there, two here


def test_each_chunk_is_tokenized_once_and_a_tokenless_text_or_pair_is_named_by_line(tmp_path, tiny_bert, sentences,
                                                                                      monkeypatch, capsys):
    """The token-less check reads the chunk's own encodings (it tokenized every chunk a second
    time before): one tokenizer pass per chunk, and the errors still name the line and field."""
    from bertkit.tokenizer import WordPieceTokenizer
    calls = []
    real = WordPieceTokenizer.encode_unpadded
    monkeypatch.setattr(WordPieceTokenizer, "encode_unpadded",
                        lambda self, texts, *a, **k: calls.append(len(texts)) or real(self, texts, *a, **k))
    monkeypatch.setattr(WordPieceTokenizer, "tokenless", lambda self, texts: pytest.fail("a second pass"))
    assert _encode(tiny_bert, sentences, tmp_path / "v.npy") == 0
    scan = scan_text_inputs(sentences, CHUNK)
    assert calls == [scan.chunk_size(c) for c in range(scan.chunks)]  # once per chunk, every text once
    lines = read_text_inputs(sentences).texts
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"text": t, "text_pair": "\u200b" if i == 150 else t}) + "\n"
                            for i, t in enumerate(lines[:200])))
    assert _encode(tiny_bert, rows, tmp_path / "p.npy") == 2
    assert "pairs.jsonl, line 151 (text_pair): no tokens in '\\u200b'" in capsys.readouterr().err


def test_a_resume_on_changed_weights_or_an_input_edited_mid_run_is_refused(tmp_path, tiny_bert, sentences,
                                                                            monkeypatch, capsys):
    """encode --resume after the model's weights changed at the same path mixed rows of two models;
    an input edited while it was encoded mixed lines. Both are refused by name, the chunks kept."""
    import shutil

    from safetensors.torch import load_file, save_file

    import bertkit.inference.encode_file as ef
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    out = tmp_path / "v.npy"
    monkeypatch.setattr(ef.os, "fdatasync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _encode(model, sentences, out) == 130
    monkeypatch.undo()
    tensors = load_file(str(model / "model.safetensors"))
    name = next(k for k in tensors if "layer.1." in k and k.endswith("output.dense.weight"))
    tensors[name] = tensors[name] * 0.5
    save_file(tensors, str(model / "model.safetensors"))
    capsys.readouterr()
    assert _encode(model, sentences, out, "--resume") == 2
    assert "is not the one" in capsys.readouterr().err and ef.partial_folder(out).exists()
    # an input edited between its scan and the reading of a chunk
    texts = tmp_path / "texts.txt"
    shutil.copy(sentences, texts)
    real = ef.read_chunk
    calls = []

    def edit_then_read(scan, chunk):
        if not calls:
            with texts.open("a") as f:
                f.write("a line appended while encoding\n")
        calls.append(chunk)
        return real(scan, chunk)
    monkeypatch.setattr(ef, "read_chunk", edit_then_read)
    assert _encode(model, texts, tmp_path / "w.npy") == 2
    assert "the file changed while it was being encoded" in capsys.readouterr().err
    assert not (tmp_path / "w.npy").exists()
