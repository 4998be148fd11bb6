"""ELECTRA's replaced-token detection (`pretrain --objective electra`): its masking, its
sampling, its losses against the plain path, an exact resume, torchrun, and folders that
transformers loads."""
import contextlib
import json
import math
import os
import subprocess

import pytest
import torch
from helpers import torchrun
from safetensors.torch import load_file

from bertkit import BertkitError
from bertkit.cli import main
from bertkit.pretraining import electra
from bertkit.pretraining.data import phase_batches
from bertkit.pretraining.train import PretrainConfig, pretrain


def _cfg(corpus, out, **kw):
    base = dict(corpus=str(corpus), model="tiny", out=str(out), steps=6, batch_size=16, max_len=32,
                vocab_size=600, holdout_every=6, eval_every=3, eval_pairs=32, save_every=3, log_every=1,
                seed=3, progress=False, sentence_per_line=True, objective="electra")
    return PretrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def setup(tmp_path_factory, wiki_excerpt, vocab):
    """A dropout-free tiny ELECTRA pair and real batches of the run's own masking."""
    from bertkit import BertConfig, WordPieceTokenizer
    from bertkit.pretraining.corpus import iter_documents
    from bertkit.pretraining.shards import tokenize_corpus
    tok = WordPieceTokenizer.from_folder(vocab)
    store, _ = tokenize_corpus(iter_documents(wiki_excerpt, per_line=True), tok, tmp_path_factory.mktemp("shards"),
                               holdout_every=0)
    batches = phase_batches(_cfg(wiki_excerpt, "unused", vocab=str(vocab), batch_size=64), 1, store, tok)
    cfg = BertConfig.preset("tiny", vocab_size=tok.vocab_size, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return electra.build(cfg), batches, tok


def _forward(model, b, **kw):
    return model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"],
                 mlm_labels=b["mlm_labels"], **kw)


def test_the_generator_reads_mask_at_every_chosen_position(setup):
    """The paper's masking: no random or unchanged tenth (the discriminator gets those from the
    generator), the recipe's share of the text tokens chosen, capped per sequence."""
    _, batches, tok = setup
    chosen = text = 0
    for _, (_, b) in zip(range(5), batches.iterate()):
        valid = b["mlm_labels"] != -100
        seen = b["input_ids"].gather(1, b["mlm_positions"])
        assert bool((seen[valid] == tok.mask_id).all())
        assert bool((b["mlm_labels"][valid] != tok.mask_id).all())
        chosen += int(valid.sum())
        text += int(b["attention_mask"].sum()) - 3 * b["input_ids"].size(0)  # [CLS] A [SEP] B [SEP]
        assert int((b["input_ids"] == tok.mask_id).sum()) == int(valid.sum())  # [MASK] nowhere else
    assert 0.25 < chosen / text < 0.33, chosen / text  # the fast recipe's 30%, rounded per pair


def test_replacements_are_the_generators_samples_and_only_at_chosen_positions(setup):
    model, batches, tok = setup
    b = next(batches.iterate())[1]
    favourite = tok.token_to_id("the")
    with torch.no_grad():
        saved = model.generator.mlm.bias.clone()
        model.generator.mlm.bias.fill_(-1e4)
        model.generator.mlm.bias[favourite] = 1e4  # the generator always samples "the"
        try:
            o = _forward(model, b)
        finally:
            model.generator.mlm.bias.copy_(saved)
    valid = b["mlm_labels"] != -100
    expected = torch.zeros_like(o.replaced)
    expected.scatter_(1, b["mlm_positions"], valid & (b["mlm_labels"] != favourite))
    assert torch.equal(o.replaced, expected)  # where "the" was the original, nothing was replaced
    assert 0 < int(o.replaced.sum()) < int(valid.sum())
    tokens = b["attention_mask"].bool()
    assert torch.equal(o.rtd_correct, ((o.rtd_logits > 0) == o.replaced) & tokens)


