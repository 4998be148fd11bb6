"""Fine-tuning on the shared training runtime: exact resume after SIGKILL, gradient
accumulation and two gloo ranks giving one batch's gradients, evaluation split over ranks
decoding as one process, a time budget, and the folder guards."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import one_thread
from safetensors.torch import load_file

from bertkit.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """64 training and 32 evaluation reviews of the real rotten-tomatoes set."""
    from bertkit.data.registry import export
    folder = tmp_path_factory.mktemp("rt")
    export("rotten-tomatoes", folder / "all")
    rows = (folder / "all" / "train.jsonl").read_text().splitlines()
    (folder / "train.jsonl").write_text("\n".join(rows[:64]) + "\n")
    (folder / "dev.jsonl").write_text("\n".join(rows[64:96]) + "\n")
    return folder


@pytest.fixture(scope="module")
def tiny_no_dropout(tmp_path_factory, tiny_bert_factory):
    return tiny_bert_factory.folder(tmp_path_factory.mktemp("tiny0"), hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)


def _args(model, data, out, *extra):
    epochs = () if "--budget" in extra or "--epochs" in extra else ("--epochs", "3")  # a budget takes no epochs
    return ["finetune", "classify", "--model", str(model), "--train", str(data / "train.jsonl"), "--eval",
            str(data / "dev.jsonl"), "--out", str(out), *epochs, "--batch-size", "8", "--save-every", "2",
            "--seed", "1", "--log-every", "1", *extra]


_KILL_AT = r'''
import os, signal, sys
from bertkit.cli import build_parser
from bertkit import finetune as ft
args = build_parser().parse_args(sys.argv[2:])
real = ft.finetune
def killing(cfg, on_step=None):
    # SIGKILL right after step N (its checkpoint, if any, is already on disk)
    return real(cfg, on_step=lambda step, model: os.kill(os.getpid(), signal.SIGKILL) if step == int(sys.argv[1]) else None)
ft.finetune = killing
args.func(args)
'''


def test_sigkill_in_epoch_2_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_bert, data, capsys):
    """Dropout on: the resumed run must restore the RNG, the optimizer, the schedule and the
    data position to end with the same weights and metrics. (Only the killed run is a process of
    its own; the others run here on its one thread.)"""
    straight = tmp_path / "straight"
    with one_thread():  # as the killed process's
        assert main(_args(tiny_bert, data, straight, "--log-every", "3")) == 0
    killed = tmp_path / "killed"
    script = tmp_path / "kill.py"
    script.write_text(_KILL_AT)
    # 8 steps per epoch: step 11 is in epoch 2, after the checkpoint of step 10
    run = subprocess.run([sys.executable, str(script), "11", *_args(tiny_bert, data, killed, "--log-every", "3")],
                         capture_output=True, text=True, env=ENV)
    assert run.returncode == -9, run.stderr[-2000:]
    state = json.loads(sorted((killed / "checkpoints").glob("step_*/trainer.json"))[-1].read_text())
    assert (state["step"], state["epoch"], state["batch"]) == (10, 2, 2)
    # without --resume the run is refused, nothing lost
    assert main(_args(tiny_bert, data, killed)) == 2 and "--resume" in capsys.readouterr().err
    with one_thread():
        assert main(_args(tiny_bert, data, killed, "--log-every", "3", "--resume")) == 0
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (straight, killed))
    assert s1["history"] == s2["history"] and s1["steps"] == s2["steps"] == 24
    # the loss records (every 3rd step and each epoch's last) are the uninterrupted run's, none twice:
    # step 10, before the checkpoint, is in the resumed run's record of step 12
    train = [[(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
              if "loss" in r] for d in (straight, killed)]
    assert train[0] == train[1] and [s for s, _ in train[1]] == [3, 6, 8, 9, 12, 15, 16, 18, 21, 24]
    assert not (killed / "checkpoints").exists()  # removed once the run completed
    # resuming the finished run ends at once (exit 0, nothing rewritten), as pretraining's does;
    # with changed options it is refused
    before = {p.name: p.stat().st_mtime_ns for p in killed.iterdir()}
    capsys.readouterr()
    assert main(_args(tiny_bert, data, killed, "--log-every", "3", "--resume")) == 0
    assert "is finished" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in killed.iterdir()} == before
    assert main(_args(tiny_bert, data, killed, "--log-every", "3", "--resume", "--epochs", "4")) == 2
    assert "epochs: 3 in the finished run vs 4 now" in capsys.readouterr().err


def test_resume_refuses_changed_options(tmp_path, tiny_bert, data, capsys):
    out = tmp_path / "run"
    script = tmp_path / "kill.py"
    script.write_text(_KILL_AT)
    subprocess.run([sys.executable, str(script), "3", *_args(tiny_bert, data, out)], env=ENV, capture_output=True)
    assert main(_args(tiny_bert, data, out, "--resume", "--lr", "1e-3")) == 2
    assert "changed options (lr: 5e-05 in the checkpoint vs 0.001 now)" in capsys.readouterr().err
    assert main(_args(tiny_bert, data, tmp_path / "none", "--resume")) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err
    # a pretraining run's folder (its checkpoints look alike) is named as one, with or without --resume
    pretraining = tmp_path / "pretraining"
    (pretraining / "checkpoints" / "step_5").mkdir(parents=True)
    (pretraining / "checkpoints" / "step_5" / "trainer.json").write_text("{}")
    (pretraining / "pretrain_config.json").write_text("{}")
    for extra in ((), ("--resume",)):
        assert main(_args(tiny_bert, data, pretraining, *extra)) == 2
        assert f"{pretraining} holds a pretraining run" in capsys.readouterr().err


def _grads(model_folder, data, grad_accum, procs=None, rows=None):
    """One global batch of 8 real reviews through accumulate_gradients; the gradients."""
    from bertkit.finetune import TaskStep, accumulate_gradients
    from bertkit.folders import load_model
    from bertkit.model import init_weights
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tokenizer import load_tokenizer
    from bertkit.training.distributed import Processes
    task = get_task("classify")()
    examples = task.read(data / "train.jsonl")[:8]
    task.fit(examples, {"pooling": "pooler", "dropout": 0.0})
    tok = load_tokenizer(model_folder)
    torch.manual_seed(0)
    bert, _ = load_model(model_folder, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert))
    init_weights(model.head, bert.config)
    feats = task.features(examples, tok, 64)
    procs = procs or Processes(0, 1, torch.device("cpu"))
    net = procs.wrap(TaskStep(task, model), find_unused_parameters=True)
    loss = accumulate_gradients(net, task, feats, tok, procs, grad_accum)
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, loss


def test_gradient_accumulation_gives_the_gradients_of_one_batch(tiny_no_dropout, data):
    one, loss1 = _grads(tiny_no_dropout, data, 1)
    three, loss3 = _grads(tiny_no_dropout, data, 3)  # micro-batches of 3, 3 and 2 examples
    assert abs(loss1 - loss3) < 1e-6
    for name in one:
        torch.testing.assert_close(three[name], one[name], rtol=1e-4, atol=1e-7, msg=name)


TASK_DATA = {"ner": ("wnut16", "train.conll"), "tag": ("wnut16", "train.conll"), "qa": ("squad-subset", "train.json"),
             "summarize": ("aclsum", "train.jsonl"), "word": ("wordnet-attributes", "train.jsonl")}


@pytest.mark.parametrize("task_name", sorted(TASK_DATA))
def test_gradient_accumulation_gives_the_gradients_of_one_batch_for_every_task(tiny_no_dropout, tmp_path, task_name):
    """Losses that are means over words, sentences or targets (not examples) weigh each
    micro-batch by its share of those (ner's gradients were 35% off at grad_accum 2, summarize's
    6x at 4). The word task's batch mixes targets that are one vocabulary token with ones that
    are not (no target: a micro-batch of only those has no loss)."""
    from bertkit.data.registry import export
    from bertkit.finetune import TaskStep, accumulate_gradients
    from bertkit.folders import load_model
    from bertkit.model import init_weights
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tokenizer import load_tokenizer
    from bertkit.training.distributed import Processes
    name, file = TASK_DATA[task_name]
    export(name, tmp_path / name)
    task = get_task(task_name)()
    examples = task.read(tmp_path / name / file)
    if task_name == "word":  # four reachable targets, then four that are not one token
        tok = load_tokenizer(tiny_no_dropout)
        one = [e for e in examples if tok.token_to_id(e["word"].lower()) is not None]
        examples = one[:4] + [dict(e, word="zzqx" + e["word"]) for e in examples[:4]]
    else:
        examples = examples[:8] if task_name != "summarize" else examples[:6]
    task.fit(examples, {"dropout": 0.0} if "dropout" in task.options else {})
    tok = load_tokenizer(tiny_no_dropout)
    feats = task.features(examples, tok, 256 if task_name == "summarize" else 64)
    units = [task.loss_units(f) for f in feats]
    assert len(set(units)) > 1 or task_name in ("qa", "tag"), units  # uneven shares: the case that was wrong
    results = []
    for grad_accum in (1, 2, 4):
        torch.manual_seed(0)
        bert, _ = load_model(tiny_no_dropout, heads=False)
        model = TaskModel(bert, task.head(bert.config, bert))
        init_weights(model.head, bert.config)
        procs = Processes(0, 1, torch.device("cpu"))
        net = procs.wrap(TaskStep(task, model), find_unused_parameters=True)
        loss = accumulate_gradients(net, task, feats, tok, procs, grad_accum)
        results.append((loss, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (loss1, one), *rest = results
    for loss, grads in rest:
        assert abs(loss - loss1) < 1e-5 * max(1.0, abs(loss1))
        for name in one:
            # fp32 sums in another order differ by a few ulps of the tensor's largest terms, not of
            # each entry (an entry near 0 can be a difference of large ones: word.weight, tied to
            # the word head, was off 2.7e-6 at an entry of 1.7e-3 with a largest entry of 1.4 on
            # a Zen 4); the bugs this guards against were 35% and 6x off
            scale = one[name].abs().max().item()
            torch.testing.assert_close(grads[name], one[name], rtol=1e-4, atol=1e-6 + 1e-5 * scale, msg=name)


_RANKS = r'''
import json, sys, torch, torch.distributed as dist
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_finetune_runtime import _grads
from bertkit.finetune import evaluate_in_parts
from bertkit.tasks.folder import load_task_model
from bertkit.training.distributed import init_processes
procs = init_processes()
grads, loss = _grads(Path(sys.argv[2]), Path(sys.argv[3]), 2, procs)
if procs.main:
    torch.save({"grads": grads, "loss": loss}, Path(sys.argv[4]))
for model_folder, path, preds in zip(*[iter(sys.argv[5:])] * 3):  # (model, data, predictions) per task
    task, model, tok = load_task_model(model_folder)
    examples = task.read(path)
    feats = task.features(examples, tok, task.info["max_len"])
    result = evaluate_in_parts(task, model, feats, examples, tok, 4, procs)
    if procs.main:
        Path(preds).write_text(json.dumps(result[0]))
dist.barrier()  # no rank tears its group down while another still uses it
dist.destroy_process_group()
'''


def _torchrun(*args, nproc=2):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300)


def test_two_ranks_give_one_process_gradients_and_evaluation(tmp_path, tiny_no_dropout, tiny_bert, data):
    """One torchrun launch, two gloo ranks. Gradients: 8 reviews in 2 ranks x 2 micro-batches (2 +
    2 examples each) equal 1 process. Evaluation: QA n-best spans over windows and NER word tags,
    each rank running its part and rank 0 decoding both, equal 1 process."""
    from bertkit.data.registry import export
    from bertkit.data.squad_subset import squad_subset_file
    from bertkit.tasks.folder import load_task_model
    from bertkit.tasks.runner import run_task
    squad = json.loads(squad_subset_file().read_text(encoding="utf-8"))
    squad["data"] = squad["data"][:1]
    squad["data"][0]["paragraphs"] = squad["data"][0]["paragraphs"][:3]
    (tmp_path / "qa.json").write_text(json.dumps(squad))
    export("wnut16", tmp_path / "wnut")
    sentences = (tmp_path / "wnut" / "dev.conll").read_text().split("\n\n")[:30]
    (tmp_path / "ner.conll").write_text("\n\n".join(sentences) + "\n")
    tasks = {"qa": (tmp_path / "qa.json", ["--max-len", "96"]),  # several windows per context
             "ner": (tmp_path / "ner.conll", [])}
    for name, (path, extra) in tasks.items():
        assert main(["finetune", name, "--model", str(tiny_bert), "--train", str(path), "--eval", str(path), "--out",
                     str(tmp_path / name), "--epochs", "1", "--batch-size", "8", *extra]) == 0
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS)
    run = _torchrun(script, Path(__file__).parent, tiny_no_dropout, data, tmp_path / "ddp.pt",
                    *[x for name, (path, _) in tasks.items()
                      for x in (tmp_path / name, path, tmp_path / f"{name}-predictions.json")])
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp.pt")
    one, loss = _grads(tiny_no_dropout, data, 1)
    assert abs(ddp["loss"] - loss) < 1e-6
    for name in one:  # DDP's own parameter names: the model sits inside the step module
        torch.testing.assert_close(ddp["grads"][name], one[name], rtol=1e-4, atol=1e-7, msg=name)
    for name, (path, _) in tasks.items():
        task, model, tok = load_task_model(tmp_path / name)
        examples = task.read(path)
        single, _ = run_task(task, model, task.features(examples, tok, task.info["max_len"]), examples, tok, 4)
        split = json.loads((tmp_path / f"{name}-predictions.json").read_text())
        if name == "qa":
            assert [p["answer"] for p in split] == [p["answer"] for p in single]
            assert ([[c["text"] for c in p["nbest"]] for p in split]
                    == [[c["text"] for c in p["nbest"]] for p in single])
        else:
            assert split == single


def test_torchrun_finetune_equals_one_process(tmp_path, tiny_no_dropout, data):
    """The whole run under torchrun (gloo, dropout 0): one writer, evaluation gathered from both
    ranks, the same metrics and weights as one process. 9 examples in batches of 8 on 2 ranks:
    the last batch of 1 leaves a rank without an example: that rank joins the step with a zero
    gradient, so the longest example (last under group_by_length) is trained on as in one process."""
    small = tmp_path / "data"
    small.mkdir()
    (small / "train.jsonl").write_text("".join((data / "train.jsonl").read_text().splitlines(True)[:9]))
    (small / "dev.jsonl").write_text("".join((data / "dev.jsonl").read_text().splitlines(True)[:5]))
    run = _torchrun("-m", "bertkit", *_args(tiny_no_dropout, small, tmp_path / "ddp", "--option", "dropout=0",
                                            "--epochs", "2"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert main(_args(tiny_no_dropout, small, tmp_path / "one", "--option", "dropout=0", "--epochs", "2")) == 0
    s2, s1 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("ddp", "one"))
    assert s2["processes"] == 2 and s2["steps"] == s1["steps"] == 4
    for h1, h2 in zip(s1["history"], s2["history"], strict=True):
        assert h1["accuracy"] == h2["accuracy"] and abs(h1["eval_loss"] - h2["eval_loss"]) < 1e-3
    lines = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4]  # one writer
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("ddp", "one"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_budgeted_finetune_ends_on_time_with_the_lr_near_zero(tmp_path, tiny_bert, data):
    """On a clock that moves 0.02 s each time it is read (a busy machine or a quiet one alike): the
    last step leaves room for the closing evaluation, and the lr has decayed to near 0 by then."""
    from bertkit.finetune import FinetuneConfig, finetune

    class Ticks:
        now = 0.0

        def __call__(self):
            self.now += 0.02
            return self.now
    out = tmp_path / "budget"
    cfg = FinetuneConfig(task="classify", model=str(tiny_bert), train=str(data / "train.jsonl"),
                         eval=str(data / "dev.jsonl"), out=str(out), batch_size=8, seed=1, log_every=1, budget="6s",
                         progress=False)
    summary = finetune(cfg, timer=Ticks())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "lr" in r]
    lrs = [r["lr"] for r in train]
    # the whole budget and no more: past it only by the clock reads of the closing work (10 reads: 0.2 s)
    assert summary["train_s"] <= 6.2 and train[-1]["elapsed_s"] > 5.0
    assert summary["epochs_run"] > 1 and len(train) == summary["steps"]  # past an epoch's end (8 steps)
    step_s = train[-1]["elapsed_s"] - train[-2]["elapsed_s"]
    assert max(lrs) == pytest.approx(5e-5, rel=0.05) and lrs[-1] < max(lrs) * 2 * step_s / (6 - train[0]["elapsed_s"])


def test_bad_runtime_options(tmp_path, tiny_bert, data, capsys):
    assert main(_args(tiny_bert, data, tmp_path / "a", "--grad-accum", "3")) == 2
    assert "not divisible by --grad-accum 3" in capsys.readouterr().err
    assert main(_args(tiny_bert, data, tmp_path / "b", "--budget", "soon")) == 2
    assert "budget 'soon'" in capsys.readouterr().err
    assert main(_args(tiny_bert, data, tmp_path / "c", "--save-every", "-1")) == 2
    assert "--save-every" in capsys.readouterr().err


def test_native_bf16_is_amx_or_avx512_bf16(monkeypatch):
    from bertkit import precision
    for amx, avx512_bf16 in ((False, False), (True, False), (False, True), (True, True)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        assert precision.native_bf16() == (amx or avx512_bf16)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")  # a torch without the check
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert precision.native_bf16() is False


def test_training_precision_auto_is_bf16_on_a_gpu_and_on_a_cpu_with_native_bf16(monkeypatch):
    from bertkit import precision
    from bertkit.errors import BertkitError
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert precision.training_precision(gpu) == "bf16"
    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(precision, "native_bf16", lambda: native)
        assert precision.training_precision(cpu) == want
        assert precision.training_precision(cpu, "fp32") == "fp32"
        assert precision.training_precision(cpu, "bf16") == "bf16"
    with pytest.raises(BertkitError, match="unknown precision 'fp16'"):
        precision.training_precision(cpu, "fp16")


def test_finetune_precision_runs_the_steps_in_bf16_and_evaluates_in_fp32(tmp_path, tiny_bert, data, monkeypatch):
    """--precision bf16: the training forward runs under bf16 autocast (the head sees bf16 hidden
    states), evaluation in fp32; fp32 runs no step in bf16. The choice is in summary.json."""
    from bertkit.tasks.classify import ClassifyTask
    seen = []
    real = ClassifyTask.forward

    def spy(self, model, batch):
        seen.append((model.training, torch.is_autocast_enabled("cpu")))
        return real(self, model, batch)
    monkeypatch.setattr(ClassifyTask, "forward", spy)
    for precision in ("bf16", "fp32"):
        seen.clear()
        out = tmp_path / precision
        assert main(_args(tiny_bert, data, out, "--epochs", "1", "--precision", precision)) == 0
        assert json.loads((out / "summary.json").read_text())["precision"] == precision
        assert {autocast for training, autocast in seen if training} == {precision == "bf16"}
        assert {autocast for training, autocast in seen if not training} == {False}  # evaluation
    from bertkit.errors import BertkitError
    from bertkit.finetune import FinetuneConfig
    with pytest.raises(BertkitError, match="--precision must be one of auto, fp32, bf16, got 'fp16'"):
        FinetuneConfig(task="classify", model=str(tiny_bert), train="t", eval="e", out="o", precision="fp16")


def test_an_epochs_evaluation_run_again_after_a_resume_is_logged_once(tmp_path, tiny_bert, data, monkeypatch, capsys):
    """--save-every can land on an epoch's last step: that checkpoint is inside the epoch, so a
    crash after the epoch's evaluation and before its end's checkpoint re-runs the evaluation on
    --resume, and metrics.jsonl had it twice."""
    import bertkit.finetune as ft

    class Stop(Exception):
        pass
    real = ft.finetune

    def at_step_8(step, model):
        if step == 8:
            raise Stop

    def stop_after_step_8(cfg, on_step=None):
        return real(cfg, on_step=at_step_8)
    out = tmp_path / "ft"
    monkeypatch.setattr(ft, "finetune", stop_after_step_8)
    with pytest.raises(Stop):  # 64 examples in batches of 8: step 8 ends epoch 1, and saves
        main(_args(tiny_bert, data, out, "--epochs", "1"))
    monkeypatch.setattr(ft, "finetune", real)
    state = json.loads((out / "checkpoints" / "step_0000008" / "trainer.json").read_text())
    assert (state["epoch"], state["batch"]) == (1, 8)
    with (out / "metrics.jsonl").open("a") as f:  # the evaluation that ran before the crash
        f.write(json.dumps({"step": 8, "epoch": 1, "eval_loss": 0.7, "eval_accuracy": 0.5}) + "\n")
    assert main(_args(tiny_bert, data, out, "--epochs", "1", "--resume")) == 0
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_loss" in r]
    assert [r["epoch"] for r in evals] == [1] and evals[0]["eval_loss"] != 0.7


@pytest.mark.parametrize("stop", ["patience", "budget"])
def test_resuming_a_run_that_stopped_early_or_ran_out_of_budget_trains_no_more(tmp_path, tiny_bert, data, monkeypatch,
                                                                               stop):
    """A run stopped between its last checkpoint and its summary.json (a crash while plotting):
    --resume trained on past its early stop (another epoch) or its budget (a step and an
    evaluation more), as if the run had not ended."""
    import bertkit.training.run as run_module
    from bertkit.tasks.classify import ClassifyTask
    small = tmp_path / "data"
    small.mkdir()
    (small / "train.jsonl").write_text("".join((data / "train.jsonl").read_text().splitlines(True)[:9]))
    (small / "dev.jsonl").write_text("".join((data / "dev.jsonl").read_text().splitlines(True)[:5]))
    # the same accuracy every epoch: patience 1 stops after epoch 2 of 4
    monkeypatch.setattr(ClassifyTask, "metrics", lambda self, preds, examples: {"accuracy": 0.5})
    out = tmp_path / "run"
    args = _args(tiny_bert, small, out,
                 *(("--epochs", "4", "--patience", "1") if stop == "patience" else ("--budget", "2s")))

    class Crash(Exception):
        pass

    def crash(*args, **kwargs):
        raise Crash
    monkeypatch.setattr(run_module, "plot_losses", crash)
    with pytest.raises(Crash):
        main(args)
    monkeypatch.undo()
    monkeypatch.setattr(ClassifyTask, "metrics", lambda self, preds, examples: {"accuracy": 0.5})
    state = json.loads(sorted((out / "checkpoints").glob("step_*/trainer.json"))[-1].read_text())
    assert state["finished"] and not (out / "summary.json").exists()
    assert main([*args, "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["epochs_run"]) == (state["step"], len(state["history"]))
    if stop == "patience":
        assert summary["epochs_run"] == 2


def test_resume_refuses_a_training_file_whose_labels_changed(tmp_path, tiny_bert, data, monkeypatch, capsys):
    """The training file edited between the stop and --resume: a new label was a size-mismatch
    traceback from load_state_dict; a label renamed (as many labels) resumed silently with the
    head's rows meaning other labels."""
    import bertkit.finetune as ft

    class Stop(Exception):
        pass
    real = ft.finetune

    def stop_at_2(cfg, on_step=None):
        return real(cfg, on_step=lambda step, model: (_ for _ in ()).throw(Stop()) if step == 2 else None)
    small = tmp_path / "data"
    small.mkdir()
    rows = (data / "train.jsonl").read_text().splitlines(True)[:16]
    (small / "train.jsonl").write_text("".join(rows))
    dev = "".join((data / "dev.jsonl").read_text().splitlines(True)[:5])
    (small / "dev.jsonl").write_text(dev)
    out = tmp_path / "run"
    monkeypatch.setattr(ft, "finetune", stop_at_2)
    with pytest.raises(Stop):
        main(_args(tiny_bert, small, out, "--epochs", "1"))
    monkeypatch.setattr(ft, "finetune", real)
    added = "".join(rows) + '{"text": "Meh.", "label": "meh"}\n'
    rename = lambda text: text.replace('"rotten"', '"bad"')  # noqa: E731
    (small / "train.jsonl").write_text(added)
    assert main(_args(tiny_bert, small, out, "--epochs", "1", "--resume")) == 2
    assert "content of --train: changed since the run began" in capsys.readouterr().err  # the file's bytes
    # a checkpoint that records no digests (an earlier version's): the labels still tell
    state_file = out / "checkpoints" / "step_0000002" / "trainer.json"
    state = json.loads(state_file.read_text())
    state["options"] = {k: v for k, v in state["options"].items() if not k.startswith("content of ")}
    state_file.write_text(json.dumps(state))
    for train, eval, message in ((added, dev, "(new: meh; gone: none)"),
                                 (rename("".join(rows)), rename(dev), "(new: bad; gone: rotten)")):
        (small / "train.jsonl").write_text(train)
        (small / "dev.jsonl").write_text(eval)
        assert main(_args(tiny_bert, small, out, "--epochs", "1", "--resume")) == 2
        assert f"its labels are not those of the run in {out} {message}" in capsys.readouterr().err
    assert (out / "checkpoints" / "step_0000002").is_dir()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: on a CPU every output is on the CPU")
