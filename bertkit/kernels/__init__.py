"""CPU kernels beside the reference model (model.py). Each does what a plain torch call does,
faster on a CPU, and is tested equal to it (tests/test_kernels.py and tests/test_model.py):

- dropout.py: dropout masks drawn in bulk by numpy instead of torch's one element at a time;
- linear.py: fp32 linear layers on oneDNN's kernel where it was measured faster (AVX-512);
- attention.py: attention with dropout spelled out around that dropout, a head at a time or batched;
- cross_entropy.py: the vocabulary projection fused with its cross-entropy (and ELECTRA's sampling).

Which of them run is the Backend's choice, made explicitly: AUTO (the default) where each pays,
REFERENCE for plain torch everywhere (`with kernels.use(kernels.REFERENCE): ...`).
"""
from .backend import AUTO, REFERENCE, Backend, current, use

__all__ = ["AUTO", "REFERENCE", "Backend", "current", "use"]
