"""The `bertkit` command. Each subcommand parses its options and calls the library."""
from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import sys
import warnings
from pathlib import Path

from .errors import BertkitError, Interrupted
from .training.memory import keep_freed_memory


def cmd_tokenizer_train(args) -> None:
    from .outputs import check_output_folder
    from .tokenizer import WordPieceTokenizer, check_vocab_size

    # a non-empty --out (a model folder's config.json, an earlier tokenizer_config.json) is never
    # written into without --overwrite; an unwritable one fails before the corpus is read
    check_vocab_size(args.vocab_size)  # before the corpus is read
    out = check_output_folder(args.out, args.overwrite)
    from .pretraining.corpus import check_corpus_name, check_sentence_per_line, iter_documents

    # read fully first: a bad file fails before anything is written
    check_corpus_name(args.corpus)
    if args.sentence_per_line:
        check_sentence_per_line(args.corpus)
    texts = [s for doc in iter_documents(args.corpus, per_line=args.sentence_per_line) for s in doc]
    if not texts:
        raise BertkitError(f"{args.corpus}: the corpus holds no text")
    tok = WordPieceTokenizer.train(texts, args.vocab_size, lowercase=not args.cased,
                                   min_frequency=args.min_frequency)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    print(f"bertkit: trained a WordPiece vocabulary of {tok.vocab_size} tokens on {len(texts)} sentences; "
          f"wrote {out / 'vocab.txt'} and {out / 'tokenizer.json'}")


def _output_lock(args):
    """pretrain's and finetune's --out and encode's --output, held while the command writes them
    (files.output_lock); under torchrun by rank 0 alone, the rank that writes."""
    from contextlib import nullcontext

    from .files import output_lock
    command = {cmd_pretrain: "pretrain", cmd_finetune: "finetune", cmd_encode: "encode"}.get(args.func)
    flag = "--output" if command == "encode" else "--out"
    path = getattr(args, flag[2:], None) if command else None
    if path is None or os.environ.get("RANK", "0") != "0":
        return nullcontext()
    return output_lock(path, f"bertkit {command}", flag)


def cmd_encode(args) -> None:
    """Streamed and resumable; under torchrun the ranks share the corpus (inference/encode_file.py)."""
    from .config import check_max_len, load_config
    from .inference.encode import Encoder  # imports torch only for --backend torch
    from .inference.encode_file import encode_file
    from .outputs import check_output_file

    # every option, the output path and the model folder are checked before any work (the input
    # is, in encode_file, before a file is made)
    output = Path(args.output)
    if output.suffix != ".npy":
        raise BertkitError(f"--output {output}: expected a .npy file name")
    check_output_file(output, args.overwrite)
    if args.batch_size < 1:
        raise BertkitError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.chunk_texts is not None and args.chunk_texts < 1:
        raise BertkitError(f"--chunk-texts must be at least 1, got {args.chunk_texts}")
    config = load_config(args.model)
    if args.max_len is not None:
        check_max_len(args.max_len, config)
    procs = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from .training.distributed import init_processes
        procs = init_processes()
    encoder = Encoder.from_folder(args.model, device=procs.device if procs else None, precision=args.precision,
                                  backend=args.backend)
    n = encode_file(encoder, args.input, output, args.pooling, args.batch_size, args.max_len, not args.no_truncation,
                    args.normalize, args.dtype, args.resume, args.overwrite, model=str(Path(args.model).resolve()),
                    backend=args.backend, procs=procs, chunk=args.chunk_texts)
    if procs and not procs.main:
        return
    normalized = encoder.default_normalize if args.normalize is None else args.normalize
    print(f"bertkit: wrote {n} vector{'' if n == 1 else 's'} of size {config.hidden_size} "
          f"({args.pooling or encoder.default_pooling} pooling{', unit length' if normalized else ''}"
          f"{', float16' if args.dtype == 'float16' else ''}) to {output}")


