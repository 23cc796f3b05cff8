"""The native engine against Hugging Face's models: the same logits and the same tokens.

Random tiny models of the T5 family in several shapes (T5 v1.0 with a tied head and ReLU, T5 v1.1
/ Flan-T5 with an untied head and gated GELU, mT5, num_heads * d_kv != d_model, one and three
decoder layers), of the BART family (BART, mBART, Marian, NLLB's M2M100) and the shipped demo pair.
Logits are compared position by position with Hugging Face's own forward pass; tokens and
statistics with the Hugging Face engine for every method and batch size.
"""

from __future__ import annotations

import pytest
import torch
from pipeline.decoding import BatchPolicy, DecodingConfig, Generator, ModelPair
from pipeline.decoding.engine import Feed
from pipeline.decoding.models import native_unsupported_reason, native_weights
from pipeline.decoding.engines.native import NativeEngine
from pipeline.pairs.tiny import PAD, byte_tokenizer, noisy_copy
from support.native_models import LAYOUTS, MODELS, build, build_t5, encode
from support.pairs import TEXTS
from support import REPO
from support.engine_checks import assert_same_tokens_and_statistics

INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut."]
MAX_NEW = 24


def pair_of(name: str, engine: str, dtype=torch.float32) -> ModelPair:
    large = build(name, dtype=dtype)
    return ModelPair(noisy_copy(large, 0.1, seed=1), large, byte_tokenizer(append_eos=True), torch.device("cpu"),
                     engine_request=engine)


@pytest.mark.parametrize("name", MODELS)
def test_the_native_engine_runs_every_family(name):
    model = build(name)
    assert native_unsupported_reason(model) is None
    assert ModelPair(model, model, byte_tokenizer(True), torch.device("cpu")).engine_kind == "native"


def hf_logits(model, sources: list[torch.Tensor], rows: list[list[int]]) -> torch.Tensor:
    """Hugging Face's full forward pass, no cache: sources right-padded with a mask, decoder rows
    right-padded (causal, so padding after a row changes nothing before it). -> [R, T, V]"""
    source = torch.zeros((len(sources), max(map(len, sources))), dtype=torch.long)
    decoder = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    for r, (ids, row) in enumerate(zip(sources, rows)):
        source[r, : len(ids)], decoder[r, : len(row)] = ids, torch.tensor(row)
    with torch.inference_mode():
        return model(input_ids=source, attention_mask=(source != PAD).long(), decoder_input_ids=decoder).logits


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logits_match_hugging_face_within_1e_4(name, layout):
    """Every read position's logits equal those of Hugging Face's full forward pass over the same
    tokens: rows of different source lengths and counts in one pass, then the same rows going on
    from their different positions in a second (against Hugging Face's batch of the same rows),
    and one row fed in three calls through its cache."""
    model = build(name)
    engine = NativeEngine(native_weights(model), slots=8)
    slots = LAYOUTS[layout]
    sources = [encode(text) for text in INPUTS[:3]]
    start = model.config.decoder_start_token_id
    rows = [[start] + list(range(10, 10 + n)) for n in (6, 2, 9)]  # the start token and some tokens
    engine.admit(slots, sources)
    counts = [4, 2, 7]  # row r feeds its first counts[r] tokens and reads all of them
    tokens = torch.zeros((3, max(counts)), dtype=torch.long)
    for r, row in enumerate(rows):
        tokens[r, : counts[r]] = torch.tensor(row[: counts[r]])
    logits = engine.forward(Feed(slots, tokens, [0, 0, 0], counts, counts))
    want = hf_logits(model, sources, rows)
    for r, count in enumerate(counts):
        torch.testing.assert_close(logits[r, :count], want[r, :count], atol=1e-4, rtol=0)
    rest = [len(row) - count for row, count in zip(rows, counts)]  # each row goes on from its own position
    tokens = torch.zeros((3, max(rest)), dtype=torch.long)
    for r, (row, count) in enumerate(zip(rows, counts)):
        tokens[r, : rest[r]] = torch.tensor(row[count:])
    logits = engine.forward(Feed(slots, tokens, counts, rest, rest))
    for r, (count, more) in enumerate(zip(counts, rest)):
        torch.testing.assert_close(logits[r, :more], want[r, count : count + more], atol=1e-4, rtol=0)

    source, row = sources[2], rows[2]
    engine.admit([5], [source])
    pieces = [(0, 1), (1, 5), (5, 10)]  # one token, four, five: reading 1, 2 and 5 of them
    got = []
    for (start, end), reads in zip(pieces, (1, 2, 5)):
        got.append(engine.forward(Feed([5], torch.tensor([row[start:end]]), [start], [end - start], [reads]))[0])
    want = hf_logits(model, [source], [row])[0]
    for (start, end), reads, logits in zip(pieces, (1, 2, 5), got):
        torch.testing.assert_close(logits, want[end - reads : end], atol=1e-4, rtol=0)


# make test-fast compares one model per family end to end (the logits tests above cover every model).
END_TO_END_FAST = ("t5-v1.0", "bart")


@pytest.mark.parametrize("name", [name if name in END_TO_END_FAST else pytest.param(name, marks=pytest.mark.slow)
                                  for name in MODELS])
