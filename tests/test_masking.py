"""The MLM masking pipeline, checked statistically (as ModernBERT's tests do) over >100 k tokens."""
import numpy as np
import pytest

from bertkit.pretraining.masking import MaskingConfig, mask_tokens

V, MASK = 1000, 4
RANDOM_IDS = np.arange(5, V)


def _batch(rng, B=4000, T=64):
    ids = rng.integers(5, V, (B, T))
    lengths = rng.integers(10, T + 1, B)
    special = np.arange(T)[None, :] >= lengths[:, None] - 1      # padding and the final [SEP]
    special[:, 0] = True                                           # [CLS]
    mid = lengths // 2
    special[np.arange(B), mid] = True                              # the middle [SEP]
    ids[special] = 2
    return ids, special


@pytest.mark.parametrize("p", [0.1, 0.15, 0.3])
def test_rate_and_80_10_10_split_hold_over_100k_tokens(p):
    rng = np.random.default_rng(0)
    ids, special = _batch(rng)
    candidates = (~special).sum()
    assert candidates > 100_000
    cfg = MaskingConfig(mask_prob=p, max_predictions=64)
    out = mask_tokens(ids, special, np.random.default_rng(1), cfg, MASK, RANDOM_IDS)
    used = out.labels != -100
    n = used.sum()
    # each row picks round(p x its candidates), at least one
    expected = np.maximum(1, np.rint((~special).sum(1) * p)).sum()
    assert n == expected
    assert abs(n / candidates - p) < 0.01
    rows = np.nonzero(used)[0]
    pos = out.positions[used]
    new, old = out.input_ids[rows, pos], ids[rows, pos]
    assert np.array_equal(out.labels[used], old)  # labels are the original tokens
    masked, kept = (new == MASK).mean(), (new == old).mean()
    randomised = ((new != MASK) & (new != old)).mean()
    # binomial standard error at n >= 10 k is below 0.005: 0.02 is four of them
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(randomised - 0.1) < 0.02
    # nothing outside the chosen positions changed
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows, pos] = False
    assert np.array_equal(out.input_ids[untouched], ids[untouched])


def test_special_tokens_are_never_chosen_and_positions_are_unique():
    rng = np.random.default_rng(2)
    ids, special = _batch(rng, B=500)
    out = mask_tokens(ids, special, rng, MaskingConfig(mask_prob=0.5, max_predictions=64), MASK, RANDOM_IDS)
    used = out.labels != -100
    assert not special[np.nonzero(used)[0], out.positions[used]].any()
    for r in range(len(ids)):
        p = out.positions[r][used[r]]
        assert len(set(p.tolist())) == len(p) and list(p) == sorted(p)


def test_cap_on_predictions_per_sequence():
    rng = np.random.default_rng(3)
    ids, special = _batch(rng, B=200)
    out = mask_tokens(ids, special, rng, MaskingConfig(mask_prob=0.5, max_predictions=5), MASK, RANDOM_IDS)
    assert out.positions.shape == (200, 5)
    n_cand = (~special).sum(1)
    assert np.array_equal((out.labels != -100).sum(1), np.minimum(5, np.maximum(1, np.rint(n_cand * 0.5))))
    assert ((out.labels != -100).sum(1) == 5).mean() > 0.9


def test_random_replacements_are_uniform_over_non_special_tokens():
    rng = np.random.default_rng(4)
    ids, special = _batch(rng, B=4000)
    cfg = MaskingConfig(mask_prob=0.15, max_predictions=64, mask_token_share=0.0, random_token_share=1.0)
    out = mask_tokens(ids, special, rng, cfg, MASK, RANDOM_IDS)
    used = out.labels != -100
    new = out.input_ids[np.nonzero(used)[0], out.positions[used]]
    assert new.min() >= 5  # never a special token
    counts = np.bincount(new, minlength=V)[5:]
    # uniform draws are Poisson-like per id: their spread is sqrt(mean), not more
    assert abs(counts.std() / np.sqrt(counts.mean()) - 1) < 0.15


def test_whole_word_masking_takes_every_piece_of_a_word():
    rng = np.random.default_rng(5)
    continuation = np.zeros(V, dtype=bool)
    continuation[500:] = True              # ids >= 500 are '##' pieces
    ids, special = _batch(rng, B=1000)
    ids[:, 1] = rng.integers(5, 500, len(ids))  # every row starts with a word start
    cfg = MaskingConfig(mask_prob=0.15, max_predictions=64, whole_word=True)
    out = mask_tokens(ids, special, rng, cfg, MASK, RANDOM_IDS, continuation)
    chosen = np.zeros_like(ids, dtype=bool)
    used = out.labels != -100
    chosen[np.nonzero(used)[0], out.positions[used]] = True
    # a continuation piece is chosen exactly when the piece before it (same word) is
    cont = continuation[ids] & ~special
    cont[:, 1:] &= ~special[:, :-1]  # a piece after [SEP] starts a word of its own
    cont[:, 0] = False
    prev_chosen = np.zeros_like(chosen)
    prev_chosen[:, 1:] = chosen[:, :-1]
    assert np.array_equal(chosen[cont], prev_chosen[cont])
    rate = used.sum() / (~special).sum()
    assert 0.14 < rate < 0.155  # whole words that would overshoot the budget are left out


@pytest.mark.parametrize("T", [8, 64])
def test_whole_word_masking_skips_a_word_that_does_not_fit_and_fills_on(T):
    """Words are taken in score order; one that would overshoot is skipped and the next tried, so
    a row ends short of its share only when no word left fits, and empty only when no word fits
    the slots. Stopping at the
    first word that did not fit left a fifth of the rows at length 8 with no prediction at all."""
    rng = np.random.default_rng(7)
    continuation = np.zeros(V, dtype=bool)
    continuation[700:] = True              # 30% of the ids are '##' pieces
    ids = rng.integers(5, V, (2000, T))
    lengths = rng.integers(4, T + 1, len(ids))
    special = np.arange(T)[None, :] >= lengths[:, None] - 1      # padding and the final [SEP]
    special[:, 0] = True                                           # [CLS]
    cfg = MaskingConfig(mask_prob=0.15, max_predictions=max(2, round(T * 0.15 + 0.5)), whole_word=True)
    out = mask_tokens(ids, special, rng, cfg, MASK, RANDOM_IDS, continuation)
    used = out.labels != -100
    n_cand = (~special).sum(1)
    n_pick = np.minimum(cfg.max_predictions, np.maximum(1, np.rint(n_cand * 0.15)))
    for b in range(len(ids)):
        chosen = set(out.positions[b][used[b]].tolist())
        words, start = [], None  # each word's positions: a start piece and the '##' pieces after it
        for t in range(T):
            if special[b, t]:
                start = None
                continue
            if start is None or not continuation[ids[b, t]]:
                words.append([])
                start = t
            words[-1].append(t)
        assert all(set(w) <= chosen or not set(w) & chosen for w in words)  # whole words only
        assert chosen or all(len(w) > cfg.max_predictions for w in words), b  # none fits the slots
        if len(chosen) < n_pick[b]:  # short only when none of the words left would fit
            left = [w for w in words if not set(w) & chosen]
            assert all(len(w) > n_pick[b] - len(chosen) for w in left), b