def cmd_pretrain(args) -> None:
    from .pretraining.recipes import PretrainConfig
    from .pretraining.report import print_report, write_samples
    from .pretraining.train import pretrain
    from .training.options import flags_given

    command = {"no_samples": False}  # the command's own options, which the TOML file may set too
    cfg = PretrainConfig.from_command(flags_given(args, PretrainConfig), args.config, command)
    summary = pretrain(cfg)
    if summary is None:  # another rank of a torchrun job: rank 0 reports
        return
    print_report(cfg, summary)
    if not (args.no_samples or command["no_samples"]):
        write_samples(cfg, summary)


def cmd_fill_mask(args) -> None:
    from .files import WEIGHTS
    from .folders import has_trained_mlm_head, load_model
    from .inference.fill_mask import fill_mask
    from .tokenizer import load_tokenizer

    if not args.text:
        raise BertkitError("give at least one text with [MASK] in it")
    if args.top_k < 1:
        raise BertkitError(f"--top-k must be at least 1, got {args.top_k}")
    tokenizer = load_tokenizer(args.model)  # refuses a vocabulary larger than the model's embeddings
    model, _ = load_model(args.model, quiet=True)
    if not has_trained_mlm_head(args.model):  # load_model gave it a random one
        generator = Path(args.model) / "generator"
        hint = (f"it is an ELECTRA encoder: its generator fills masks (--model {generator})"
                if (generator / WEIGHTS).is_file() else "pretrain it first")
        raise BertkitError(f"{args.model} has no trained MLM head (no cls.predictions.* weights in "
                           f"{WEIGHTS}): fill-mask would answer at random; {hint}")
    for text, preds in zip(args.text, fill_mask(model, tokenizer, args.text, args.top_k)):
        print(json.dumps({"text": text, "predictions": preds}))


def _task_options(args) -> dict:
    opts = {}
    for pair in args.option or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise BertkitError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            opts[key] = json.loads(value)
        except ValueError:
            opts[key] = value
    if args.head:
        if args.task != "classify":
            raise BertkitError(f"--head is an option of the classify task, not of {args.task}")
        opts["head"] = args.head
    return opts


def cmd_finetune(args) -> None:
    from .finetune import FinetuneConfig, finetune
    from .tasks import get_task
    from .training.options import flags_given

    options = _task_options(args)
    get_task(args.task)().check_options(options)  # a misspelled key fails before any work
    cfg = FinetuneConfig(task=args.task, options=options, **flags_given(args, FinetuneConfig))
    summary = finetune(cfg)
    if summary is None:  # another rank of a torchrun job: rank 0 reports
        return
    best = summary["best_metrics"]
    shown = {k: round(v, 4) for k, v in best.items() if isinstance(v, float)}
    print(f"bertkit: best epoch {summary['best_epoch']} of {summary['epochs_run']}: {json.dumps(shown)}; "
          f"model in {args.out}")


def cmd_evaluate(args) -> None:
    from .tasks.runner import evaluate_folder

    print(json.dumps(evaluate_folder(args.task, args.model, args.data, max_len=args.max_len,
                                     precision=args.precision)))


def cmd_predict(args) -> None:
    from .tasks.folder import task_max_len
    from .tasks.runner import run_task

    if args.input is not None and args.text:
        raise BertkitError("give --input FILE or texts to predict, not both (one of them would be left out)")
    if args.backend != "torch" and args.precision != "fp32":
        raise BertkitError(f"--backend {args.backend} runs on ONNX Runtime's own weights; leave --precision at fp32")
    if args.top_k is not None and (args.task != "word" or args.top_k < 1):
        raise BertkitError(f"--top-k {args.top_k}: " + ("must be at least 1" if args.task == "word" else
                                                         "words per text, an option of the word task"))
    from .inference.export import open_task_folder
    task, model, tok = open_task_folder(args.model, args.task, args.backend)
    if args.top_k is not None:
        task.top_k = args.top_k
    if args.input is None and not args.text:
        raise BertkitError("give --input FILE or texts to predict")
    max_len = task_max_len(task, model, args.max_len)  # within the model's position limit
    if args.text:  # a file's blank lines are refused as it is read
        tok.refuse_tokenless(args.text, lambda i: f"text {i + 1}")
    examples = task.read_inputs(path=args.input) if args.input else task.read_inputs(texts=args.text)
    for field in ("text", "text_pair"):  # classify, word: what the model reads of each line
        if args.input and any(isinstance(ex, dict) and ex.get(field) is not None for ex in examples):
            tok.refuse_tokenless([ex.get(field) for ex in examples], lambda i, field=field: f"{args.input}, line {i + 1} ({field})")
    # a classifier fine-tuned on single texts given pairs, or the reverse, read inputs it never saw (as evaluate refuses)
    task.check(examples, args.input or "the texts given")
    feats = task.features(examples, tok, max_len)
    preds, _ = run_task(task, model, feats, examples, tok, precision=args.precision)
    for p, ex in zip(preds, examples):
        print(json.dumps(task.describe(p, ex)))


