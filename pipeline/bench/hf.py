"""Hugging Face's own generate() on the pair's models: the baseline a transformers user runs."""

from __future__ import annotations

import contextlib

import torch

from pipeline.decoding import ModelPair


@contextlib.contextmanager
def _hf_cache_workaround(*models):
    """transformers sizes a T5 decoder cache by the *encoder* depth (num_layers), which breaks
    generate() for pairs whose decoder depth differs; for HF's own runs, let it see the decoder's."""
    saved = []
    for model in models:
        config = model.config
        if getattr(config, "num_decoder_layers", None) not in (None, getattr(config, "num_layers", None)):
            saved.append((config, config.num_layers))
            config.num_layers = config.num_decoder_layers
    try:
        yield
    finally:
        for config, layers in saved:
            config.num_layers = layers


def hf_greedy(pair: ModelPair, input_ids: torch.Tensor, max_new_tokens: int, assistant=None,
              confidence: float | None = None) -> list[int]:
    """The large model's greedy generate(); with ``assistant``, HF's assisted generation (its own
    speculative decoding), with ``confidence`` its dynamic draft window."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                  attention_mask=torch.ones_like(input_ids))
    if assistant is not None:
        kwargs["assistant_model"] = assistant
        if confidence is not None:
            kwargs["assistant_confidence_threshold"] = confidence
    with torch.inference_mode(), _hf_cache_workaround(pair.large, pair.small):
        out = pair.large.generate(input_ids, **kwargs)
    start = len(pair.decoder_prefix(input_ids[0]))  # the start token (and a forced first token), or the prompt
    return out[0, start:].tolist()


def same_output(a: list[int], b: list[int], eos: frozenset[int]) -> bool:
    """Equal token ids, ignoring what HF pads after EOS."""
    def cut(tokens):
        for i, t in enumerate(tokens):
            if t in eos:
                return tokens[: i + 1]
        return tokens
    return cut(a) == cut(b)
