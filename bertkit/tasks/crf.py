"""A linear-chain conditional random field for BIO tagging on top of BERT token emissions.

A tag path y_1..y_n over a row of n real positions scores

    score(y) = start[y_1] + sum_i emissions[i, y_i] + sum_i transitions[y_i, y_i+1] + end[y_n]

and p(y | x) = exp(score(y)) / Z, Z summing over all T^n paths. Training minimises
log Z - score(gold), log Z by the forward algorithm; prediction is the Viterbi argmax path.
Shapes: B batch, L positions, T tags. Rows are left-aligned: a prefix of each row is real.

Hard constraints (BIO: I-X only after B-X or I-X, never first; BIOES / BILOU also: after B-X or
I-X only I-X or E-X, and never B-X or I-X last) add a large negative score to forbidden
transitions, starts and ends, in the loss and in decoding alike, so neither ever prefers them.
"""
from __future__ import annotations

import torch
from torch import nn

FORBIDDEN = -1e4  # not -inf: exp underflows to 0 all the same, and gradients stay finite


# the prefixes of each tag scheme: begin, inside, then (BIOES, BILOU) last and one-word ("unit")
SCHEMES = {"bio": "BI", "bioes": "BIES", "bilou": "BILU"}


def label_scheme(labels) -> str:
    """"bio", "bioes" or "bilou": the tag scheme a label set is written in (BIO when it has only B-
    and I- prefixes, BIOES with E- or S-, BILOU with L- or U-). ValueError names a label no scheme
    has, or the two labels that put BIOES's and BILOU's prefixes into one set."""
    first: dict[str, str] = {}  # prefix -> the first label with it
    for label in labels:
        if label == "O":
            continue
        if label[:1] not in "BIESLU" or label[1:2] != "-" or len(label) <= 2:
            raise ValueError(f"label {label!r} is not BIO, BIOES or BILOU: expected 'O' or a B-, I-, E-, S- "
                             "(or L-, U-) prefix and a type")
        first.setdefault(label[0], label)
    bioes, bilou = [first[p] for p in "ES" if p in first], [first[p] for p in "LU" if p in first]
    if bioes and bilou:
        raise ValueError(f"labels {bioes[0]!r} and {bilou[0]!r} mix BIOES's E-/S- with BILOU's L-/U- prefixes")
    return "bioes" if bioes else "bilou" if bilou else "bio"


def scheme_constraints(labels: list[str], scheme: str | None = None) -> tuple[torch.Tensor, ...]:
    """(allowed (T, T) bool [from, to], allowed_start (T,) bool, allowed_end (T,) bool) for labels
    in `scheme` (None: label_scheme's). In every scheme an entity continues (I-X, and E-X / L-X)
    only after B-X or I-X and never begins a sentence; in BIOES and BILOU an open entity (B-X,
    I-X) must go on (I-X) or end (E-X / L-X), so nothing else follows it and no sentence ends in it."""
    scheme = scheme or label_scheme(labels)
    prefixes = SCHEMES[scheme]
    parsed = []  # (prefix, entity type) per label, ("O", "") for O
    for label in labels:
        if label == "O":
            parsed.append(("O", ""))
        elif label[:1] in prefixes and label[1:2] == "-" and len(label) > 2:
            parsed.append((label[0], label[2:]))
        else:
            names = [f"'{p}-<type>'" for p in prefixes]
            raise ValueError(f"label {label!r} is not {scheme.upper()}: expected 'O', {', '.join(names[:-1])} "
                             f"or {names[-1]}")
    continues = prefixes[1:3]      # I (and E / L): only after B-X or I-X of the same type
    closes = scheme != "bio"       # B-X and I-X must be followed by I-X or E-X / L-X
    T = len(labels)
    allowed = torch.ones(T, T, dtype=torch.bool)
    start = torch.tensor([prefix not in continues for prefix, _ in parsed], dtype=torch.bool)
    end = torch.tensor([not (closes and prefix in "BI") for prefix, _ in parsed], dtype=torch.bool)
    for j, (prefix, kind) in enumerate(parsed):
        for i, (prev_prefix, prev_kind) in enumerate(parsed):
            open_ = prev_prefix in "BI"
            if prefix in continues:
                allowed[i, j] = open_ and prev_kind == kind
            elif closes and open_:
                allowed[i, j] = False
    return allowed, start, end