def cmd_serve(args) -> None:
    from .inference.serve import ServeConfig, serve

    serve(ServeConfig(model=args.model, host=args.host, port=args.port, backend=args.backend,
                      batching=not args.no_batching, batch_window_ms=args.batch_window_ms,
                      batch_tokens=args.batch_tokens, max_body_bytes=args.max_body_bytes, max_texts=args.max_texts,
                      max_tokens=args.max_tokens, max_attention_tokens=args.max_attention_tokens,
                      max_queue=args.max_queue))


def cmd_export(args) -> None:
    from .inference.export import export, export_file

    if args.onnx:
        report = export_file(args.model, args.onnx, int8=args.int8, overwrite=args.overwrite)
        print(f"bertkit: wrote {report['onnx']}, the encoder (inputs input_ids, token_type_ids, attention_mask; "
              f"outputs sequence_output, pooled_output; largest difference from PyTorch on a check batch: "
              f"{report['max_abs_diff']:.1e})")
        if args.int8:
            print(f"bertkit: wrote {report['int8']} (int8 weights; largest difference: "
                  f"{report['int8_max_abs_diff']:.1e})")
        from .tasks.folder import fine_tuned_task
        if fine_tuned_task(args.model):
            print("bertkit: the file holds the encoder only; `bertkit export --out DIR` also exports the task's head")
        return
    report = export(args.model, args.out, int8=args.int8, overwrite=args.overwrite)
    print(f"bertkit: wrote {report['onnx']} (largest difference from PyTorch on a check batch: "
          f"{report['max_abs_diff']:.1e})")
    if "head" in report:
        print(f"bertkit: wrote {report['head']} (the task head; largest difference: {report['head_max_abs_diff']:.1e})")
    if args.int8:
        print(f"bertkit: wrote {report['int8']} (int8 weights; largest difference: {report['int8_max_abs_diff']:.1e})")
    backends = "--backend onnx" + (" or onnx-int8" if args.int8 else "")
    print(f"bertkit: {args.out} is a model folder: use it with {backends} (encode, predict, serve)")


def cmd_data_export(args) -> None:
    from .data.registry import export

    summary = export(args.name, args.out, overwrite=args.overwrite)
    counts = {k: v for k, v in summary["counts"].items() if isinstance(v, int)}
    print(f"bertkit: exported {args.name} to {args.out}: {json.dumps(counts)}")
    for split, path in summary["files"].items():
        print(f"  {split}: {path}")


def cmd_data_list(args) -> None:
    from .data.registry import available, available_checkpoints

    for name, line in available().items():
        print(f"{name:20} {line}")
    print("\ncheckpoints (each a model folder: pass its path as --model):")
    for name, line in available_checkpoints().items():
        print(f"{name:20} {line}")


PRECISION_HELP = ("fp32 (default) or bf16 autocast: faster on a GPU and on a CPU with native bf16 (AMX or AVX512_BF16), "
                  "results drift from fp32")


