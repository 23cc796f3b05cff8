"""pipeline/decoding/engines/ct2_engine.py: models.engine ct2 gives the tokens our own engine gives for methods
large and small (two families, batch 1 and 4), caches its conversions by content, and refuses what it
cannot run, naming the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from pipeline.decoding import DecodingConfig, Generator, ModelPair, ModelSpec
from pipeline.decoding.engines import ct2_engine
from pipeline.decoding.decoders import open_generator
from pipeline.decoding.engines.ct2_engine import checkpoint_hash, converted_checkpoint
from pipeline.decoding.generator import encode_text
from pipeline.decoding.scheduler import BatchPolicy
from pipeline.pairs.tiny import save_pair
from support.pairs import TEXTS

pytest.importorskip("ctranslate2")

INPUTS = [*TEXTS, "", "Ein alter Mann liest eine Zeitung auf der Bank vor dem Haus, und die Sonne scheint."]


@pytest.fixture(scope="module", params=["t5", "bart"])
def saved_pair(request, tmp_path_factory):
    small, large = save_pair(tmp_path_factory.mktemp(request.param), request.param, small="noisy")
    if request.param == "bart":  # CTranslate2's BART loader needs a bos token, which our byte tokenizer lacks
        for folder in (small, large):  # (BART's own has <s>); naming an existing one changes no encoding
            tokenizer = AutoTokenizer.from_pretrained(folder)
            tokenizer.bos_token = "</s>"
            tokenizer.save_pretrained(folder)
    return str(small), str(large)


def _columns(results) -> list[tuple]:
    return [(r.prediction, r.error, r.token_ids, r.input_tokens, r.truncated, r.stats.output_tokens,
             r.stats.small_tokens, r.stats.large_tokens) for r in results]


@pytest.mark.parametrize("method", ["large", "small"])
def test_ct2_decodes_as_our_engine_does(saved_pair, method, tmp_path):
    """Greedy, float32: the same tokens, texts, truncation and counters as our native engine, record by
    record and in groups of 4; the empty text gets its error row on both."""
    small, large = saved_pair
    config = DecodingConfig(method=method, max_new_tokens=20, max_input_tokens=12)
    ours = Generator(ModelPair.from_pretrained(small, large, device="cpu", engine="native"), config)
    spec = ModelSpec(small, large, device="cpu", engine="ct2", ct2_cache=str(tmp_path))
    theirs = open_generator(spec, config)
    expected = _columns(ours.generate(INPUTS))
    assert any(row[4] for row in expected) and any(row[1] for row in expected)  # a cut input, an error row
    for batch in (None, BatchPolicy(batch_size=4)):
        assert _columns(theirs.generate(INPUTS, batch=batch)) == expected
    assert (theirs.ran().engine, theirs.ran().quantize) == ("ct2", "none")


def test_ct2_int8_runs_ct2s_int8_and_greedy_only(saved_pair, tmp_path):
    """quantize: int8 is CTranslate2's own int8 arithmetic, not a label: CTranslate2 reports an int8 compute
    type, and its log-probabilities of the float32 model's greedy output move off float32's, yet stay much
    closer to them than a copy of the weights with 10% noise (the pair's small model) does."""
    small, large = saved_pair
    greedy = DecodingConfig(method="large", max_new_tokens=16)
    spec = ModelSpec(small, large, device="cpu", engine="ct2", quantize="int8", ct2_cache=str(tmp_path))
    int8 = open_generator(spec, greedy)
    float32 = open_generator(ModelSpec(small, large, device="cpu", engine="ct2", ct2_cache=str(tmp_path)), greedy)
    noisy = open_generator(ModelSpec(small, large, device="cpu", engine="ct2", ct2_cache=str(tmp_path)),
                         DecodingConfig(method="small", max_new_tokens=16))
    assert int8.decoder.model.translator.compute_type.startswith("int8"), int8.decoder.model.translator.compute_type
    assert float32.decoder.model.translator.compute_type == "float32"
    assert int8.ran().int8_scheme == "ctranslate2-int8" and float32.ran().int8_scheme is None
    texts = [text for text in INPUTS if text]
    results = int8.generate(texts)
    assert len(results) == len(texts) and all(r.error is None and r.stats.output_tokens > 0 for r in results)
    tokenizer = float32.tokenizer
    off = {"int8": [], "noisy": []}  # |log p - log p_float32| per position of float32's greedy output
    for text, result in zip(texts, float32.generate(texts)):
        source = tokenizer.convert_ids_to_tokens(encode_text(tokenizer, text, greedy.max_input_tokens)[0][0].tolist())
        target = tokenizer.convert_ids_to_tokens(result.token_ids)
        want = torch.tensor(float32.decoder.model.translator.score_batch([source], [target])[0].log_probs)
        for name, other in (("int8", int8), ("noisy", noisy)):
            got = torch.tensor(other.decoder.model.translator.score_batch([source], [target])[0].log_probs)
            assert got.shape == want.shape
            off[name].append((got - want).abs())
    int8_off, noisy_off = (float(torch.cat(values).mean()) for values in (off["int8"], off["noisy"]))
    assert int8_off > 1e-3, int8_off  # int8 arithmetic ran: float32 would give the very same scores
    assert int8_off < 0.5 * noisy_off, (int8_off, noisy_off)  # and stayed close to float32
    with pytest.raises(ValueError, match="decoding.do_sample with models.engine ct2"):  # no seed: no sampling
        open_generator(spec, DecodingConfig(method="large", do_sample=True))


def test_conversions_are_cached_by_content_and_converted_folders_load_as_they_are(saved_pair, tmp_path, monkeypatch):
    """A checkpoint is converted once per content: converting it again, or a byte-identical copy of it
    elsewhere, reuses the folder; editing its weights (a further fine-tune: here the small model's weights,
    the same architecture) converts anew into a folder named by the new content, leaves the old one as it
    was, and the engine then writes the new weights' tokens (those of our engine on the edited checkpoint)."""
    small, large = saved_pair
    cache = tmp_path / "cache"
    calls = []
    convert = ct2_engine.convert_folder
    monkeypatch.setattr(ct2_engine, "convert_folder", lambda *a: calls.append(a) or convert(*a))
    folder = converted_checkpoint(large, cache)
    assert len(calls) == 1 and folder.name.startswith(f"{checkpoint_hash(Path(large))}-ct2-")
    converted_at = (folder / "model.bin").stat().st_mtime_ns
    same = tmp_path / "same"
    shutil.copytree(large, same)
    assert converted_checkpoint(large, cache) == converted_checkpoint(str(same), cache) == folder
    assert len(calls) == 1  # unchanged content: no second conversion
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no partial folder left

    changed = tmp_path / "changed"
    shutil.copytree(large, changed)
    shutil.copy(Path(small) / "model.safetensors", changed / "model.safetensors")  # only the weights change
    reconverted = converted_checkpoint(str(changed), cache)
    assert len(calls) == 2 and Path(calls[-1][0]) == changed  # the edit made it convert again ...
    assert reconverted != folder and reconverted.name.startswith(f"{checkpoint_hash(changed)}-ct2-")
    assert checkpoint_hash(changed) != checkpoint_hash(Path(large))  # ... keyed by the new content
    assert (folder / "model.bin").stat().st_mtime_ns == converted_at  # the old conversion is left as it was
    config = DecodingConfig(method="large", max_new_tokens=16)
    original = _columns(open_generator(ModelSpec(small, large, engine="ct2", ct2_cache=str(cache)), config).generate(TEXTS))
    edited = open_generator(ModelSpec(small, str(changed), engine="ct2", ct2_cache=str(cache)), config)
    ours = Generator(ModelPair.from_pretrained(small, str(changed), device="cpu", engine="native"), config)
    assert _columns(edited.generate(TEXTS)) == _columns(ours.generate(TEXTS)) != original  # the new weights' tokens
    assert len(calls) == 2  # both loads found their conversions in the cache

    from_folder = open_generator(ModelSpec(small, str(folder), engine="ct2", ct2_cache=str(tmp_path / "unused")), config)
    assert len(calls) == 2 and not (tmp_path / "unused").exists()
    assert _columns(from_folder.generate(TEXTS)) == original
    bare = tmp_path / "weights-only"  # a checkpoint without its tokenizer: models.tokenizer names it
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(f"{large}/{name}", bare)
    named = open_generator(ModelSpec(small, str(bare), tokenizer=large, engine="ct2", ct2_cache=str(cache)), config)
    assert _columns(named.generate(TEXTS)) == original


def test_ct2_refuses_the_methods_that_verify_drafts(saved_pair, tmp_path):
    small, large = saved_pair
    for method in ("bild", "speculative", "cascade"):
        with pytest.raises(ValueError, match="models.engine ct2 runs methods large and small only"):
            open_generator(ModelSpec(small, large, engine="ct2", ct2_cache=str(tmp_path)), DecodingConfig(method=method))
    with pytest.raises(ValueError, match="a model pair.s engine is one of"):
        ModelPair.from_pretrained(small, large, device="cpu", engine="ct2")
