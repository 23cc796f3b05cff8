"""Greedy corpus BLEU (metrics.quality: sacrebleu, detokenized output) and per-token decode cost."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from pipeline.decoding.models import load_model as _load_any_model
from pipeline.io.records import apply_prompt
from pipeline.metrics.quality import signatures, translation_scores


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """A saved model in float32 (the float16 export too), in eval mode: the decoding layer's loader."""
    return _load_any_model(str(path), dtype=torch.float32, device=device)


def _empty_cache():
    """An empty seq2seq KV cache that grows with the decoder, whatever its depth."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), DynamicCache())


@torch.inference_mode()
def greedy_translate(model, tokenizer, sources: list[str], *, prompt: str | None = None,
                     batch_size: int = 64, max_new_tokens: int = 128,
                     max_source_tokens: int = 256) -> list[str]:
    """Greedy (num_beams=1) batched generation; sources are sorted by length for speed. ``prompt``: the
    template around each source, as in job files ("translate German to English: {text}")."""
    device = next(model.parameters()).device
    texts = [apply_prompt(prompt, s) for s in sources]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[str | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        enc = tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                        truncation=True, max_length=max_source_tokens).to(device)
        # A fresh, unsized cache: generate() would size its own by the encoder's depth, which
        # breaks a decoder deeper than the encoder (T5's num_decoder_layers > num_layers).
        gen = model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                             cache=_empty_cache())
        for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True)):
            out[i] = text.strip()
    return out  # type: ignore[return-value]


def bleu_of(model, tokenizer, sources: list[str], references: list[str], **kw) -> tuple[float, list[str]]:
    hyps = greedy_translate(model, tokenizer, sources, **kw)
    return translation_scores(hyps, references).bleu, hyps


@torch.inference_mode()
def decode_step_ms(model, *, source_len: int = 16, steps: int = 32, repeats: int = 5,
                   warmup: int = 1) -> float:
    """Median milliseconds of ONE decoder forward step (batch 1, KV cache, CPU by default).

    The encoder runs once outside the timed region; each timed step feeds one token with the
    cache of the previous steps, as an autoregressive decoder does.
    """
    model.eval()
    device = next(model.parameters()).device
    cfg = model.config
    src = torch.randint(3, cfg.vocab_size, (1, source_len), device=device)
    enc = model.get_encoder()(input_ids=src)
    tok = torch.full((1, 1), cfg.decoder_start_token_id, dtype=torch.long, device=device)
    per_step = []
    for r in range(warmup + repeats):
        cache = _empty_cache()
        t = tok
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(encoder_outputs=enc, decoder_input_ids=t, cache=cache, use_cache=True)
            t = out.logits[:, -1:].argmax(-1)
        dt = (time.perf_counter() - t0) * 1000 / steps
        if r >= warmup:
            per_step.append(dt)
    return statistics.median(per_step)


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.inference_mode()
def teacher_forced_agreement(small, large, tokenizer, sources: list[str], large_outputs: list[str],
                             batch_size: int = 100) -> float:
    """Fraction of the large model's greedy output tokens that the small model also predicts
    (argmax) given the same prefix: a cheap proxy for how often BiLD keeps a small-model draft."""
    agree = total = 0
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start:start + batch_size], return_tensors="pt", padding=True)
        lab = tokenizer(large_outputs[start:start + batch_size], return_tensors="pt", padding=True).input_ids
        mask = lab != tokenizer.pad_token_id
        dec_in = large._shift_right(lab)
        ps = small(**enc, decoder_input_ids=dec_in).logits.argmax(-1)
        pl = large(**enc, decoder_input_ids=dec_in).logits.argmax(-1)
        agree += int(((ps == pl) & mask).sum())
        total += int(mask.sum())
    return agree / max(1, total)


def folder_mb(path: str | Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e6


def evaluate_exports(export_dir: str | Path, data_dir: str | Path, *, split: str = "test_2016_flickr",
                     threads: int = 1, device: str = "cpu", timing_repeats: int = 15) -> dict:
    """Test BLEU (greedy, detokenized, sacrebleu defaults), params, decode-step cost (batch 1,
    KV cache, CPU) and size of every model in ``export_dir``; writes ``report.json`` there.

    Decode cost is timed with the models interleaved, ``timing_repeats`` times 32 steps each; the
    minimum is the least disturbed by other work on a shared CPU, the median is also reported."""
    from transformers import AutoTokenizer

    from .data import read_parallel

    torch.set_num_threads(threads)
    export_dir = Path(export_dir)
    src, ref = read_parallel(data_dir, split)
    names = [n for n in ("large", "small", "small-aligned") if (export_dir / n).exists()]
    models = {n: load_model(export_dir / n, "cpu") for n in names}
    tok = AutoTokenizer.from_pretrained(str(export_dir / names[0]))
    report: dict = {"split": split, "sentences": len(src), "threads": threads,
                    "bleu_signature": signatures("translation")["bleu"], "models": {}}
    hyps = {}
    for n, m in models.items():
        t0 = time.time()
        bleu, hyps[n] = bleu_of(m, tok, src, ref, batch_size=100, max_new_tokens=128)
        report["models"][n] = {"params": count_params(m), "test_bleu": round(bleu, 2),
                               "translate_seconds": round(time.time() - t0, 1),
                               "size_mb": round(folder_mb(export_dir / n), 2)}
        print(f"{n}: BLEU {bleu:.2f}", flush=True)
    # Decode-step cost: interleave the models so background load hits all of them alike.
    timings: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(timing_repeats):
        for n, m in models.items():
            timings[n].append(decode_step_ms(m, repeats=1))
    for n in names:
        report["models"][n]["decode_step_ms_median"] = round(statistics.median(timings[n]), 3)
        report["models"][n]["decode_step_ms_min"] = round(min(timings[n]), 3)
    if "large" in models:
        L = report["models"]["large"]
        for n in names:
            if n != "large":
                r = report["models"][n]
                r["step_cost_vs_large_median"] = round(r["decode_step_ms_median"] / L["decode_step_ms_median"], 3)
                r["step_cost_vs_large_min"] = round(r["decode_step_ms_min"] / L["decode_step_ms_min"], 3)
                r["agreement_with_large_greedy"] = round(
                    teacher_forced_agreement(models[n], models["large"], tok, src, hyps["large"]), 4)
    report["total_mb"] = round(folder_mb(export_dir), 2)
    (export_dir / "report.json").write_text(json.dumps(report, indent=2))
    hyp_dir = export_dir.parent / "eval"  # outside the export, so it does not count in its size
    hyp_dir.mkdir(exist_ok=True)
    for n in names:
        (hyp_dir / f"{n}.{split}.hyp.txt").write_text("\n".join(hyps[n]) + "\n")
    (hyp_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report
