"""int8 weights (models.quantize: int8, pipeline/decoding/engines/int8.py) on the native engines.

The invariants hold against the model that runs: int8 BiLD with rollback_threshold 0 and greedy
speculative decoding return exactly int8 `large`'s greedy tokens at every batch size, on both native
families, because a row's int8 product does not depend on the other rows of the call. The logits
stay within a stated distance of float32's.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engines import int8
from pipeline.decoding.engines.native import Matrix
from pipeline.pairs.tiny import build_pair
from support import REPO
from support.engine_checks import assert_lossless_at_every_batch_size
from support.pairs import TEXTS

FAMILIES = ["t5", "bart"]
INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut."]
MAX_NEW = 20


@pytest.fixture
def every_matrix_in_int8(monkeypatch):
    """The tiny models' matrices are far below the size where int8 pays: quantize them all anyway."""
    monkeypatch.setattr(int8, "MIN_WEIGHTS", 0)


def int8_pair(family: str, seed: int = 0) -> ModelPair:
    small, large, tokenizer = build_pair(family, seed=seed, small="noisy")
    return ModelPair(small, large, tokenizer, torch.device("cpu"), quantize="int8")


def relative_error(matrix, weight: torch.Tensor, x: torch.Tensor) -> float:
    """Relative error of an int8 product x @ W against float32's (weight [out, in])."""
    exact = x @ weight.t()
    return float((matrix.product(x) - exact).norm() / exact.norm())


def test_the_fbgemm_ops_int8_runs_on_are_there():
    """int8 calls the ops beneath torch.ao's deprecated eager entry points: this fails when they go."""
    assert hasattr(torch.ops.quantized, "linear_prepack") and hasattr(torch.ops.quantized, "linear_dynamic")
    weight = torch.randn(16, 8)
    assert relative_error(int8.Int8Matrix(weight), weight, torch.randn(3, 8)) < 0.03


def test_a_rows_int8_product_is_the_same_whatever_else_is_in_the_call():
    """Each row is quantized on its own scale: a batch gives bit for bit the rows' products alone,
    however different the rows' magnitudes (a per-tensor quantization would not)."""
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    matrix = int8.Int8Matrix(weight)
    x = torch.randn(7, 64) * torch.tensor([0.01, 1, 30, 2, 0.5, 100, 3])[:, None]
    bias, residual = torch.randn(96), torch.randn(7, 96)
    alone = torch.cat([matrix.product(row[None]) for row in x])
    assert torch.equal(matrix.product(x), alone)
    assert torch.equal(matrix.addmm(residual, x), torch.cat([matrix.addmm(residual[i:i + 1], x[i:i + 1])
                                                             for i in range(7)]))
    written = torch.empty(7, 96)
    matrix.into(written, x, bias)
    assert torch.equal(written, matrix.addmm(bias, x))
    # Within 3% of float32 (8-bit weights per channel, 7-bit activations per row): measured ~1.6%.
    assert relative_error(matrix, weight, x) < 0.03


def test_only_matrices_where_int8_pays_are_quantized():
    """The measured rule, by shape alone: the demo's 256x768 layers stay float32, its 256x6000 head and
    T5-large's layers go int8."""
    assert not int8.pays_off(torch.empty(768, 256))
    assert int8.pays_off(torch.empty(6000, 256)) and int8.pays_off(torch.empty(4096, 1024))
    small, large, tokenizer = build_pair("t5", seed=0, small="noisy")
    weights = _weights(ModelPair(small, large, tokenizer, torch.device("cpu"), quantize="int8"))
    assert type(weights.head) is Matrix  # tiny: nothing pays


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_logits_stay_close_to_float32s(family, every_matrix_in_int8):
    """Every matrix in int8, `large`'s logits along a greedy output: within 5% of float32's (norm of the
    difference over the norm; each product is within ~2%), no logit off by more than 0.2 of the logits'
    standard deviation, and the same argmax at 90% of positions or more. T5 is checked on the shipped
    demo pair: a random tiny T5 is chaotic (1% noise on its weights moves its logits by ~55%), a
    trained one is not (measured: 2.1%, 0.11, every argmax the same)."""
    config = DecodingConfig(method="large", max_new_tokens=MAX_NEW)
    generators = {quantize: Generator(pair_for_logits(family, quantize), config) for quantize in ("none", "int8")}
    tokens = generators["none"].generate_one(INPUTS[1]).token_ids
    logits = {q: teacher_forced_logits(g, INPUTS[1], tokens) for q, g in generators.items()}
    difference = logits["int8"] - logits["none"]
    assert 0 < float(difference.norm() / logits["none"].norm()) < 0.05  # int8 really ran, and stayed close
    assert float(difference.abs().max() / logits["none"].std()) < 0.2
    assert (logits["int8"].argmax(-1) == logits["none"].argmax(-1)).float().mean() >= 0.9


def pair_for_logits(family: str, quantize: str) -> ModelPair:
    if family == "t5":
        demo = REPO / "models" / "demo-de-en"
        return ModelPair.from_pretrained(str(demo / "small-aligned"), str(demo / "large"), device="cpu",
                                         quantize=quantize)
    small, large, tokenizer = build_pair(family, seed=0, small="noisy")
    return ModelPair(small, large, tokenizer, torch.device("cpu"), quantize=quantize)


def teacher_forced_logits(generator: Generator, text: str, tokens: list[int]) -> torch.Tensor:
    """The large engine's logits [len(tokens), V] at each position of `tokens` after the decoder prefix."""
    from pipeline.decoding.engine import Feed

    pair = generator.decoder.pair
    input_ids = generator.encode(text)[0][0]
    prefix = pair.decoder_prefix(input_ids).tolist()
    engine = pair.engine("large", 1)
    engine.admit([0], [input_ids])
    sequence = prefix + tokens
    feed = Feed(slots=[0], tokens=torch.tensor([sequence]), positions=[0], counts=[len(sequence)],
                reads=[len(tokens)])
    logits = engine.forward(feed)[0]
    engine.release(0)
    return logits


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_bild_and_speculative_are_int8_larges_greedy_output_at_every_batch_size(family, every_matrix_in_int8):
    pair = int8_pair(family)
    assert type(_weights(pair).head) is int8.Int8Matrix
    assert_lossless_at_every_batch_size(pair, INPUTS, MAX_NEW)


def _weights(pair: ModelPair):
    pair.engine("large", 1)
    return pair._prepared["large"]


def test_int8_where_it_cannot_run_is_a_clear_error():
    small, large, tokenizer = build_pair("gpt2", seed=0, small="noisy")  # no native engine: Hugging Face's
    with pytest.raises(ValueError, match="models.quantize int8 runs on the native or onnx engine"):
        ModelPair(small, large, tokenizer, torch.device("cpu"), quantize="int8")
    small, large, tokenizer = build_pair("t5", seed=0, small="noisy")
    with pytest.raises(ValueError, match="models.quantize int8 runs on the native or onnx engine"):
        ModelPair(small, large, tokenizer, torch.device("cpu"), engine_request="hf", quantize="int8")