def _encode_parser(sub) -> None:
    e = sub.add_parser("encode", help="sentence vectors of texts or text pairs, written as .npy (streamed, resumable, "
                                      "and shared among processes under torchrun)")
    e.add_argument("--model", required=True, help="model folder (HF layout)")
    e.add_argument("--input", required=True, help=".txt (one text per line) or .jsonl with text[, text_pair]")
    e.add_argument("--output", required=True, help="output .npy file, shape (texts, hidden size)")
    e.add_argument("--pooling", choices=["cls", "mean", "pooler"], default=None,
                   help="default: what the folder declares (sentence-transformers), else cls")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--chunk-texts", type=int, default=None, metavar="N",
                   help="texts sorted by length together, the most a kill loses and what processes share out "
                        "(default 4096; on --resume, the interrupted run's)")
    e.add_argument("--max-len", type=int, default=None,
                   help="tokens per text (default: a sentence-transformers folder's max_seq_length, as "
                        "sentence-transformers reads it, e.g. 256 for all-MiniLM-L6-v2; else the model's positions)")
    e.add_argument("--no-truncation", action="store_true", help="error on texts over --max-len")
    e.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="scale vectors to unit length (default: as the folder says; a sentence-transformers "
                        "folder ending with Normalize, as all-MiniLM-L6-v2 does, is normalised)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --output file (and start an "
                   "interrupted one over)")
    e.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.partial (same input and options; any process count)")
    e.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="the vectors' type in the file (float16 halves it)")
    e.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help=PRECISION_HELP)
    e.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                   help="onnx: the encoder on ONNX Runtime (a folder made by `bertkit export`)")
    e.set_defaults(func=cmd_encode)


def _pretrain_parser(sub) -> None:
    from .pretraining.recipes import PretrainConfig
    from .training.options import add_flags
    pt = sub.add_parser("pretrain", help="pretrain BERT with MLM + NSP on raw text (default: tiny on wiki)")
    pt.add_argument("--config", help="TOML file with the options below (underscores or dashes); flags override it")
    add_flags(pt, PretrainConfig, budget="default 10m", save_every="default 100",
              lr="default: the recipe's from scratch or from a bertkit run that began there, 5e-5 from "
                 "another folder", warmup="recipe: 0.05, textbook 0.1")
    pt.add_argument("--no-samples", action="store_true", help="skip the fill-mask and context examples and the downstream check at the end")
    pt.set_defaults(func=cmd_pretrain)


def _fill_mask_parser(sub) -> None:
    fm = sub.add_parser("fill-mask", help="top predictions for each [MASK] in the texts")
    fm.add_argument("--model", required=True)
    fm.add_argument("--top-k", type=int, default=5)
    fm.add_argument("text", nargs="*")
    fm.set_defaults(func=cmd_fill_mask)


def _finetune_parser(sub) -> None:
    from .tasks import TASKS
    from .training.options import add_flags
    ft = sub.add_parser("finetune", help="fine-tune a model folder for a task")
    ft.add_argument("task", choices=list(TASKS))
    from .tasks import DEFAULTS, OPTION_DEFAULTS, OPTION_KEYS
    from .tasks.options import FinetuneConfig
    per_task = lambda key: "; ".join(f"{t} {d[key]:g}" for t, d in DEFAULTS.items())  # noqa: E731
    variants = lambda key: "; ".join(f"{t} with {k}={v}: {d[key]:g}" for t, by in OPTION_DEFAULTS.items()  # noqa: E731
                                     for (k, v), d in by.items() if key in d)
    ft.add_argument("--head", choices=["linear", "mlp"], help="classify: the classifier head")
    ft.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="task option, checked before anything is read: "
                         + "; ".join(f"{task}: {keys}" for task, keys in OPTION_KEYS.items()))
    add_flags(ft, FinetuneConfig, budget="instead of --epochs", warmup="default 0.1", resume="give the same options",
              lr=f"default per task: {per_task('lr')}; for a model bertkit pretrained from scratch "
                 "1e-3 x 128 / its hidden size",
              save_every="default: at each epoch's end; removed when the run completes",
              precision="evaluation is always fp32",
              epochs=f"default per task: {per_task('epochs')} ({variants('epochs')}); for a model bertkit pretrained "
                     "from scratch, more where that is under 950 steps",
              batch_size=f"default per task: {per_task('batch_size')}",
              max_len=f"default per task: {per_task('max_len')}")
    ft.set_defaults(func=cmd_finetune)


