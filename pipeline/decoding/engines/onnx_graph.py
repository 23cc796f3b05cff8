"""One decoder step, and the admission of new rows, as ONNX graphs for the onnx engine
(onnx_engine.py) to run with onnxruntime.

A step on the CPU is a chain of one-row matrix products: onnxruntime's MLAS runs that chain in
float32 about twice as fast as torch's MKL calls, and in int8 about seven times as fast, at the
demo pair's 256-wide shapes where fbgemm's int8 does not pay (docs/decoding.md has the measurement). Everything else of the step is small ops that
onnxruntime runs without Python in between.

``LayerGraph`` has one method per verb of a layer (a matrix product, a norm, an activation, a
residual sum), ``StepGraph`` adds a decoder layer's self- and cross-attention and ``EncoderGraph`` an
encoder layer's attention. A model family writes each layer once with these verbs (``decoder_layer``
and ``encoder_layer`` in t5_engine.py and bart_engine.py); torch_verbs.py has the same verbs in
torch, for the native engine.

Attention is onnxruntime's: GroupQueryAttention for the causal self-attention (it writes the fed
keys and values into the layer's cache in place and attends to each row's own length only),
MultiHeadAttention over the encoder's keys and values; a residual sum and the norm after it are one
Skip*Normalization op. So a T5 layer is about 16 ops; a step's time at small shapes goes to the
number of ops as much as to the products (it was 44 ops a layer, in primitives).

The step's inputs and outputs (A rows of W positions, C cache positions, S source positions):

| name | shape | what |
|---|---|---|
| hidden | [A, W, d] | the embedded tokens (embedding and positions in torch: one or two ops) |
| self_k.l, self_v.l | [A, H, C, dk] | layer l's self-attention cache of the rows, handed over in place |
| seqlens_k | [A] int32 | each row's last cached position after the step: its length + count (see below) |
| query_seqlens | [A] int32 | each row's fed count + 1 (the extra query row of ``_one_more_row``); 0: an idle row |
| total_sequence_length | [] int32 | C |
| self_bias | [A, H, W + 1, C] | T5 only: added to q.k at each key position (relative positions) |
| cross_k.l, cross_v.l | [A, H, S, dk] | layer l's cross-attention keys and values |
| source_lengths | [A] int32 | each row's source length (its keys past it are padding) |
| read | [n] | the flat positions (a * W + i) whose logits are read |
| logits | [n, V] | output |
| self_k.l.updated, self_v.l.updated | as self_k.l | output: the cache with the fed positions' keys and
values written in; bound to the input's own memory, so written in place |

int8 (``quantize="int8"``) comes in two kernels; in both a row's product does not depend on the
other rows of the call (bit for bit: tested) — the property int8.py keeps for the eager engine,
which keeps BiLD with rollback_threshold 0 identical to ``large``:
- ``blocks``: one MatMulNBits op (8 bits) per product: weights symmetric in blocks of INT8_BLOCK
  inputs per output column (scale max |w| / 127), each row quantized at run time by blocks too.
  One op: the cheapest at a few rows.
- ``rows``: CTranslate2's scheme (and int8.py's): weights per output column, each row quantized on
  its own scale, MLAS's integer product (MatMulIntegerToFloat), scaled back. Seven ops where the
  other has one, but the integer product is 2-3x faster from about 8 rows on (``onnx_engine`` picks a
  step's by the rows an engine runs, and runs every admission, a whole source at once, by rows).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.decoding.engines.attention_kernel import ATTENTIONS

OPSET = 20  # Gelu with its tanh approximation
MICROSOFT = "com.microsoft"  # onnxruntime's contrib ops: MatMulNBits, the attention and Skip norms, Gelu
# int8 weights: one scale per 64 inputs of each output (fewer for narrower matrices). Larger blocks
# multiply faster (one row of 1024x4096: 32 -> 64 is 2.9x, 64 -> 256 1.05x more), but from 128 on
# MLAS rounds a row differently with an odd number of rows in the call, and a row's product must
# not depend on the other rows (test_onnx_engine's bit-for-bit tests fail at 128).
INT8_BLOCK = 64
INT8_KERNELS = ("blocks", "rows")


def _has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX-512 or AVX): MLAS's u8s8 product then sums in int32."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


# The ``rows`` kernel quantizes activations to 8 bits (levels -127..127 around 128) where the CPU has
# VNNI, to 7 bits (-63..63 around 64) elsewhere: without VNNI MLAS's u8s8 product sums pairs of u8 x s8
# products in int16, which 8-bit activations can overflow. (T5 shapes, a 14-token source through
# 24 encoder layers: 8 bits differ from the blocks kernel by 0.9% of the largest output, 7 bits by 1.5%.)
ROW_BITS = 8 if _has_vnni() else 7
ROW_LEVELS = (1 << (ROW_BITS - 1)) - 1
ROW_ZERO = ROW_LEVELS + 1


def int8_scheme(step_kernel: str) -> str:
    """What the output's int8_scheme column says of an engine whose steps multiply by ``step_kernel``:
    ``rows``: weights per output channel, each row's activations on its own scale in ROW_BITS bits
    (MLAS's MatMulIntegerToFloat); ``blocks``: MatMulNBits, 8-bit weights in blocks of up to INT8_BLOCK
    inputs per output, rows quantized by blocks at run time. Admissions multiply by rows either way
    (onnx_engine.ADMISSION_INT8_KERNEL)."""
    rows = f"onnxruntime-int8-per-channel-a{ROW_BITS}"
    return rows if step_kernel == "rows" else f"onnxruntime-matmulnbits-int8-block{INT8_BLOCK}+admission-{rows}"

# onnxruntime's contrib ops take their inputs by position (onnxruntime >= 1.32: query_seqlens).
GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
              "k_norm_weight", "query_seqlens")
MHA_INPUTS = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value")
MATMUL_NBITS_INPUTS = ("A", "B", "scales", "zero_points", "g_idx", "bias")

# ACT2FN's names -> how the graph computes them: one op, or "tanh" (GELU's tanh approximation: opset
# 20's Gelu; onnxruntime's FastGelu differs from torch's by up to 6e-5 of the logits' scale) or "silu"
# (x * sigmoid(x)).
ACTIVATIONS = {"relu": ("Relu", ""), "gelu": ("Gelu", MICROSOFT), "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
               "silu": "silu", "swish": "silu"}


class LayerGraph:
    """The verbs a model family writes its layers with (a matrix product, a norm, an activation, a
    residual sum), for layers of ``heads`` attention heads of ``d_kv``; subclasses add attention and
    the graph's inputs and outputs."""

    def __init__(self, *, d_model: int, heads: int, d_kv: int, quantize: str = "none", int8_kernel: str = "blocks"):
        if int8_kernel not in INT8_KERNELS:
            raise ValueError(f"int8_kernel {int8_kernel!r}: one of {', '.join(INT8_KERNELS)}")
        self.d_model, self.heads, self.d_kv = d_model, heads, d_kv
        self.quantize, self.int8_kernel = quantize, int8_kernel
        self.nodes: list = []
        self.initializers: dict[str, np.ndarray] = {}
        self._count = 0
        self._sums: dict[str, int] = {}  # the output of each Add made by ``add`` -> its node's index

    # --- building blocks --------------------------------------------------------------------------

    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def op(self, op_type: str, *inputs: str, domain: str = "", **attributes) -> str:
        """One node with one output; returns the output's name."""
        output = self._fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], domain=domain, **attributes))
        return output

    def constant(self, value, dtype=np.float32, name: str = "const") -> str:
        """An initializer holding ``value`` (a scalar or an array)."""
        key = self._fresh(name)
        self.initializers[key] = np.asarray(value, dtype=dtype)
        return key

    # --- the verbs of a layer ---------------------------------------------------------------------

    def matmul(self, x: str, matrix, bias=None) -> str:
        """x [..., in] @ W [in, out] (+ bias [out]); ``matrix``: a native.Matrix (float weight [in, out])."""
        weight = matrix.weight.detach().float().cpu().numpy()
        bias = None if bias is None else self.constant(bias.detach().float().cpu().numpy(), name="bias")
        if self.quantize == "int8":
            if self.int8_kernel == "rows":
                return self._int8_rows_matmul(x, weight, bias)
            return self._int8_matmul(x, weight, bias)
        product = self.op("MatMul", x, self.constant(weight, name="weight"))
        return product if bias is None else self.op("Add", product, bias)

    def _int8_matmul(self, x: str, weight: np.ndarray, bias: str | None) -> str:
        """x @ W (+ bias) with W [in, out] in int8, blocks of INT8_BLOCK inputs per output on their own
        scale, as onnxruntime's MatMulNBits (8 bits) stores it, the bias added by the same op; accuracy
        level 4 quantizes each row of x to int8 by blocks too, so that a row's product does not depend
        on the other rows."""
        rows, columns = weight.shape
        block = min(INT8_BLOCK, max(16, 1 << (rows - 1).bit_length()))
        blocks = -(-rows // block)
        padded = np.zeros((blocks * block, columns), dtype=np.float32)
        padded[:rows] = weight
        grouped = padded.T.reshape(columns, blocks, block)  # [out, blocks, block]
        scales = np.maximum(np.abs(grouped).max(axis=-1) / 127, 1e-12).astype(np.float32)  # [out, blocks]
        codes = (np.clip(np.rint(grouped / scales[..., None]), -127, 127) + 128).astype(np.uint8)  # zero point 128
        inputs = _positional(MATMUL_NBITS_INPUTS, A=x, B=self.constant(codes, np.uint8, name="weight"),
                             scales=self.constant(scales.reshape(-1), name="scale"), bias=bias or "")
        return self.op("MatMulNBits", *inputs, domain=MICROSOFT, K=rows, N=columns, bits=8, block_size=block,
                       accuracy_level=4)

    def _int8_rows_matmul(self, x: str, weight: np.ndarray, bias: str | None) -> str:
        """x @ W (+ bias) with W [in, out] in int8 on one scale per output column, each row of x
        quantized at run time on its own scale (its max |x|): the integer product of a row does not
        depend on the other rows, and scaling back is per row and per column."""
        scales = np.maximum(np.abs(weight).max(axis=0) / 127, 1e-12).astype(np.float32)  # [out]
        codes = np.clip(np.rint(weight / scales), -127, 127).astype(np.int8)
        row_max = self.op("ReduceMax", self.op("Abs", x), self.constant([-1], np.int64, name="axis"), keepdims=1)
        row_max = self.op("Max", row_max, self.constant(1e-12))  # [..., 1]; a row of zeros stays zeros
        step = self.constant(1 / ROW_LEVELS, name="step")
        levels = self.op("QuantizeLinear", self.op("Div", x, row_max), step,
                         self.constant(ROW_ZERO, np.uint8, name="zero"))  # x / max |x| in ROW_BITS-bit levels
        product = self.op("MatMulIntegerToFloat", levels, self.constant(codes, np.int8, name="weight"), step,
                          self.constant(scales, name="scale"), self.constant(ROW_ZERO, np.uint8, name="zero"),
                          domain=MICROSOFT)
        product = self.op("Mul", product, row_max)
        return product if bias is None else self.op("Add", product, bias)

    def residual(self, x: str, output: str, matrix, bias=None) -> str:
        """x + output @ W (+ bias): a sub-layer's last product added to the residual stream."""
        return self.add(x, self.matmul(output, matrix, bias))

    def add(self, a: str, b: str) -> str:
        """a + b (a norm of the sum fuses with it: ``_normalized``)."""
        total = self.op("Add", a, b)
        self._sums[total] = len(self.nodes) - 1
        return total

    def rms_norm(self, x: str, eps: float, weight=None) -> str:
        """T5's RMSNorm: without its weight (folded into the next matrix), or with it."""
        scale = np.ones(self.d_model) if weight is None else weight.detach().float().cpu().numpy()
        return self._normalized("SimplifiedLayerNormalization", x, eps, scale)

    def layer_norm(self, x: str, eps: float, weight=None, bias=None) -> str:
        """LayerNorm over the last axis: with its weight and bias, or bare (a folded pre-norm)."""
        scale = np.ones(self.d_model) if weight is None else weight.detach().float().cpu().numpy()
        shift = np.zeros(self.d_model) if bias is None else bias.detach().float().cpu().numpy()
        return self._normalized("LayerNormalization", x, eps, scale, shift)

    def _normalized(self, op_type: str, x: str, eps: float, *parameters: np.ndarray) -> str:
        """The norm ``op_type`` of x with its ``parameters``. Where x is a sum made by ``add``, the
        sum and its norm become one op, onnxruntime's Skip form of the norm, whose fourth output is
        the sum (under x's name, for the residual path): a step's op count is what its time goes to
        at small shapes."""
        parameters = [self.constant(value) for value in parameters]
        index = self._sums.pop(x, None)
        if index is None:  # (SimplifiedLayerNormalization: an ONNX-domain op in onnxruntime)
            return self.op(op_type, x, *parameters, axis=-1, epsilon=eps)
        normed = self._fresh(op_type.lower())
        self.nodes[index] = helper.make_node(f"Skip{op_type}", [*self.nodes[index].input, *parameters],
                                             [normed, "", "", x], domain=MICROSOFT, epsilon=eps)
        return normed

    def activation(self, x: str, name: str) -> str:
        if name not in ACTIVATIONS:
            raise ValueError(f"the onnx engine has no activation {name!r} (it has {', '.join(ACTIVATIONS)})")
        how = ACTIVATIONS[name]
        if how == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if how == "tanh":
            return self.op("Gelu", x, approximate="tanh")
        op_type, domain = how
        return self.op(op_type, x, domain=domain)

    def gated(self, x: str, name: str) -> str:
        """act(gate) * linear for x = [gate | linear] along the last axis (T5 v1.1's gated FF)."""
        gate, linear = self._fresh("gate"), self._fresh("linear")
        self.nodes.append(helper.make_node("Split", [x], [gate, linear], axis=-1, num_outputs=2))  # two equal halves
        return self.op("Mul", self.activation(gate, name), linear)

    def _one_more_row(self, x: str) -> str:
        """[A, W, n] -> [A, W + 1, n], a row of zeros after the last.

        Attention runs with at least two query rows per call: MLAS multiplies a single row by
        another kernel, with other rounding, and a query's arithmetic must be the same bit for bit
        however many rows are fed with it (int8 rounding downstream turns a last-bit difference into
        another token). The extra row's result is dropped (``_without_last_row``)."""
        return self.op("Pad", x, self.constant([0, 0, 0, 0, 1, 0], np.int64, name="pads"))

    def _without_last_row(self, x: str) -> str:
        return self.op("Slice", x, self.constant([0], np.int64, name="start"), self.constant([-1], np.int64, name="end"),
                       self.constant([1], np.int64, name="axis"))

    def finished(self, name: str, inputs: dict[str, tuple], outputs: dict[str, tuple]) -> onnx.ModelProto:
        """The graph as a model. ``inputs``: name -> (element type, shape); ``outputs``: name ->
        (the value it is, element type, shape)."""
        for output, (value, *_) in outputs.items():
            if value != output:
                self.nodes.append(helper.make_node("Identity", [value], [output]))
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info(key, *info) for key, info in inputs.items()],
            [helper.make_tensor_value_info(key, *info) for key, (_, *info) in outputs.items()],
            [numpy_helper.from_array(value, key) for key, value in self.initializers.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MICROSOFT, 1)])


