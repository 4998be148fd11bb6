import contextlib
import dataclasses

import pytest
import torch

from bertkit import PRESETS, BertConfig, BertForPreTraining, kernels
from bertkit.kernels import attention as kattn
from bertkit.kernels import dropout as kdrop
from bertkit.kernels import linear as klin


@pytest.fixture
def backend():
    """backend(onednn_linear=True): the kernels' backend from here to the test's end."""
    with contextlib.ExitStack() as stack:
        yield lambda **choices: stack.enter_context(kernels.use(dataclasses.replace(kernels.current(), **choices)))


def _inputs(cfg, B=13, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    types = torch.randint(0, cfg.type_vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 4:] = 0  # one padded row
    return ids, types, mask


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_with_hf_parameter_count_and_shapes(name):
    # meta tensors: full-size shapes and parameter counts without allocating base/large
    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining as HFPreTraining
    cfg = BertConfig.preset(name)
    with torch.device("meta"):
        ours = BertForPreTraining(cfg)
        hf = HFPreTraining(HFConfig(**{k: v for k, v in cfg.to_dict().items() if k != "architectures"}))
        ids = torch.zeros(2, 9, dtype=torch.long)
        out = ours(ids, attention_mask=torch.ones_like(ids), mlm_positions=torch.zeros(2, 3, dtype=torch.long))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    assert out.sequence_output.shape == (2, 9, cfg.hidden_size)
    assert out.pooled_output.shape == (2, cfg.hidden_size)
    assert out.mlm_logits.shape == (2, 3, cfg.vocab_size)
    assert out.nsp_logits.shape == (2, 2)


def test_pretraining_heads_shapes_losses_and_gradients(tiny_bert_factory):
    model = tiny_bert_factory.model(BertForPreTraining)
    cfg = model.config
    ids, types, mask = _inputs(cfg)
    positions = torch.randint(0, 4, (13, 3))
    labels = torch.randint(0, cfg.vocab_size, (13, 3))
    labels[1, 2] = -100  # a padded prediction slot
    nsp = torch.randint(0, 2, (13,))
    with torch.no_grad():
        assert model(ids, types, mask, mlm_positions=positions).mlm_logits.shape == (13, 3, 99)
    out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp)
    assert out.mlm_correct.shape == (13, 3) and out.nsp_logits.shape == (13, 2)
    assert out.sequence_output is None and out.pooled_output.shape == (13, 32)  # the last layer ran at the slots only
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if not name.startswith("bert.embeddings.position") and "segment" not in name:
            assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_mlm_decoder_is_tied_to_word_embeddings(tiny_bert_factory):
    model = BertForPreTraining(tiny_bert_factory.config())
    assert model.mlm.decoder_weight is model.bert.embeddings.word.weight
    # one parameter, counted once
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))


def test_mlm_head_projects_only_the_given_positions(tiny_bert_factory):
    cfg = tiny_bert_factory.config()
    torch.manual_seed(1)
    model = BertForPreTraining(cfg).eval()
    ids, types, mask = _inputs(cfg)
    positions = torch.tensor([[1, 3], [0, 2]] + [[1, 1]] * 11)
    calls = []
    model.mlm.register_forward_hook(lambda m, inp, out: calls.append(inp[0].shape))
    with torch.no_grad():
        out = model(ids, types, mask, mlm_positions=positions)
        full = model.mlm(out.sequence_output.reshape(-1, cfg.hidden_size)).view(13, 7, -1)
    assert calls[0] == (13 * 2, cfg.hidden_size)  # 26 rows projected, not 13 * 7
    expected = full.gather(1, positions[..., None].expand(-1, -1, cfg.vocab_size))
    torch.testing.assert_close(out.mlm_logits, expected)