def test_the_fused_training_losses_equal_the_plain_ones(setup):
    """The generator's MLM loss is the fused kernel's; in the REFERENCE backend, plain cross-
    entropy over full logits. The same samples (the same RNG state) give the same figures."""
    from bertkit import kernels
    model, batches, _ = setup
    b = next(batches.iterate())[1]
    torch.manual_seed(11)
    fused = _forward(model, b)
    torch.manual_seed(11)
    with kernels.use(kernels.REFERENCE):
        plain = _forward(model, b)
    assert torch.equal(fused.replaced, plain.replaced)
    assert torch.equal(fused.mlm_correct, plain.mlm_correct)
    assert fused.mlm_loss.item() == pytest.approx(plain.mlm_loss.item(), rel=1e-5)
    assert fused.rtd_loss.item() == pytest.approx(plain.rtd_loss.item(), rel=1e-5)
    assert fused.loss.item() == pytest.approx(plain.mlm_loss.item() + electra.RTD_WEIGHT * plain.rtd_loss.item(),
                                              rel=1e-5)
    fused.loss.backward()
    shared = model.bert.embeddings.word.weight
    assert shared is model.generator.mlm.decoder_weight and shared.grad is not None
    assert model.generator.bert.layers[0].attn.qkv.weight.grad.abs().sum() > 0  # the generator learns too
    model.zero_grad(set_to_none=True)


def test_gradient_accumulation_gives_the_gradients_of_one_batch(setup):
    """Two micro-batches weigh every prediction and every token as one batch does (a generator
    that samples one token makes the replacements the same however the batch is split)."""
    model, batches, tok = setup
    b = next(batches.iterate())[1]
    b["mlm_labels"][:8, 1:] = -100  # the first micro-batch predicts far fewer tokens
    n, m = int((b["mlm_labels"] != -100).sum()), int(b["attention_mask"].sum())
    grads = []
    with torch.no_grad():
        saved = model.generator.mlm.bias.clone()
        model.generator.mlm.bias.fill_(-1e4)
        model.generator.mlm.bias[tok.token_to_id("the")] = 1e4
    try:
        for accum in (1, 2):
            model.zero_grad(set_to_none=True)
            stats = electra.accumulate_gradients(model, b, n_predictions=n, n_tokens=m, grad_accum=accum, world=1,
                                                 mask_id=tok.mask_id, autocast=contextlib.nullcontext())
            grads.append(({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, stats))
    finally:
        with torch.no_grad():
            model.generator.mlm.bias.copy_(saved)
        model.zero_grad(set_to_none=True)
    (one, s1), (two, s2) = grads
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-6, msg=k)
    torch.testing.assert_close(s1, s2, rtol=1e-6, atol=1e-6)
    assert s1[9] == m and s1[3] == int(((b["mlm_labels"] != -100)).sum())  # tokens; [MASK] = all predictions


def test_the_discriminator_learns_which_tokens_were_replaced(setup):
    """Fifty steps on one batch: the detection loss falls below the entropy of the replaced
    share (what knowing only that share gives) and its calls beat always answering "original"."""
    import copy
    model, batches, _ = setup
    model = copy.deepcopy(model)
    b = next(batches.iterate())[1]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(0)
    for _ in range(50):
        o = _forward(model, b)
        opt.zero_grad()
        o.loss.backward()
        opt.step()
    with torch.no_grad():
        o = _forward(model, b)
    tokens = b["attention_mask"].bool()
    rate = o.replaced[tokens].float().mean().item()
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert o.rtd_loss.item() < entropy - 0.1, (o.rtd_loss.item(), entropy)
    assert o.rtd_correct[tokens].float().mean().item() > (1 - rate) + 0.03


