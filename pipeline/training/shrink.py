"""Shrink-and-fine-tune: a small T5 cut out of the large one (deep encoder, shallow decoder).

On a CPU at batch 1 the cost of one decoding step is set by the decoder alone (the encoder runs
once per input), and for models this size mostly by the number of decoder layers. So the small
model of the pair keeps the large model's width, its shared embedding / LM head and its whole
encoder (weights copied), and gets ONE decoder layer, copied from a layer of the large decoder
(Kasai et al. 2021, "Deep encoder, shallow decoder"; Shleifer & Rush 2020, "shrink and
fine-tune"). Fine-tuning then trains only what differs from the large model: the decoder.
"""
from __future__ import annotations

from pathlib import Path

import torch


def shrink_from_large(large, *, decoder_layers: list[int] | tuple[int, ...] = (0,),
                      encoder_layers: list[int] | tuple[int, ...] | None = None):
    """A new ``T5ForConditionalGeneration`` whose weights are copied from ``large``.

    ``large``: a T5 model (or a folder / hub id of one). ``decoder_layers`` / ``encoder_layers``:
    which of the large model's layers to keep, in order (encoder default: all). The shared
    embedding (= tied LM head), final layer norms and every kept layer are copied exactly. T5
    keeps its relative-attention bias only in layer 0 of each stack: the new layer 0 always gets
    the large model's layer-0 bias, whichever layer its other weights come from.
    """
    from transformers import AutoModelForSeq2SeqLM, T5ForConditionalGeneration

    if isinstance(large, (str, Path)):
        large = AutoModelForSeq2SeqLM.from_pretrained(str(large), dtype=torch.float32)
    cfg = large.config
    enc_keep = list(range(cfg.num_layers)) if encoder_layers is None else list(encoder_layers)
    dec_keep = list(decoder_layers)
    for name, keep, n in (("encoder", enc_keep, cfg.num_layers), ("decoder", dec_keep, cfg.num_decoder_layers)):
        if not keep or any(not 0 <= i < n for i in keep):
            raise ValueError(f"{name}_layers must be a non-empty list of layer indices in [0, {n}), got {keep}")
    new_cfg = cfg.__class__.from_dict({**cfg.to_dict(), "num_layers": len(enc_keep),
                                       "num_decoder_layers": len(dec_keep)})
    small = T5ForConditionalGeneration(new_cfg).to(next(large.parameters()).dtype)
    small.shared.load_state_dict(large.shared.state_dict())
    for stack, keep in ((("encoder"), enc_keep), (("decoder"), dec_keep)):
        src, dst = getattr(large, stack), getattr(small, stack)
        for j, i in enumerate(keep):
            state = dict(src.block[i].state_dict())
            bias_key = "layer.0.SelfAttention.relative_attention_bias.weight"
            if j == 0:
                state[bias_key] = src.block[0].state_dict()[bias_key]
            dst.block[j].load_state_dict(state, strict=True)
        dst.final_layer_norm.load_state_dict(src.final_layer_norm.state_dict())
    if not small.config.tie_word_embeddings:
        small.lm_head.load_state_dict(large.lm_head.state_dict())
    small.generation_config = large.generation_config
    return small.eval()


def save_shrunk(large_dir: str | Path, out_dir: str | Path, *, decoder_layers=(0,), encoder_layers=None) -> Path:
    """``shrink_from_large`` of the model in ``large_dir``, written (with its tokenizer files) to ``out_dir``;
    does nothing if ``out_dir`` already holds a model."""
    from .train import export_model

    out_dir = Path(out_dir)
    if (out_dir / "model.safetensors").exists():
        return out_dir
    small = shrink_from_large(large_dir, decoder_layers=decoder_layers, encoder_layers=encoder_layers)
    export_model(small, large_dir, out_dir, info={
        "shrunk_from": str(large_dir), "decoder_layers": list(decoder_layers),
        "encoder_layers": None if encoder_layers is None else list(encoder_layers)})
    return out_dir
