"""The onnx engine's own attention (attention_kernel.py, decode_attention.c) and the step cut around it
(onnx_segments.py). Its numerics and its invariants run in test_onnx_engine.py with either attention;
here: the kernel against a plain torch reference, the cut step's plumbing, what the kernel refuses to
be handed, how it is built (and that it builds wherever there is a compiler: a failure, not a skip), the
library the install built and when it is not loaded, a machine without a compiler, and the output rows
saying which attention and int8 scheme ran. A wheel's library on a machine without one:
tests/infra/test_wheel.py."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.decoding import BatchPolicy, DecodingConfig, ModelSpec
from pipeline.decoding.engine import Feed
from pipeline.decoding.engines import attention_kernel, onnx_engine, onnx_graph
from pipeline.decoding.engines.onnx_engine import OnnxEngine
from pipeline.decoding.engines.onnx_segments import Attention
from pipeline.decoding.engines.onnx_sessions import OnnxSessions
from pipeline.decoding.models import native_weights
from pipeline.stage import DecodeStage, DecodeStageSpec
from support.native_models import build

ROWS, WIDTH, HEADS, DK, CAPACITY, SOURCES = 3, 4, 2, 24, 16, 7


def reference(query, keys, values, scale, bias=None):
    """softmax(scale * q.k + bias) . v in float64: query [dk], keys and values [n, dk]."""
    scores = scale * keys.double() @ query.double()
    if bias is not None:
        scores = scores + bias.double()
    return torch.softmax(scores, dim=0) @ values.double()


def compiler_here() -> str | None:
    """The compiler the kernel's builder uses, where it is on this machine (None: no compiler)."""
    command = attention_kernel.compiler()
    return command if command and shutil.which(command) else None


@pytest.fixture(scope="module")
def kernel():
    """The kernel the engines run; a skip only where there is no compiler (a build that fails fails)."""
    if compiler_here() is None:
        pytest.skip("no C compiler here: the engine runs onnxruntime's attention (tested below)")
    if os.environ.get("BILD_ATTENTION_KERNEL") == "0":
        pytest.skip("BILD_ATTENTION_KERNEL=0 turns the kernel off")
    built = attention_kernel.kernel()
    if built is None:
        attention_kernel.build()  # raises BuildError with the compiler's message
        pytest.fail("attention_kernel.kernel() is None where the kernel builds")
    return built


def test_the_kernel_builds_wherever_there_is_a_compiler():
    """Fails, not skips, where a compiler is present and decode_attention.c does not build with it."""
    command = compiler_here()
    if command is None:
        pytest.skip("no C compiler on this machine")
    built = attention_kernel.build(command)  # BuildError: the compiler's message
    assert isinstance(built, attention_kernel.DecodeAttention)


def test_it_is_built_without_contraction_and_a_change_of_flags_builds_anew():
    """-ffp-contract=off (clang fuses a * b + c by default: nodes would decode a record differently), the
    -O flags kept, for any x86-64 (no -march: a wheel's library runs elsewhere), -fwrapv undone (Python's
    CFLAGS, 2.3x the time); the library is kept under its compiler, flags and source."""
    flags = attention_kernel.FLAGS
    assert "-ffp-contract=off" in flags and "-O3" in flags and not any("fast-math" in flag for flag in flags)
    assert not any(flag.startswith(("-march", "-mtune")) for flag in flags) and "-fno-wrapv" in flags
    key = attention_kernel.build_key("cc", flags)
    assert key == attention_kernel.build_key("cc", flags)
    assert key != attention_kernel.build_key("cc", tuple(flag for flag in flags if flag != "-ffp-contract=off"))
    assert key != attention_kernel.build_key("clang", flags)
    if compiler_here() is not None:
        assert attention_kernel.build().flags == flags


