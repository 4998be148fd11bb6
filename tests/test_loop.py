"""The training loop (bertkit/training/loop.py) against a toy job (loop_toy.py): exact resume,
a budget on an injected clock, the two non-finite policies, signals, epoch ends with patience,
accumulation and two torchrun ranks. Pretraining and fine-tuning are tested end to end in their
own files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertkit.errors import BertkitError, Interrupted
from bertkit.training.distributed import Processes
from bertkit.training.loop import ROLL_BACK, STOP

sys.path.insert(0, str(Path(__file__).parent))
from helpers import Stop, stop_at, torchrun  # noqa: E402
from loop_toy import FakeTimer, run  # noqa: E402

ONE = Processes(0, 1, torch.device("cpu"))


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(job) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in job.model.parameters()])


def test_a_run_stopped_anywhere_resumes_to_the_same_weights_and_log(tmp_path):
    straight, _ = run(ONE, tmp_path / "a")
    for stop in (5, 7, 19):  # on a checkpoint, past one (the steps after it run again), one before the end
        out = tmp_path / f"stop{stop}"
        with pytest.raises(Stop):
            run(ONE, out, on_step=stop_at(stop))
        job, loop = run(ONE, out, resume=True)
        assert loop.step == 20 and torch.equal(_weights(job), _weights(straight)), stop
        assert _records(out) == _records(tmp_path / "a"), stop
    # the last checkpoint says the run is finished: resuming it trains no more
    job, loop = run(ONE, tmp_path / "a", resume=True)
    assert loop.step == 20 and torch.equal(_weights(job), _weights(straight))


def test_the_lr_warms_up_then_decays_to_zero_by_steps(tmp_path):
    from bertkit.training.step import lr_factor
    run(ONE, tmp_path / "a", warmup=0.2)
    lrs = [r["lr"] for r in _records(tmp_path / "a")]
    assert lrs == pytest.approx([0.1 * lr_factor(s, 20, 0.2, 1) for s in range(20)])
    assert max(lrs) == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.1 / 16)


def test_a_budget_stops_where_one_more_step_and_the_closing_saves_would_not_fit(tmp_path):
    """Each step takes 1 s and each checkpoint 1 s of the fake clock. After the saves at steps 10
    and 20 the loop leaves room for two saves: step k > 20 ends at k + 2 s, and step 26 is the last
    whose successor would not fit in 30 s with them; the final save ends at 29 s."""
    timer = FakeTimer()
    job, loop = run(ONE, tmp_path / "b", timer=timer, steps=None, budget=30.0, save_every=10,
                    job_options={"save_s": 1.0})
    assert loop.step == 26 and timer.now == 29.0 and loop.clock() <= 30.0
    lrs = [r["lr"] for r in _records(tmp_path / "b") if "lr" in r]
    assert max(lrs) == pytest.approx(0.1) and lrs[-1] < 0.1 * 2 / 27  # decayed to ~0 as the budget ends
    # stopped at step 12 and resumed from step 10: the same clock and schedule, the same end (the
    # saves take no time here: a checkpoint's clock cannot hold the time of its own writing)
    job, loop = run(ONE, tmp_path / "c", steps=None, budget=30.0, save_every=10)
    assert loop.step == 30
    with pytest.raises(Stop):
        run(ONE, tmp_path / "d", steps=None, budget=30.0, save_every=10, on_step=stop_at(12))
    job2, loop2 = run(ONE, tmp_path / "d", resume=True, steps=None, budget=30.0, save_every=10)
    assert loop2.step == 30 and torch.equal(_weights(job2), _weights(job))
    assert _records(tmp_path / "c") == _records(tmp_path / "d")
    # resumed from its final checkpoint, a budgeted run trains no more
    job3, loop3 = run(ONE, tmp_path / "c", resume=True, steps=None, budget=30.0, save_every=10)
    assert loop3.step == 30 and torch.equal(_weights(job3), _weights(job))


def test_data_preparation_that_spends_the_budget_is_an_error(tmp_path):
    from bertkit.training.loop import RunClock
    timer = FakeTimer()
    clock = RunClock(timer)
    clock.spent = 31.0  # a resumed run whose data preparation took 31 s
    from loop_toy import ToyJob

    from bertkit.training.loop import Loop
    with pytest.raises(BertkitError, match="data preparation took 31 s, the whole budget of 30 s"):
        Loop(ToyJob(ONE, timer), ONE, tmp_path, lr=0.1, warmup=0.1, clip=1.0, steps=None, budget=30.0, clock=clock,
             save_every=0, keep_checkpoints=1, log_every=1, options={}, metrics=None, log=print, progress=False,
             how_to_continue="")


def test_non_finite_steps_are_skipped_and_stop_the_run_or_roll_it_back(tmp_path):
    # one bad step is skipped (the weights do not move); five in a row stop the run (fine-tuning's policy)
    with pytest.raises(BertkitError, match=r"step 9: 5 steps in a row had a non-finite .*\(6 skipped in all\)"):
        run(ONE, tmp_path / "stop", non_finite=STOP, job_options={"poison": (2, 5, 6, 7, 8, 9)})
    # or go back to the last checkpoint at half the lr (pretraining's)
    job, loop = run(ONE, tmp_path / "back", non_finite=ROLL_BACK, job_options={"poison": (2, 11, 12, 13, 14, 15)})
    records = _records(tmp_path / "back")
    back = [r for r in records if "rolled_back_to" in r]
    assert [(r["rolled_back_to"], r["lr_scale"]) for r in back] == [("step_0000010", 0.5)]
    assert loop.step == 20 and loop.guard.skipped == 6 and torch.isfinite(_weights(job)).all()
    logged = [r["step"] for r in records if "loss" in r]
    assert logged == sorted(set(logged)) and 2 not in logged and logged[-1] == 20  # a skipped step logs nothing
    after = [r for r in records if "loss" in r and records.index(r) > records.index(back[0])]
    from bertkit.training.step import lr_factor
    assert after[0]["lr"] == pytest.approx(0.1 * 0.5 * lr_factor(10, 20, 0.1, 1))


def test_a_signal_ends_the_run_after_its_step_with_a_checkpoint(tmp_path):
    out = tmp_path / "sig"
    before = signal.getsignal(signal.SIGTERM)
    # sent after step 3's work: noticed at step 4's end, which is saved
    with pytest.raises(Interrupted, match="stopped by SIGTERM at step 4; the checkpoint is saved: resume it"):
        run(ONE, out, on_step=lambda step, model: os.kill(os.getpid(), signal.SIGTERM) if step == 3 else None)
    assert (out / "checkpoints" / "step_0000004").is_dir()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    job, loop = run(ONE, out, resume=True)
    straight, _ = run(ONE, tmp_path / "a")
    assert torch.equal(_weights(job), _weights(straight))


def test_epoch_ends_evaluate_checkpoint_and_stop_on_patience(tmp_path):
    options = {"epochs": True, "patience": 1}
    job, loop = run(ONE, tmp_path / "e", steps=40, save_every=0, job_options=options)  # 8 steps an epoch
    assert [e for e, _ in job.evals] == list(range(1, len(job.evals) + 1))
    assert [s for _, s in job.evals] == [8 * e for e, _ in job.evals]
    steps = sorted(int(p.name[5:]) for p in (tmp_path / "e" / "checkpoints").glob("step_*"))
    state = json.loads((tmp_path / "e" / "checkpoints" / f"step_{steps[-1]:07d}" / "trainer.json").read_text())
    assert state["finished"] and state["epoch"] == len(job.evals) + 1 and state["batch"] == 0
    # an epoch's end run again after a resume from a checkpoint inside it gives the same run
    out = tmp_path / "r"
    with pytest.raises(Stop):
        run(ONE, out, steps=40, save_every=3, job_options=options, on_step=stop_at(7))
    job2, loop2 = run(ONE, out, resume=True, steps=40, save_every=3, job_options=options)
    assert loop2.step == loop.step and torch.equal(_weights(job2), _weights(job))


def test_micro_batches_give_the_gradients_of_the_whole_batch(tmp_path):
    whole, _ = run(ONE, tmp_path / "1", job_options={"grad_accum": 1, "dropout": False})
    split, _ = run(ONE, tmp_path / "4", job_options={"grad_accum": 4, "dropout": False})
    assert torch.allclose(_weights(whole), _weights(split), atol=1e-6)
    assert not torch.equal(_weights(whole), _weights(run(ONE, tmp_path / "0", steps=19)[0]))  # it did train


_RANKS = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from bertkit.training.distributed import init_processes
from loop_toy import run
procs = init_processes()
job, loop = run(procs, Path(sys.argv[2]), job_options={"grad_accum": 2, "dropout": False})
if procs.main:
    torch.save(torch.cat([p.detach().flatten() for p in job.model.parameters()]), Path(sys.argv[2]) / "w.pt")
'''


def test_two_torchrun_ranks_share_each_batch_and_keep_one_model(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*torchrun(2), str(script), str(Path(__file__).parent), str(tmp_path / "two")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(tmp_path / "two" / "w.pt")
    one, _ = run(ONE, tmp_path / "one", job_options={"grad_accum": 2, "dropout": False})
    assert torch.allclose(two, _weights(one), atol=1e-6)  # each rank's half of every batch: one process's step
    records = _records(tmp_path / "two")
    assert [r["step"] for r in records] == list(range(1, 21))  # rank 0 alone writes the log
    assert torch.isfinite(two).all() and records[-1]["loss"] < records[0]["loss"]
    state = json.loads((tmp_path / "two" / "checkpoints" / "step_0000020" / "trainer.json").read_text())
    assert state["world_size"] == 2 and state["finished"]