KERNEL = "bild"  # the domain of the attention nodes that the engine runs itself (``attention="kernel"``)


class StepGraph(LayerGraph):
    """Builds one decoder step of a model with ``layers`` layers of ``heads`` heads of ``d_kv``."""

    def __init__(self, *, layers: int, self_bias: bool, attention: str = "onnxruntime", **shape):
        """``self_bias``: whether self-attention adds a bias input to its scores (T5's relative
        positions); without one it is only causal. ``attention``: onnxruntime's ops, or "kernel": an
        op of the domain KERNEL per attention, which onnx_segments.py cuts the step at, for the engine
        to run decode_attention.c there. ``shape``: LayerGraph's."""
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
        super().__init__(**shape)
        self.layers, self.self_bias, self.attention = layers, self_bias, attention

    def _kernel_attention(self, kind: str, layer: int, x: str, scale: float) -> str:
        """A node the engine runs itself: ``kind`` ("self": x is the packed q | k | v, "cross": x is
        the query) attention of ``layer`` -> [A, W, inner]."""
        return self.op(f"{kind.capitalize()}Attention", x, domain=KERNEL, layer=layer, scale=float(scale))

    @staticmethod
    def _layer_of(cache: str, layer: int) -> str:
        """The input holding one layer's cache (one input per layer: slicing one input of every layer
        in the graph would copy the whole cache each step)."""
        return f"{cache}.{layer}"

    @staticmethod
    def updated(cache_input: str) -> str:
        """The name of the output that is the cache input ``cache_input`` updated in place."""
        return f"{cache_input}.updated"

    def self_attention(self, layer: int, hidden: str, matrix, bias=None, scale: float = 1.0) -> str:
        """Causal self-attention of the fed positions: hidden [A, W, d] @ [d, 3 * inner] gives q, k, v
        (packed, as GroupQueryAttention reads them); it writes k and v at their positions into the
        layer's cache, in place (the output bound to the input's memory), and attends to each row's
        cached positions up to each query's own, adding ``self_bias`` (T5's relative positions)."""
        if self.attention == "kernel":
            return self._kernel_attention("self", layer, self.matmul(hidden, matrix, bias), scale)
        qkv = self._one_more_row(self.matmul(hidden, matrix, bias))  # [A, W + 1, 3 * inner]
        cache_k, cache_v = self._layer_of("self_k", layer), self._layer_of("self_v", layer)
        attended = self._fresh("attended")
        inputs = _positional(GQA_INPUTS, query=qkv, past_key=cache_k, past_value=cache_v, seqlens_k="seqlens_k",
                             total_sequence_length="total_sequence_length", query_seqlens="query_seqlens",
                             attention_bias="self_bias" if self.self_bias else "")
        self.nodes.append(helper.make_node("GroupQueryAttention", inputs,
                                           [attended, self.updated(cache_k), self.updated(cache_v)], domain=MICROSOFT,
                                           num_heads=self.heads, kv_num_heads=self.heads, scale=scale))
        return self._without_last_row(attended)

    def cross_attention(self, layer: int, query: str, scale: float = 1.0) -> str:
        """Attention over the rows' encoder outputs (each row's first ``source_lengths``); query
        [A, W, inner] -> [A, W, inner]."""
        if self.attention == "kernel":
            return self._kernel_attention("cross", layer, query, scale)
        inputs = _positional(MHA_INPUTS, query=self._one_more_row(query), key=self._layer_of("cross_k", layer),
                             value=self._layer_of("cross_v", layer), key_padding_mask="source_lengths")
        return self._without_last_row(self.op("MultiHeadAttention", *inputs, domain=MICROSOFT, num_heads=self.heads,
                                              scale=scale))

    def read(self, hidden: str) -> str:
        """[A, W, d] -> [n, d]: the positions whose logits are read."""
        flat = self.op("Reshape", hidden, self.constant([-1, self.d_model], np.int64, name="shape"))
        return self.op("Gather", flat, "read", axis=0)

    # --- the model --------------------------------------------------------------------------------

    def model(self, logits: str) -> onnx.ModelProto:
        """The finished step: ``logits`` [n, V] and every layer's self-attention cache, updated, as outputs."""
        floats, ints = TensorProto.FLOAT, TensorProto.INT32
        H, dk = self.heads, self.d_kv
        caches = {"self_k": ["A", H, "C", dk], "self_v": ["A", H, "C", dk], "cross_k": ["A", H, "S", dk],
                  "cross_v": ["A", H, "S", dk]}
        inputs = {"hidden": (floats, ["A", "W", self.d_model])}
        if self.self_bias:
            inputs["self_bias"] = (floats, ["A", H, "W1", "C"])
        inputs.update({"seqlens_k": (ints, ["A"]), "query_seqlens": (ints, ["A"]), "total_sequence_length": (ints, []),
                       "source_lengths": (ints, ["A"]), "read": (TensorProto.INT64, ["n"])})
        layers = [(cache, layer) for cache in caches for layer in range(self.layers)]
        inputs.update({self._layer_of(cache, layer): (floats, caches[cache]) for cache, layer in layers})
        outputs = {"logits": (logits, floats, ["n", "V"])}
        for cache, layer in layers:
            if cache.startswith("self"):
                updated = self.updated(self._layer_of(cache, layer))
                outputs[updated] = (updated, floats, caches[cache])
        return self.finished("decoder_step", inputs, outputs)


