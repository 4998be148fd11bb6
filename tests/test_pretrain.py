"""Pretraining end to end on real text: it learns, it resumes exactly, it refuses bad input."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertkitError
from bertkit.cli import main
from bertkit.pretraining.train import PretrainConfig, pretrain


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, wiki_excerpt):
    """One vocabulary for the runs compared with each other (WordPiece training in `tokenizers`
    breaks ties in hash order, so two trainings can differ)."""
    out = tmp_path_factory.mktemp("vocab")
    assert main(["tokenizer", "train", "--corpus", str(wiki_excerpt), "--vocab-size", "600", "--out", str(out)]) == 0
    return out


def _cfg(corpus, out, **kw):
    base = dict(corpus=str(corpus), model="tiny", out=str(out), steps=6, batch_size=16, max_len=32,
                vocab_size=600, holdout_every=6, eval_every=3, eval_batches=2, save_every=3, log_every=1,
                seed=3, progress=False)
    return PretrainConfig(**{**base, **kw})


class Stop(Exception):
    pass


def _lines(out):
    keep = lambda r: {k: v for k, v in r.items() if k not in ("elapsed_s", "pairs_per_s")}
    return [keep(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_resume_after_a_stop_equals_an_uninterrupted_run(tmp_path, wiki_excerpt, vocab):
    straight = pretrain(_cfg(wiki_excerpt, tmp_path / "a", vocab=str(vocab)))

    def stop_at_3(step, model):
        if step == 3:
            raise Stop
    with pytest.raises(Stop):
        pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab)), on_step=stop_at_3)
    assert not (tmp_path / "b" / "model.safetensors").exists()
    resumed = pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab), resume=True))
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _lines(tmp_path / "a") == _lines(tmp_path / "b")
    assert straight["final_train"]["loss"] == resumed["final_train"]["loss"]


def test_a_short_run_lowers_the_mlm_loss_and_writes_the_run_files(tmp_path, wiki_excerpt):
    out = tmp_path / "run"
    summary = pretrain(_cfg(wiki_excerpt, out, steps=80, batch_size=32, max_len=64, lr=2e-3, save_every=0,
                            eval_every=40, log_every=1, tensorboard=True))
    train = [r for r in _lines(out) if "mlm_loss" in r]
    first = train[0]["mlm_loss"]
    last = sum(r["mlm_loss"] for r in train[-10:]) / 10
    # from ln(600) = 6.4 (uniform guessing) down past the unigram plateau's start (measured 5.6)
    assert first > 6.0 and last < first - 0.6, (first, last)
    assert summary["final_eval"]["eval_mlm_loss"] < first - 0.6
    for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()):
        if "eval_mlm_loss" in r:
            continue
        assert {"step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "elapsed_s", "pairs_per_s"} <= set(r)
    for name in ("summary.json", "loss.png", "config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # the result is a model folder transformers can load, MLM and NSP heads included
    from transformers import BertForPreTraining as HF
    hf = HF.from_pretrained(str(out))
    assert hf.config.vocab_size <= 600


def test_continue_pretraining_from_a_hf_folder(tmp_path, wiki_excerpt, minilm_folder, capfd):
    out = tmp_path / "cont"
    summary = pretrain(_cfg(wiki_excerpt, out, model=str(minilm_folder), steps=2, save_every=0, eval_every=2))
    assert "no MLM/NSP heads" in capfd.readouterr().err
    assert summary["vocab_size"] == 30522
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] == 384 and cfg["num_hidden_layers"] == 6


def test_bad_input_is_refused_and_nothing_is_lost(tmp_path, wiki_excerpt, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(BertkitError, match="empty"):
        pretrain(_cfg(empty, tmp_path / "o1"))
    one = tmp_path / "one.txt"
    one.write_text("Only one document here. It has two sentences.\n")
    with pytest.raises(BertkitError, match="needs at least two documents"):
        pretrain(_cfg(one, tmp_path / "o2", holdout_every=0))
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "x.txt").write_bytes(b"text\x00\x01\x02")
    with pytest.raises(BertkitError, match=r"x.txt: looks binary: NUL byte at byte offset 4"):
        pretrain(_cfg(binary, tmp_path / "o3"))
    with pytest.raises(BertkitError, match="max length 4 is too small for \\[CLS\\] A \\[SEP\\] B \\[SEP\\]"):
        _cfg(wiki_excerpt, tmp_path / "o4", max_len=4)
    with pytest.raises(BertkitError, match="model 'huge' is neither a preset"):
        _cfg(wiki_excerpt, tmp_path / "o5", model="huge")
    # a finished run is neither overwritten nor resumed with another configuration
    out = tmp_path / "done"
    pretrain(_cfg(wiki_excerpt, out, steps=3))
    before = (out / "model.safetensors").read_bytes()
    assert main(["pretrain", "--corpus", str(wiki_excerpt), "--out", str(out), "--steps", "3", "--no-samples"]) == 2
    assert "already holds a training run" in capsys.readouterr().err
    with pytest.raises(BertkitError, match="different model configuration.*hidden_size 128 in the checkpoint vs 256"):
        pretrain(_cfg(wiki_excerpt, out, model="mini", resume=True))
    with pytest.raises(BertkitError, match="changed options.*batch_size: 16 in the checkpoint vs 8"):
        pretrain(_cfg(wiki_excerpt, out, batch_size=8, resume=True))
    with pytest.raises(BertkitError, match="no checkpoint to resume from"):
        pretrain(_cfg(wiki_excerpt, tmp_path / "never", resume=True))
    assert (out / "model.safetensors").read_bytes() == before


def test_cli_pretrain_with_a_toml_config_then_fill_mask(tmp_path, wiki_excerpt, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text(f'[pretrain]\ncorpus = "{wiki_excerpt}"\nsteps = 2\nbatch-size = 8\nmax_len = 32\n'
                    'vocab_size = 500\nholdout_every = 6\neval_batches = 1\nlog_every = 1\nprogress = false\n')
    out = tmp_path / "cli"
    assert main(["pretrain", "--config", str(toml), "--out", str(out), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "pretrained 2 steps" in printed and "fill-mask on held-out sentences" in printed
    assert json.loads((out / "pretrain_config.json").read_text())["batch_size"] == 8
    assert main(["fill-mask", "--model", str(out), "the [MASK] of france", "a [MASK] b [MASK]"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and len(rows[0]["predictions"]) == 1 and len(rows[1]["predictions"]) == 2
    assert all(len(p) == 5 for p in rows[1]["predictions"])
    # --resume alone picks up the run's own options (here: 2 more steps)
    assert main(["pretrain", "--out", str(out), "--resume", "--steps", "4", "--no-samples"]) == 0
    assert "pretrained 4 steps" in capsys.readouterr().out
    toml.write_text("stepz = 3\n")
    assert main(["pretrain", "--config", str(toml), "--out", str(tmp_path / "x")]) == 2
    assert "unknown key 'stepz'" in capsys.readouterr().err
    assert main(["fill-mask", "--model", str(out), "no mask here"]) == 2
    assert "has no [MASK] token" in capsys.readouterr().err


def test_torchrun_with_two_processes_trains_one_model(tmp_path, wiki_excerpt, vocab):
    """DistributedDataParallel on CPU (gloo): two processes share each batch; rank 0 writes."""
    import os
    import subprocess
    import sys
    out = tmp_path / "ddp"
    args = ["--corpus", str(wiki_excerpt), "--vocab", str(vocab), "--out", str(out), "--steps", "4",
            "--batch-size", "16", "--max-len", "32", "--holdout-every", "6", "--eval-every", "4",
            "--save-every", "2", "--log-every", "1", "--seed", "3", "--no-samples"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "bertkit", "pretrain", *args], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4]  # one writer
    assert all(math.isfinite(r["loss"]) for r in lines if "loss" in r)
    assert json.loads((out / "checkpoints" / "step_0000004" / "trainer.json").read_text())["world_size"] == 2
    # the same global batches in one process: the first step's loss agrees (dropout differs on rank 1)
    single = pretrain(_cfg(wiki_excerpt, tmp_path / "one", vocab=str(vocab), steps=1, save_every=0))
    assert abs(lines[0]["loss"] - single["final_train"]["loss"]) < 0.1
    from transformers import BertForPreTraining as HF
    HF.from_pretrained(str(out))
