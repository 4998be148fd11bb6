"""model2vec's static vectors for distill_value.py's probe, run in its own venv (.venv-model2vec,
`make bench-distill` makes it: model2vec's distill extra pins other transformers and tokenizers
versions than bertkit's): distilled offline from a sentence-transformers folder, then each input
file's texts (one JSON object with "text" per line) encoded to an .npy beside it.

    .venv-model2vec/bin/python benchmarks/model2vec_vectors.py MODEL_FOLDER OUT_DIR FILE.jsonl ...
"""
import json
import sys
from pathlib import Path

import numpy as np
from model2vec.distill import distill

PCA_DIMS = 256  # model2vec's default for its potion models

model, out, files = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
m2v = distill(model_name=model, pca_dims=PCA_DIMS)
out.mkdir(parents=True, exist_ok=True)
for f in files:
    texts = [json.loads(line)["text"] for line in Path(f).read_text().split("\n") if line.strip()]  # not splitlines: U+2028 in a text
    np.save(out / (Path(f).parent.name + "-" + Path(f).stem + ".npy"), m2v.encode(texts))
print(json.dumps({"pca_dims": PCA_DIMS, "files": files}))
