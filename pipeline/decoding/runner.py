"""One model's decoder with its KV cache: feed the uncached tail, cut back after a rollback.

The decode loops see a model only through this class (or a test double with the same three
members: ``forward``, ``rewind``, ``cached``), so drafting, verification and cache handling
stay separate concerns.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel


class CachedDecoder:
    """A model's decoder and its KV cache for a sequence that grows, and sometimes shrinks.

    The caller keeps the token sequence [B, T]. The cache holds keys and values for its first
    ``cached`` positions; ``forward`` feeds only positions ``cached..T`` (so a token already
    read is never read again) and ``rewind`` drops cache entries past a kept prefix (so a
    rolled-back token never stays behind in the cache).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        encoder_outputs=None,
        encoder_attention_mask: torch.Tensor | None = None,
    ):
        self.model = model
        self.encoder_outputs = encoder_outputs
        self.encoder_attention_mask = encoder_attention_mask
        if encoder_outputs is not None:
            self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        else:
            self.cache = DynamicCache()
        self.cached = 0
        self.calls = 0
        self.tokens_fed = 0
        # Time spent inside the model's forward, so benchmarks can split model time from loop time.
        self.forward_seconds = 0.0

    @torch.inference_mode()
    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        """Logits for every uncached position. sequence: [B, T] -> logits: [B, T - cached, V]"""
        tail = sequence[:, self.cached :]
        if tail.shape[1] == 0:
            raise ValueError("nothing to feed: every position of the sequence is cached already")
        start = time.perf_counter()
        if self.encoder_outputs is not None:
            out = self.model(
                encoder_outputs=self.encoder_outputs,
                attention_mask=self.encoder_attention_mask,
                decoder_input_ids=tail,
                cache=self.cache,
                use_cache=True,
            )
        else:
            out = self.model(input_ids=tail, cache=self.cache, use_cache=True)
        self.forward_seconds += time.perf_counter() - start
        self.calls += 1
        self.tokens_fed += tail.shape[1]
        self.cached = sequence.shape[1]
        return out.logits

    def rewind(self, keep: int) -> None:
        """Keep only the first ``keep`` cached positions (a no-op if fewer are cached)."""
        if keep < self.cached:
            self.cache.crop(keep - self.cached)  # a negative count: tokens to drop
            self.cached = keep
