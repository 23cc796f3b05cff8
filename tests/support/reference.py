"""A deliberately naive BiLD (greedy) with no KV caches: every step re-reads the whole sequence.

Written straight from docs/design.md §1 and independently of pipeline.decoding, it is the oracle
for the cached loop: any stale cache entry in the real loop makes the two disagree.
"""

from __future__ import annotations

import torch


@torch.inference_mode()
def next_token_logits(model, input_ids: torch.Tensor, sequence: list[int]) -> torch.Tensor:
    """Logits at every position of `sequence` (no cache). -> [len(sequence), V]"""
    tokens = torch.tensor([sequence])
    if model.config.is_encoder_decoder:
        return model(input_ids=input_ids, decoder_input_ids=tokens, use_cache=False).logits[0]
    return model(input_ids=tokens, use_cache=False).logits[0]


def reference_bild(small, large, input_ids, prefix: list[int], config, eos: set[int]) -> dict:
    out: list[int] = []
    stats = dict(fallbacks=0, rollbacks=0, small_tokens=0, large_tokens=0)
    while len(out) < config.max_new_tokens:
        window = min(config.max_draft_tokens, config.max_new_tokens - len(out))
        drafts: list[int] = []
        ended_on_eos = False
        while len(drafts) < window:
            probs = torch.softmax(next_token_logits(small, input_ids, prefix + out + drafts)[-1].double(), -1)
            if probs.max() < config.fallback_threshold:
                stats["fallbacks"] += 1
                break
            drafts.append(int(probs.argmax()))
            if drafts[-1] in eos:
                ended_on_eos = True
                break
        logits = next_token_logits(large, input_ids, prefix + out + drafts)[len(prefix) + len(out) - 1 :]
        probs = torch.softmax(logits.double(), -1)
        choice = probs.argmax(-1).tolist()
        accepted = len(drafts)
        for i, token in enumerate(drafts):
            if -torch.log(probs[i, token]) > config.rollback_threshold and token != choice[i]:
                accepted = i
                stats["rollbacks"] += 1
                break
        out += drafts[:accepted]
        stats["small_tokens"] += accepted
        if accepted == len(drafts) and ended_on_eos:
            break
        if len(out) < config.max_new_tokens:
            out.append(choice[accepted])
            stats["large_tokens"] += 1
            if out[-1] in eos:
                break
    return {"tokens": out, **stats}
