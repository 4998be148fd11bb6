"""Beyond one process: two torchrun "nodes" on 127.0.0.1 through the c10d rendezvous, resuming
a 2-process checkpoint in 1 and in 4 processes, and a rank that dies (gloo on CPU). The runs of
one process run in this one, as `bertkit pretrain` without torchrun does."""
import json
import os
import subprocess
import time

import pytest
from helpers import torchrun

from bertkit.pretraining.train import PretrainConfig, pretrain
from bertkit.training.checkpoints import checkpoint_problem, latest_checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# pretrain() with per-rank reports: a digest of this rank's final weights; an optional SIGKILL
_RUN = r'''
import hashlib, json, os, signal, sys
from pathlib import Path
from bertkit.pretraining.train import PretrainConfig, pretrain
options, report = json.loads(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ.get("RANK", "0"))
kill = [int(x) for x in os.environ.get("KILL_RANK_AT_STEP", "-1,-1").split(",")]
held = {}
def on_step(step, model):
    held["model"] = model
    if [rank, step] == kill:
        os.kill(os.getpid(), signal.SIGKILL)
pretrain(PretrainConfig(**options), on_step=on_step)
state = held["model"].state_dict()
digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state)))
(report / f"rank{rank}.sha").write_text(digest.hexdigest())
'''


def _options(corpus, vocab, out, steps, **more):
    return json.dumps({"corpus": str(corpus), "vocab": str(vocab), "out": str(out), "steps": steps, "batch_size": 16,
                       "max_len": 32, "holdout_every": 6, "eval_every": 100, "eval_pairs": 16, "save_every": 2,
                       "log_every": 1, "seed": 5, "progress": False, "sentence_per_line": True, **more})


def _torchrun(tmp_path, nproc, options, env=ENV, nodes=None):
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    report = tmp_path / f"report-{nproc}-{time.monotonic_ns()}"
    report.mkdir()
    return torchrun(nproc, nodes) + [str(script), options, str(report)], report


def _steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_two_nodes_on_loopback_train_one_model(tmp_path, wiki_excerpt, vocab):
    """Two torchrun launches, one process each, meet through the c10d rendezvous: the job ends,
    both ranks hold the same weights, and only rank 0 writes."""
    out = tmp_path / "run"
    cmd, report = _torchrun(tmp_path, 1, _options(wiki_excerpt, vocab, out, 4), nodes=2)
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for _ in range(2)]
    results = [n.communicate(timeout=300) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), [err[-2000:] for _, err in results]
    digests = {p.read_text() for p in report.glob("rank*.sha")}
    assert len(list(report.glob("rank*.sha"))) == 2 and len(digests) == 1
    assert _steps(out) == [1, 2, 3, 4]  # one writer
    state = json.loads((latest_checkpoint(out) / "trainer.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 4


@pytest.fixture(scope="module")
def two_process_checkpoint(tmp_path_factory, wiki_excerpt, vocab):
    """An 8-step run in 2 processes stopped after its step-4 checkpoint, and the same 8 steps in
    one process without a stop."""
    tmp = tmp_path_factory.mktemp("resume")
    first = tmp / "first"
    cmd, _ = _torchrun(tmp, 2, _options(wiki_excerpt, vocab, first, 8))
    subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "KILL_RANK_AT_STEP": "0,4"}, timeout=300)
    assert json.loads((latest_checkpoint(first) / "trainer.json").read_text())["step"] == 4
    pretrain(PretrainConfig(**json.loads(_options(wiki_excerpt, vocab, tmp / "straight", 8))))
    return first, tmp / "straight"


@pytest.mark.parametrize("nproc", [1, 4])
def test_a_two_process_checkpoint_resumes_in_other_process_counts(tmp_path, wiki_excerpt, vocab, nproc,
                                                                  two_process_checkpoint):
    """The global batch stays 16 pairs: the schedule and the data position continue, and with
    dropout off (the default recipe) the resumed steps match an uninterrupted run's."""
    import shutil
    first, straight = two_process_checkpoint
    out = tmp_path / "resumed"
    shutil.copytree(first, out)
    options = _options(wiki_excerpt, vocab, out, 8, resume=True)
    if nproc == 1:
        pretrain(PretrainConfig(**json.loads(options)))
    else:
        cmd, _ = _torchrun(tmp_path, nproc, options)
        run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]

    def records(folder):
        return {r["step"]: r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
    resumed, uninterrupted = records(out), records(straight)
    assert sorted(resumed) == list(range(1, 9))
    for step in range(5, 9):  # the same lr and nearly the same loss: the same batches at the same point
        assert resumed[step]["lr"] == pytest.approx(uninterrupted[step]["lr"], rel=1e-9)
        assert resumed[step]["loss"] == pytest.approx(uninterrupted[step]["loss"], abs=2e-3)
    assert json.loads((latest_checkpoint(out) / "trainer.json").read_text())["world_size"] == nproc


def test_a_rank_that_dies_stops_the_job_and_the_checkpoint_stays_loadable(tmp_path, wiki_excerpt, vocab):
    out = tmp_path / "run"
    cmd, _ = _torchrun(tmp_path, 2, _options(wiki_excerpt, vocab, out, 40))
    # a job that hangs instead of stopping ends in TimeoutExpired
    run = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "KILL_RANK_AT_STEP": "1,3"}, timeout=120)
    assert run.returncode != 0
    assert "exitcode" in run.stderr and "-9" in run.stderr  # torchrun names the rank that died
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and checkpoint_problem(ckpt) is None
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == 2
    pretrain(PretrainConfig(**json.loads(_options(wiki_excerpt, vocab, out, 4, resume=True, extend=True))))
    assert _steps(out)[-1] == 4