def _evaluate_parser(sub) -> None:
    from .tasks import TASKS
    ev = sub.add_parser("evaluate", help="metrics of a fine-tuned folder on a data file, as one JSON object")
    ev.add_argument("task", choices=list(TASKS))
    ev.add_argument("--model", required=True)
    ev.add_argument("--data", required=True)
    ev.add_argument("--max-len", type=int, default=None)
    ev.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help=PRECISION_HELP)
    ev.set_defaults(func=cmd_evaluate)


def _predict_parser(sub) -> None:
    from .tasks import TASKS
    pr = sub.add_parser("predict", help="predictions of a fine-tuned folder, as JSON lines")
    pr.add_argument("task", choices=list(TASKS))
    pr.add_argument("--model", required=True)
    pr.add_argument("--input", help=".txt (one per line) or .jsonl (text[, text_pair]; qa: question, context)")
    pr.add_argument("--max-len", type=int, default=None)
    pr.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help=PRECISION_HELP)
    pr.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                    help="onnx: the encoder on ONNX Runtime (a folder made by `bertkit export`)")
    pr.add_argument("--top-k", type=int, help="word: words per text, best first (default 10)")
    pr.add_argument("text", nargs="*")
    pr.set_defaults(func=cmd_predict)


def _serve_parser(sub) -> None:
    sv = sub.add_parser("serve", help="HTTP server: /encode, /v1/embeddings, /fill-mask, /predict, /attention, page at /")
    sv.add_argument("--model", required=True, help="model folder (pretrained, fine-tuned or exported)")
    sv.add_argument("--host", default="127.0.0.1", help="default loopback only; 0.0.0.0 opens it to the network")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                    help="onnx: the encoder on ONNX Runtime (a folder made by `bertkit export`)")
    sv.add_argument("--no-batching", action="store_true", help="run each request alone")
    sv.add_argument("--batch-window-ms", type=float, default=0.0,
                    help="extra wait for requests to share a model call (default 0: the requests that "
                         "arrived while the model was busy share the next call)")
    sv.add_argument("--batch-tokens", type=int, default=16384, help="tokens per model call at most (default 16384)")
    sv.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit (default 1 MiB)")
    sv.add_argument("--max-texts", type=int, default=256, help="texts per request (default 256)")
    sv.add_argument("--max-tokens", type=int, default=None,
                    help="tokens per text (default: a sentence-transformers folder's max_seq_length, e.g. 256 for "
                         "all-MiniLM-L6-v2; else the model's positions)")
    sv.add_argument("--max-attention-tokens", type=int, default=128, help="tokens per /attention text (default 128)")
    sv.add_argument("--max-queue", type=int, default=64,
                    help="requests in the server at once (default 64); past it a request gets 503 with Retry-After")
    sv.set_defaults(func=cmd_serve)


def _export_parser(sub) -> None:
    ex = sub.add_parser("export", help="a model folder with the encoder as ONNX, for --backend onnx")
    ex.add_argument("--model", required=True)
    where = ex.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="a new model folder: the model's files plus model.onnx (and a fine-tuned "
                                     "task's head.onnx), for --backend onnx")
    where.add_argument("--onnx", metavar="FILE", help="the encoder alone as one .onnx file, for ONNX Runtime "
                                                      "outside bertkit")
    ex.add_argument("--int8", action="store_true",
                    help="also write the int8 model (dynamic int8 weights): model.int8.onnx, or FILE.int8.onnx")
    ex.add_argument("--overwrite", action="store_true",
                    help="write into a non-empty --out (its model files the model lacks removed), or over an --onnx file")
    ex.set_defaults(func=cmd_export)


