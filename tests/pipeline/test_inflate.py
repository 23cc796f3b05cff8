"""Function-preserving inflation (pipeline/pairs/inflate.py): the demo pair grown to larger shapes decodes
the same tokens with logits within float rounding, on our engines, float32 and int8."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from support import REPO
from transformers import T5ForConditionalGeneration

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.pairs.inflate import InflationError, inflate_t5

DEMO = REPO / "models" / "demo-de-en"
# Every kind of growth at once (width, heads, feed-forward, encoder and decoder layers), small enough
# to run in seconds; `bild-pipeline inflate-pair` takes the same code to T5-small/T5-large shapes.
GROWN = dict(d_model=320, d_ff=768, num_heads=6, num_layers=7, num_decoder_layers=14)
TEXTS = ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", "Zwei Hunde spielen im Schnee.",
         "Eine Frau in einem roten Kleid singt auf einer Bühne vor vielen Menschen."]


@pytest.fixture(scope="module")
def pairs():
    """The demo's large model and its inflated self."""
    large = T5ForConditionalGeneration.from_pretrained(DEMO / "large", dtype=torch.float32).eval()
    grown = inflate_t5(large, **GROWN)
    return large, grown


def _pair(small, large, tokenizer, quantize="none", engine="native"):
    return ModelPair(small=small, large=large, tokenizer=tokenizer, device=torch.device("cpu"),
                     engine_request=engine, quantize=quantize)


def test_the_inflated_model_has_the_shape_asked_for_and_its_padding_is_zero(pairs):
    large, grown = pairs
    assert sum(p.numel() for p in grown.parameters()) > 1.5 * sum(p.numel() for p in large.parameters())
    assert (grown.config.d_model, grown.config.num_heads, grown.config.num_decoder_layers) == (320, 6, 14)
    assert grown.shared.weight[:, 256:].abs().max() == 0
    added = grown.decoder.block[13].layer[2].DenseReluDense
    assert added.wo.weight.abs().max() == 0 and added.wi.weight.abs().max() == 0


def test_logits_of_the_inflated_model_match_the_original(pairs):
    large, grown = pairs
    tokenizer = _tokenizer()
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    decoder = torch.randint(3, 6000, (len(TEXTS), 16), generator=torch.Generator().manual_seed(0))
    decoder[:, 0] = large.config.decoder_start_token_id
    with torch.no_grad():
        want = large(**batch, decoder_input_ids=decoder, use_cache=False).logits
        got = grown(**batch, decoder_input_ids=decoder, use_cache=False).logits
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()  # float summation order only


@pytest.mark.parametrize("engine,quantize", [("native", "none"), ("onnx", "int8")])
def test_the_inflated_large_model_decodes_the_original_tokens_on_our_engines(pairs, engine, quantize):
    large, grown = pairs
    tokenizer = _tokenizer()
    config = DecodingConfig(method="large", max_new_tokens=32)
    want = Generator(_pair(large, large, tokenizer, quantize, engine), config).generate(TEXTS)
    got = Generator(_pair(grown, grown, tokenizer, quantize, engine), config).generate(TEXTS)
    assert [r.error for r in got] == [None] * len(TEXTS)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert all(len(r.token_ids) > 3 for r in want)


def test_only_function_preserving_growth_is_accepted(pairs):
    large, _ = pairs
    with pytest.raises(InflationError, match="d_model 128 is below"):
        inflate_t5(large, d_model=128)
    with pytest.raises(InflationError, match="unknown shape keys"):
        inflate_t5(large, d_kv=128)


def test_inflate_pair_writes_a_loadable_pair(tmp_path):
    from pipeline.cli import main

    result = CliRunner().invoke(main, ["inflate-pair", str(tmp_path), "--small", str(DEMO / "small-aligned"),
                                       "--large", str(DEMO / "large"), "--shapes", "t5",
                                       "--set", "large.num_layers=6", "--set", "large.num_decoder_layers=13",
                                       "--set", "large.d_model=384", "--set", "large.d_ff=1024",
                                       "--set", "large.num_heads=6", "--set", "small.d_model=288"])
    assert result.exit_code == 0, result.output
    pair = ModelPair.from_pretrained(str(tmp_path / "small"), str(tmp_path / "large"))
    assert (pair.small.config.d_model, pair.large.config.d_model) == (288, 384)
    assert pair.small.config.num_decoder_layers == 6  # T5-small's, grown from one
    outputs = Generator(pair, DecodingConfig(method="bild", max_new_tokens=24)).generate(TEXTS[:1])
    assert outputs[0].error is None and outputs[0].prediction


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO / "large")
