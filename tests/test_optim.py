"""The optimizer's fast path: the fused AdamW kernel (used on CPU and GPU) against PyTorch's
per-tensor loop, the plain path it replaces, over several steps of a real BERT step."""
import torch

from bertkit import BertForPreTraining
from bertkit.optim import adamw


def _train(tiny_bert_factory, fused: bool, steps: int = 5) -> tuple[dict, torch.optim.Optimizer]:
    model = tiny_bert_factory.model(BertForPreTraining, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    opt = adamw(model, 1e-3, 0.01, eps=1e-6)
    for group in opt.param_groups:
        group["fused"] = fused or None
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(5, 99, (13, 7), generator=g)
        out = model(ids, mlm_positions=torch.randint(0, 7, (13, 3), generator=g),
                    mlm_labels=torch.randint(5, 99, (13, 3), generator=g),
                    nsp_labels=torch.randint(0, 2, (13,), generator=g))
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, opt


def test_bertkit_adamw_is_fused_on_cpu():
    model = torch.nn.Linear(4, 4)
    assert all(g["fused"] for g in adamw(model, 1e-3, 0.01).param_groups)


def test_fused_adamw_equals_the_per_tensor_loop(tiny_bert_factory):
    fused, opt_f = _train(tiny_bert_factory, True)
    plain, opt_p = _train(tiny_bert_factory, False)
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)
    # the moments, which a checkpoint carries, agree too
    for sf, sp in zip(opt_f.state.values(), opt_p.state.values()):
        torch.testing.assert_close(sf["exp_avg"], sp["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sf["exp_avg_sq"], sp["exp_avg_sq"], rtol=1e-5, atol=1e-9)
        assert float(sf["step"]) == float(sp["step"]) == 5