def test_self_attention_writes_the_fed_keys_and_attends_causally(kernel):
    rng = np.random.default_rng(0)
    inner = HEADS * DK
    qkv = rng.standard_normal((ROWS, WIDTH, 3 * inner), dtype=np.float32)
    cache_k = rng.standard_normal((ROWS, CAPACITY, HEADS, DK), dtype=np.float32)  # positions, then heads
    cache_v = rng.standard_normal((ROWS, CAPACITY, HEADS, DK), dtype=np.float32)
    before = cache_k.copy()
    positions, counts = np.array([0, 5, 9], dtype=np.int32), np.array([4, 1, 0], dtype=np.int32)  # row 2 idle
    bias = rng.standard_normal((ROWS, HEADS, WIDTH + 1, CAPACITY), dtype=np.float32)
    out = np.full((ROWS, WIDTH, inner), np.nan, dtype=np.float32)
    slots = np.arange(ROWS, dtype=np.int32)
    kernel.self_attention(qkv, cache_k, cache_v, slots, positions, counts, bias, 0.5, out)()
    q, k, v = (torch.from_numpy(qkv[..., part * inner:(part + 1) * inner]).view(ROWS, WIDTH, HEADS, DK)
               for part in range(3))
    for a in range(ROWS):
        position, count = int(positions[a]), int(counts[a])
        for h in range(HEADS):
            assert np.array_equal(cache_k[a, position:position + count, h], k[a, :count, h].numpy())
            assert np.array_equal(cache_v[a, position:position + count, h], v[a, :count, h].numpy())
            assert np.array_equal(cache_k[a, position + count:, h], before[a, position + count:, h])  # nothing past
            for i in range(count):
                n = position + i + 1  # its own position included, none after it
                want = reference(q[a, i, h], torch.from_numpy(cache_k[a, :n, h]), torch.from_numpy(cache_v[a, :n, h]),
                                 0.5, torch.from_numpy(bias[a, h, i, :n]))
                torch.testing.assert_close(torch.from_numpy(out[a, i, h * DK:(h + 1) * DK]).double(), want,
                                           atol=1e-5, rtol=0)
        assert not out[a, count:].any()  # positions not fed are left zero


def test_cross_attention_reads_each_rows_own_sources(kernel):
    rng = np.random.default_rng(1)
    inner = HEADS * DK
    query = rng.standard_normal((ROWS, WIDTH, inner), dtype=np.float32)
    keys = rng.standard_normal((ROWS, SOURCES, HEADS, DK), dtype=np.float32)
    values = rng.standard_normal((ROWS, SOURCES, HEADS, DK), dtype=np.float32)
    lengths, counts = np.array([7, 2, 5], dtype=np.int32), np.array([2, 4, 1], dtype=np.int32)
    out = np.zeros((ROWS, WIDTH, inner), dtype=np.float32)
    kernel.cross_attention(query, keys, values, np.arange(ROWS, dtype=np.int32), lengths, counts, 1.0, out)()
    for a in range(ROWS):
        n = int(lengths[a])
        for i in range(int(counts[a])):
            for h in range(HEADS):
                want = reference(torch.from_numpy(query[a, i, h * DK:(h + 1) * DK]), torch.from_numpy(keys[a, :n, h]),
                                 torch.from_numpy(values[a, :n, h]), 1.0)
                torch.testing.assert_close(torch.from_numpy(out[a, i, h * DK:(h + 1) * DK]).double(), want,
                                           atol=1e-5, rtol=0)


