"""pipeline/decoding/engines/ct2_engine.py: models.engine ct2 gives the tokens our own engine gives for methods
large and small (two families, batch 1 and 4), caches its conversions by content, and refuses what it
cannot run, naming the key."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from pipeline.decoding import DecodingConfig, Generator, ModelPair, ModelSpec
from pipeline.decoding.engines import ct2_engine
from pipeline.decoding.engines.ct2_engine import CT2Generator, checkpoint_hash, converted_checkpoint
from pipeline.decoding.scheduler import BatchPolicy
from pipeline.tiny import save_pair
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
    theirs = CT2Generator(spec, config)
    expected = _columns(ours.generate(INPUTS))
    assert any(row[4] for row in expected) and any(row[1] for row in expected)  # a cut input, an error row
    for batch in (None, BatchPolicy(batch_size=4)):
        assert _columns(theirs.generate(INPUTS, batch=batch)) == expected
    assert (theirs.engine_kind, theirs.quantize) == ("ct2", "none")


def test_ct2_int8_runs_ct2s_int8_and_greedy_only(saved_pair, tmp_path):
    small, large = saved_pair
    greedy = DecodingConfig(method="large", max_new_tokens=16)
    spec = ModelSpec(small, large, device="cpu", engine="ct2", quantize="int8", ct2_cache=str(tmp_path))
    int8 = CT2Generator(spec, greedy)
    assert int8.model.compute_type == "int8" and int8.quantize == "int8"
    assert all(r.error is None and r.stats.output_tokens > 0 for r in int8.generate(TEXTS))
    with pytest.raises(ValueError, match="decoding.do_sample with models.engine ct2"):  # no seed: no sampling
        CT2Generator(spec, DecodingConfig(method="large", do_sample=True))


def test_conversions_are_cached_by_content_and_converted_folders_load_as_they_are(saved_pair, tmp_path, monkeypatch):
    small, large = saved_pair
    calls = []
    convert = ct2_engine.convert_folder
    monkeypatch.setattr(ct2_engine, "convert_folder", lambda *a: calls.append(a) or convert(*a))
    folder = converted_checkpoint(large, tmp_path / "cache")
    assert converted_checkpoint(large, tmp_path / "cache") == folder and len(calls) == 1  # once per content
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no partial folder left
    changed = tmp_path / "changed"
    shutil.copytree(large, changed)
    (changed / "README.md").write_text("fine-tuned further")  # any file of the folder is its content
    assert checkpoint_hash(changed) != checkpoint_hash(tmp_path / "cache" / folder.name) != ""
    assert converted_checkpoint(str(changed), tmp_path / "cache") != folder and len(calls) == 2

    config = DecodingConfig(method="large", max_new_tokens=16)
    from_checkpoint = CT2Generator(ModelSpec(small, large, engine="ct2", ct2_cache=str(tmp_path / "cache")), config)
    from_folder = CT2Generator(ModelSpec(small, str(folder), engine="ct2", ct2_cache=str(tmp_path / "unused")), config)
    assert len(calls) == 2 and not (tmp_path / "unused").exists()
    assert _columns(from_folder.generate(TEXTS)) == _columns(from_checkpoint.generate(TEXTS))
    bare = tmp_path / "weights-only"  # a checkpoint without its tokenizer: models.tokenizer names it
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(f"{large}/{name}", bare)
    named = CT2Generator(ModelSpec(small, str(bare), tokenizer=large, engine="ct2", ct2_cache=str(tmp_path / "cache")),
                         config)
    assert _columns(named.generate(TEXTS)) == _columns(from_checkpoint.generate(TEXTS))


def test_ct2_refuses_the_methods_that_verify_drafts(saved_pair, tmp_path):
    small, large = saved_pair
    for method in ("bild", "speculative", "cascade"):
        with pytest.raises(ValueError, match="models.engine ct2 decodes with method large or small"):
            CT2Generator(ModelSpec(small, large, engine="ct2", ct2_cache=str(tmp_path)), DecodingConfig(method=method))
    with pytest.raises(ValueError, match="a model pair.s engine is one of"):
        ModelPair.from_pretrained(small, large, device="cpu", engine="ct2")
