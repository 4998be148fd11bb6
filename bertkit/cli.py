"""The `bertkit` command. Each subcommand parses its options and calls the library."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .errors import BertkitError


def _corpus_texts(path: Path):
    """Lines of a .txt file, or of every .txt file under a folder (sorted, for reproducibility)."""
    from .inputs import read_text

    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise BertkitError(f"{path}: folder holds no .txt files")
    elif path.is_file():
        files = [path]
    else:
        raise BertkitError(f"{path}: no such file or folder")
    for f in files:
        for line in read_text(f).splitlines():
            if line.strip():
                yield line


def cmd_tokenizer_train(args) -> None:
    from .tokenizer import WordPieceTokenizer

    out = Path(args.out)
    existing = [n for n in ("tokenizer.json", "vocab.txt") if (out / n).exists()]
    if existing and not args.overwrite:
        raise BertkitError(f"{out} already holds {', '.join(existing)}; choose another --out "
                           "or pass --overwrite")
    texts = list(_corpus_texts(Path(args.corpus)))  # read fully first: a bad file fails before any write
    if not texts:
        raise BertkitError(f"{args.corpus}: the corpus holds no text")
    tok = WordPieceTokenizer.train(texts, args.vocab_size, lowercase=not args.cased,
                                   min_frequency=args.min_frequency)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    print(f"bertkit: trained a WordPiece vocabulary of {tok.vocab_size} tokens on {len(texts)} lines; "
          f"wrote {out / 'vocab.txt'} and {out / 'tokenizer.json'}")


def cmd_encode(args) -> None:
    import numpy as np

    from .encode import Encoder
    from .inputs import read_text_inputs

    inputs = read_text_inputs(args.input)
    output = Path(args.output)
    if output.suffix != ".npy":
        raise BertkitError(f"--output {output}: expected a .npy file name")
    if output.exists() and not args.overwrite:
        raise BertkitError(f"{output} already exists; choose another --output or pass --overwrite")
    encoder = Encoder.from_folder(args.model)
    vectors = encoder.encode(inputs.texts, inputs.pairs, pooling=args.pooling, batch_size=args.batch_size,
                             max_len=args.max_len, truncation=not args.no_truncation,
                             normalize=args.normalize)
    output.parent.mkdir(parents=True, exist_ok=True)
    np.save(output, vectors)
    print(f"bertkit: wrote {vectors.shape[0]} vectors of size {vectors.shape[1]} "
          f"({args.pooling or encoder.default_pooling} pooling) to {output}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertkit", description="BERT end to end: encode, tokenize, train.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("encode", help="sentence vectors of texts or text pairs, written as .npy")
    e.add_argument("--model", required=True, help="model folder (HF layout)")
    e.add_argument("--input", required=True, help=".txt (one text per line) or .jsonl with text[, text_pair]")
    e.add_argument("--output", required=True, help="output .npy file, shape (texts, hidden size)")
    e.add_argument("--pooling", choices=["cls", "mean", "pooler"], default=None,
                   help="default: what the folder declares (sentence-transformers), else cls")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--max-len", type=int, default=None, help="default: the model's position limit")
    e.add_argument("--no-truncation", action="store_true", help="error on texts over --max-len")
    e.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    e.set_defaults(func=cmd_encode)

    t = sub.add_parser("tokenizer", help="WordPiece vocabularies")
    tsub = t.add_subparsers(dest="action", required=True)
    tt = tsub.add_parser("train", help="train a WordPiece vocabulary on a text file or folder of .txt files")
    tt.add_argument("--corpus", required=True)
    tt.add_argument("--vocab-size", type=int, default=30522)
    tt.add_argument("--out", required=True)
    tt.add_argument("--min-frequency", type=int, default=2)
    tt.add_argument("--cased", action="store_true", help="keep case (default: lower-case, as uncased BERT)")
    tt.add_argument("--overwrite", action="store_true", help="replace an existing vocabulary in --out")
    tt.set_defaults(func=cmd_tokenizer_train)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = lambda msg, *a, **k: f"bertkit: warning: {msg}\n"
    try:
        args.func(args)
    except BertkitError as e:
        print(f"bertkit: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