def test_each_row_reads_and_writes_its_own_slot(kernel):
    """Row a of a step is slot slots[a] of the caches, in any order: a step over slots 3 and 0 of four
    writes and reads those slots alone and gives each row what a step over that slot alone gives."""
    rng = np.random.default_rng(2)
    inner, slots = HEADS * DK, np.array([3, 0], dtype=np.int32)
    qkv = rng.standard_normal((2, 1, 3 * inner), dtype=np.float32)
    cache_k = rng.standard_normal((4, CAPACITY, HEADS, DK), dtype=np.float32)
    cache_v = rng.standard_normal((4, CAPACITY, HEADS, DK), dtype=np.float32)
    positions, counts = np.array([6, 2], dtype=np.int32), np.ones(2, dtype=np.int32)
    lengths = np.array([5, 1, 1, 7], dtype=np.int32)  # by slot
    before_k, before_v = cache_k.copy(), cache_v.copy()
    together = {kind: np.zeros((2, 1, inner), dtype=np.float32) for kind in ("self", "cross")}
    kernel.self_attention(qkv, cache_k, cache_v, slots, positions, counts, None, 0.5, together["self"])()
    kernel.cross_attention(qkv[..., :inner].copy(), before_k, before_v, slots, lengths, counts, 1.0,
                           together["cross"])()
    assert np.array_equal(cache_k[[1, 2]], before_k[[1, 2]]) and np.array_equal(cache_v[[1, 2]], before_v[[1, 2]])
    for row, slot in enumerate(slots):
        alone_k, alone_v = before_k.copy(), before_v.copy()
        alone = {kind: np.zeros((1, 1, inner), dtype=np.float32) for kind in ("self", "cross")}
        kernel.self_attention(qkv[row:row + 1].copy(), alone_k, alone_v, slots[row:row + 1].copy(),
                              positions[row:row + 1].copy(), counts[:1].copy(), None, 0.5, alone["self"])()
        kernel.cross_attention(qkv[row:row + 1, :, :inner].copy(), before_k, before_v, slots[row:row + 1].copy(),
                               lengths, counts[:1].copy(), 1.0, alone["cross"])()
        assert np.array_equal(cache_k[slot], alone_k[slot]) and np.array_equal(cache_v[slot], alone_v[slot])
        for kind in ("self", "cross"):
            assert np.array_equal(together[kind][row], alone[kind][0]), kind
    # cross-attention read slot 3's seven keys for row 0 (a float64 reference over them)
    want = reference(torch.from_numpy(qkv[0, 0, :DK]), torch.from_numpy(before_k[3, :7, 0]),
                     torch.from_numpy(before_v[3, :7, 0]), 1.0)
    torch.testing.assert_close(torch.from_numpy(together["cross"][0, 0, :DK]).double(), want, atol=1e-5, rtol=0)


def self_arrays(rows=2, width=2, slots=3):
    """A self-attention call's arguments, every one as the kernel takes it (names as its binding's)."""
    inner = HEADS * DK
    return dict(qkv=np.zeros((rows, width, 3 * inner), np.float32),
                cache_k=np.ones((slots, CAPACITY, HEADS, DK), np.float32),
                cache_v=np.ones((slots, CAPACITY, HEADS, DK), np.float32),
                slots=np.arange(rows, dtype=np.int32), positions=np.zeros(rows, np.int32),
                counts=np.ones(rows, np.int32), bias=None, scale=0.5,
                out=np.full((rows, width, inner), np.nan, np.float32))


def cross_arrays(rows=2, width=2, slots=3):
    inner = HEADS * DK
    return dict(query=np.zeros((rows, width, inner), np.float32),
                cross_k=np.ones((slots, SOURCES, HEADS, DK), np.float32),
                cross_v=np.ones((slots, SOURCES, HEADS, DK), np.float32),
                slots=np.arange(rows, dtype=np.int32), lengths=np.full(slots, SOURCES, np.int32),
                counts=np.ones(rows, np.int32), scale=1.0, out=np.full((rows, width, inner), np.nan, np.float32))