def test_bert_model_gradients_and_padding_does_not_leak(tiny_bert_factory):
    model = tiny_bert_factory.model(seed=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg = model.config
    ids, types, mask = _inputs(cfg)
    out = model(ids, types, mask)
    out.pooled_output.sum().backward()
    for name, p in model.named_parameters():  # every weight reaches the pooled output, finitely
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    # what sits in the padded positions of row 0 must not change its real tokens
    ids2 = ids.clone()
    ids2[0, 4:] = torch.randint(5, 99, (3,))
    with torch.no_grad():
        a = model(ids, types, mask).sequence_output[0, :4]
        b = model(ids2, types, mask).sequence_output[0, :4]
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_mlm_loss_equals_the_plain_cross_entropy(tiny_bert_factory, autocast):
    """The training path (fused linear + cross-entropy at the used slots) gives the loss,
    predictions and gradients of the plain path (logits, then F.cross_entropy)."""
    import torch.nn.functional as F

    model = tiny_bert_factory.model(BertForPreTraining, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with torch.no_grad():
        model.mlm.bias.normal_(0, 0.5)  # a bias that matters
    ids = torch.randint(5, 99, (13, 7))
    positions = torch.randint(0, 7, (13, 3))
    labels = torch.randint(5, 99, (13, 3))
    labels[:4, 2] = -100  # unused slots
    nsp = torch.randint(0, 2, (13,))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)

    def run(fused: bool):
        model.zero_grad(set_to_none=True)
        with ctx:
            if fused:
                out = model(ids, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp, mlm_denominator=20.0)
                assert out.mlm_logits is None
                assert out.mlm_predictions is None
                mlm, pred = out.mlm_loss, out.mlm_correct
            else:
                out = model(ids, mlm_positions=positions, nsp_labels=nsp)
                mlm = F.cross_entropy(out.mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                      reduction="sum") / 20.0
                pred = out.mlm_logits.argmax(-1) == labels
        (mlm + out.nsp_loss).backward()
        return mlm.detach(), pred, {k: p.grad.clone() for k, p in model.named_parameters()}

    loss_f, pred_f, grads_f = run(True)
    loss_p, pred_p, grads_p = run(False)
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loss_f, loss_p, **tol)
    used = labels != -100
    if not autocast:  # bf16 rounding may flip near-ties
        assert torch.equal(pred_f[used], pred_p[used])
    for name in grads_p:
        torch.testing.assert_close(grads_f[name], grads_p[name], **tol, msg=name)
    assert not pred_f[~used].any()
    # evaluation asks for the logits: the plain loss beside them, with or without gradients
    with torch.no_grad():
        out = model(ids, mlm_positions=positions, mlm_labels=labels, logits=True)
    assert out.mlm_logits.shape == (13, 3, 99)
    assert torch.equal(out.mlm_correct, (out.mlm_predictions == labels) & used)
    torch.testing.assert_close(out.mlm_loss * used.sum(), loss_p * 20.0, rtol=1e-4, atol=1e-5)



