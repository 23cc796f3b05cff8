"""pipeline/bench/ct2.py: CTranslate2's greedy outputs equal transformers' own greedy search."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DynamicCache, EncoderDecoderCache

from pipeline.bench.ct2 import CT2Model, available
from pipeline.pairs.tiny import EOS, save_pair
from support import REPO

pytest.importorskip("ctranslate2")

TEXTS = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball im Park.",
    "Eine Frau mit rotem Hut liest ein Buch.",
    "Kinder bauen eine Sandburg am Strand.",
    "Ja.",
]
DEMO_LARGE = REPO / "models" / "demo-de-en" / "large"
DEMO_SOURCES = REPO / "data" / "multi30k_sample" / "test_2016_flickr.parquet"


@torch.inference_mode()
def hf_greedy(model, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy search for one input: generated ids, no decoder start, cut after EOS."""
    # An explicit cache: the one generate builds itself is sized by the encoder's layer count,
    # too few for these models' deeper decoders (IndexError in transformers 5).
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    out = model.generate(torch.tensor([input_ids]), max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                         cache=cache)[0, 1:].tolist()
    return out[: out.index(EOS) + 1] if EOS in out else out


def save_stopping_copy(large_dir: Path, out_dir: Path, like: int = 165) -> Path:
    """The tiny large model with EOS's output row set to twice token `like`'s, so EOS wins, by a
    clear margin, where `like` would. Tiny random models never stop on their own; this one stops
    on three of TEXTS (after 2, 3 and 29 tokens) and runs to a 40-token limit on the other two."""
    model = AutoModelForSeq2SeqLM.from_pretrained(large_dir)
    with torch.no_grad():
        model.lm_head.weight[EOS] = 2 * model.lm_head.weight[like]
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(large_dir).save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    """name -> (CT2Model, transformers model, tokenizer): the tiny T5 "large" model and its "stopping" copy."""
    tmp = tmp_path_factory.mktemp("ct2")
    _, large_dir = save_pair(tmp, "t5", small="noisy")
    models = {}
    for name, model_dir in (("large", large_dir), ("stopping", save_stopping_copy(large_dir, tmp / "stopping"))):
        ct2 = CT2Model.convert(model_dir, tmp / f"ct2-{name}")
        models[name] = ct2, AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    return models


BOTH = pytest.mark.parametrize("name", ["large", "stopping"])


def test_available(monkeypatch):
    assert available()
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # what an environment without it sees
    assert not available()


@BOTH
@pytest.mark.parametrize("max_new_tokens", [1, 7, 40])
def test_batch_of_one_equals_transformers_greedy(tiny_models, name, max_new_tokens):
    ct2, model, tokenizer = tiny_models[name]
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert ids[-1] == EOS
        assert ct2.generate([ids], max_new_tokens) == [hf_greedy(model, ids, max_new_tokens)], text


@BOTH
def test_batch_of_different_lengths_equals_transformers_greedy(tiny_models, name):
    ct2, model, tokenizer = tiny_models[name]
    batch = [tokenizer(text).input_ids for text in TEXTS]
    assert len({len(ids) for ids in batch}) > 1
    for max_new_tokens in (5, 40):
        got = ct2.generate(batch, max_new_tokens)
        assert got == [hf_greedy(model, ids, max_new_tokens) for ids in batch]
        assert all(len(out) <= max_new_tokens for out in got)


def test_eos_is_returned_and_counts_toward_max_new_tokens(tiny_models):
    """As in transformers: the EOS ends the output, and a limit one short of it cuts it off."""
    ct2, _, tokenizer = tiny_models["stopping"]
    batch = [tokenizer(text).input_ids for text in TEXTS]
    outputs = ct2.generate(batch, 40)
    stopped = [out[-1] == EOS for out in outputs]
    assert any(stopped) and not all(stopped), [len(out) for out in outputs]
    for ids, out in zip(batch, outputs):
        assert EOS not in out[:-1]
        if out[-1] == EOS:
            assert ct2.generate([ids], len(out)) == [out]
            assert ct2.generate([ids], len(out) - 1) == [out[:-1]]


