"""The T5 shapes of the embedded German->English pair.

``large`` is trained from scratch. The small model of the pair is ``SHRINK["small"]``: cut out of
the trained large model (shrink.py) -- the large model's whole encoder (run once per input, so it
costs little per token), its width, embedding and LM head, and ONE decoder layer (copied from
the large decoder's layer 0), so one decoding step is cheap: on CPU a model this size spends
its step mostly in per-layer call overhead, so decoder depth dominates. That is also why the
large decoder has 12 layers: with 6 (the first shipped pair) a small step cost about a third
of a large one, since the per-call work outside the layers is shared by both; with 12 it is
under a quarter, which is what lets BiLD's skipped large steps pay. ``SHAPES["small"]`` is
the earlier from-scratch small shape (d_model 128, 3/1 layers), kept for ``t5_config`` users and
tests. All share the tokenizer (pad 0, eos 1, unk 2) and T5's conventions (decoder start = pad).
"""
from __future__ import annotations

from transformers import T5Config

SHAPES: dict[str, dict] = {
    "large": dict(d_model=256, d_ff=512, num_heads=4, d_kv=64,
                  num_layers=6, num_decoder_layers=12, dropout_rate=0.1),
    "small": dict(d_model=128, d_ff=512, num_heads=4, d_kv=32,
                  num_layers=3, num_decoder_layers=1, dropout_rate=0.1),
}

# size -> shrink_from_large() arguments: which of the large model's layers the small model keeps.
SHRINK: dict[str, dict] = {
    "small": dict(decoder_layers=(0,), encoder_layers=None),  # all 6 encoder layers, 1 decoder layer
}


def t5_config(size: str, vocab_size: int, **overrides) -> T5Config:
    """The T5Config for ``size`` ("large" or "small"); ``overrides`` replace shape fields."""
    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SHAPES)}")
    shape = {**SHAPES[size], **overrides}
    return T5Config(
        vocab_size=vocab_size,
        feed_forward_proj="relu",
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        layer_norm_epsilon=1e-6,
        initializer_factor=1.0,
        tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        use_cache=True,
        **shape,
    )