@pytest.mark.parametrize("per_head", [True, False])
def test_training_runs_the_last_layer_at_cls_and_the_slots_only_with_the_full_layers_result(monkeypatch, per_head,
                                                                                             tiny_bert_factory):
    """Pretraining reads the last layer at [CLS] and the predicted slots only, so the training
    path computes it only there (keys and values still from every token): the loss and every
    gradient equal those of the full last layer, with padding, on both spelled-out attention
    paths (p -> 0 keeps every element) and SDPA's."""
    import torch.nn.functional as F

    from bertkit import model as bk
    monkeypatch.setattr(kattn, "PER_HEAD_MIN", 0 if per_head else 1 << 60)
    net = tiny_bert_factory.model(BertForPreTraining, seed=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg = net.config
    ids, types, mask = _inputs(cfg)
    positions = torch.randint(0, 4, (13, 3))
    labels = torch.randint(5, 99, (13, 3))
    labels[2, 1:] = -100  # unused slots (position 0 there is [CLS] again)
    positions[2, 1:] = 0
    nsp = torch.randint(0, 2, (13,))
    rows = []
    net.bert.layers[-1].ffn_in.register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[:2]))

    def run(sparse: bool, p: float):
        bk.set_dropout(net, p)
        net.zero_grad(set_to_none=True)
        if sparse:
            out = net(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp,
                      mlm_denominator=30.0)
            loss = out.mlm_loss + out.nsp_loss
        else:  # the plain path: every layer at every position, then the heads
            out = net.bert(ids, types, mask)
            picked = bk.gather_rows(out.sequence_output, positions)
            loss = F.cross_entropy(net.mlm(picked).flatten(0, 1), labels.flatten(), ignore_index=-100,
                                   reduction="sum") / 30.0
            loss = loss + F.cross_entropy(net.nsp(out.pooled_output), nsp)
        loss.backward()
        return loss.detach(), {k: q.grad.clone() for k, q in net.named_parameters()}

    for p in (0.0, 1e-12):  # SDPA, then the spelled-out path
        rows.clear()
        loss_s, grads_s = run(True, p)
        assert rows == [(13, 1 + 3)]  # the last layer's FFN saw [CLS] and the 3 slots of each row
        loss_p, grads_p = run(False, p)
        assert rows[-1] == (13, 7)
        torch.testing.assert_close(loss_s, loss_p, rtol=1e-5, atol=1e-6)
        for name in grads_p:
            torch.testing.assert_close(grads_s[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)


def test_attention_from_some_queries_equals_the_full_attention_at_those_rows(monkeypatch):
    from bertkit import model as bk
    g = torch.Generator().manual_seed(6)
    B, T, nh, hs = 3, 8, 2, 4
    qkv = torch.randn(B, T, 3 * nh * hs, generator=g)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [1] * 2 + [0] * 6]).bool()[:, None, None, :]
    rows = torch.tensor([[0, 7, 3], [0, 1, 1], [0, 4, 2]])
    H = nh * hs
    for per_head in (True, False):
        monkeypatch.setattr(kattn, "PER_HEAD_MIN", 0 if per_head else 1 << 60)
        for p in (0.0, 1e-12):
            q, k, v = qkv.split(H, dim=2)
            full = kattn.attention(q, k, v, nh, mask, p)
            some = kattn.attention(bk.gather_rows(q, rows), k, v, nh, mask, p)
            torch.testing.assert_close(some, bk.gather_rows(full, rows), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mlm_loss_is_exact_where_the_labels_probability_underflows(dtype):
    """The fused loss reads -log p(label) off the softmax; a row whose label is ~100 nats below
    the top has p = 0 there, and its loss comes from logsumexp instead (finite, exact)."""
    import torch.nn.functional as F

    from bertkit.kernels.cross_entropy import LinearCrossEntropy
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 8, generator=g)
    w = torch.randn(11, 8, generator=g)
    b = torch.zeros(11)
    b[3] = -150.0  # token 3 is never likely: p = 0 in fp32 and bf16
    labels = torch.tensor([3, 0, 3, 5, 3, 1])  # row 4: in the chunk with the padding
    logits = (h.to(dtype) @ w.to(dtype).t() + b.to(dtype)).float()
    expected = F.cross_entropy(logits, labels, reduction="sum") / 6.0
    assert expected > 40
    # chunks of 4 rows: 2 chunks; then 2 padding rows in the second chunk (the training path pads
    # to a multiple of 64 rows: the underflowing rows were picked among the padded ones, an IndexError)
    for rows in (h, torch.cat([h, torch.zeros(2, 8)])):
        loss, hit = LinearCrossEntropy.apply(rows.to(dtype), w, b, labels, 6.0, 4)
        assert torch.isfinite(loss)
        torch.testing.assert_close(loss, expected, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)
        assert torch.equal(hit, logits.argmax(-1) == labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mlm_hit_breaks_ties_as_argmax_does(dtype):
    """A label tied with an earlier token at the row's maximum is argmax's miss: `>= max` counted
    it a hit (bf16 logits tie at the top in 2% of the rows near the unigram plateau: training
    mlm_acc counted 1,530 hits in 13,575 where argmax of the same logits has 1,515)."""
    from bertkit.kernels.cross_entropy import LinearCrossEntropy
    g = torch.Generator().manual_seed(3)
    h = torch.randn(6, 8, generator=g)
    w = torch.randn(9, 8, generator=g)
    w[5] = w[2] = h[0] * 10  # tokens 2 and 5: the same, top logit in every row close to h[0]
    h[1:4] = h[0]
    b = torch.zeros(9)
    labels = torch.tensor([5, 2, 7, 5, 0, 1])  # row 0 and 3: the later of the tied pair; row 1 the first
    loss, hit = LinearCrossEntropy.apply(h.to(dtype), w, b, labels, 6.0, 4)  # 2 chunks
    logits = h.to(dtype) @ w.to(dtype).t() + b.to(dtype)
    assert logits[0, 2] == logits[0, 5] == logits[0].max()
    assert torch.equal(hit, logits.argmax(-1) == labels)
    assert hit.tolist()[:4] == [False, True, False, False]


def test_fused_mlm_loss_ignores_padding_rows():
    # rows after the labelled ones (the training path pads to a multiple of 64) change nothing
    # and get a zero gradient
    from bertkit.kernels.cross_entropy import LinearCrossEntropy
    g = torch.Generator().manual_seed(2)
    h = torch.randn(70, 16, generator=g, requires_grad=True)
    w = torch.randn(30, 16, generator=g, requires_grad=True)
    b = torch.randn(30, generator=g, requires_grad=True)
    labels = torch.randint(0, 30, (45,), generator=g)
    loss, hit = LinearCrossEntropy.apply(h, w, b, labels, 45.0, 32)  # the padding starts inside the 2nd chunk
    loss.backward()
    ref_h = h.detach()[:45].clone().requires_grad_()
    ref_w, ref_b = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_h @ ref_w.t() + ref_b, labels)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    assert hit.shape == (45,) and torch.equal(hit, (ref_h @ ref_w.t() + ref_b).argmax(-1) == labels)
    torch.testing.assert_close(h.grad[:45], ref_h.grad)
    assert torch.equal(h.grad[45:], torch.zeros(25, 16))
    torch.testing.assert_close(w.grad, ref_w.grad)
    torch.testing.assert_close(b.grad, ref_b.grad)