def test_token_strings_round_trip(tiny_models):
    """Byte-level BPE tokens (byte characters such as 'Ġ', 'Ã') map back to the same ids."""
    _, _, tokenizer = tiny_models["large"]
    ids = tokenizer(TEXTS[0]).input_ids
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert "Ġ" in tokens
    assert tokenizer.convert_tokens_to_ids(tokens) == ids


def test_not_an_encoder_decoder_model_is_refused_by_name(tmp_path):
    _, decoder_only = save_pair(tmp_path, "gpt2")
    with pytest.raises(ValueError, match=re.escape(str(decoder_only))):
        CT2Model.convert(decoder_only, tmp_path / "ct2")


def test_a_folder_without_a_model_is_refused_by_name(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "empty"))):
        CT2Model.convert(tmp_path / "empty", tmp_path / "ct2")


@pytest.mark.slow
@pytest.mark.skipif(not DEMO_LARGE.is_dir() or not DEMO_SOURCES.is_file(), reason="demo pair or sample data absent")
def test_demo_model_equals_transformers_greedy(tmp_path):
    """The shipped SentencePiece T5 (saved float16, run in float32): 20 Multi30k test sentences,
    one batch, token for token. Most stop on EOS; one runs to the 64-token limit."""
    import pyarrow.parquet as pq

    texts = pq.read_table(DEMO_SOURCES, columns=["de"]).column("de").to_pylist()[:20]
    ct2 = CT2Model.convert(DEMO_LARGE, tmp_path / "ct2", compute_type="float32")
    model = AutoModelForSeq2SeqLM.from_pretrained(DEMO_LARGE, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO_LARGE)
    batch = [tokenizer(text).input_ids for text in texts]
    assert any(token.startswith("▁") for token in tokenizer.convert_ids_to_tokens(batch[0]))
    got = ct2.generate(batch, 64)
    for text, ids, out in zip(texts, batch, got):
        assert out == hf_greedy(model, ids, 64), text
    assert sum(out[-1] == EOS for out in got) >= 15


@pytest.mark.parametrize("shape", ["t5", "opus-mt", "bart-opus-mt", "nllb"])
def test_every_random_pair_shape_converts_and_scores_as_transformers(tmp_path, monkeypatch, shape):
    """`tiny-pair --shape` pairs convert with CTranslate2's own converter (opus-mt: <pad> at the last
    id, as CTranslate2's Marian loader expects; BART: a config without the legacy normalize_before)
    and give transformers' log-probabilities to random target tokens, position by position, and its
    greedy tokens. Widths and vocabulary are shrunk; family, tokenizer and special tokens are the shape's."""
    from pipeline.pairs import random_shapes

    model_class, config_class, _, small, _ = random_shapes.SHAPES[shape]
    narrow = dict(small, d_model=64, **({"d_kv": 16, "d_ff": 128, "num_heads": 4} if shape == "t5" else
                                        {"encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                                         "encoder_attention_heads": 4, "decoder_attention_heads": 4}))
    monkeypatch.setitem(random_shapes.SHAPES, shape, (model_class, config_class, 600, narrow, narrow))
    model = random_shapes.shaped_model(shape, "small", seed=3)
    tokenizer = random_shapes.shaped_tokenizer(shape)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    ct2 = CT2Model.convert(tmp_path / "m", tmp_path / "ct2")

    inputs = [tokenizer(text)["input_ids"] for text in TEXTS]
    targets = torch.randint(4, 598, (len(TEXTS), 10), generator=torch.Generator().manual_seed(0)).tolist()
    scored = ct2.translator.score_batch([tokenizer.convert_ids_to_tokens(ids) for ids in inputs],
                                        [tokenizer.convert_ids_to_tokens(ids) for ids in targets])
    start = model.config.decoder_start_token_id
    for ids, target, result in zip(inputs, targets, scored):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[start] + target])).logits[0]
        if tokenizer.pad_token_id == 599:  # opus-mt: CTranslate2 drops <pad>, the last id, from the vocabulary
            logits = logits[:, :599]
        expected = logits.log_softmax(-1)[torch.arange(10), torch.tensor(target)]
        assert torch.allclose(torch.tensor(result.log_probs[:10]), expected, atol=1e-4), shape
    assert ct2.generate(inputs, max_new_tokens=12) == [hf_greedy(model, ids, 12) for ids in inputs]
