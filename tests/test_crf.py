"""The CRF against brute force over every tag path, plus BIO constraints, training and bad input."""
from itertools import product

import pytest
import torch

from bertkit.tasks.crf import CRF, bio_constraints

LABELS = ["O", "B-person", "I-person", "B-geo-loc", "I-geo-loc"]


def _random_crf(T, gen, allowed=None):
    crf = CRF(T, allowed)
    with torch.no_grad():
        for p in crf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return crf


def _random_batch(T, L, gen, B=4, scale=1.0):
    """Emissions (B, L, T) and a left-aligned mask with rows of lengths 1..L, one of them L."""
    emissions = scale * torch.randn(B, L, T, generator=gen)
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    lengths[0] = L
    mask = torch.arange(L)[None, :] < lengths[:, None]  # (B, L)
    return emissions, mask, lengths.tolist()


def _all_paths(crf, emissions, n, allowed=None):
    """Every tag path of length n (allowed ones only, given constraints) and its score, in float64."""
    T = crf.num_tags
    paths = torch.tensor(list(product(range(T), repeat=n)))  # (P, n)
    if allowed is not None:
        trans_ok, start_ok = allowed
        ok = start_ok[paths[:, 0]] & trans_ok[paths[:, :-1], paths[:, 1:]].all(dim=1)
        paths = paths[ok]
    trans, start, end = (p.detach().double()
                         for p in (crf.transitions, crf.start_transitions, crf.end_transitions))
    em = emissions[:n].double()  # (n, T)
    scores = (start[paths[:, 0]] + em[torch.arange(n), paths].sum(dim=1)
              + trans[paths[:, :-1], paths[:, 1:]].sum(dim=1) + end[paths[:, -1]])  # (P,)
    return paths, scores


def _valid_bio(path):
    """No I-X first, after O, or after B-Y / I-Y with Y != X."""
    labels = ["O"] + [LABELS[t] for t in path]  # as if an O came before the sentence
    return all(not cur.startswith("I-") or prev[2:] == cur[2:] for prev, cur in zip(labels, labels[1:]))


@pytest.mark.parametrize("T", [3, 4])
@pytest.mark.parametrize("L", [1, 2, 3, 4, 5])
def test_log_partition_matches_brute_force(T, L):
    gen = torch.Generator().manual_seed(100 * T + L)
    for _ in range(3):
        crf = _random_crf(T, gen)
        emissions, mask, lengths = _random_batch(T, L, gen)
        log_z = crf.log_partition(emissions, mask)
        assert log_z.shape == (4,) and log_z.dtype == torch.float32
        expected = torch.stack([_all_paths(crf, emissions[b], n)[1].logsumexp(0)
                                for b, n in enumerate(lengths)])
        torch.testing.assert_close(log_z.double(), expected, rtol=1e-5, atol=1e-5)


def test_score_and_loss_match_definition():
    gen = torch.Generator().manual_seed(0)
    crf = _random_crf(4, gen)
    emissions, mask, lengths = _random_batch(4, 5, gen)
    tags = torch.randint(0, 4, (4, 5), generator=gen).masked_fill(~mask, -100)  # padding as HF's ignore index
    expected = []
    for b, n in enumerate(lengths):
        paths, scores = _all_paths(crf, emissions[b], n)
        expected.append(scores[(paths == tags[b, :n]).all(dim=1)].squeeze(0))
    score = crf.score(emissions, tags, mask)
    torch.testing.assert_close(score.double(), torch.stack(expected), rtol=1e-5, atol=1e-5)
    loss = crf(emissions, tags, mask)
    torch.testing.assert_close(loss, (crf.log_partition(emissions, mask) - score).mean())
    assert loss.ndim == 0 and loss.item() >= 0


@pytest.mark.parametrize("constrained", [False, True])
def test_decode_matches_brute_force(constrained):
    gen = torch.Generator().manual_seed(1 + constrained)
    allowed = bio_constraints(LABELS) if constrained else None
    T = len(LABELS) if constrained else 4
    for case in range(40):
        crf = _random_crf(T, gen, allowed)
        emissions, mask, lengths = _random_batch(T, 1 + case % 5, gen, scale=3.0)
        decoded = crf.decode(emissions, mask)
        assert [len(p) for p in decoded] == lengths
        for b, n in enumerate(lengths):
            paths, scores = _all_paths(crf, emissions[b], n, allowed)
            assert decoded[b] == paths[scores.argmax()].tolist()


def test_constrained_log_partition_sums_allowed_paths_only():
    gen = torch.Generator().manual_seed(3)
    allowed = bio_constraints(LABELS)
    for L in range(1, 6):
        crf = _random_crf(len(LABELS), gen, allowed)
        emissions, mask, lengths = _random_batch(len(LABELS), L, gen)
        expected = torch.stack([_all_paths(crf, emissions[b], n, allowed)[1].logsumexp(0)
                                for b, n in enumerate(lengths)])
        log_z = crf.log_partition(emissions, mask).double()
        torch.testing.assert_close(log_z, expected, rtol=1e-5, atol=1e-5)


def test_bio_constraints_table():
    allowed, start = bio_constraints(LABELS)
    O, BP, IP, BG, IG = range(5)
    assert start.tolist() == [True, True, False, True, False]
    for i in range(5):
        assert allowed[i, O] and allowed[i, BP] and allowed[i, BG]  # O and B-X may follow anything
    assert [allowed[i, IP].item() for i in range(5)] == [False, True, True, False, False]
    assert [allowed[i, IG].item() for i in range(5)] == [False, False, False, True, True]