def test_tokens_and_statistics_equal_the_hugging_face_engines(name):
    native, hf = pair_of(name, "native"), pair_of(name, "hf")
    assert (native.engine_kind, hf.engine_kind) == ("native", "hf")
    compared = assert_same_tokens_and_statistics(hf, native, INPUTS, MAX_NEW)
    assert compared == 4 * 3 * len(INPUTS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", ["t5-v1.0", "t5-v1.1", "narrow-heads"])
def test_half_precision_is_as_close_to_float32_as_hugging_faces(dtype, shape):
    """bfloat16/float16 (on the CPU here; on a GPU in the GPU check): the same computation in a
    coarser type. Its logits may be no further from the float32 model's than Hugging Face's own
    run in that dtype (random tiny models are sensitive: both err by up to a third of the scale)."""
    reference, model = build_t5(shape), build_t5(shape, dtype=dtype)
    engine = NativeEngine(native_weights(model), slots=1)
    source, row = encode(INPUTS[0]), [PAD, 10, 11, 12, 13]
    engine.admit([0], [source])
    got = engine.forward(Feed([0], torch.tensor([row]), [0], [len(row)], [len(row)]))[0]
    assert got.dtype == dtype
    exact = hf_logits(reference, [source], [row])[0]
    theirs = hf_logits(model, [source], [row])[0].float()
    ours_error = float((got.float() - exact).abs().max())
    their_error = float((theirs - exact).abs().max())
    assert ours_error <= 2 * their_error + 0.01 * float(exact.abs().max()), (ours_error, their_error)


def test_a_rollback_is_only_a_shorter_length():
    """rewind changes no cached tensor; the next forward overwrites from the kept length on."""
    model = build_t5("t5-v1.0")
    engine = NativeEngine(native_weights(model), slots=1)
    engine.admit([0], [encode(INPUTS[0])])
    engine.forward(Feed([0], torch.tensor([[PAD, 20, 21, 22]]), [0], [4], [1]))
    before = engine.qkv.clone()
    engine.rewind(0, 2)
    assert engine.lengths[0] == 2 and torch.equal(engine.qkv, before)
    with pytest.raises(ValueError, match="position"):
        engine.forward(Feed([0], torch.tensor([[30]]), [4], [1], [1]))  # past the kept length: refused
    after = engine.forward(Feed([0], torch.tensor([[30]]), [2], [1], [1]))[0, 0]
    with torch.inference_mode():
        want = model(input_ids=encode(INPUTS[0])[None], decoder_input_ids=torch.tensor([[PAD, 20, 30]])).logits[0, -1]
    torch.testing.assert_close(after, want, atol=1e-4, rtol=0)


def test_models_without_a_native_engine_fall_back_to_hugging_face(caplog, make_pair):
    gpt2 = make_pair("gpt2")
    assert gpt2.engine_kind == "hf"
    with caplog.at_level("WARNING", logger="pipeline.decoding"):
        pair = ModelPair(gpt2.small, gpt2.large, gpt2.tokenizer, gpt2.device, engine_request="native")
    assert pair.engine_kind == "hf"
    assert "Hugging Face engine" in caplog.text and "GPT2LMHeadModel" in caplog.text
    with pytest.raises(ValueError, match="engine"):
        ModelPair(gpt2.small, gpt2.large, gpt2.tokenizer, gpt2.device, engine_request="fast")


@pytest.mark.slow
def test_the_demo_pair_decodes_the_same_on_both_engines(demo_pair_paths):
    small, large = demo_pair_paths
    pairs = {engine: ModelPair.from_pretrained(small, large, device="cpu", engine=engine) for engine in ("native", "hf")}
    assert pairs["native"].engine_kind == "native" and pairs["native"].shares_encoder
    texts = demo_sentences(12)
    for method in ("large", "small", "bild", "speculative"):
        config = DecodingConfig(method=method, max_new_tokens=64, fallback_threshold=0.4, rollback_threshold=1.0,
                                adaptive_draft=False)  # the same rounds on both engines, whatever their speed
        for batch in (None, BatchPolicy(8)):
            want = Generator(pairs["hf"], config).generate(texts, batch=batch)
            got = Generator(pairs["native"], config).generate(texts, batch=batch)
            assert [r.token_ids for r in got] == [r.token_ids for r in want], (method, batch)
            assert [r.stats for r in got] == [r.stats for r in want], (method, batch)


def demo_sentences(count: int) -> list[str]:
    import pyarrow.parquet as pq

    folder = REPO / "data" / "multi30k_sample"
    table = pq.read_table(folder / "test_2016_flickr.parquet")
    return table.column("de").to_pylist()[:count]


@pytest.fixture(scope="module")
def demo_pair_paths():
    models = REPO / "models" / "demo-de-en"
    return str(models / "small-aligned"), str(models / "large")


def test_a_forced_first_token_is_part_of_the_prefix_as_generate_forces_it():
    """mBART/NLLB force the target language (generation_config.forced_bos_token_id): our output is
    what follows it, generate()'s output with it."""
    pair = pair_of("nllb", "native")
    pair.large.generation_config.forced_bos_token_id = 77
    try:
        source = encode(INPUTS[0])
        assert pair.decoder_prefix(source).tolist() == [pair.decoder_start_token_id, 77]
        ours = Generator(pair, DecodingConfig(method="large", max_new_tokens=12)).decode_ids(source[None]).tokens
        with torch.inference_mode():
            theirs = pair.large.generate(source[None], max_new_tokens=13, do_sample=False, num_beams=1)[0].tolist()
        assert theirs[:2] == [pair.decoder_start_token_id, 77] and ours == theirs[2:]
    finally:
        pair.large.generation_config.forced_bos_token_id = None
