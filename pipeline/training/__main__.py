"""Command line: ``python -m pipeline.training {tokenizer,train,align,export,evaluate,all} ...``.

Every step writes under ``--out`` and is resumable: rerunning the same command skips finished
steps and continues a training run from its last checkpoint.

  tokenizer  joint de+en SentencePiece -> <out>/tokenizer
  train      --size large|small -> <out>/ckpt-<size>/ (checkpoints), <out>/<size>-best (best val BLEU);
             the small model starts as a cut-down copy of <out>/large-best (<out>/small-init, shrink.py)
             and only its decoder is trained
  align      large greedy outputs on the training sources, small fine-tuned on them
             -> <out>/small-aligned-run/small-aligned-best (--align-loss distill: on the large
             model's next-token distributions, -> <out>/small-aligned-distill-run/...)
  export     copies tokenizer + best models into <out>/export/{tokenizer,large,small,small-aligned}
             (weights as float16 safetensors unless --export-dtype float32)
  evaluate   test BLEU + decode-step cost of each exported model -> <out>/export/report.json
  all        tokenizer, train large, train small, align, export, evaluate
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .model_shapes import SHRINK

# Per-size training defaults, chosen by short pilot runs on a 2-core CPU (Adafactor with relative
# updates beat AdamW at equal steps on these T5 shapes; epochs are what fit the CPU budget).
# The small model is not trained from scratch: it is cut out of the trained large model (its whole
# encoder, embedding/LM head and one decoder layer, see shrink.py) and only its decoder is trained.
TRAIN_DEFAULTS = {
    "large": dict(optimizer="adafactor", epochs=5, batch_tokens=2500, lr=2e-2, warmup_steps=200),
    "small": dict(optimizer="adafactor", epochs=4, batch_tokens=2500, lr=1e-2, warmup_steps=100,
                  freeze_encoder=True),
}


def cmd_tokenizer(args) -> Path:
    from .data import read_parallel
    from .tokenizer import build_tokenizer

    out = Path(args.out) / "tokenizer"
    if (out / "tokenizer.json").exists():
        print(f"tokenizer exists: {out}")
        return out
    src, tgt = read_parallel(args.data, "train")
    build_tokenizer(src, tgt, out, vocab_size=args.vocab_size, seed=args.seed)
    print(f"tokenizer written: {out}")
    return out


def train_config(args, size: str):
    from .train import TrainConfig

    kw = dict(TRAIN_DEFAULTS[size])
    for name in ("optimizer", "epochs", "batch_tokens", "lr", "warmup_steps", "dropout", "max_minutes",
                 "eval_minutes"):
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    shape = dict(parse_shape(item) for item in getattr(args, "shape", None) or []) if size == "large" else {}
    return TrainConfig(size=size, seed=args.seed, threads=args.threads, device=args.device,
                       val_subset=args.val_subset, shape_overrides=shape, **kw)


def parse_shape(item: str) -> tuple[str, int]:
    """``"num_decoder_layers=12"`` -> ``("num_decoder_layers", 12)``: one T5Config shape field."""
    from .model_shapes import SHAPES

    integer_fields = sorted(k for k, v in SHAPES["large"].items() if isinstance(v, int))
    name, _, value = item.partition("=")
    if name not in integer_fields or not value.strip().isdigit():
        raise SystemExit(f"--shape {item!r}: expected FIELD=INTEGER with FIELD one of {integer_fields}")
    return name, int(value)


def cmd_train(args) -> Path:
    from .shrink import save_shrunk
    from .train import train

    tok_dir = cmd_tokenizer(args)
    init_from = None
    if args.size in SHRINK:  # shrink-and-fine-tune: start from a cut-down copy of the large model
        large = Path(args.out) / "large-best"
        if not (large / "model.safetensors").exists():
            raise SystemExit(f"{large} is missing: train the large model first (train --size large)")
        init_from = save_shrunk(large, Path(args.out) / f"{args.size}-init", **SHRINK[args.size])
        print(f"{args.size} model initialised from {large}: {init_from}")
    return train(args.data, args.out, tok_dir, train_config(args, args.size), init_from=init_from)


def cmd_align(args) -> Path:
    from .align import align_small_model
    from .data import read_parallel

    out = Path(args.out)
    src, _ = read_parallel(args.data, "train")
    if args.align_limit:
        src = src[:args.align_limit]
    return align_small_model(out / "small-best", out / "large-best", src, align_run_dir(out, args.align_loss),
                             epochs=args.align_epochs, lr=args.align_lr, batch_tokens=2500,
                             seed=args.seed, device=args.device, threads=args.threads,
                             val_data_dir=args.data, freeze_encoder=TRAIN_DEFAULTS["small"]["freeze_encoder"],
                             max_minutes=args.max_minutes or 0.0, distill=args.align_loss == "distill")


def align_run_dir(out: Path, align_loss: str = "labels") -> Path:
    """Where ``align`` works: one folder per alignment loss, so that a run never resumes the other's checkpoint."""
    return out / ("small-aligned-run" if align_loss == "labels" else f"small-aligned-{align_loss}-run")