def test_evaluation_over_ranks_gathers_outputs_on_the_cpu(tiny_bert, data):
    """all_gather_object pickles: a CUDA tensor comes back on the sending rank's GPU, and rank 0
    concatenated classify's probabilities from two GPUs (an error in every multi-GPU run)."""
    from bertkit.finetune import evaluate_in_parts
    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tokenizer import load_tokenizer
    from bertkit.training.distributed import Processes

    class Gathered(Exception):
        pass

    class TwoRanks(Processes):
        def gather(self, value):
            self.sent = value
            raise Gathered
    task = get_task("classify")()
    examples = task.read(data / "dev.jsonl")[:6]
    task.fit(task.read(data / "train.jsonl"), {"pooling": "pooler"})
    tok = load_tokenizer(tiny_bert)
    bert, _ = load_model(tiny_bert, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert)).cuda()
    procs = TwoRanks(0, 2, torch.device("cuda"))
    with pytest.raises(Gathered):
        evaluate_in_parts(task, model, task.features(examples, tok, 64), examples, tok, 4, procs)
    outputs, _ = procs.sent
    assert outputs and all(t.device.type == "cpu" for t in outputs)


def test_a_second_finetune_on_the_same_out_is_refused_and_the_first_ends_as_if_alone(tmp_path, tiny_bert, data,
                                                                                    capsys):
    """A real process writes --out; a second run into it (new, --overwrite or --resume; here, in
    this process) is refused by name while the first writes (both ended 'saved' with the second's
    model before the lock)."""
    import time
    out = tmp_path / "ft"
    args = _args(tiny_bert, data, out, "--epochs", "2", "--batch-size", "2")
    first = subprocess.Popen([sys.executable, "-m", "bertkit", *args], env={**os.environ, "OMP_NUM_THREADS": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = time.monotonic()
    while time.monotonic() - t < 120 and first.poll() is None and not (out / "metrics.jsonl").is_file():
        time.sleep(0.05)
    assert first.poll() is None, "the first run ended before the second could start"
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert f"{out} is being written by another bertkit process" in err, err[-500:]
    assert first.poll() is None  # the refusals came while it ran
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-500:]
    summary = json.loads((out / "summary.json").read_text())
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert summary["epochs_run"] == 2 and steps == list(range(1, summary["steps"] + 1))