@pytest.mark.parametrize("kind, name, value, error, message", [
    ("self", "positions", np.zeros(2, np.float32), TypeError, "`positions` must be int32, got float32"),
    ("self", "slots", np.zeros(2, np.int64), TypeError, "`slots` must be int32, got int64"),
    ("self", "qkv", np.zeros((2, 2, 3 * HEADS * DK)), TypeError, "`qkv` must be float32, got float64"),
    ("self", "cache_v", torch.zeros(3, CAPACITY, HEADS, DK), TypeError, "`cache_v` must be a numpy array"),
    ("self", "counts", np.ones(3, np.int32), ValueError, r"`counts` must be of shape \[2\], got \[3\]"),
    ("self", "cache_v", np.ones((3, CAPACITY + 1, HEADS, DK), np.float32), ValueError, "`cache_v` must be of shape"),
    ("self", "out", np.zeros((2, 2, HEADS * DK + 1), np.float32), ValueError, "`out` must be of shape"),
    ("self", "bias", np.zeros((2, HEADS, 1, CAPACITY), np.float32), ValueError, "`bias` must have at least W = 2"),
    ("self", "bias", np.zeros((2, HEADS, 3, CAPACITY - 1), np.float32), ValueError, "`bias` must be of shape"),
    ("self", "cache_k", np.ones((3, 2 * CAPACITY, HEADS, DK), np.float32)[:, ::2], ValueError,
     "`cache_k` must be C-contiguous"),
    ("self", "positions", np.zeros(4, np.int32)[::2], ValueError, "`positions` must be C-contiguous"),
    ("cross", "lengths", np.ones(2, np.int32), ValueError, r"`lengths` must be of shape \[3\]"),
    ("cross", "query", np.zeros((2, 2, HEADS * DK), np.float16), TypeError, "`query` must be float32"),
    ("cross", "cross_k", np.ones((3, 2 * SOURCES, HEADS, DK), np.float32)[:, 1::2], ValueError,
     "`cross_k` must be C-contiguous"),
])
def test_arrays_it_cannot_read_are_refused_naming_them(kernel, kind, name, value, error, message):
    arrays = self_arrays() if kind == "self" else cross_arrays()
    arrays[name] = value
    with pytest.raises(error, match=message):
        getattr(kernel, f"{kind}_attention")(**arrays)


def test_a_cache_written_in_place_must_be_writable(kernel):
    arrays = self_arrays()
    arrays["cache_k"].flags.writeable = False
    with pytest.raises(ValueError, match="`cache_k` is written in place"):
        kernel.self_attention(**arrays)


@pytest.mark.parametrize("name, values, message", [
    ("slots", [0, 3], r"`slots`\[1\] = 3 is not one of the caches' 3 slots"),
    ("slots", [-1, 0], r"`slots`\[0\] = -1 is not one of"),
    ("counts", [3, 1], r"`counts`\[0\] = 3 is outside 0..2"),
    ("counts", [1, -1], r"`counts`\[1\] = -1 is outside"),
    ("positions", [0, CAPACITY - 1], rf"`positions`\[1\] \+ `counts`\[1\] = {CAPACITY - 1} \+ 2 is outside "
                                     rf"0..{CAPACITY}"),
    ("positions", [-1, 0], r"`positions`\[0\] \+ `counts`\[0\] = -1 \+ 2"),
])
def test_a_row_outside_the_caches_is_refused_before_anything_is_written(kernel, name, values, message):
    """The values change every step, after the call is bound: the C code checks each row's slot, count
    and position + count against the arrays before it writes, and the call raises naming the argument."""
    arrays = self_arrays()
    arrays["counts"][:] = 2
    arrays["qkv"][:] = 7.0  # what a call would write into the caches
    arrays[name][:] = values
    call = kernel.self_attention(**arrays)
    with pytest.raises(ValueError, match=message):
        call()
    assert (arrays["cache_k"] == 1).all() and (arrays["cache_v"] == 1).all() and np.isnan(arrays["out"]).all()
    arrays[name][:] = self_arrays()[name] if name != "counts" else 2  # the same bound call, rows in range
    call()
    assert (arrays["cache_k"][:2, :2] == 7).all() and not np.isnan(arrays["out"]).any()


