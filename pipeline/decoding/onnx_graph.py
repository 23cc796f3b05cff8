"""One decoder step as an ONNX graph, for the onnx engine (onnx_engine.py) to run with onnxruntime.

A step on the CPU is a chain of one-row matrix products: onnxruntime's MLAS runs that chain in
float32 about twice as fast as torch's MKL calls, and in int8 about seven times as fast, at the
demo pair's 256-wide shapes where fbgemm's int8 does not pay (docs/decoding.md has the measurement). Everything else of the step is small ops that
onnxruntime runs without Python in between.

``StepGraph`` has one method per verb of a decoder layer (a matrix product, a norm, an activation,
self- and cross-attention); a model family writes its layer with them (``decoder_layer_graph`` in
t5_engine.py and bart_engine.py), mirroring its torch ``decoder_layer`` line by line.

The step's inputs and outputs (A rows of W positions, C cache positions, S source positions):

| name | shape | what |
|---|---|---|
| hidden | [A, W, d] | the embedded tokens (embedding and positions in torch: one or two ops) |
| self_k.l, self_v.l | [A, H, dk, C], [A, H, C, dk] | layer l's cache of the rows, handed over in place |
| steps | [A, W] | each fed position's place in the cache (its absolute position) |
| self_bias | [A, Hb, W + 1, C] | added to q.k at each key position (-inf: after the query); the last row
repeats the first (see ``_attention``) |
| cross_k.l, cross_v.l | [A, H, dk, S], [A, H, S, dk] | layer l's cross-attention keys and values |
| cross_bias | [A, 1, 1, S] | -inf past each row's source |
| read | [n] | the flat positions (a * W + i) whose logits are read |
| logits | [n, V] | output |
| self_k.l.updated, self_v.l.updated | as self_k.l, self_v.l | output: the cache with the fed positions'
keys and values written in; bound to the input's own memory, so written in place |

int8 (``quantize="int8"``): each matrix is one MatMulNBits op (8 bits): weights symmetric in blocks
of 32 inputs per output column (scale max |w| / 127), activations quantized to int8 at run time by
blocks of each row, so a row's product does not depend on the other rows of the call (bit for bit:
tested) — the property int8.py keeps for the eager engine, which keeps BiLD with rollback_threshold
0 identical to ``large``. One op per product: per-row quantization built from ONNX ops (Abs,
ReduceMax, Div, QuantizeLinear, MatMulIntegerToFloat, Mul) cost more than the product itself.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MICROSOFT = "com.microsoft"  # onnxruntime's contrib ops: MatMulNBits, Gelu
INT8_BLOCK = 32  # int8 weights: one scale per 32 inputs of each output (MatMulNBits' smallest block)

# ACT2FN's names -> how the graph computes them: one op, or "tanh" (GELU's tanh approximation, from
# primitives: onnxruntime's FastGelu differs from torch's by up to 6e-5 of the logits' scale) or
# "silu" (x * sigmoid(x)).
ACTIVATIONS = {"relu": ("Relu", ""), "gelu": ("Gelu", MICROSOFT), "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
               "silu": "silu", "swish": "silu"}


class StepGraph:
    """Builds one decoder step of a model with ``layers`` layers of ``heads`` heads of ``d_kv``."""

    def __init__(self, *, d_model: int, layers: int, heads: int, d_kv: int, quantize: str = "none"):
        self.d_model, self.layers, self.heads, self.d_kv = d_model, layers, heads, d_kv
        self.quantize = quantize
        self.nodes: list = []
        self.initializers: dict[str, np.ndarray] = {}
        self._count = 0
        self._indices: tuple[str, str] | None = None  # _cache_indices

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
        if self.quantize == "int8":
            product = self._int8_matmul(x, weight)
        else:
            product = self.op("MatMul", x, self.constant(weight, name="weight"))
        if bias is None:
            return product
        return self.op("Add", product, self.constant(bias.detach().float().cpu().numpy(), name="bias"))

    def _int8_matmul(self, x: str, weight: np.ndarray) -> str:
        """x @ W with W [in, out] in int8, blocks of INT8_BLOCK inputs per output on their own scale,
        as onnxruntime's MatMulNBits (8 bits) stores it; accuracy level 4 quantizes each row of x
        to int8 by blocks too, so that a row's product does not depend on the other rows."""
        rows, columns = weight.shape
        blocks = -(-rows // INT8_BLOCK)
        padded = np.zeros((blocks * INT8_BLOCK, columns), dtype=np.float32)
        padded[:rows] = weight
        grouped = padded.T.reshape(columns, blocks, INT8_BLOCK)  # [out, blocks, block]
        scales = np.maximum(np.abs(grouped).max(axis=-1) / 127, 1e-12).astype(np.float32)  # [out, blocks]
        codes = (np.clip(np.rint(grouped / scales[..., None]), -127, 127) + 128).astype(np.uint8)  # zero point 128
        return self.op("MatMulNBits", x, self.constant(codes, np.uint8, name="weight"),
                       self.constant(scales.reshape(-1), name="scale"), domain=MICROSOFT, K=rows, N=columns, bits=8,
                       block_size=INT8_BLOCK, accuracy_level=4)

    def add(self, a: str, b: str) -> str:
        return self.op("Add", a, b)

    def rms_norm(self, x: str, eps: float) -> str:
        """T5's RMSNorm without its weight (folded into the next matrix)."""
        return self.op("SimplifiedLayerNormalization", x, self.constant(np.ones(self.d_model)),  # an ONNX-domain op in onnxruntime
                       axis=-1, epsilon=eps)

    def layer_norm(self, x: str, eps: float, weight=None, bias=None) -> str:
        """LayerNorm over the last axis: with its weight and bias, or bare (a folded pre-norm)."""
        scale = np.ones(self.d_model) if weight is None else weight.detach().float().cpu().numpy()
        shift = np.zeros(self.d_model) if bias is None else bias.detach().float().cpu().numpy()
        return self.op("LayerNormalization", x, self.constant(scale), self.constant(shift), axis=-1, epsilon=eps)

    def activation(self, x: str, name: str) -> str:
        if name not in ACTIVATIONS:
            raise ValueError(f"the onnx engine has no activation {name!r} (it has {', '.join(ACTIVATIONS)})")
        how = ACTIVATIONS[name]
        if how == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if how == "tanh":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            cubic = self.op("Mul", self.op("Mul", self.op("Mul", x, x), x), self.constant(0.044715))
            inner = self.op("Mul", self.op("Add", x, cubic), self.constant((2 / np.pi) ** 0.5))
            half = self.op("Mul", x, self.constant(0.5))
            return self.op("Mul", half, self.op("Add", self.op("Tanh", inner), self.constant(1.0)))
        op_type, domain = how
        return self.op(op_type, x, domain=domain)

    def gated(self, x: str, name: str) -> str:
        """act(gate) * linear for x = [gate | linear] along the last axis (T5 v1.1's gated FF)."""
        gate, linear = self._fresh("gate"), self._fresh("linear")
        self.nodes.append(helper.make_node("Split", [x], [gate, linear], axis=-1))  # two equal halves
        return self.op("Mul", self.activation(gate, name), linear)

    @staticmethod
    def _layer_of(cache: str, layer: int) -> str:
        """The input holding one layer's cache (one input per layer: slicing one input of every layer
        in the graph would copy the whole cache each step)."""
        return f"{cache}.{layer}"

    def _attention(self, query: str, keys_t: str, values: str, bias: str, scale: float) -> str:
        """query [A, H, W, dk], keys_t [A, H, dk, T], values [A, H, T, dk], bias [A, Hb, W + 1, T] added
        to the scores -> [A, W, inner].

        A query's arithmetic is the same bit for bit whatever else the call holds (rows, fed
        positions), which int8 rounding downstream would otherwise turn into other tokens
        (measured on the demo pair: 8 of 200 outputs changed). So: plain MatMul and Softmax over the
        keys at their absolute positions (onnxruntime's MultiHeadAttention over cached then fed
        keys is not), and the query's first row repeated once, because MatMul takes another path,
        with other rounding, for a single row (the extra row's result is dropped)."""
        if scale != 1.0:
            query = self.op("Mul", query, self.constant(scale))
        first = self.op("Slice", query, *self._first_row())
        query = self.op("Concat", query, first, axis=2)  # [A, H, W + 1, dk]
        weights = self.op("Softmax", self.op("Add", self.op("MatMul", query, keys_t), bias), axis=-1)
        attended = self.op("Slice", self.op("MatMul", weights, values), *self._all_but_last_row())  # [A, H, W, dk]
        return self.op("Reshape", self.op("Transpose", attended, perm=[0, 2, 1, 3]),
                       self.constant([0, 0, self.heads * self.d_kv], np.int64, name="shape"))

    def _first_row(self) -> tuple[str, str, str]:
        """Slice's starts, ends, axes for row 0 of axis 2."""
        return (self.constant([0], np.int64, name="start"), self.constant([1], np.int64, name="end"),
                self.constant([2], np.int64, name="axis"))

    def _all_but_last_row(self) -> tuple[str, str, str]:
        return (self.constant([0], np.int64, name="start"), self.constant([-1], np.int64, name="end"),
                self.constant([2], np.int64, name="axis"))

    def self_attention(self, layer: int, hidden: str, matrix, bias=None, scale: float = 1.0) -> str:
        """Causal self-attention of the fed positions: hidden [A, W, d] @ [d, 3 * inner] gives q, k, v;
        k and v are written at their positions into the layer's cache (in place: ``_scattered``) and
        attended over with the rest of it."""
        qkv = self.op("Reshape", self.matmul(hidden, matrix, bias),
                      self.constant([0, 0, 3, self.heads, self.d_kv], np.int64, name="shape"))  # [A, W, 3, H, dk]
        parts = self.op("Transpose", qkv, perm=[2, 0, 3, 1, 4])  # [3, A, H, W, dk]
        query, key, value = self._fresh("query"), self._fresh("key"), self._fresh("value")
        self.nodes.append(helper.make_node("Split", [parts], [query, key, value], axis=0))
        zero = self.constant([0], np.int64, name="axis")
        query, value = self.op("Squeeze", query, zero), self.op("Squeeze", value, zero)  # [A, H, W, dk]
        key_t = self.op("Transpose", self.op("Squeeze", key, zero), perm=[0, 1, 3, 2])  # [A, H, dk, W]
        key_index, value_index = self._cache_indices()
        keys_t = self._scattered("self_k", layer, key_index, key_t, axis=3)  # [A, H, dk, C]
        values = self._scattered("self_v", layer, value_index, value, axis=2)  # [A, H, C, dk]
        return self._attention(query, keys_t, values, "self_bias", scale)

    def _cache_indices(self) -> tuple[str, str]:
        """Each fed position's place in a layer's keys [A, H, dk, W] and values [A, H, W, dk], from
        ``steps`` [A, W]; built once, shared by every layer."""
        if self._indices is None:
            H, dk = self.heads, self.d_kv
            keys = self.op("Unsqueeze", "steps", self.constant([1, 2], np.int64, name="axes"))  # [A, 1, 1, W]
            values = self.op("Unsqueeze", "steps", self.constant([1, 3], np.int64, name="axes"))  # [A, 1, W, 1]
            self._indices = (self.op("Expand", keys, self.constant([1, H, dk, 1], np.int64, name="shape")),
                             self.op("Expand", values, self.constant([1, H, 1, dk], np.int64, name="shape")))
        return self._indices

    def _scattered(self, cache: str, layer: int, index: str, update: str, axis: int) -> str:
        """The layer's cache with ``update`` at the positions ``index`` holds: a graph output that the
        engine binds to the very buffer it passed in, so onnxruntime's ScatterElements writes the fed
        positions in place (it copies its input only when input and output are different memory)."""
        output = self.updated(self._layer_of(cache, layer))
        self.nodes.append(helper.make_node("ScatterElements", [self._layer_of(cache, layer), index, update], [output],
                                           axis=axis))
        return output

    @staticmethod
    def updated(cache_input: str) -> str:
        """The name of the output that is the cache input ``cache_input`` updated in place."""
        return f"{cache_input}.updated"

    def cross_attention(self, layer: int, query: str, scale: float = 1.0) -> str:
        """Attention over the rows' encoder outputs; query [A, W, inner] -> [A, W, inner]."""
        query = self.op("Reshape", query, self.constant([0, 0, self.heads, self.d_kv], np.int64, name="shape"))
        return self._attention(self.op("Transpose", query, perm=[0, 2, 1, 3]), self._layer_of("cross_k", layer),
                               self._layer_of("cross_v", layer), "cross_bias", scale)

    def read(self, hidden: str) -> str:
        """[A, W, d] -> [n, d]: the positions whose logits are read."""
        flat = self.op("Reshape", hidden, self.constant([-1, self.d_model], np.int64, name="shape"))
        return self.op("Gather", flat, "read", axis=0)

    # --- the model --------------------------------------------------------------------------------

    def model(self, logits: str) -> onnx.ModelProto:
        """The finished step: ``logits`` [n, V] and every layer's self-attention cache, updated, as outputs."""
        self.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
        floats = TensorProto.FLOAT
        L, H, dk = self.layers, self.heads, self.d_kv
        caches = {"self_k": ["A", H, dk, "C"], "self_v": ["A", H, "C", dk], "cross_k": ["A", H, dk, "S"],
                  "cross_v": ["A", H, "S", dk]}
        inputs = [
            helper.make_tensor_value_info("hidden", floats, ["A", "W", self.d_model]),
            helper.make_tensor_value_info("self_bias", floats, ["A", "Hb", "W1", "C"]),
            helper.make_tensor_value_info("cross_bias", floats, ["A", 1, 1, "S"]),
            helper.make_tensor_value_info("steps", TensorProto.INT64, ["A", "W"]),
            helper.make_tensor_value_info("read", TensorProto.INT64, ["n"]),
            *(helper.make_tensor_value_info(self._layer_of(cache, layer), floats, shape)
              for cache, shape in caches.items() for layer in range(L)),
        ]
        outputs = [
            helper.make_tensor_value_info("logits", floats, ["n", "V"]),
            *(helper.make_tensor_value_info(self.updated(self._layer_of(cache, layer)), floats, caches[cache])
              for cache in ("self_k", "self_v") for layer in range(L)),
        ]
        initializers = [numpy_helper.from_array(value, name) for name, value in self.initializers.items()]
        graph = helper.make_graph(self.nodes, "decoder_step", inputs, outputs, initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                       helper.make_opsetid(MICROSOFT, 1)])
