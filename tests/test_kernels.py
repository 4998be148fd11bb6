"""The kernels' backend (bertkit/kernels): the default kernels against the REFERENCE backend's
plain torch, a block-scoped choice, and the pretraining forward's outputs decided by its
arguments and the backend, never by whether gradients are on. Each kernel alone is tested
against plain torch in test_model.py."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertForPreTraining, kernels
from bertkit.kernels import dropout as kdrop


def _batch(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (6, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding
    positions = torch.randint(1, 6, (6, 3), generator=g)
    labels = torch.randint(5, cfg.vocab_size, (6, 3), generator=g)
    labels[2, 1:] = -100  # unused slots
    return dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask, mlm_positions=positions,
                mlm_labels=labels, nsp_labels=torch.randint(0, 2, (6,), generator=g))


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch, mlm_denominator=15.0)
    out.loss.backward()
    return out, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_a_pretraining_step_on_the_default_kernels_equals_the_reference_backend(tiny_bert_factory):
    model = tiny_bert_factory.model(BertForPreTraining, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)  # masks differ by design
    cfg = model.config
    batch = _batch(cfg)
    fast, fast_grads = _step(model, batch)
    with kernels.use(kernels.REFERENCE):
        plain, plain_grads = _step(model, batch)
    # the fused loss keeps no logits and the last layer ran at the slots only; the reference has both
    assert fast.mlm_logits is None and fast.sequence_output is None
    assert plain.mlm_logits.shape == (6, 3, cfg.vocab_size) and plain.sequence_output.shape == (6, 9, cfg.hidden_size)
    torch.testing.assert_close(fast.loss, plain.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(fast.mlm_correct, plain.mlm_correct)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # and a choice that differs shows: without the fused loss the gradients stay, the logits come back
    with kernels.use(dataclasses.replace(kernels.AUTO, fused_mlm_loss=False)):
        mixed, _ = _step(model, batch)
    assert mixed.mlm_logits is not None and mixed.sequence_output is None


def test_the_pretraining_forward_returns_the_same_fields_with_or_without_gradients(tiny_bert_factory):
    cfg = tiny_bert_factory.config()
    model = BertForPreTraining(cfg).eval()
    batch = _batch(cfg, seed=1)
    fields = lambda out: {f.name for f in dataclasses.fields(out) if getattr(out, f.name) is None}  # noqa: E731
    for extra in ({}, {"logits": True}):
        with torch.no_grad():
            off = model(**batch, **extra)
        on = model(**batch, **extra)
        assert fields(off) == fields(on), extra
        torch.testing.assert_close(off.loss, on.loss.detach(), rtol=1e-5, atol=1e-6)
    assert on.mlm_logits is not None and off.mlm_predictions is not None  # logits=True: evaluation's fields


def test_the_backend_holds_for_its_block_and_its_thread_only():
    assert kernels.current() is kernels.AUTO
    seen = []
    with kernels.use(kernels.REFERENCE):
        with kernels.use(dataclasses.replace(kernels.REFERENCE, bulk_dropout=True)) as inner:
            assert kernels.current() is inner
        assert kernels.current() is kernels.REFERENCE
        t = threading.Thread(target=lambda: seen.append(kernels.current()))
        t.start()
        t.join()
    assert kernels.current() is kernels.AUTO and seen == [kernels.AUTO]


def test_the_reference_dropout_is_torchs_own():
    x = torch.randn(64, 33)
    torch.manual_seed(3)
    want = F.dropout(x, 0.3, True)
    torch.manual_seed(3)
    with kernels.use(kernels.REFERENCE):
        assert torch.equal(kdrop.dropout(x, 0.3), want)
    torch.manual_seed(3)
    bulk = kdrop.dropout(x, 0.3)  # bulk masks: another draw, the same scaling
    kept = bulk != 0
    assert not torch.equal(bulk, want)
    torch.testing.assert_close(bulk[kept], x[kept] / 0.7)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_attention_in_the_reference_backend_is_sdpa(p):
    from bertkit.kernels.attention import attention
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5]).bool()[:, None, None, :]
    heads = lambda t: t.unflatten(2, (2, 4)).transpose(1, 2)  # noqa: E731
    torch.manual_seed(4)
    want = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask, dropout_p=p)
    torch.manual_seed(4)
    with kernels.use(kernels.REFERENCE):
        got = attention(q, k, v, 2, mask, p)
    assert torch.equal(got, want.transpose(1, 2).reshape(2, 5, 8))