@pytest.mark.parametrize("name, values, message", [
    ("slots", [0, 5], r"`slots`\[1\] = 5 is not one of the caches' 3 slots"),
    ("counts", [0, 3], r"`counts`\[1\] = 3 is outside 0..2"),
    ("lengths", [SOURCES, SOURCES + 1, 0], rf"`lengths`\[1\] = {SOURCES + 1} \(row 1's slot\) is outside "
                                           rf"0..{SOURCES}"),
    ("lengths", [-2, 1, 1], r"`lengths`\[0\] = -2 \(row 0's slot\)"),
])
def test_a_cross_attention_row_outside_its_arrays_is_refused(kernel, name, values, message):
    arrays = cross_arrays()
    arrays[name][:] = values
    call = kernel.cross_attention(**arrays)
    with pytest.raises(ValueError, match=message):
        call()
    assert np.isnan(arrays["out"]).all()


@pytest.mark.parametrize("name", ["t5-v1.1", "bart"])
def test_the_cut_step_hands_each_tensor_on_in_a_buffer_no_piece_both_reads_and_writes(name, kernel):
    """Between a piece that writes a tensor and its last reader no other tensor takes its buffer, and a
    piece never writes a buffer it reads (onnxruntime and the kernel would overwrite their own input);
    the buffers are far fewer than the tensors (a step's memory does not grow with its layers)."""
    weights = native_weights(build(name))
    pieces, logits, (where, widths) = OnnxSessions(weights, "int8").step_pieces("rows")
    assert sum(isinstance(piece, Attention) for piece in pieces) == 2 * weights.layer_count
    reads = [[piece.input] if isinstance(piece, Attention) else list(piece[0].inputs) for piece in pieces]
    writes = [[piece.output] if isinstance(piece, Attention) else list(piece[0].outputs) for piece in pieces]
    holder = {}  # buffer -> the tensor in it now
    for index, (read, written) in enumerate(zip(reads, writes)):
        for name_read in read:
            if name_read in where:
                assert holder[where[name_read]] == name_read, f"piece {index}: {name_read} was overwritten"
        for name_written in written:
            if name_written in where:
                assert where[name_written] not in {where[r] for r in read if r in where}, f"piece {index}"
                holder[where[name_written]] = name_written
    assert logits in writes[-1] and logits not in where
    assert len(widths) <= 6 < len(where)


def test_the_install_built_the_kernel_and_the_engines_load_it(kernel):
    """`pip install -e .` (make setup) built it in place wherever there is a compiler, and kernel() loads
    that one; it computes what the run-time build computes, bit for bit (the same source and flags)."""
    assert attention_kernel.installed_library() is not None, (
        "no installed kernel beside attention_kernel.py: `.venv/bin/pip install -e . --no-deps` builds it")
    assert kernel.origin == "installed", "decode_attention.c changed since the install: `pip install -e .` rebuilds it"
    built = attention_kernel.build()
    assert built.origin == "built at run time"
    rng, arrays = np.random.default_rng(3), cross_arrays(rows=3)
    for name in ("query", "cross_k", "cross_v"):
        arrays[name] = rng.standard_normal(arrays[name].shape, dtype=np.float32)
    outs = [np.zeros_like(arrays["out"]) for _ in range(2)]
    for each, out in zip((kernel, built), outs):
        each.cross_attention(**{**arrays, "out": out})()
    assert outs[0].any() and np.array_equal(*outs)