class EncoderGraph(LayerGraph):
    """Builds a model's admission: its encoder over right-padded sources and every decoder layer's
    cross-attention keys and values from the encoder's output (``projections_only``: from encoder
    states given, when another model's identical encoder computed them)."""

    def __init__(self, *, source_bias: bool, projections_only: bool = False, **shape):
        """``source_bias``: whether attention adds a bias input to its scores (T5's relative
        positions). ``shape``: LayerGraph's (the encoder's heads)."""
        super().__init__(**shape)
        self.source_bias, self.projections_only = source_bias, projections_only

    def self_attention(self, hidden: str, matrix, bias=None, scale: float = 1.0) -> str:
        """Attention of every source position to every other of its row (its first ``source_lengths``):
        hidden [A, S, d] @ [d, 3 * inner] gives q, k, v -> [A, S, inner]. (The engine pads S to at
        least 2: the reason is ``_one_more_row``'s.)"""
        query, key, value = self._fresh("query"), self._fresh("key"), self._fresh("value")
        self.nodes.append(helper.make_node("Split", [self.matmul(hidden, matrix, bias)], [query, key, value], axis=-1,
                                           num_outputs=3))
        inputs = _positional(MHA_INPUTS, query=query, key=key, value=value, key_padding_mask="source_lengths",
                             attention_bias="source_bias" if self.source_bias else "")
        return self.op("MultiHeadAttention", *inputs, domain=MICROSOFT, num_heads=self.heads, scale=scale)

    def model(self, encoded: str, projections: str) -> onnx.ModelProto:
        """The finished admission: ``encoded`` [A, S, d] and ``projections`` [A, S, L * 2 * inner]."""
        floats, ints = TensorProto.FLOAT, TensorProto.INT32
        if self.projections_only:
            inputs = {"encoded": (floats, ["A", "S", self.d_model])}
        else:
            inputs = {"hidden": (floats, ["A", "S", self.d_model]), "source_lengths": (ints, ["A"])}
            if self.source_bias:
                inputs["source_bias"] = (floats, [1, self.heads, "S", "S"])
        outputs = {"cross_kv": (projections, floats, ["A", "S", "KV"])}
        if not self.projections_only:
            outputs["encoded"] = (encoded, floats, ["A", "S", self.d_model])
        return self.finished("admission", inputs, outputs)


def _positional(names: tuple[str, ...], **given: str) -> list[str]:
    """An op's input list from its inputs by name: "" for the optional ones not given, up to the last given."""
    last = max(names.index(name) for name, value in given.items() if value)
    return [given.get(name, "") for name in names[: last + 1]]