def test_resume_after_a_stop_equals_an_uninterrupted_run(tmp_path, wiki_excerpt, vocab):
    class Stop(Exception):
        pass

    def stop_at_3(step, model):
        if step == 3:
            raise Stop
    pretrain(_cfg(wiki_excerpt, tmp_path / "a", vocab=str(vocab)))
    with pytest.raises(Stop):
        pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab)), on_step=stop_at_3)
    pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab), resume=True))
    for name in ("model.safetensors", "generator/model.safetensors"):
        a, b = load_file(str(tmp_path / "a" / name)), load_file(str(tmp_path / "b" / name))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (name, k)
    lines = lambda out: [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "pairs_per_s")}
                         for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines(tmp_path / "a") == lines(tmp_path / "b")
    newest = tmp_path / "a" / "checkpoints" / "step_0000006"
    assert (newest / electra.RTD_HEAD).is_file()
    # the generator's files are in the checkpoint's manifest: damage there is found, not resumed from
    from bertkit.training.checkpoints import checkpoint_problem
    with open(newest / "generator" / "model.safetensors", "r+b") as f:
        f.seek(-8, 2)
        last = f.read(1)
        f.seek(-8, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    assert checkpoint_problem(newest) == "generator/model.safetensors does not match its checksum"


def test_a_short_run_learns_to_detect_and_saves_folders_transformers_loads(tmp_path, wiki_excerpt, capsys):
    out = tmp_path / "run"
    assert main(["pretrain", "--objective", "electra", "--corpus", str(wiki_excerpt), "--sentence-per-line",
                 "--out", str(out), "--steps", "80", "--batch-size", "32", "--max-len", "64", "--vocab-size", "600",
                 "--holdout-every", "6", "--eval-every", "40", "--save-every", "0", "--log-every", "1", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "detection accuracy" in printed and "fill-mask on held-out sentences" in printed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert all({"mlm_loss", "rtd_loss", "mlm_acc", "rtd_acc", "rtd_replaced_recall"} <= set(r) for r in train)
    assert not any("nsp_loss" in r for r in records)
    # the generator learns: from about ln(600) = 6.4 (uniform guessing)
    assert train[0]["mlm_loss"] > 6.2 and train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 0.5, (train[0], train[-1])
    ev = json.loads((out / "summary.json").read_text())["final_eval"]
    # 80 steps leave the discriminator where 80 steps leave MLM, on the unigram plateau: it has learned how
    # often tokens are replaced (the loss from ln 2 to about the entropy of that rate), not yet which ones
    # (test_the_discriminator_learns_which_tokens_were_replaced)
    rate = 1 - ev["eval_rtd_original_acc"]
    assert 0.05 < rate < 0.3, ev
    assert ev["eval_rtd_loss"] < math.log(2) - 0.15, ev
    assert not any("nsp" in k for k in ev)
    assert json.loads((out / "bertkit.json").read_text())["objective"] == "electra"
    # the discriminator is a plain BertModel folder: transformers reads it, with the same outputs as bertkit
    from transformers import BertForMaskedLM, BertModel

    from bertkit.folders import load_model
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    assert not any(k.startswith(("cls.", "generator", "rtd")) for k in load_file(str(out / "model.safetensors")))
    ours, _ = load_model(out, heads=False)
    hf = BertModel.from_pretrained(str(out)).eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).sequence_output, hf(ids).last_hidden_state, rtol=1e-4, atol=1e-5)
    # the generator beside it, a fill-mask model that shares its embeddings
    capsys.readouterr()
    assert main(["fill-mask", "--model", str(out), "Paris is the [MASK] of France."]) == 2
    assert f"its generator fills masks (--model {out / 'generator'})" in capsys.readouterr().err
    assert main(["fill-mask", "--model", str(out / "generator"), "Paris is the [MASK] of France."]) == 0
    assert json.loads(capsys.readouterr().out)["predictions"]
    gen = BertForMaskedLM.from_pretrained(str(out / "generator"))
    assert gen.config.num_hidden_layers == 1
    assert torch.equal(gen.bert.embeddings.word_embeddings.weight, hf.embeddings.word_embeddings.weight)


def test_torchrun_with_two_processes(tmp_path, wiki_excerpt, vocab):
    """DDP with the encoders' poolers and the generator's NSP head left out of the loss."""
    out = tmp_path / "ddp"
    args = ["--objective", "electra", "--corpus", str(wiki_excerpt), "--sentence-per-line", "--vocab", str(vocab),
            "--out", str(out), "--steps", "3", "--batch-size", "16", "--max-len", "32", "--holdout-every", "6",
            "--eval-every", "3", "--save-every", "3", "--log-every", "1", "--seed", "3", "--no-samples"]
    run = subprocess.run([*torchrun(2), "-m", "bertkit", "pretrain", *args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in lines if "loss" in r)
    # one process, the same global batches: the first step's losses agree (samples and dropout differ)
    single = pretrain(_cfg(wiki_excerpt, tmp_path / "one", vocab=str(vocab), steps=1, save_every=0))
    assert abs(lines[0]["mlm_loss"] - single["final_train"]["mlm_loss"]) < 0.1


def test_an_unknown_objective_or_a_negative_weight_is_refused(tmp_path, wiki_excerpt):
    with pytest.raises(BertkitError, match="unknown objective 'gpt'; choose one of mlm-nsp, electra"):
        _cfg(wiki_excerpt, tmp_path / "x", objective="gpt")
    with pytest.raises(BertkitError, match="--rtd-weight must be a number >= 0, got -1"):
        _cfg(wiki_excerpt, tmp_path / "x", rtd_weight=-1.0)
    with pytest.raises(BertkitError, match="--generator-layers must be 0 .+ got -2"):
        _cfg(wiki_excerpt, tmp_path / "x", generator_layers=-2)
    with pytest.raises(BertkitError, match=r"--mask-token-share must be in \[0, 1\], got 1.5"):
        _cfg(wiki_excerpt, tmp_path / "x", mask_token_share=1.5)


def test_bert_s_80_10_10_for_the_generator_when_asked(setup, wiki_excerpt, vocab):
    _, batches, tok = setup
    cfg = _cfg(wiki_excerpt, "unused", vocab=str(vocab), batch_size=64, mask_token_share=0.8)
    store = batches.store
    _, b = next(phase_batches(cfg, 1, store, tok).iterate())
    valid = b["mlm_labels"] != -100
    seen = b["input_ids"].gather(1, b["mlm_positions"])[valid]
    masked = (seen == tok.mask_id).float().mean().item()
    unchanged = (seen == b["mlm_labels"][valid]).float().mean().item()
    assert 0.7 < masked < 0.9 and 0.04 < unchanged < 0.18, (masked, unchanged)


def test_the_generator_has_half_the_layers_unless_told():
    from bertkit import BertConfig
    cfg = BertConfig.preset("mini", vocab_size=100)  # 4 layers
    assert len(electra.build(cfg).generator.bert.layers) == 2
    assert len(electra.build(cfg, generator_layers=3).generator.bert.layers) == 3
    assert len(electra.build(BertConfig.preset("tiny", vocab_size=100)).generator.bert.layers) == 1


def test_the_detection_weight_scales_the_detection_loss_only(setup):
    model, batches, _ = setup
    b = next(batches.iterate())[1]
    outs = []
    for weight in (50.0, 1.0):
        model.rtd_weight = weight
        torch.manual_seed(5)
        with torch.no_grad():
            outs.append(_forward(model, b))
    model.rtd_weight = electra.RTD_WEIGHT
    (a, b1) = outs
    assert a.rtd_loss == b1.rtd_loss and a.mlm_loss == b1.mlm_loss
    assert b1.loss.item() == pytest.approx(b1.mlm_loss.item() + b1.rtd_loss.item(), rel=1e-6)
