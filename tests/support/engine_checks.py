"""Checks every engine's tests make: lossless methods equal `large`, and one engine equals another."""

from __future__ import annotations

from pipeline.decoding import BatchPolicy, DecodingConfig, Generator, ModelPair


def assert_lossless_at_every_batch_size(pair: ModelPair, inputs: list[str], max_new: int) -> None:
    """Greedy BiLD with rollback_threshold 0 and greedy speculative decoding return exactly `large`'s
    tokens at batch 1, 3 and 8, and the verifications rejected drafts (so corrections are covered)."""
    expected = [r.token_ids for r in Generator(pair, DecodingConfig(method="large", max_new_tokens=max_new))
                .generate(inputs)]
    rollbacks = 0
    for method, threshold in (("bild", 0.0), ("speculative", 3.0)):
        config = DecodingConfig(method=method, rollback_threshold=threshold, fallback_threshold=0.4,
                                max_new_tokens=max_new)
        for size in (1, 3, 8):
            results = Generator(pair, config).generate(inputs, batch=BatchPolicy(size))
            assert [r.token_ids for r in results] == expected, f"{method} at batch {size}"
            assert all(r.stats.small_tokens + r.stats.large_tokens == r.stats.output_tokens for r in results)
            rollbacks += sum(r.stats.rollbacks for r in results)
    assert rollbacks


def assert_same_tokens_and_statistics(reference: ModelPair, pair: ModelPair, inputs: list[str], max_new: int) -> int:
    """Every method at batch 1, 3 and 8 (half of the rows verified per pass) gives the same tokens and
    statistics on ``pair`` as on ``reference``, with fixed windows (measured ones follow each engine's speed);
    returns how many records were compared."""
    compared = 0
    for method in ("large", "small", "bild", "speculative"):
        config = DecodingConfig(method=method, max_new_tokens=max_new, fallback_threshold=0.5, rollback_threshold=2.0,
                                max_draft_tokens=4, adaptive_draft=False)
        for batch in (None, BatchPolicy(3), BatchPolicy(8, verify_share=0.5)):
            want = Generator(reference, config).generate(inputs, batch=batch)
            got = Generator(pair, config).generate(inputs, batch=batch)
            assert [r.token_ids for r in got] == [r.token_ids for r in want], (method, batch)
            assert [r.stats for r in got] == [r.stats for r in want], (method, batch)
            compared += len(got)
    return compared