def bio_constraints(labels: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed (T, T) bool [from, to], allowed_start (T,) bool) for BIO / IOB2 labels."""
    allowed, start, _ = scheme_constraints(labels, "bio")
    return allowed, start


class CRF(nn.Module):
    """Linear-chain CRF over T tags.

    allowed: None (every path allowed), a bool (T, T) [from, to] transition mask, the
    (transitions (T, T), start (T,)) pair that bio_constraints returns or the (transitions, start,
    end (T,)) triple of scheme_constraints.
    """

    def __init__(self, num_tags: int,
                 allowed: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        T = self.num_tags = num_tags
        # zeros: an untrained CRF decodes the per-position argmax of the emissions (within constraints)
        self.transitions = nn.Parameter(torch.zeros(T, T))  # [from, to]
        self.start_transitions = nn.Parameter(torch.zeros(T))
        self.end_transitions = nn.Parameter(torch.zeros(T))
        allowed_trans, allowed_start, allowed_end = (*allowed, None, None)[:3] if isinstance(allowed, tuple) else (
            allowed, None, None)
        allowed_trans = torch.ones(T, T, dtype=torch.bool) if allowed_trans is None else allowed_trans.bool()
        allowed_start = torch.ones(T, dtype=torch.bool) if allowed_start is None else allowed_start.bool()
        allowed_end = torch.ones(T, dtype=torch.bool) if allowed_end is None else allowed_end.bool()
        if allowed_trans.shape != (T, T) or allowed_start.shape != (T,) or allowed_end.shape != (T,):
            raise ValueError(f"allowed must be ({T}, {T}) and allowed_start and allowed_end ({T},) for {T} tags, "
                             f"got {tuple(allowed_trans.shape)}, {tuple(allowed_start.shape)} and "
                             f"{tuple(allowed_end.shape)}")
        # non-persistent: constraints follow from the label set, checkpoints hold only the 3 parameters
        self.register_buffer("transition_penalty", torch.where(allowed_trans, 0.0, FORBIDDEN),
                             persistent=False)  # (T, T)
        self.register_buffer("start_penalty", torch.where(allowed_start, 0.0, FORBIDDEN),
                             persistent=False)  # (T,)
        self.register_buffer("end_penalty", torch.where(allowed_end, 0.0, FORBIDDEN),
                             persistent=False)  # (T,)

    def forward(self, emissions, tags, mask) -> torch.Tensor:
        """Mean over the batch of the negative log-likelihood log Z - score(tags)."""
        emissions, mask, tags = self._check(emissions, mask, tags)
        return (self._log_partition(emissions, mask) - self._score(emissions, tags, mask)).mean()

    def log_partition(self, emissions, mask) -> torch.Tensor:
        """(B,) log Z: log-sum-exp of score(y) over all tag paths of each row."""
        return self._log_partition(*self._check(emissions, mask))

    def score(self, emissions, tags, mask) -> torch.Tensor:
        """(B,) unnormalised score of the given tag paths (tags at padded positions are ignored)."""
        emissions, mask, tags = self._check(emissions, mask, tags)
        return self._score(emissions, tags, mask)

    def decode(self, emissions, mask) -> list[list[int]]:
        """Viterbi: the highest-scoring tag path of each row, as a list of its real length."""
        emissions, mask = self._check(emissions, mask)
        trans, start, end = self._weights()
        B, L, T = emissions.shape
        best = start + emissions[:, 0]                                   # (B, T) best path ending in each tag
        backpointers = []
        for i in range(1, L):
            cand = best.unsqueeze(2) + trans                            # (B, T from, T to)
            top, arg = cand.max(dim=1)                                   # (B, T) each
            best = torch.where(mask[:, i, None], top + emissions[:, i], best)  # padding carries best through
            backpointers.append(arg)
        tag = (best + end).argmax(dim=1)                                 # (B,) last real tag
        path = [tag]
        for i in range(L - 1, 0, -1):
            # past a row's end the tag stays put; at real positions step back along the pointer
            tag = torch.where(mask[:, i], backpointers[i - 1].gather(1, tag[:, None]).squeeze(1), tag)
            path.append(tag)
        paths = torch.stack(path[::-1], dim=1).tolist()                  # (B, L), one transfer to the host
        return [row[:n] for row, n in zip(paths, mask.sum(dim=1).tolist())]

    def _weights(self):
        """Float32 parameters with the constraint penalties folded in."""
        return (self.transitions.float() + self.transition_penalty,
                self.start_transitions.float() + self.start_penalty, self.end_transitions.float() + self.end_penalty)

    def _log_partition(self, emissions, mask):
        trans, start, end = self._weights()
        alpha = start + emissions[:, 0]                    # (B, T) log-sum-exp over paths ending in each tag
        for i in range(1, emissions.size(1)):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + trans, dim=1) + emissions[:, i]  # (B, T)
            alpha = torch.where(mask[:, i, None], nxt, alpha)
        return torch.logsumexp(alpha + end, dim=1)                       # (B,)

    def _score(self, emissions, tags, mask):
        trans, start, end = self._weights()
        tags = tags.masked_fill(~mask, 0)                                # padding may hold -100 or any junk
        emit = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)        # (B, L)
        steps = trans[tags[:, :-1], tags[:, 1:]]                         # (B, L-1)
        last = tags.gather(1, mask.sum(dim=1, keepdim=True) - 1).squeeze(1)  # (B,)
        return (start[tags[:, 0]] + (emit * mask).sum(dim=1) + (steps * mask[:, 1:]).sum(dim=1) + end[last])

    def _check(self, emissions, mask, tags=None):
        """Validate shapes and the mask; emissions as float32, mask as bool."""
        if emissions.dim() != 3 or emissions.size(2) != self.num_tags:
            raise ValueError(f"emissions must be (batch, length, {self.num_tags}), "
                             f"got {tuple(emissions.shape)}")
        if mask.shape != emissions.shape[:2]:
            raise ValueError(f"mask must be {tuple(emissions.shape[:2])} like emissions, "
                             f"got {tuple(mask.shape)}")
        if emissions.size(1) == 0:
            raise ValueError("sequences must have at least one position")
        mask = mask.bool()
        if not mask[:, 0].all():
            raise ValueError("mask: the first position of every row must be real (mask 1)")
        if (mask[:, 1:] & ~mask[:, :-1]).any():
            raise ValueError("mask must be left-aligned: in every row the real positions (1) "
                             "must all come before the padding (0)")
        if tags is None:
            return emissions.float(), mask
        if tags.shape != mask.shape:
            raise ValueError(f"tags must be {tuple(mask.shape)} like emissions, got {tuple(tags.shape)}")
        real = tags[mask]
        if ((real < 0) | (real >= self.num_tags)).any():
            raise ValueError(f"tags at real positions must lie in [0, {self.num_tags}), "
                             f"got {real.min().item()}..{real.max().item()}")
        return emissions.float(), mask, tags.long()
