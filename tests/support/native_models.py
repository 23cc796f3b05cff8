"""Tiny random models of every family the native engines run, and the feeds the engine tests use."""

from __future__ import annotations

import torch
from transformers import MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration

from pipeline.pairs.tiny import EOS, PAD, VOCAB_SIZE, _scale_weights, build_model, byte_tokenizer

SHAPES = {
    "t5-v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True, num_decoder_layers=3),
    "t5-v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3),
    "mt5": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3, mt5=True),
    "narrow-heads": dict(d_model=48, num_heads=3, d_kv=24, num_decoder_layers=3),  # 3 * 24 != 48
    "one-decoder-layer": dict(num_decoder_layers=1, tie_word_embeddings=False),
}
BART_FAMILY = ("bart", "mbart", "marian", "nllb")  # pipeline.pairs.tiny's families; nllb is M2M100
# Each BART-family model in pipeline.pairs.tiny's two shapes: "large" (width 64, 3 decoder layers) and
# ":small" (width 32, one decoder layer).
MODELS = [*SHAPES, *BART_FAMILY, *(f"{family}:small" for family in BART_FAMILY)]


def build(name: str, seed: int = 0, dtype=torch.float32):
    """A tiny random model: a T5 shape of SHAPES, or a BART-family model of pipeline.pairs.tiny."""
    family, _, size = name.partition(":")
    if family in BART_FAMILY:
        return build_model(family, size or "large", seed=seed).to(dtype).eval()
    return build_t5(name, seed, dtype)


def build_t5(shape: str, seed: int = 0, dtype=torch.float32):
    settings = dict(SHAPES[shape])
    model_class = MT5ForConditionalGeneration if settings.pop("mt5", False) else T5ForConditionalGeneration
    config = T5Config(vocab_size=VOCAB_SIZE, d_model=settings.pop("d_model", 64), d_ff=128, num_layers=2,
                      num_heads=settings.pop("num_heads", 4), d_kv=settings.pop("d_kv", 16), dropout_rate=0.0,
                      decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS, **settings)
    if model_class is MT5ForConditionalGeneration:
        config.model_type = "mt5"
    torch.manual_seed(seed)
    model = model_class(config)
    _scale_weights(model, 4.0, logit_std=4.0)
    model.generation_config.eos_token_id = EOS
    return model.to(dtype).eval()


def encode(text: str) -> torch.Tensor:
    return torch.tensor(byte_tokenizer(append_eos=True)(text)["input_ids"])


# Where three rows sit among 8 slots: in slot order, out of order, with a gap (read in place over
# the span), and scattered (gathered).
LAYOUTS = {"in-order": [0, 1, 2], "out-of-order": [2, 0, 1], "gap": [2, 0, 3], "scattered": [0, 7, 3]}
