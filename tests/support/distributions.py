"""Tiny pairs over a 6-token vocabulary, whose output distributions can be enumerated exactly:
what the chi-square tests of speculative sampling compare against."""

from __future__ import annotations

import torch

VOCAB = 6
P_FLOOR = 1e-3  # a correct sampler fails a test at this level about once in a thousand runs; seeds are fixed


def tiny_vocab_pair(family: str = "gpt2"):
    """A pair over a 6-token vocabulary, so the output distribution can be enumerated: GPT-2 (run by
    the Hugging Face engine) or T5 (run by the native engine)."""
    import pipeline.tiny as tiny

    models = []
    for seed, size in ((1, "small"), (0, "large")):
        config = tiny._config(family, size)
        config.vocab_size = VOCAB
        torch.manual_seed(seed)
        model = tiny._MODEL_CLASSES[family](config).double().eval()
        tiny._scale_weights(model, 1.0, logit_std=1.5)
        models.append(model)
    return models


SOURCE = torch.tensor([2, 3, 4])  # the prompt (GPT-2) or the encoder input (T5)


def next_token_probs(model, tokens: list[int]) -> torch.Tensor:
    """pL(. | tokens) [V]: after the prompt (GPT-2), or the decoder's start token and tokens (T5)."""
    with torch.inference_mode():
        if model.config.is_encoder_decoder:
            logits = model(input_ids=SOURCE[None], decoder_input_ids=torch.tensor([[0, *tokens]])).logits
        else:
            logits = model(torch.cat([SOURCE, torch.tensor(tokens, dtype=torch.long)])[None]).logits
    return torch.softmax(logits[0, -1], -1)


def two_token_distribution(large) -> torch.Tensor:
    """pL(a, b | source) over all VOCAB * VOCAB pairs, flattened as a * VOCAB + b."""
    first = next_token_probs(large, [])
    second = torch.stack([next_token_probs(large, [a]) for a in range(VOCAB)])
    return (first[:, None] * second).flatten()


def prefix_for(model):
    if model.config.is_encoder_decoder:
        return lambda input_ids: torch.tensor([0])
    return lambda input_ids: input_ids
