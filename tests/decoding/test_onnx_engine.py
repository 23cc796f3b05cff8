"""The onnx engine (models.engine: onnx) against the native engine it is built from.

float32: every read position's logits within 1e-4 of the native engine's over the same feeds and
encoder states, in every layout of rows among slots, and the encoder within 1e-4 of float64; the
same tokens and statistics for every method and batch size. int8: BiLD with rollback_threshold 0 and
greedy speculative decoding return exactly int8 `large`'s tokens at every batch size (a row's
product does not depend on the other rows of the call), with either int8 kernel (by blocks, by
rows), speculative sampling follows the int8 model's own distribution, and the logits stay close to
float32's. Both model families (T5, BART); the BART family in all four variants.
"""

from __future__ import annotations

import pytest
import torch

import pipeline.decoding.engine as engine_module
import pipeline.decoding.policies as policies_module
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engine import Feed
from pipeline.decoding.engines.native import NativeEngine
from pipeline.decoding.engines import attention_kernel, onnx_engine
from pipeline.decoding.engines.onnx_engine import OnnxEngine
from pipeline.decoding.engines.onnx_sessions import OnnxSessions
from pipeline.decoding.models import build_engine, native_weights
from pipeline.pairs.tiny import build_pair, byte_tokenizer, noisy_copy
from support import REPO
from support.distributions import (RESIDUALS, check_loop, engine_probs_of, sample_loop, tiny_vocab_pair,
                                   verify_with_residual)
from support.engine_checks import assert_lossless_at_every_batch_size, assert_same_tokens_and_statistics
from support.native_models import LAYOUTS, SHAPES, build, encode
from support.pairs import TEXTS

# T5 v1.0 (ReLU, tied head), v1.1 (gated GELU), heads * d_kv != d_model, and the BART family.
MODELS = ["t5-v1.0", "t5-v1.1", "narrow-heads", "bart", "mbart", "marian", "nllb"]
INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut."]
MAX_NEW = 20
KERNELS = ["blocks", "rows"]  # onnx_graph.INT8_KERNELS (not imported: onnx_graph needs onnx at import)
# attention_kernel.ATTENTIONS: onnxruntime's ops, or ours (decode_attention.c; where no C compiler builds it,
# engines run onnxruntime's: test_attention_kernel.py)
ATTENTIONS = ["onnxruntime", pytest.param("kernel", marks=pytest.mark.skipif(
    attention_kernel.kernel() is None, reason="no C compiler here to build the attention kernel"))]
INT8_SAMPLES = 4000  # as the batched distribution test (test_batch.py)


def engines(model, slots: int, quantize: str = "none", kernel: str | None = None,
            attention: str | None = None) -> tuple[OnnxEngine, NativeEngine]:
    weights = native_weights(model)
    return (OnnxEngine(weights, OnnxSessions(weights, quantize), slots, kernel, attention=attention),
            NativeEngine(weights, slots))


def pair_of(name: str, engine: str, quantize: str = "none") -> ModelPair:
    large = build(name)
    return ModelPair(noisy_copy(large, 0.1, seed=1), large, byte_tokenizer(append_eos=True), torch.device("cpu"),
                     engine_request=engine, quantize=quantize)