def test_cpu_dropout_draws_its_masks_from_torchs_seed_and_scales_like_f_dropout(monkeypatch):
    """The bulk-drawn CPU dropout: keep rate 1 - p, output and gradient x * keep / (1 - p) (what
    F.dropout computes for its own mask), masks decided by torch.manual_seed, fresh per call."""
    from bertkit import model
    torch.manual_seed(0)
    first, second = kdrop.keep_mask((1000, 1000), 0.1), kdrop.keep_mask((1000, 1000), 0.1)
    assert abs(first.float().mean().item() - 0.9) < 0.002 and not torch.equal(first, second)
    torch.manual_seed(0)
    assert torch.equal(kdrop.keep_mask((1000, 1000), 0.1), first)
    assert kdrop.keep_mask((7, 3), 0.0).all() and kdrop.keep_mask((5, 9, 2), 0.5).shape == (5, 9, 2)
    for p in (0.01, 0.5, 0.9):  # 16 bits per element: the rate to within 2^-17, sizes not a multiple of 4
        assert abs(kdrop.keep_mask((999, 1001), p).float().mean().item() - (1 - p)) < 0.002
    # a mask of several parts (drawn on threads) is the same whatever the thread count
    threads = torch.get_num_threads()
    try:
        torch.manual_seed(4)
        torch.set_num_threads(1)
        one = kdrop.keep_mask((3, kdrop.MASK_PART + 5), 0.1)
        torch.manual_seed(4)
        torch.set_num_threads(2)
        assert torch.equal(kdrop.keep_mask((3, kdrop.MASK_PART + 5), 0.1), one)
    finally:
        torch.set_num_threads(threads)
    parts = one.flatten()[:3 * kdrop.MASK_PART].view(3, -1)
    assert not torch.equal(parts[0], parts[1]) and abs(one.float().mean().item() - 0.9) < 0.001
    masks = []
    real = kdrop.keep_mask
    monkeypatch.setattr(kdrop, "keep_mask", lambda shape, p: masks.append(real(shape, p)) or masks[-1])
    x = torch.randn(4, 6, 8, requires_grad=True)
    y = kdrop.dropout(x, 0.25)
    (y * torch.arange(8.0)).sum().backward()
    assert torch.allclose(y, x * masks[0] / 0.75)
    assert torch.allclose(x.grad, masks[0] / 0.75 * torch.arange(8.0))
    assert kdrop.dropout(x, 0.25, training=False) is x and kdrop.dropout(x, 0.0) is x
    layer = model.Dropout(0.3)
    assert isinstance(layer, torch.nn.Dropout)  # set_dropout and HF-style code still see a dropout