def cmd_evaluate(args) -> dict:
    from .evaluate import evaluate_exports

    report = evaluate_exports(Path(args.out) / "export", args.data, split=args.split,
                              threads=args.threads, device=args.device)
    print(json.dumps(report, indent=2))
    return report


def export_all(out: Path, dtype: str = "float16", align_loss: str = "labels") -> Path:
    """Copies the finished models into ``<out>/export/{tokenizer,large,small,small-aligned}``.

    The weights are written in ``dtype`` ("float16" by default: half the size on disk, so the three
    models fit the repository's budget; loaders cast them back, e.g. ModelPair loads float32 on CPU,
    and the evaluation step measures the exported files) or "float32" (as trained)."""
    import torch

    from .evaluate import load_model

    exp = out / "export"
    exp.mkdir(parents=True, exist_ok=True)
    pairs = {"tokenizer": out / "tokenizer", "large": out / "large-best", "small": out / "small-best",
             "small-aligned": align_run_dir(out, align_loss) / "small-aligned-best"}
    for name, src in pairs.items():
        if not src.exists():
            print(f"missing {src}; not exported", file=sys.stderr)
            continue
        dst = exp / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=None if name == "tokenizer" else shutil.ignore_patterns("spiece.model"))
        if name != "tokenizer" and dtype != "float32":
            model = load_model(src).to(getattr(torch, dtype))
            model.save_pretrained(str(dst), safe_serialization=True)
    return exp


def cmd_all(args) -> None:
    cmd_tokenizer(args)
    for size in ("large", "small"):
        args.size = size
        cmd_train(args)
    cmd_align(args)
    export_all(Path(args.out), args.export_dtype, args.align_loss)
    cmd_evaluate(args)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m pipeline.training", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("--data", required=True, help="folder with train/val/test .de/.en files")
        sp.add_argument("--out", required=True, help="output folder (checkpoints, exports)")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--vocab-size", type=int, default=6000)
        sp.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 is robust when the CPU is shared)")
        sp.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
        sp.add_argument("--val-subset", type=int, default=200)
        sp.add_argument("--optimizer", choices=["adafactor", "adamw"])
        sp.add_argument("--epochs", type=float)
        sp.add_argument("--batch-tokens", type=int)
        sp.add_argument("--lr", type=float)
        sp.add_argument("--warmup-steps", type=int)
        sp.add_argument("--dropout", type=float)
        sp.add_argument("--max-minutes", type=float, help="stop training after this many minutes")
        sp.add_argument("--eval-minutes", type=float, help="also evaluate (val BLEU, best export) this often")
        sp.add_argument("--align-epochs", type=float, default=3.0)
        sp.add_argument("--align-lr", type=float, default=5e-3,
                        help="peak (relative, Adafactor) learning rate of the alignment fine-tune")
        sp.add_argument("--align-loss", choices=["labels", "distill"], default="labels",
                        help="alignment target: the large model's output tokens (labels), or its whole "
                             "next-token distribution at each of them (distill: KL, the token-level KD)")
        sp.add_argument("--align-limit", type=int, default=0,
                        help="align on the first N training sources only (0: all)")
        sp.add_argument("--shape", action="append", metavar="FIELD=N",
                        help="override one field of the large model's shape (model_shapes.SHAPES), e.g. "
                             "num_decoder_layers=12; repeatable. The small model is always cut from the large one")
        sp.add_argument("--split", default="test_2016_flickr")
        sp.add_argument("--export-dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                        help="dtype of the exported weights (float16: half the size; loaded back as float32)")
        return sp

    common(sub.add_parser("tokenizer", help="train the joint SentencePiece tokenizer")).set_defaults(fn=cmd_tokenizer)
    tp = common(sub.add_parser("train", help="train one model (resumes from its checkpoint)"))
    tp.add_argument("--size", choices=["large", "small"], required=True)
    tp.set_defaults(fn=cmd_train)
    common(sub.add_parser("align", help="BiLD prediction alignment of the small model")).set_defaults(fn=cmd_align)
    common(sub.add_parser("export", help="copy the finished models into <out>/export")).set_defaults(
        fn=lambda a: print(export_all(Path(a.out), a.export_dtype, a.align_loss)))
    common(sub.add_parser("evaluate", help="test BLEU and decode cost of the exports")).set_defaults(fn=cmd_evaluate)
    common(sub.add_parser("all", help="everything, in order")).set_defaults(fn=cmd_all)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