def test_constrained_decode_never_breaks_bio_even_against_emissions():
    allowed = bio_constraints(LABELS)
    crf = CRF(len(LABELS), allowed)
    # every position screams I-person, then I-geo-loc after an O and a B-person
    emissions = torch.zeros(3, 4, 5)
    emissions[0, :, 2] = 50.0
    emissions[1, 0, 0], emissions[1, 1, 4] = 50.0, 50.0
    emissions[2, 0, 1], emissions[2, 1, 4] = 50.0, 60.0
    paths = crf.decode(emissions, torch.ones(3, 4, dtype=torch.bool))
    assert paths[0][0] != 2 and all(_valid_bio(p) for p in paths)
    assert CRF(len(LABELS)).decode(emissions, torch.ones(3, 4))[0][0] == 2  # unconstrained, it would
    gen = torch.Generator().manual_seed(4)
    bias = torch.tensor([0.0, 0.0, 8.0, 0.0, 8.0])  # push hard towards I- tags
    for _ in range(30):
        crf = _random_crf(5, gen, allowed)
        emissions, mask, _ = _random_batch(5, 8, gen, B=8, scale=5.0)
        assert all(_valid_bio(p) for p in crf.decode(emissions + bias, mask))


def test_gradients_reach_emissions_and_all_parameters():
    gen = torch.Generator().manual_seed(5)
    crf = _random_crf(4, gen)
    emissions, mask, _ = _random_batch(4, 5, gen)
    emissions.requires_grad_(True)
    crf(emissions, torch.randint(0, 4, (4, 5), generator=gen), mask).backward()
    for name, grad in [("emissions", emissions.grad), *((n, p.grad) for n, p in crf.named_parameters())]:
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    assert emissions.grad[~mask].abs().sum() == 0  # padding takes no part


def test_bf16_model_and_emissions_are_computed_in_float32():
    gen = torch.Generator().manual_seed(6)
    crf = _random_crf(5, gen, bio_constraints(LABELS)).to(torch.bfloat16)  # as in a model cast to bf16
    emissions, mask, _ = _random_batch(5, 5, gen)
    half = emissions.bfloat16()
    tags = torch.zeros(4, 5, dtype=torch.long)
    log_z, score = crf.log_partition(half, mask), crf.score(half, tags, mask)
    assert log_z.dtype == score.dtype == torch.float32
    ref = crf.float()  # in place: the same bf16-rounded numbers, now held in float32
    torch.testing.assert_close(log_z, ref.log_partition(half.float(), mask))
    torch.testing.assert_close(score, ref.score(half.float(), tags, mask))


def test_state_dict_holds_only_the_three_parameters():
    crf = CRF(5, bio_constraints(LABELS))
    assert sorted(crf.state_dict()) == ["end_transitions", "start_transitions", "transitions"]
    assert crf.transitions.shape == (5, 5) and crf.start_transitions.shape == (5,)


def test_training_learns_tags_that_emissions_alone_cannot_tell_apart():
    # words: 0 "the", 1 "said", 2 and 3 person names, 4 and 5 place names. A name is B- or I-
    # depending on the word before it, which a per-word emission cannot see: transitions must learn it.
    sentences = [[2, 3, 1, 0, 4], [0, 4, 5, 1], [3, 2, 2], [1, 2, 0, 5, 4, 1], [4], [0, 3, 1, 2, 3]]
    kind = {2: "person", 3: "person", 4: "geo-loc", 5: "geo-loc"}
    B, L = len(sentences), max(map(len, sentences))
    words = torch.zeros(B, L, dtype=torch.long)
    tags = torch.full((B, L), -100)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b, sent in enumerate(sentences):
        for i, w in enumerate(sent):
            words[b, i], mask[b, i] = w, True
            label = "O" if w not in kind else ("I-" if i and kind.get(sent[i - 1]) == kind[w] else "B-") + kind[w]
            tags[b, i] = LABELS.index(label)
    torch.manual_seed(0)
    emit = torch.nn.Embedding(6, len(LABELS))  # a linear layer over one-hot words
    crf = CRF(len(LABELS))
    opt = torch.optim.Adam([*emit.parameters(), *crf.parameters()], lr=0.1)
    losses = []
    for _ in range(60):
        loss = crf(emit(words), tags, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    gold = [tags[b, :len(s)].tolist() for b, s in enumerate(sentences)]
    assert losses[-1] < 0.05 * losses[0]
    assert crf.decode(emit(words), mask) == gold
    assert CRF(len(LABELS)).decode(emit(words), mask) != gold  # the trained emissions alone get it wrong


def test_bad_input_raises_clear_errors():
    crf = CRF(3)
    em = torch.zeros(2, 4, 3)
    ok = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    tags = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="left-aligned"):
        crf(em, tags, torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="first position"):
        crf.decode(em, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"emissions must be \(batch, length, 3\)"):
        crf.log_partition(torch.zeros(2, 4, 5), ok)
    with pytest.raises(ValueError, match="emissions must be"):
        crf.log_partition(torch.zeros(4, 3), ok)
    with pytest.raises(ValueError, match="mask must be"):
        crf.log_partition(em, ok[:, :3])
    with pytest.raises(ValueError, match="tags must be"):
        crf(em, tags[:1], ok)
    with pytest.raises(ValueError, match=r"tags at real positions must lie in \[0, 3\)"):
        crf(em, torch.full((2, 4), 3), ok)
    with pytest.raises(ValueError, match="at least one position"):
        crf.decode(torch.zeros(2, 0, 3), torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"allowed must be \(3, 3\)"):
        CRF(3, torch.ones(4, 4, dtype=torch.bool))
    for bad in ["PER", "B-", "E-person", "b-person"]:
        with pytest.raises(ValueError, match=f"label '{bad}' is not BIO"):
            bio_constraints(["O", "B-person", bad])