def feeds(start: int, slots: list[int]) -> list[Feed]:
    """Rows of different counts from position 0, then each going on from its own position; rows read
    all they feed (a verification) or fewer (place_logits' scatter)."""
    rows = [[start] + list(range(10, 10 + n)) for n in (6, 2, 9)]
    counts, reads = [4, 2, 7], [4, 1, 7]
    first = torch.zeros((3, 7), dtype=torch.long)
    for r, row in enumerate(rows):
        first[r, : counts[r]] = torch.tensor(row[: counts[r]])
    rest = [len(row) - count for row, count in zip(rows, counts)]
    second = torch.zeros((3, max(rest)), dtype=torch.long)
    for r, (row, count) in enumerate(zip(rows, counts)):
        second[r, : rest[r]] = torch.tensor(row[count:])
    return [Feed(slots, first, [0, 0, 0], counts, reads), Feed(slots, second, counts, rest, [1, 1, 2])]


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_float32_logits_match_the_native_engines_within_1e_4(name, layout, attention):
    """The step, with onnxruntime's attention ops or our kernel between onnxruntime segments: both
    engines attend to the same encoder states (the native engine's; the onnx engine's own encoder is
    held to float64 in the test after this one)."""
    model = build(name)
    onnx, native = engines(model, slots=8, attention=attention)
    slots = LAYOUTS[layout]
    sources = [encode(text) for text in INPUTS[:3]]
    onnx.admit(slots, sources, native.admit(slots, sources))
    for feed in feeds(model.config.decoder_start_token_id, slots):
        got, want = onnx.forward(feed), native.forward(feed)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # One row through its cache, one token at a time, past the first capacity (64 positions): float32
    # rounding adds up over 70 steps of these deliberately sharp random models (both engines drift
    # from float64 by ~1e-3), so each is held to the exact float64 logits, onnx no further than native.
    source = encode(INPUTS[4])
    for engine in (onnx, native):
        engine.admit([5], [source])
    sequence, steps = [model.config.decoder_start_token_id], {"onnx": [], "native": []}
    for position in range(70):
        feed = Feed([5], torch.tensor([sequence[-1:]]), [position], [1], [1])
        steps["onnx"].append(onnx.forward(feed)[0, 0])
        steps["native"].append(native.forward(feed)[0, 0])
        sequence.append(int(steps["native"][-1].argmax()))
    with torch.inference_mode():
        exact = model.double()(input_ids=source[None], decoder_input_ids=torch.tensor([sequence[:-1]])).logits[0]
    error = {kind: float((torch.stack(logits).double() - exact).abs().max()) for kind, logits in steps.items()}
    assert error["onnx"] <= 1.5 * error["native"] + 1e-4, error


@pytest.mark.parametrize("name", MODELS)
def test_the_encoder_is_within_1e_4_of_float64(name):
    """The admission's encoder (onnxruntime, float32) against the model's own in float64, beside the
    native engine's (torch, float32): states of scale ~4, which these sharp random models compute in
    float32 1e-6 (BART family) to 3e-5 (T5) from float64 either way; its logits are held to the
    native engine's in the test before this one, on the same states."""
    model = build(name)
    onnx, native = engines(model, slots=3)
    sources = [encode(text) for text in INPUTS[:3]]
    states = {"onnx": onnx.admit([0, 1, 2], sources), "native": native.admit([0, 1, 2], sources)}
    with torch.inference_mode():
        exact = [model.double().get_encoder()(input_ids=source[None]).last_hidden_state[0] for source in sources]
    error = {kind: max(float((encoded[row, : len(source)].double() - exact[row]).abs().max())
                       for row, source in enumerate(sources)) for kind, encoded in states.items()}
    assert error["onnx"] < 1e-4 and error["native"] < 1e-4, error


@pytest.mark.parametrize("name", ["t5-v1.1", "bart", pytest.param("t5-v1.0", marks=pytest.mark.slow),
                                  pytest.param("nllb", marks=pytest.mark.slow)])  # make test-fast: one per family
