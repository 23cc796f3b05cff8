"""The onnx engine's own attention (attention_kernel.py, decode_attention.c) and the step cut around it
(onnx_segments.py). Its numerics and its invariants run in test_onnx_engine.py with either attention;
here: the kernel against a plain torch reference, the cut step's plumbing, and a machine without a
compiler."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pipeline.decoding.engine import Feed
from pipeline.decoding.engines import attention_kernel, onnx_engine
from pipeline.decoding.engines.onnx_engine import OnnxEngine
from pipeline.decoding.engines.onnx_segments import Attention
from pipeline.decoding.engines.onnx_sessions import OnnxSessions
from pipeline.decoding.models import native_weights
from support.native_models import build

ROWS, WIDTH, HEADS, DK, CAPACITY, SOURCES = 3, 4, 2, 24, 16, 7


def reference(query, keys, values, scale, bias=None):
    """softmax(scale * q.k + bias) . v in float64: query [dk], keys and values [n, dk]."""
    scores = scale * keys.double() @ query.double()
    if bias is not None:
        scores = scores + bias.double()
    return torch.softmax(scores, dim=0) @ values.double()


@pytest.fixture(scope="module")
def kernel():
    built = attention_kernel.kernel()
    if built is None:
        pytest.skip("no C compiler here: the engine runs onnxruntime's attention (tested below)")
    return built


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


def test_arrays_it_cannot_read_are_refused(kernel):
    cache = np.zeros((1, CAPACITY, HEADS, DK), dtype=np.float32)
    with pytest.raises(ValueError, match="C-contiguous float32 or int32"):
        kernel.cross_attention(np.zeros((1, 1, HEADS * DK)), cache, cache, np.zeros(1, np.int32), np.ones(1, np.int32),
                               np.ones(1, np.int32), 1.0, np.zeros((1, 1, HEADS * DK), np.float32))  # float64 query
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel.cross_attention(np.zeros((1, 1, HEADS * DK), np.float32), cache[:, ::2], cache[:, ::2],
                               np.zeros(1, np.int32), np.ones(1, np.int32), np.ones(1, np.int32), 1.0,
                               np.zeros((1, 1, HEADS * DK), np.float32))


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


def test_without_a_compiler_the_engine_keeps_onnxruntimes_attention(monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.delenv("BILD_ATTENTION_KERNEL", raising=False)
    attention_kernel.kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.decoding.engines.attention_kernel"):
            assert attention_kernel.kernel() is None
        assert "did not build" in caplog.text
        weights = native_weights(build("t5-v1.0"))
        sessions = OnnxSessions(weights)
        assert OnnxEngine(weights, sessions, onnx_engine.KERNEL_FROM_SLOTS).attention == "onnxruntime"
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
    """The kernel writes where a row's slot says, unchecked: the engine refuses a slot it does not hold
    (a negative one passes Engine.forward's length check) before the kernel runs."""
    weights = native_weights(build("bart"))
    engine = OnnxEngine(weights, OnnxSessions(weights), onnx_engine.KERNEL_FROM_SLOTS, attention="kernel")
    with pytest.raises(ValueError, match="distinct slots among 4"):
        engine.forward(Feed([-1], torch.tensor([[5]]), [0], [1], [1]))