def test_an_installed_kernel_of_another_source_is_not_loaded(kernel, monkeypatch, tmp_path, caplog):
    """decode_attention.c edited since the install: the installed library is refused (its digest is the
    old text's) and the kernel is built at run time, with one warning saying why."""
    edited = tmp_path / "decode_attention.c"
    edited.write_bytes(attention_kernel.SOURCE.read_bytes() + b"/* edited */\n")
    monkeypatch.setattr(attention_kernel, "SOURCE", edited)
    with pytest.raises(attention_kernel.NotInstalled, match="built from another decode_attention.c"):
        attention_kernel.load_installed()
    attention_kernel.kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.decoding.engines.attention_kernel"):
            assert attention_kernel.kernel().origin == "built at run time"
            assert attention_kernel.kernel().origin == "built at run time"
        warnings = [record.getMessage() for record in caplog.records]
        assert len(warnings) == 1 and "built from another" in warnings[0] and "built at run time" in warnings[0]
    finally:
        attention_kernel.kernel.cache_clear()


def test_without_a_compiler_the_engine_keeps_onnxruntimes_attention(monkeypatch, caplog):
    """Neither installed (an install without a compiler) nor buildable: onnxruntime's attention."""
    monkeypatch.setattr(attention_kernel, "installed_library", lambda: None)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.delenv("BILD_ATTENTION_KERNEL", raising=False)
    attention_kernel.kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.decoding.engines.attention_kernel"):
            assert attention_kernel.kernel() is None
            assert attention_kernel.kernel() is None
        warnings = [record.getMessage() for record in caplog.records]
        assert len(warnings) == 1, warnings  # once, naming why and what runs instead
        assert "not installed (no _decode_attention library" in warnings[0]
        assert "did not build (/nonexistent/cc" in warnings[0] and "onnxruntime's attention ops instead" in warnings[0]
        monkeypatch.delenv("CC")
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(attention_kernel.BuildError, match="no C compiler"):
            attention_kernel.build()
        weights = native_weights(build("t5-v1.0"))
        sessions = OnnxSessions(weights)
        engine = OnnxEngine(weights, sessions, onnx_engine.KERNEL_FROM_SLOTS)
        assert engine.attention == engine.attention_path == "onnxruntime"
        with pytest.raises(ValueError, match="did not build here"):
            OnnxEngine(weights, sessions, 1, attention="kernel")
    finally:
        attention_kernel.kernel.cache_clear()


def test_engines_of_enough_slots_run_the_kernel(kernel):
    weights = native_weights(build("bart"))
    sessions = OnnxSessions(weights)
    slots = onnx_engine.KERNEL_FROM_SLOTS
    assert OnnxEngine(weights, sessions, slots).attention == "kernel"
    assert OnnxEngine(weights, sessions, slots - 1).attention == "onnxruntime"
    with pytest.raises(ValueError, match="attention 'fused': one of onnxruntime, kernel"):
        OnnxEngine(weights, sessions, 1, attention="fused")


def test_a_step_over_a_slot_outside_the_caches_is_refused(kernel):
    """The kernel refuses a slot outside its caches (above), and the engine first refuses one it does not hold
    (a negative one passes Engine.forward's length check) before the kernel runs."""
    weights = native_weights(build("bart"))
    engine = OnnxEngine(weights, OnnxSessions(weights), onnx_engine.KERNEL_FROM_SLOTS, attention="kernel")
    with pytest.raises(ValueError, match="distinct slots among 4"):
        engine.forward(Feed([-1], torch.tensor([[5]]), [0], [1], [1]))


@pytest.mark.parametrize("batch_size, attention", [(1, "onnxruntime"), (onnx_engine.KERNEL_FROM_SLOTS, "kernel")])
def test_rows_say_which_attention_and_int8_scheme_ran(saved_tiny_pair, kernel, batch_size, attention):
    """An onnx int8 job's rows, an unreadable one included: the engines' attention (ours from
    KERNEL_FROM_SLOTS slots on) and int8 scheme (by blocks below ROWS_KERNEL_FROM_SLOTS)."""
    small, large = saved_tiny_pair
    config = DecodingConfig(method="bild", max_new_tokens=8, fallback_threshold=0.5)
    records = pa.table({"id": ["a", "b", "c"], "text": ["Ein Hund.", "Die Sonne scheint.", "?"],
                        "reference": ["x"] * 3, "input_error": [None, None, "unreadable"]})
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu", engine="onnx", quantize="int8"),
                           points=(("bild", config),), prompt=None, job_name="t", config_hash="h",
                           batch=BatchPolicy(batch_size))
    rows = DecodeStage(spec)(records).to_pylist()
    assert [row["error"] for row in rows] == [None, None, "unreadable"]
    assert {(row["engine"], row["quantize"], row["attention"], row["int8_scheme"]) for row in rows} == {
        ("onnx", "int8", attention, onnx_graph.int8_scheme("blocks"))}