def test_tokens_and_statistics_equal_the_native_engines(name):
    onnx, native = pair_of(name, "onnx"), pair_of(name, "native")
    assert (onnx.engine_kind, native.engine_kind) == ("onnx", "native")
    assert type(onnx.engine("large", 1)) is OnnxEngine
    assert assert_same_tokens_and_statistics(native, onnx, INPUTS, MAX_NEW) == 4 * 3 * len(INPUTS)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_after_a_rewind_the_next_logits_are_a_fresh_decodes(attention):
    """A rollback is only a shorter length: rewind copies no cached tensor, and the forward after it gives
    the logits a fresh engine gives over the kept prefix and the new tokens at those positions (and the
    model itself, without any cache): the rewound drafts' keys and values, still in the buffer, are
    overwritten and never attended to. They would change the logits (the last check), so the equality
    is no accident of the feed."""
    model = build("t5-v1.0")
    start, source = model.config.decoder_start_token_id, encode(INPUTS[0])
    rewound, _ = engines(model, slots=1, attention=attention)
    rewound.admit([0], [source])
    rewound.forward(Feed([0], torch.tensor([[start, 20, 21, 22]]), [0], [4], [1]))  # 21, 22: drafts to reject
    before = rewound.self_k.clone(), rewound.self_v.clone()
    rewound.rewind(0, 2)
    assert rewound.lengths[0] == 2
    assert torch.equal(rewound.self_k, before[0]) and torch.equal(rewound.self_v, before[1])
    one = rewound.forward(Feed([0], torch.tensor([[30]]), [2], [1], [1]))[0, 0]  # one token after the rewind ...
    rewound.rewind(0, 2)
    two = rewound.forward(Feed([0], torch.tensor([[30, 31]]), [2], [2], [2]))[0]  # ... and a verification's two
    kept = [start, 20, 30, 31]
    fresh, _ = engines(model, slots=1, attention=attention)
    fresh.admit([0], [source])
    want = fresh.forward(Feed([0], torch.tensor([kept]), [0], [4], [4]))[0]
    torch.testing.assert_close(one, want[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(two, want[2:], atol=1e-5, rtol=0)
    with torch.inference_mode():
        exact = model(input_ids=source[None], decoder_input_ids=torch.tensor([kept]), use_cache=False).logits[0]
    torch.testing.assert_close(two, exact[2:], atol=1e-4, rtol=0)
    with torch.inference_mode():  # had the drafts stayed, the same tokens would read other logits
        stale = model(input_ids=source[None], decoder_input_ids=torch.tensor([[start, 20, 21, 22, 30, 31]]),
                      use_cache=False).logits[0, 4:]
    assert float((stale - exact[2:]).abs().max()) > 1e-2
    # bench-batch's time split: onnxruntime's call is part of a step; the native engine has no such call
    _, native = engines(model, slots=1, attention=attention)
    native.admit([0], [source])
    native.forward(Feed([0], torch.tensor([kept]), [0], [4], [4]))
    assert 0 < rewound.runtime_seconds < rewound.forward_seconds and native.runtime_seconds == 0


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_the_source_buffer_holds_the_longest_source_and_only_onnxruntimes_attention_shrinks_it(attention):
    """onnxruntime's cross-attention reads every position of the buffer: once a long source is gone the
    buffer shrinks to the sources held. Our kernel reads only each row's own: its buffer only grows
    (a resize copies every cross cache and rebinds every step)."""
    weights = native_weights(build("bart"))
    engine = OnnxEngine(weights, OnnxSessions(weights), 4, attention=attention)
    long, short = encode("x" * 60), encode(INPUTS[-2])  # 61 and 10 positions
    engine.admit([0], [long])
    assert engine.sources == 64
    engine.release(0)
    engine.admit([1], [short])
    assert engine.sources == (64 if attention == "kernel" else 16)
    engine.admit([2], [encode("y" * 70)])  # past the buffer: it grows
    assert engine.sources == (128 if attention == "kernel" else 72)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_forgotten_rollback_would_be_caught(monkeypatch, family):
    """The token comparisons have teeth on this engine: one that keeps rejected drafts' keys and
    values diverges from the native engine (or fails)."""
    small, large, tokenizer = build_pair(family, seed=0, small="independent")  # disagrees: rollbacks
    pairs = {kind: ModelPair(small, large, tokenizer, torch.device("cpu"), engine_request=kind)
             for kind in ("onnx", "native")}
    config = DecodingConfig(method="bild", max_new_tokens=32, rollback_threshold=2.0, fallback_threshold=0.3,
                            max_draft_tokens=5, adaptive_draft=False)
    want = Generator(pairs["native"], config).generate(TEXTS)
    assert [r.token_ids for r in Generator(pairs["onnx"], config).generate(TEXTS)] == [r.token_ids for r in want]
    assert sum(r.stats.rollbacks for r in want) > 0

    def forget_to_cut(self, slot, length):
        pass  # the rejected drafts' keys and values stay cached

    monkeypatch.setattr(OnnxEngine, "rewind", forget_to_cut)  # the native engine still cuts
    got = Generator(pairs["onnx"], config).generate(TEXTS)
    assert any(g.error is not None or g.token_ids != w.token_ids for g, w in zip(got, want))


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("family", ["t5", "bart"])
def test_int8_bild_and_speculative_are_int8_larges_greedy_output_at_every_batch_size(family, kernel, attention,
                                                                                       monkeypatch):
    """With the int8 kernel and the attention engines of every batch size pick here (the rules pick
    by slots)."""
    monkeypatch.setattr(onnx_engine, "ROWS_KERNEL_FROM_SLOTS", 1 if kernel == "rows" else 10**6)
    monkeypatch.setattr(onnx_engine, "KERNEL_FROM_SLOTS", 1 if attention == "kernel" else 10**6)
    small, large, tokenizer = build_pair(family, seed=0, small="noisy")
    pair = ModelPair(small, large, tokenizer, torch.device("cpu"), engine_request="onnx", quantize="int8")
    assert_lossless_at_every_batch_size(pair, INPUTS, MAX_NEW)


@pytest.mark.parametrize("variant", ["fixed", "residual_is_p"])
def test_int8_speculative_sampling_keeps_the_int8_large_models_distribution(variant, monkeypatch):
    """Speculative sampling on an int8 pair (the tiny-vocabulary T5 pair, float32, every matrix int8
    on this engine) at batch 64: four tokens follow the int8 large model's own pL(t1..t4), enumerated
    with the same engine, and the bonus tokens its pL(t4 | t1..t3); a replacement drawn from p
    instead of the residual fails the same tests."""
    if variant in RESIDUALS:
        monkeypatch.setattr(policies_module, "speculative_verify", verify_with_residual(variant))
    large = tiny_vocab_pair("t5")[1].float()
    reference = build_engine(large, "onnx", 64, quantize="int8")  # as many slots: the same int8 kernel
    outputs = sample_loop("t5", INT8_SAMPLES, 64, variant, engine="onnx", quantize="int8")
    check_loop(outputs, "t5", variant, INT8_SAMPLES, probs_of=engine_probs_of(reference))


@pytest.mark.parametrize("kernel,row_bits", [("blocks", None), ("rows", 7), ("rows", 8)])
def test_int8_logits_stay_close_to_float32s(kernel, row_bits, monkeypatch):
    """The demo pair's `large` along a greedy output, every matrix in int8 (8-bit weights by blocks
    of each column, or per column with 7- or 8-bit activations per row; admissions by rows): within
    5% of float32's logits (norm of the difference over the norm), no logit off by more than 0.2 of
    their standard deviation, 90% of argmaxes the same. 8-bit activations where the CPU has VNNI only
    (onnx_graph.ROW_BITS: elsewhere MLAS's int16 sums can overflow)."""
    from pipeline.decoding.engines import onnx_graph

    if row_bits == 8 and onnx_graph.ROW_BITS != 8:
        pytest.skip("this CPU has no VNNI: 8-bit activations could overflow MLAS's int16 sums")
    if row_bits is not None:
        monkeypatch.setattr(onnx_graph, "ROW_LEVELS", 2 ** (row_bits - 1) - 1)
        monkeypatch.setattr(onnx_graph, "ROW_ZERO", 2 ** (row_bits - 1))
    demo = REPO / "models" / "demo-de-en"
    pair = ModelPair.from_pretrained(str(demo / "small-aligned"), str(demo / "large"), device="cpu")
    generator = Generator(pair, DecodingConfig(method="large", max_new_tokens=MAX_NEW))
    input_ids = generator.encode(INPUTS[1])[0][0]
    sequence = pair.decoder_prefix(input_ids).tolist() + generator.generate_one(INPUTS[1]).token_ids
    feed = Feed([0], torch.tensor([sequence]), [0], [len(sequence)], [len(sequence)])
    logits = {}
    for quantize in ("none", "int8"):
        engine, _ = engines(pair.large, 1, quantize, kernel)
        engine.admit([0], [input_ids])
        logits[quantize] = engine.forward(feed)[0]
    difference = logits["int8"] - logits["none"]
    assert 0 < float(difference.norm() / logits["none"].norm()) < 0.05  # int8 really ran, and stayed close
    assert float(difference.abs().max() / logits["none"].std()) < 0.2
    assert (logits["int8"].argmax(-1) == logits["none"].argmax(-1)).float().mean() >= 0.9


def greedy_reference(model, source: torch.Tensor, steps: int) -> tuple[list[int], torch.Tensor]:
    """The model's own greedy decode (transformers, no cache, float32): the decoder input [start, t1..tn]
    and the logits [n, V] at each of its positions."""
    sequence = [model.config.decoder_start_token_id]
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(input_ids=source[None], decoder_input_ids=torch.tensor([sequence]), use_cache=False).logits
            sequence.append(int(logits[0, -1].argmax()))
        logits = model(input_ids=source[None], decoder_input_ids=torch.tensor([sequence[:-1]]), use_cache=False).logits
    return sequence, logits[0]


def test_build_engine_builds_it_with_the_int8_asked_for():
    """What bench's projection and the pair use, against the model itself (transformers, no cache) along
    its own greedy output: float32 within 1e-4 of its logits; int8 really int8 (off float32's by more than
    rounding), yet within 2% of the model's logits (norm of the difference over the norm) and its argmax
    at every position the model's own greedy token, so a greedy decode on it writes the same tokens. (The
    BART-family tiny model: the T5 ones are too sharp for int8 to keep their argmax.)"""
    model = build("bart")
    built = {quantize: build_engine(model, "onnx", 1, quantize=quantize) for quantize in ("none", "int8")}
    for quantize, engine in built.items():
        assert type(engine) is OnnxEngine and engine.sessions.quantize == quantize
        assert engine.weights.dtype == torch.float32  # the weights stay float: the sessions quantize their own
    for text in INPUTS[:3]:
        source = encode(text)
        sequence, exact = greedy_reference(model, source, MAX_NEW)
        feed = Feed([0], torch.tensor([sequence[:-1]]), [0], [MAX_NEW], [MAX_NEW])
        logits = {}
        for quantize, engine in built.items():
            engine.admit([0], [source])
            logits[quantize] = engine.forward(feed)[0]
        torch.testing.assert_close(logits["none"], exact, atol=1e-4, rtol=0)
        int8_off = float((logits["int8"] - logits["none"]).norm() / logits["none"].norm())
        assert 1e-4 < int8_off, int8_off  # int8 ran (float32 is within 1e-4 of the model, above)
        assert float((logits["int8"] - exact).norm() / exact.norm()) < 0.02
        assert logits["int8"].argmax(-1).tolist() == sequence[1:]  # the model's own greedy tokens


def test_where_it_cannot_run_is_a_clear_error():
    """The rule is stated once (rules.engine_problem, which the job schema asks); the engine only asserts it."""
    from pipeline.decoding.rules import engine_problem

    assert "models.engine onnx runs on the CPU in float32" in engine_problem("onnx", "none", "cpu", "float64")
    assert "models.engine onnx runs on the CPU in float32" in engine_problem("onnx", "int8", "cuda", "auto")
    assert engine_problem("onnx", "int8", "auto", "float32") is None
    small, large, tokenizer = build_pair("t5", seed=0, small="noisy")
    with pytest.raises(AssertionError, match="engine_problem"):
        OnnxEngine(native_weights(large.to(torch.float64)), None, 1)


def test_heads_onnxruntime_cannot_attend_with_run_on_the_native_engine(caplog, monkeypatch):
    """GroupQueryAttention takes heads a multiple of 8 wide: a pair with others runs on the native
    engine, and the log says why."""
    monkeypatch.setitem(SHAPES, "heads-20-wide", dict(SHAPES["narrow-heads"], d_kv=20))
    large = build("heads-20-wide")
    with caplog.at_level("WARNING", logger="pipeline.decoding"):
        pair = ModelPair(noisy_copy(large, 0.1, seed=1), large, byte_tokenizer(append_eos=True), torch.device("cpu"),
                         engine_request="onnx")
    assert pair.engine_kind == "native"
    assert "running on the native engine" in caplog.text and "20 wide, not a multiple of 8" in caplog.text
    assert pair_of("narrow-heads", "onnx").engine_kind == "onnx"  # 24 wide


def test_weights_past_protobufs_limit_load_from_a_file(monkeypatch):
    """A model whose weights do not fit in one protobuf message (2 GiB) is saved with its weights in
    a file beside the graph and loaded from there: the same logits."""
    import onnx

    from pipeline.decoding.engines import onnx_sessions

    model = build("bart")
    weights = native_weights(model)
    saved = []  # the graphs written to a file, with their weights beside them
    real_save = onnx.save_model
    monkeypatch.setattr(onnx, "save_model", lambda *args, **kwargs: saved.append(kwargs) or real_save(*args, **kwargs))
    feed = Feed([0], torch.tensor([[model.config.decoder_start_token_id, 11, 12]]), [0], [3], [3])
    logits = []
    for limit in (onnx_sessions.PROTOBUF_LIMIT, 0):
        monkeypatch.setattr(onnx_sessions, "PROTOBUF_LIMIT", limit)
        engine = OnnxEngine(weights, OnnxSessions(weights), 1)
        engine.admit([0], [encode(INPUTS[0])])  # the sessions are built when first used: admission, then the step
        logits.append(engine.forward(feed))
        if limit:
            assert saved == []  # small weights travel inside the serialized graph
    assert len(saved) == 2 and all(kwargs["save_as_external_data"] for kwargs in saved)
    assert torch.equal(*logits)


@pytest.mark.parametrize("quantize", ["none", "int8 blocks", "int8 rows"])
@pytest.mark.parametrize("name", ["t5-v1.0", "bart"])
def test_a_records_cache_does_not_depend_on_the_records_admitted_with_it(name, quantize, monkeypatch):
    """Records admitted together (one padded batch) get bit for bit the cross-attention keys and
    values each gets alone: int8 rounding downstream would turn a last-bit difference into another
    token."""
    monkeypatch.setattr(engine_module, "ADMISSION_PADDING", 1.0)  # (not in length groups: one batch)
    quantize, _, kernel = quantize.partition(" ")
    weights = native_weights(build(name))
    sessions = OnnxSessions(weights, quantize)
    together, alone = OnnxEngine(weights, sessions, 3, kernel or None), OnnxEngine(weights, sessions, 3, kernel or None)
    sources = [encode(text) for text in INPUTS[:3]]
    together.admit([0, 1, 2], sources)
    for slot, source in enumerate(sources):
        alone.admit([slot], [source])
    for slot, source in enumerate(sources):
        assert torch.equal(together.cross_k[:, slot, :, : len(source)], alone.cross_k[:, slot, :, : len(source)])
        assert torch.equal(together.cross_v[:, slot, :, : len(source)], alone.cross_v[:, slot, :, : len(source)])


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_one_token_source_gets_the_same_cache_from_shared_encoder_states_alone_or_in_a_group(kernel):
    """The small model's admission from the large one's encoder states: a one-token source (an empty
    record's EOS), a length group of its own, is a product of one row; it gets the cross-attention
    keys and values it gets beside another, bit for bit (int8 rounding downstream would turn a
    last-bit difference into another token)."""
    weights = native_weights(build("t5-v1.0"))
    sessions = OnnxSessions(weights, "int8")
    states = torch.randn(2, 1, weights.d_model, generator=torch.Generator().manual_seed(0))  # two one-token sources
    alone, together = OnnxEngine(weights, sessions, 2, kernel), OnnxEngine(weights, sessions, 2, kernel)
    sources = [encode("")] * 2
    assert len(sources[0]) == 1
    alone.admit([0], sources[:1], states[:1])
    together.admit([0, 1], sources, states)
    assert torch.equal(alone.cross_k[:, 0, :, :1], together.cross_k[:, 0, :, :1])
    assert torch.equal(alone.cross_v[:, 0, :, :1], together.cross_v[:, 0, :, :1])


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["t5-v1.1", "bart", "nllb"])
def test_int8_logits_are_the_same_bit_for_bit_however_a_position_is_fed(name, kernel, attention):
    """Under int8 a last-bit difference upstream can move a product's rounding and so a token; every
    way of computing a position must give the same bits: one token per call, all in one call (a
    verification), or beside other rows of other lengths (a batch)."""
    model = build(name)
    weights = native_weights(model)
    session = OnnxSessions(weights, "int8")
    start = model.config.decoder_start_token_id
    row = [start] + [10 + (7 * i) % 50 for i in range(9)]
    sources = [encode(text) for text in INPUTS[:3]]
    stepwise = OnnxEngine(weights, session, 1, kernel, attention=attention)
    stepwise.admit([0], [sources[0]])
    one_by_one = torch.cat([stepwise.forward(Feed([0], torch.tensor([[token]]), [i], [1], [1]))[0]
                            for i, token in enumerate(row)])
    at_once = OnnxEngine(weights, session, 1, kernel, attention=attention)
    at_once.admit([0], [sources[0]])
    verified = at_once.forward(Feed([0], torch.tensor([row]), [0], [len(row)], [len(row)]))[0]
    batched = OnnxEngine(weights, session, 3, kernel, attention=attention)
    batched.admit([0, 1, 2], sources)
    tokens = torch.zeros((3, len(row)), dtype=torch.long)
    tokens[0], tokens[1, :4], tokens[2, :7] = torch.tensor(row), torch.tensor(row[:4]), torch.tensor(row[:7])
    in_a_batch = batched.forward(Feed([0, 1, 2], tokens, [0, 0, 0], [len(row), 4, 7], [len(row), 4, 7]))[0]
    assert torch.equal(verified, one_by_one)
    assert torch.equal(in_a_batch, one_by_one)
