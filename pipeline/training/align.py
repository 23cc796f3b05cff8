"""BiLD prediction alignment (Kim et al. 2023, arXiv 2302.07863, section 3.4).

The small model is fine-tuned on the LARGE model's own greedy outputs for the training inputs
(not on the references), so that it predicts what the large model would write and its drafts are
accepted more often. Works for any Hugging Face seq2seq pair sharing a tokenizer.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

from pipeline.io.records import apply_prompt

from .evaluate import greedy_translate, load_model
from .train import TrainConfig, log, pick_device, train


def large_model_outputs(large_path: str | Path, source_texts: list[str], cache_file: str | Path, *,
                        prompt: str | None = None, batch_size: int = 100, max_new_tokens: int = 128,
                        device: str = "auto", chunk: int = 2000) -> list[str]:
    """The large model's greedy outputs for ``source_texts``, cached (and resumable) as JSONL.

    Work is done in chunks of ``chunk`` sources; each finished chunk is appended to
    ``cache_file`` so an interrupted run continues where it stopped.
    """
    from transformers import AutoTokenizer

    cache_file = Path(cache_file)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    done: dict[int, str] = {}
    if cache_file.exists():
        with open(cache_file, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a torn last line from an interrupted write
                    continue
                done[row["i"]] = row["text"]
    todo = [i for i in range(len(source_texts)) if i not in done]
    if todo:
        dev = pick_device(device)
        model = load_model(large_path, dev)
        tok = AutoTokenizer.from_pretrained(str(large_path))
        t0 = time.time()
        for start in range(0, len(todo), chunk):
            idx = todo[start:start + chunk]
            outs = greedy_translate(model, tok, [source_texts[i] for i in idx], prompt=prompt,
                                    batch_size=batch_size, max_new_tokens=max_new_tokens)
            with open(cache_file, "a", encoding="utf-8") as f:
                for i, text in zip(idx, outs):
                    f.write(json.dumps({"i": i, "text": text}, ensure_ascii=False) + "\n")
                    done[i] = text
            n = start + len(idx)
            log(f"large outputs: {n}/{len(todo)} ({n/(time.time()-t0):.1f} sentences/s)")
    return [done[i] for i in range(len(source_texts))]


def align_small_model(small_path: str | Path, large_path: str | Path, source_texts: list[str],
                      out_dir: str | Path, *, prompt: str | None = None, epochs: float = 2.0,
                      lr: float = 5e-3, optimizer: str = "adafactor", batch_tokens: int = 2500, seed: int = 0,
                      device: str = "auto", threads: int = 1, warmup_steps: int = 50,
                      val_sources: list[str] | None = None, val_references: list[str] | None = None,
                      val_data_dir: str | Path | None = None, max_new_tokens: int = 128,
                      dropout: float | None = None, drop_degenerate: bool = True,
                      freeze_encoder: bool = False, max_minutes: float = 0.0,
                      distill: bool = False) -> Path:
    """Fine-tunes the small model on the large model's greedy outputs; returns the aligned model folder.

    1. ``large_path`` greedily decodes every ``source_texts`` entry (batched ``generate``; cached in
       ``out_dir/large_outputs.jsonl``, resumable).
    2. The small model (``small_path``) is trained on (source, large output) pairs with the
       ordinary resumable loop (checkpoints in ``out_dir/ckpt-small-aligned``).
    3. The aligned model is written with ``save_pretrained`` to ``out_dir/small-aligned-best``
       (the best by val BLEU against references when val text is given, else the last one),
       together with the small model's tokenizer files.

    ``drop_degenerate`` leaves out the large model's outputs that are repetition loops or far
    longer than their source (a few percent here), which otherwise teach the small model to loop.
    ``prompt`` is the template around every source, as in job files (e.g. ``"translate German to English:
    {text}"`` for T5 checkpoints that expect a task prefix). Both models must share one tokenizer.
    ``freeze_encoder`` fine-tunes the small model's decoder only (for a small model whose encoder
    is the large model's, see shrink.py); ``max_minutes`` caps the fine-tune's training time.
    ``distill`` trains on the large model's whole next-token distribution at every position of
    its outputs (KL, see train.seq2seq_loss) instead of its output tokens alone.
    """
    torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_same_vocab(small_path, large_path)
    targets = large_model_outputs(large_path, source_texts, out_dir / "large_outputs.jsonl",
                                  prompt=prompt, device=device, max_new_tokens=max_new_tokens)
    sources = [apply_prompt(prompt, s) for s in source_texts]
    if drop_degenerate:
        keep = [i for i, (s, t) in enumerate(zip(source_texts, targets)) if not looks_degenerate(s, t)]
        log(f"alignment data: {len(keep)}/{len(sources)} pairs kept "
            f"(dropped {len(sources) - len(keep)} degenerate large outputs)")
        sources, targets = [sources[i] for i in keep], [targets[i] for i in keep]
    if val_sources is not None:
        val_sources = [apply_prompt(prompt, s) for s in val_sources]
    cfg = TrainConfig(size="aligned", epochs=epochs, batch_tokens=batch_tokens, lr=lr, optimizer=optimizer,
                      warmup_steps=warmup_steps, min_lr_ratio=0.05, seed=seed, device=device,
                      threads=threads, dropout=dropout, freeze_encoder=freeze_encoder,
                      max_minutes=max_minutes, distill_from=str(large_path) if distill else None)
    return train(val_data_dir, out_dir, small_path, cfg, init_from=small_path,
                 train_sources=sources, train_targets=targets, run_name="small-aligned",
                 val_sources=val_sources, val_references=val_references)


_LOOP = re.compile(r"(\b\w+\b)( \1\b){2,}")


def looks_degenerate(source: str, output: str) -> bool:
    """A repetition loop ("a a a", "of of of") or an output over twice the source's word count + 3."""
    return bool(_LOOP.search(output)) or len(output.split()) > 2 * len(source.split()) + 3


def _check_same_vocab(small_path, large_path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    ts, tl = AutoTokenizer.from_pretrained(str(small_path)), AutoTokenizer.from_pretrained(str(large_path))
    if ts.get_vocab() != tl.get_vocab():
        raise ValueError(f"{small_path} and {large_path} do not share a vocabulary")
    cs, cl = AutoConfig.from_pretrained(str(small_path)), AutoConfig.from_pretrained(str(large_path))
    if not (cs.is_encoder_decoder and cl.is_encoder_decoder):
        raise ValueError("align_small_model needs two encoder-decoder (seq2seq) models")