def _attention(qkv, nh, mask, p):  # model.attention on a fused (B, T, 3H) projection
    return kattn.attention(*qkv.split(qkv.size(-1) // 3, dim=2), nh, mask, p)


@pytest.mark.parametrize("per_head", [True, False])
def test_attention_with_dropout_is_sdpas_math_with_the_drawn_mask(monkeypatch, per_head):
    monkeypatch.setattr(kattn, "PER_HEAD_MIN", 0 if per_head else 1 << 60)  # a head at a time, or batched
    g = torch.Generator().manual_seed(3)
    B, T, nh, hs = 2, 7, 4, 8
    qkv = torch.randn(B, T, 3 * nh * hs, generator=g, requires_grad=True)
    mask = torch.tensor([[1] * 5 + [0] * 2, [1] * 2 + [0] * 5]).bool()[:, None, None, :]

    def heads(t):  # (B, T, H) -> (B, nh, T, hs)
        return t.view(B, T, nh, hs).transpose(1, 2)
    q, k, v = (heads(t) for t in qkv.split(nh * hs, dim=2))

    def plain(keep, p):
        probs = ((q @ k.transpose(-2, -1)) / hs ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        return ((probs * keep / (1 - p)) @ v).transpose(1, 2).reshape(B, T, nh * hs)
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, -1)
    # without dropout: SDPA itself; p -> 0 keeps every element: the spelled-out steps equal SDPA's
    # fused kernel, values and gradients, with and without padding
    assert torch.equal(_attention(qkv, nh, mask, 0.0), fused)
    ours = _attention(qkv, nh, mask, 1e-12)
    assert torch.allclose(ours, fused, atol=1e-6)
    g_ours, g_fused = (torch.autograd.grad(out.square().sum(), qkv)[0] for out in (ours, fused))
    assert torch.allclose(g_ours, g_fused, atol=1e-5)
    unpadded = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, -1)
    assert torch.allclose(_attention(qkv, nh, None, 1e-12), unpadded, atol=1e-6)
    masks = []
    real = kdrop.keep_mask
    monkeypatch.setattr(kdrop, "keep_mask", lambda shape, p: masks.append(real(shape, p)) or masks[-1])
    ours = _attention(qkv, nh, mask, 0.2)
    if per_head:
        assert len(masks) == nh and masks[0].shape == (B, T, T) and not masks[0].all()
        keep = torch.stack(masks, 1)  # (B, nh, T, T)
    else:
        assert len(masks) == 1 and masks[0].shape == (B * nh, T, T) and not masks[0].all()
        keep = masks[0].view(B, nh, T, T)
    assert torch.allclose(ours, plain(keep, 0.2), atol=1e-6)
    g_ours, g_plain = (torch.autograd.grad(out.square().sum(), qkv)[0] for out in (ours, plain(keep, 0.2)))
    assert torch.allclose(g_ours, g_plain, atol=1e-5)


def test_bf16_training_attention_without_dropout_is_spelled_out_and_equals_sdpa(monkeypatch):
    # SDPA's CPU backward in bf16 is slow, so bf16 training takes the spelled-out path even at
    # dropout 0; values and gradients match fp32 SDPA to bf16's precision, and bf16 inference
    # (no gradient) still runs SDPA
    g = torch.Generator().manual_seed(5)
    B, T, nh, hs = 3, 9, 2, 16
    qkv = torch.randn(B, T, 3 * nh * hs, generator=g)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7]).bool()[:, None, None, :]
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(a[0].dtype) or sdpa(*a, **k))
    ref_in = qkv.clone().requires_grad_()
    ref = _attention(ref_in, nh, mask, 0.0)
    assert calls == [torch.float32]
    ours_in = qkv.to(torch.bfloat16).requires_grad_()
    ours = _attention(ours_in, nh, mask, 0.0)
    assert calls == [torch.float32] and ours.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), ref, atol=3e-2, rtol=2e-2)
    w = torch.randn(ref.shape, generator=g)
    (ref * w).sum().backward()
    (ours.float() * w).sum().backward()
    assert torch.allclose(ours_in.grad.float(), ref_in.grad, atol=5e-2, rtol=5e-2)
    with torch.no_grad():
        inference = _attention(qkv.to(torch.bfloat16), nh, mask, 0.0)
    assert calls == [torch.float32, torch.bfloat16]
    assert torch.allclose(inference.float(), ref.detach(), atol=3e-2, rtol=2e-2)