def test_engines_name_their_int8_scheme_truthfully():
    """Each scheme string names what the code runs: onnx_graph's kernels (its block size), int8.py's."""
    from pipeline.decoding.engines import int8
    from pipeline.decoding.engines.native import NativeEngine

    assert f"block{onnx_graph.INT8_BLOCK}" in onnx_graph.int8_scheme("blocks")
    assert onnx_graph.int8_scheme("rows") == f"onnxruntime-int8-per-channel-a{onnx_graph.ROW_BITS}"
    assert onnx_graph.int8_scheme("blocks").endswith(f"+admission-{onnx_graph.int8_scheme('rows')}")
    assert onnx_graph.ROW_LEVELS == 2 ** (onnx_graph.ROW_BITS - 1) - 1 and onnx_graph.ROW_ZERO == onnx_graph.ROW_LEVELS + 1
    weights = native_weights(build("bart"))
    for kernel_name in onnx_graph.INT8_KERNELS:
        engine = OnnxEngine(weights, OnnxSessions(weights, "int8"), 1, kernel_name)
        assert engine.int8_scheme == onnx_graph.int8_scheme(kernel_name)
        engine.admit([0], [torch.tensor([5, 6, 7])])  # admissions multiply by rows, whatever the steps use
        assert {key for key in engine.sessions._sessions if key[0] == "admission"} == {("admission", False, "rows")}
    assert OnnxEngine(weights, OnnxSessions(weights), 1).int8_scheme is None
    assert NativeEngine(weights, 1).int8_scheme is None and NativeEngine(weights, 1).attention_path == "model"
    quantized = native_weights(build("bart"), "int8")
    assert NativeEngine(quantized, 1).int8_scheme == int8.SCHEME


def test_the_int8_kernel_goes_by_slots_and_by_the_weights_a_step_reads(monkeypatch):
    """Rows from ROWS_KERNEL_FROM_SLOTS slots on, or at any slots for a model whose step multiplies by
    ROWS_KERNEL_FROM_WEIGHTS weights or more (its step bound by reading them); blocks otherwise."""
    weights = native_weights(build("t5-v1.0"))
    sessions = OnnxSessions(weights, "int8")
    layer = weights.decoder_layers[0]
    per_layer = sum(m.shape[0] * m.shape[1] for m in (layer.qkv, layer.out, layer.ff_in, layer.ff_out,
                                                      layer.cross_q, layer.cross_out))
    assert weights.step_weights() == weights.layer_count * per_layer + weights.head.shape[0] * weights.head.shape[1]
    slots = onnx_engine.ROWS_KERNEL_FROM_SLOTS
    assert [OnnxEngine(weights, sessions, n).int8_kernel for n in (1, slots - 1, slots)] == ["blocks", "blocks", "rows"]
    monkeypatch.setattr(onnx_engine, "ROWS_KERNEL_FROM_WEIGHTS", weights.step_weights())
    assert [OnnxEngine(weights, sessions, n).int8_kernel for n in (1, slots)] == ["rows", "rows"]
    monkeypatch.setattr(onnx_engine, "ROWS_KERNEL_FROM_WEIGHTS", weights.step_weights() + 1)
    assert OnnxEngine(weights, sessions, 1).int8_kernel == "blocks"
