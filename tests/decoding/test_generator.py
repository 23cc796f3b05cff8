"""Text in, result out: input errors per record, truncation, incompatible pairs, loading."""

from __future__ import annotations

import pytest
import torch

from pipeline.decoding import DecodingConfig, Generator, IncompatiblePairError, ModelPair
from pipeline.pairs.tiny import build_model, byte_tokenizer, save_pair
from support.pairs import TEXTS, tiny_pair

DESIGN_COLUMNS = {"prediction", "error", "method", "input_tokens", "truncated", "output_tokens", "small_tokens",
                  "large_tokens", "fallbacks", "rollbacks", "small_calls", "large_calls", "latency_ms"}


@pytest.mark.parametrize("bad, message", [("", "empty"), ("   \n\t", "empty"), (None, "string"), (42, "string")])
def test_bad_text_is_a_per_record_error(bad, message):
    generator = Generator(tiny_pair("t5"), DecodingConfig(max_new_tokens=8))
    results = generator.generate([TEXTS[0], bad, TEXTS[1]])
    assert [r.error is None for r in results] == [True, False, True]
    assert message in results[1].error and results[1].prediction is None
    assert results[0].prediction is not None and results[0].stats.output_tokens > 0


def test_record_carries_every_design_column():
    result = Generator(tiny_pair("gpt2"), DecodingConfig(max_new_tokens=8)).generate_one(TEXTS[0])
    record = result.to_record()
    assert DESIGN_COLUMNS <= set(record)
    assert record["method"] == "bild" and record["latency_ms"] > 0


@pytest.mark.parametrize("family", ["t5", "gpt2"])
def test_truncation_is_flagged(family):
    pair = tiny_pair(family)
    generator = Generator(pair, DecodingConfig(max_input_tokens=10, max_new_tokens=4))
    long_result = generator.generate_one("x" * 50)
    short_result = generator.generate_one("xyz")
    assert long_result.truncated and long_result.input_tokens == 10
    assert not short_result.truncated and short_result.input_tokens < 10
    if family == "t5":  # the tokenizer keeps the closing EOS when it cuts
        ids, _ = generator.encode("x" * 50)
        assert ids[0, -1].item() == pair.tokenizer.eos_token_id


def test_decode_exception_becomes_a_row_error(monkeypatch):
    generator = Generator(tiny_pair("t5"), DecodingConfig(max_new_tokens=8))

    def explode(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(generator, "decode_ids", explode)
    result = generator.generate_one(TEXTS[0])
    assert result.error == "RuntimeError: CUDA out of memory (simulated)" and result.prediction is None


def test_pairs_with_different_vocabularies_are_refused():
    small = build_model("t5", "small")
    large = build_model("t5", "large")
    large.resize_token_embeddings(300)
    with pytest.raises(IncompatiblePairError, match="different vocabularies"):
        ModelPair(small, large, byte_tokenizer(True), torch.device("cpu"))


def test_encoder_decoder_and_decoder_only_cannot_be_mixed():
    with pytest.raises(IncompatiblePairError, match="decoder-only"):
        ModelPair(build_model("gpt2", "small"), build_model("t5"), byte_tokenizer(True), torch.device("cpu"))


def test_load_saved_pair_and_refuse_mismatched_tokenizers(tmp_path):
    small, large = save_pair(tmp_path / "pair", "t5", small="noisy")
    pair = ModelPair.from_pretrained(str(small), str(large), dtype="float32", device="cpu")
    assert pair.is_encoder_decoder and pair.eos_token_ids == {1}
    assert Generator(pair, DecodingConfig(max_new_tokens=4)).generate_one("Hallo").error is None

    # A small model whose own tokenizer differs from the large model's is refused before loading weights.
    other = byte_tokenizer(True)
    other.add_tokens(["<extra>"])
    other.save_pretrained(small)
    with pytest.raises(IncompatiblePairError, match="different tokenizers"):
        ModelPair.from_pretrained(str(small), str(large), device="cpu")


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="method"):
        DecodingConfig(method="beam")
    with pytest.raises(ValueError, match="temperature"):
        DecodingConfig(temperature=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        DecodingConfig(max_new_tokens=0)


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_a_small_model_cut_from_the_large_one_shares_its_encoder_pass(engine, monkeypatch):
    """A shrunk small model (pipeline/training/shrink.py) keeps the large encoder: it runs once."""
    import dataclasses

    from support.pairs import TEXTS, tiny_pair
    from pipeline.decoding.models import ModelPair
    from pipeline.decoding.scheduler import BatchPolicy
    from pipeline.decoding.engines.t5_engine import T5Weights
    from pipeline.training.shrink import shrink_from_large

    base = tiny_pair("t5", "independent", 0)
    assert not base.shares_encoder
    small = shrink_from_large(base.large).eval()
    pair = ModelPair(small, base.large, base.tokenizer, base.device, engine_request=engine)
    assert pair.shares_encoder and pair.engine_kind == engine
    calls = []
    hooks = [model.get_encoder().register_forward_hook(lambda *args: calls.append(1)) for model in (pair.small, pair.large)]
    encode = T5Weights.encode
    monkeypatch.setattr(T5Weights, "encode", lambda *args: (calls.append(1), encode(*args))[1])
    config = DecodingConfig(method="bild", max_new_tokens=16, fallback_threshold=0.5, adaptive_draft=False)
    shared = Generator(pair, config).generate(TEXTS)
    assert len(calls) == len(TEXTS)  # one encoder pass per record, not two
    batched = Generator(pair, config).generate(TEXTS, batch=BatchPolicy(3))
    apart = dataclasses.replace(pair)
    apart.shares_encoder = False  # the same pair, each model running its own (identical) encoder
    alone = Generator(apart, config).generate(TEXTS)
    assert [r.token_ids for r in shared] == [r.token_ids for r in alone] == [r.token_ids for r in batched]
    assert [r.stats for r in shared] == [r.stats for r in alone]
    small_only = DecodingConfig(method="small", max_new_tokens=16)  # no large model runs to share its encoder
    assert [r.token_ids for r in Generator(pair, small_only).generate(TEXTS, batch=BatchPolicy(3))] == \
        [r.token_ids for r in Generator(apart, small_only).generate(TEXTS, batch=BatchPolicy(3))]
    for hook in hooks:
        hook.remove()