def _aten_ops(fn):
    """fn's result and the names of the aten/mkldnn ops it ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))
    with Ops() as ops:
        out = fn()
    return out, ops.names


onednn = pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")),
                            reason="this torch build has no oneDNN linear kernel")


@onednn
def test_onednn_linear_equals_f_linear_in_inference_and_training_and_runs_in_fp32_only(backend):
    import torch.nn.functional as F

    backend(onednn_linear=True)
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    inputs = [torch.randn(5, 16, generator=g), torch.randn(3, 7, 16, generator=g), torch.randn(0, 16),
              torch.randn(2, 0, 16), torch.randn(16, 5, generator=g).t(),          # empty and strided inputs
              torch.randn(4, 6, 16, generator=g)[:, 0], torch.randn(3, 7, 32, generator=g)[..., ::2]]
    with torch.inference_mode():
        for x in inputs:
            for bias in (b, None):
                y, ops = _aten_ops(lambda: klin.linear(x, w, bias))
                assert "mkldnn._linear_pointwise" in ops
                assert y.shape == F.linear(x, w, bias).shape
                torch.testing.assert_close(y, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    # training: OneDNNLinear, the output and every gradient as F.linear's autograd gives them
    for x in inputs:
        for bias in (b, None):
            for needs in ((True, True, True), (False, True, True), (True, False, False)):
                leaves, ref_leaves = ([t.detach().clone().requires_grad_(r) for t, r in zip((x, w, b), needs)]
                                      for _ in range(2))
                up = torch.randn(*x.shape[:-1], 24, generator=g)
                y, ops = _aten_ops(lambda: klin.linear(leaves[0], leaves[1], leaves[2] if bias is not None else None))
                assert "mkldnn._linear_pointwise" in ops
                ref = F.linear(ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias is not None else None)
                torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
                if not any(needs[:2]) and bias is None:
                    continue
                (y * up).sum().backward()
                (ref * up).sum().backward()
                for t, r in zip(leaves, ref_leaves):
                    assert (t.grad is None) == (r.grad is None)
                    if r.grad is not None:
                        torch.testing.assert_close(t.grad, r.grad, rtol=1e-5, atol=1e-5)
    x = inputs[1]

    def under_autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return klin.linear(x, w, b)
    with torch.no_grad():
        for run in (lambda: klin.linear(x.double(), w.double(), b.double()), under_autocast):  # not fp32
            _, ops = _aten_ops(run)
            assert "mkldnn._linear_pointwise" not in ops
    backend(onednn_linear=False)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            _, ops = _aten_ops(lambda: klin.linear(x, w, b))
        assert "mkldnn._linear_pointwise" not in ops


@onednn
def test_a_pretraining_step_on_onednn_gives_f_linears_loss_and_gradients(backend):
    # the whole model's autograd through OneDNNLinear and the MLM loss's logits on oneDNN
    from bertkit import model
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    net = model.BertForPreTraining(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (4, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    positions = torch.tensor([[1, 3, 5], [2, 4, 6], [7, 8, 9], [10, 11, 12]])
    labels = torch.randint(5, 300, (4, 3), generator=g)
    results = {}
    for on in (False, True):
        backend(onednn_linear=on)
        net.zero_grad(set_to_none=True)
        out, ops = _aten_ops(lambda: net(ids, torch.zeros_like(ids), mask, mlm_positions=positions, mlm_labels=labels,
                                         nsp_labels=torch.tensor([0, 1, 0, 1])))
        out.loss.backward()
        assert ("mkldnn._linear_pointwise" in ops) == on
        results[on] = out.loss.item(), {n: p.grad.clone() for n, p in net.named_parameters()}
    (plain_loss, plain), (fast_loss, fast) = results[False], results[True]
    assert fast_loss == pytest.approx(plain_loss, rel=1e-6)
    for name, grad in plain.items():
        torch.testing.assert_close(fast[name], grad, rtol=1e-4, atol=1e-6 + 1e-5 * grad.abs().max().item(), msg=name)


@onednn
def test_onednn_linear_fuses_gelu_and_keeps_its_blocked_weight_only_while_the_weight_is_unchanged(backend):
    import copy
    import pickle

    import torch.nn.functional as F

    from bertkit import model
    backend(onednn_linear=True)
    torch.manual_seed(0)
    lin = model.Linear(16, 24)
    x = torch.randn(3, 7, 16)
    with torch.inference_mode():
        for gelu in (False, True):
            plain = F.linear(x, lin.weight, lin.bias)
            plain = F.gelu(plain) if gelu else plain
            for run in (lambda: lin(x, gelu=gelu), lambda: klin.linear(x, lin.weight, lin.bias, gelu=gelu)):
                y, ops = _aten_ops(run)
                assert "mkldnn._linear_pointwise" in ops and "aten.gelu" not in ops
                torch.testing.assert_close(y, plain, rtol=1e-5, atol=1e-5)
        assert "_blocked" in lin.__dict__
        # a weight changed in place (an optimizer step, load_state_dict) or replaced is read afresh
        with torch.no_grad():
            lin.weight.mul_(-2)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    lin.weight = torch.nn.Parameter(torch.randn(24, 16))
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        made_here = model.Linear(16, 24)  # inference tensors: no version counter, so nothing kept
        torch.testing.assert_close(made_here(x), F.linear(x, made_here.weight, made_here.bias), rtol=1e-5, atol=1e-5)
        assert "_blocked" not in made_here.__dict__
    # the blocked copy is never pickled or deep-copied (it has no storage), and training drops it
    for clone in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        assert "_blocked" not in clone.__dict__
        torch.testing.assert_close(clone.weight, lin.weight)
    lin.train()
    assert "_blocked" not in lin.__dict__
    # off the oneDNN path (training: autograd) the GELU is torch's, after F.linear
    y = lin(x.requires_grad_(), gelu=True)
    torch.testing.assert_close(y, F.gelu(F.linear(x, lin.weight, lin.bias)))
    y.sum().backward()
    weight, bias, x_ref = (t.detach().clone().requires_grad_() for t in (lin.weight, lin.bias, x))
    F.gelu(F.linear(x_ref, weight, bias)).sum().backward()
    for got, want in ((lin.weight.grad, weight.grad), (lin.bias.grad, bias.grad), (x.grad, x_ref.grad)):
        torch.testing.assert_close(got, want)


@onednn
def test_minilm_encodes_the_same_vectors_through_onednn(backend, minilm_folder):
    # the real checkpoint on real sentences, the whole model with its linear layers either way
    from bertkit.inference.encode import Encoder
    texts = ["The cat sat on the mat.", "A crane lifted the steel beam onto the roof of the new station.",
             "Stocks fell sharply on Monday", "ok"]
    enc = Encoder.from_folder(minilm_folder)
    backend(onednn_linear=False)
    plain = enc.encode(texts)
    backend(onednn_linear=True)
    fast, ops = _aten_ops(lambda: enc.encode(texts))
    assert "mkldnn._linear_pointwise" in ops and "aten.addmm" not in ops
    assert "aten.gelu" not in ops  # fused into the feed-forward's first linear layer
    assert abs(fast - plain).max() < 1e-5


def test_onednn_linear_is_on_where_it_was_measured_faster_and_the_environment_can_switch_it_off():
    """oneDNN's fp32 linear layers on every CPU with AVX-512 (measured faster on AMD Zen 4 and an
    Intel Xeon), MKL on AVX2 CPUs (measured faster on a quiet AMD Zen 2); BERTKIT_ONEDNN_LINEAR=0
    keeps MKL, which encode_speed.py compares against."""
    import os
    import subprocess
    import sys
    probe = ("import torch, bertkit.kernels as k; print(k.AUTO.onednn_linear, "
             "torch.backends.mkldnn.is_available() and torch.cpu._is_avx512_supported())")

    def run(**env):
        out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0] == "True", out[1] == "True"
    on, measured_faster = run()
    assert on == measured_faster
    assert run(BERTKIT_ONEDNN_LINEAR="0")[0] is False


def test_pretraining_forward_with_no_mlm_positions_gives_empty_logits(tiny_bert_factory):
    """NSP alone (no slot to predict) failed to reshape its 0 logits."""
    cfg = tiny_bert_factory.config()
    model = BertForPreTraining(cfg).eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 7))
    with torch.no_grad():
        out = model(ids, mlm_positions=torch.zeros(2, 0, dtype=torch.long))
    assert out.mlm_logits.shape == (2, 0, cfg.vocab_size) and out.nsp_logits.shape == (2, 2)