def _data_parser(sub) -> None:
    from .data.registry import DATASETS
    d = sub.add_parser("data", help="the built-in real data sets, in the standard file formats")
    dsub = d.add_subparsers(dest="action", required=True)
    de = dsub.add_parser("export", help="write a data set with its fixed seeded split")
    de.add_argument("name", choices=list(DATASETS))
    de.add_argument("--out", required=True)
    de.add_argument("--overwrite", action="store_true", help="replace files already in --out")
    de.set_defaults(func=cmd_data_export)
    dl = dsub.add_parser("list", help="the data sets and the published checkpoint, and whether their packages are installed")
    dl.set_defaults(func=cmd_data_list)


def _tokenizer_parser(sub) -> None:
    from .pretraining.recipes import SENTENCE_PER_LINE_HELP
    t = sub.add_parser("tokenizer", help="WordPiece vocabularies")
    tsub = t.add_subparsers(dest="action", required=True)
    tt = tsub.add_parser("train", help="train a WordPiece vocabulary on a .txt file, a folder of them, or 'wiki'")
    tt.add_argument("--corpus", required=True)
    tt.add_argument("--vocab-size", type=int, default=30522)
    tt.add_argument("--out", required=True)
    tt.add_argument("--min-frequency", type=int, default=2)
    tt.add_argument("--cased", action="store_true", help="keep case (default: lower-case, as uncased BERT)")
    tt.add_argument("--sentence-per-line", action="store_true", help=SENTENCE_PER_LINE_HELP)
    tt.add_argument("--overwrite", action="store_true", help="replace an existing vocabulary in --out")
    tt.set_defaults(func=cmd_tokenizer_train)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertkit", description="BERT end to end: encode, tokenize, train.")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_encode_parser, _pretrain_parser, _fill_mask_parser, _finetune_parser, _evaluate_parser,
                _predict_parser, _serve_parser, _export_parser, _data_parser, _tokenizer_parser):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # texts after the options (`predict TASK --model M "a text"`): argparse leaves them over
    # (after "--", a text may start with "-": "-5 stars")
    texts = extra[1:] if extra[:1] == ["--"] else extra
    if extra and hasattr(args, "text") and (extra[:1] == ["--"] or not any(e.startswith("-") for e in extra)):
        args.text = list(args.text or []) + texts
    elif extra:
        hint = ("; a text that starts with '-' goes after '--' (bertkit predict classify --model M -- \"-5 stars\")"
                if hasattr(args, "text") else "")
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    warnings.formatwarning = lambda msg, *a, **k: f"bertkit: warning: {msg}\n"
    if args.func in (cmd_encode, cmd_fill_mask, cmd_predict, cmd_evaluate):
        # a batch's freed activations serve the next one (training/memory.py): bertkit encode on
        # 4,096 reviews faulted 0.7-1.0 M pages without, 0.15 M with, and ran 1.07x faster
        keep_freed_memory()
    try:
        with _output_lock(args):
            args.func(args)
    except BertkitError as e:
        print(f"bertkit: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"bertkit: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a full disk: an OSError, or safetensors' own SafetensorError
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if not (full or (type(e).__name__ == "SafetensorError" and "No space left on device" in str(e))):
            raise
        # checkpoints and model files are written whole (atomic_write) or not at all: what was whole stays
        where = getattr(e, "filename", None) or getattr(args, "out", None) or getattr(args, "output", None) or "a file"
        print(f"bertkit: error: no space left on device while writing {where}; the checkpoints and files "
              "written whole before it are kept", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a training loop's own handling (which says what it saved)
        # not "nothing was saved": a run stopped after its loop (its closing evaluation or plot)
        # keeps the checkpoints it wrote, and --resume continues from them
        out = getattr(args, "out", None)
        print("bertkit: interrupted" + (f"; what was already written to {out} is kept" if out else ""),
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """The `bertkit` console command (and `python -m bertkit`): main(), then exit without the
    interpreter's last garbage collections over every object torch made at import (0.4 s of
    the 1.7 s `bertkit encode` took on one sentence). Frozen objects are skipped by them, and
    files, atexit handlers and streams still close as usual. Not in main(), which tests call
    in one long-lived process."""
    code = main()
    gc.freeze()
    sys.exit(code)
