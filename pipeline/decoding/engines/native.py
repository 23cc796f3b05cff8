"""What the native engines share: a preallocated per-slot cache and one decoder pass over a Feed.

In the style of gpt-fast. At batch size 1 a decode step reads the decoder's weights once and is
memory-bound, so everything but the matrix products is cut:

- a model family's ``NativeWeights`` (t5_engine.py, bart_engine.py) reads the Hugging Face
  checkpoint once and lays it out for decoding (q/k/v fused, norms folded into the next matrix
  where that is exact, matrices stored [in, out], which a CPU's matmul reads faster for one row
  than ``F.linear``'s [out, in]) and computes one decoder layer;
- every decoder layer's cross-attention keys and values come from one matmul per record, at
  admission;
- the self-attention mask (T5: with the relative position bias folded in) is one table per
  capacity, [H or 1, C, C]; a forward pass takes one slice of it for all layers;
- a row's q, k and v are written straight into its slot ([slots, C, 3, H, dk] per layer), so the
  cache costs no copy; a rollback is only a shorter length (engine.py);
- the output head projects only the positions whose logits are read.

Plain device-agnostic torch (CPU or CUDA; float32, bfloat16, float16).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.decoding.engine import Engine, Feed, place_logits, read_positions
from pipeline.decoding.engines import int8
from pipeline.decoding.engines.cache_rows import grown, padded_ids, resized, span_of
from pipeline.decoding.engines.torch_verbs import TORCH, EncoderAttention, TorchVerbs


class NativeWeights(ABC):
    """A model's weights laid out for decoding, and the family's pieces of a forward pass."""

    dtype: torch.dtype
    device: torch.device
    heads: int  # the decoder's attention heads ...
    d_kv: int  # ... and their width
    encoder_heads: int
    layer_count: int  # decoder layers
    attention_scale: float  # on q.k: 1.0 for T5, d_kv ** -0.5 for BART-like models
    position_bias: bool  # whether self_mask adds more than the causal mask (T5's relative position bias)
    # Whether ``embed`` of a token is its row of ``decoder_embedding`` alone (no position, scale or norm):
    # the onnx engine then looks a drafting step's token up in numpy, without torch's per-call cost.
    lookup_embedding: bool = False

    def __init__(self, model, unsupported: str | None, quantize: str = "none"):
        """``unsupported``: the family's reason not to run ``model`` (its ``unsupported_reason``), or None;
        ``quantize``: "none", or "int8" for int8 matrices where they pay (int8.py; float32 on a CPU only)."""
        if unsupported:
            raise ValueError(unsupported)
        self.dtype, self.device = model.dtype, model.device
        assert quantize != "int8" or (self.device.type == "cpu" and self.dtype == torch.float32), \
            "rules.engine_problem: int8 on the CPU in float32 only"
        self.quantize = quantize

    def layer_matrix(self, weight: torch.Tensor) -> "Matrix | int8.Int8Matrix":
        """A layer's float [out, in] weight as this model multiplies by it: int8 where asked for and
        where it pays (int8.pays_off), else in the model's dtype."""
        if self.quantize == "int8" and int8.pays_off(weight):
            return int8.Int8Matrix(weight)
        return Matrix(weight, self.dtype)

    def step_weights(self) -> int:
        """How many weights a decoder step multiplies by (every decoder layer's matrices and the head):
        what it reads from memory each step."""
        matrices = [value for layer in self.decoder_layers for value in vars(layer).values()
                    if isinstance(value, (Matrix, int8.Int8Matrix))]
        return sum(matrix.shape[0] * matrix.shape[1] for matrix in [*matrices, self.head])

    @torch.inference_mode()
    def encode(self, input_ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The encoder's output [J, S, d] for right-padded ``input_ids`` [J, S]: the family's encoder
        layers run in torch."""
        rows, width = input_ids.shape
        x = self.source_embedding(input_ids).view(rows * width, -1)
        mask = self.source_bias(width)  # [1, H, S, S] or None
        padding = key_padding_mask(lengths, width, self.dtype, self.device)  # padded keys are never attended
        if padding is not None:
            mask = padding if mask is None else mask + padding  # [J, H or 1, S, S]
        verbs = EncoderAttention(rows, width, self.encoder_heads, mask)
        for index in range(len(self.encoder_layers)):
            x = self.encoder_layer(verbs, x, index)
        return self.encoder_output(verbs, x).view(rows, width, -1)

    @abstractmethod
    def source_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The encoder's input [J, S, d] for ``input_ids`` [J, S]."""

    def source_bias(self, width: int) -> torch.Tensor | None:
        """What the encoder's attention adds to its scores, [1, H, S, S] (T5's relative positions), or None."""
        return None

    @abstractmethod
    def self_mask(self, capacity: int) -> torch.Tensor:
        """[H or 1, C, C]: what query position i adds to key position j's score (-inf for j > i)."""

    @abstractmethod
    def embed(self, tokens: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's input [R * W, d] for tokens [R, W] at absolute positions [R, W] (written into
        ``out`` where given)."""

    # The family's layers, each written once against verbs (torch_verbs.py): run in torch by the
    # native engine (``verbs`` a TorchVerbs, x a tensor), added to an ONNX graph by the onnx engine
    # (``verbs`` an onnx_graph.StepGraph or EncoderGraph, x the name of a value).

    @abstractmethod
    def decoder_layer(self, verbs, x, index: int):
        """Decoder layer ``index`` over x [N, d] (in a graph [A, W, d]); ``verbs`` does its self- and
        cross-attention too."""

    @abstractmethod
    def logits(self, verbs, hidden):
        """[n, d] hidden states after the last layer -> [n, V]."""

    @abstractmethod
    def encoder_layer(self, verbs, x, index: int):
        """Encoder layer ``index`` over x [J * S, d] (in a graph [A, S, d])."""

    @abstractmethod
    def encoder_output(self, verbs, x):
        """The encoder's output from its last layer's (its final norm, where it has one)."""

    @abstractmethod
    def cross_keys_values(self, verbs, encoded):
        """Every decoder layer's cross-attention keys and values from one product:
        [N, d] -> [N, layers * 2 * H * dk] (in a graph [A, S, d] -> [A, S, ...])."""


class Matrix:
    """A layer's weight as the native engines multiply by it: ``x @ W`` for W [in, out].

    On a CPU in float32 two layouts are kept: MKL's GEMM reads the plain [in, out] layout fastest
    for a few rows (a step of one or two positions, the common case at batch 1), oneDNN's packed
    layout is faster from about four rows on (verifications, batches; BENCHMARKS.md). Elsewhere (a
    GPU, half precision) only the plain tensor.
    """

    packed_from_rows = 4  # measured on the demo pair: MKL wins at 1-2 rows, oneDNN at 6 and more

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype):
        """weight: a float [out, in] matrix (a linear layer's), already folded where the family folds."""
        self.weight = weight.t().contiguous().to(dtype)  # [in, out]
        self.packed = _onednn_packed(weight) if dtype == torch.float32 else None

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W for x [N, in]. (No ``__rmatmul__``: ``tensor @ Matrix`` costs ~13 µs more per call,
        torch raising and catching a TypeError before Python tries the right operand.)"""
        return self.addmm(None, x)

    def addmm(self, input: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """input + x @ W for x [N, in]; input: None, a bias [out] or a residual [N, out]."""
        if self.packed is None or len(x) < self.packed_from_rows:
            return torch.mm(x, self.weight) if input is None else torch.addmm(input, x, self.weight)
        bias = input if input is not None and input.dim() == 1 else None
        product = torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        return product if input is None or bias is not None else product.add_(input)

    def into(self, out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """out = x @ W (+ bias), written into ``out`` [N, out] (straight from MKL's GEMM where it runs)."""
        if self.packed is None or len(x) < self.packed_from_rows:
            if bias is None:
                torch.mm(x, self.weight, out=out)
            else:
                torch.addmm(bias, x, self.weight, out=out)
        else:
            out.copy_(self.addmm(bias, x))


def _onednn_packed(weight: torch.Tensor):
    """oneDNN's packed copy of a float32 [out, in] CPU weight, or None where oneDNN is not there."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:  # the layout is tuned for a batch of about 8 rows; any number of rows runs on it
        return torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), 8)
    except (AttributeError, RuntimeError):
        return None


def key_padding_mask(lengths: list[int], width: int, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor | None:
    """[J, 1, 1, width]: -inf on each row's keys past its length, for attention over right-padded
    rows; None when no row is padded."""
    if min(lengths) >= width:
        return None
    beyond = torch.arange(width, device=device)[None, :] >= torch.tensor(lengths, device=device)[:, None]
    return torch.zeros(beyond.shape, dtype=dtype, device=device).masked_fill(beyond, float("-inf"))[:, None, None, :]


class NativeEngine(Engine):
    """A native decoder over ``slots`` rows, each with its own cache of self- and cross-attention."""

    kind = "native"

    def __init__(self, weights: NativeWeights, slots: int):
        super().__init__(slots, weights.device)
        self.weights = w = weights
        self.capacity, self.sources = 0, 0  # C and S: grown by _reserve and _reserve_sources
        self.qkv = torch.zeros((w.layer_count, slots, 0, 3, w.heads, w.d_kv), dtype=w.dtype, device=self.device)
        # ^ [layers, slots, C, 3, H, dk]: each position's q, k, v as its matmul wrote them
        self.cross = torch.zeros((w.layer_count, 2, slots, w.heads, 0, w.d_kv), dtype=w.dtype, device=self.device)
        # ^ [layers, 2, slots, H, S, dk]
        self.table = None  # [H or 1, C, C]
        self.source_lengths = [0] * slots
        self._cross_rows = None  # (slots, cross keys/values of those rows) reused while they run together
        self._reserve(64)

    @property
    def int8_scheme(self) -> str | None:
        return int8.SCHEME if self.weights.quantize == "int8" else None

    # --- memory -----------------------------------------------------------------------------------

    def _reserve(self, positions: int) -> None:
        """Room for ``positions`` decoder positions per slot (doubling, so growing is rare)."""
        if positions <= self.capacity:
            return
        self.capacity = grown(positions, self.capacity)
        self.qkv = resized(self.qkv, 2, self.capacity)
        self.table = self.weights.self_mask(self.capacity)

    def _reserve_sources(self, length: int) -> None:
        if length <= self.sources:
            return
        self.sources = grown(length, self.sources)
        self.cross = resized(self.cross, 4, self.sources)

    # --- rows joining -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None):
        """Run the encoder once for the newcomers (unless given) and store each decoder layer's
        cross-attention keys and values in their slots."""
        lengths = [len(ids) for ids in input_ids]
        if encoded is None:
            encoded = self.weights.encode(padded_ids(input_ids, max(lengths)).to(self.device), lengths)
        width = encoded.shape[1]
        self._reserve_sources(width)
        w = self.weights
        kv = w.cross_keys_values(TORCH, encoded.reshape(len(slots) * width, -1))
        kv = kv.view(len(slots), width, w.layer_count, 2, w.heads, w.d_kv)  # [J, S, layers, 2, H, dk]
        index = torch.tensor(slots, device=self.device)
        self.cross[:, :, index, :, :width] = kv.permute(2, 3, 0, 4, 1, 5)  # [layers, 2, J, H, S, dk]
        for slot, length in zip(slots, lengths):
            self.source_lengths[slot] = length
        self._cross_rows = None
        return encoded

    # --- the forward pass -------------------------------------------------------------------------

    @torch.inference_mode()
    def _forward(self, feed: Feed) -> torch.Tensor:
        w = self.weights
        rows, width = feed.tokens.shape
        keys = max(feed.positions) + width  # key positions 0 .. keys-1 cover every row
        self._reserve(keys)
        positions = torch.tensor(feed.positions, device=self.device)[:, None] + torch.arange(width, device=self.device)
        x = w.embed(feed.tokens.to(self.device), positions)  # [N, d]
        attend = self._one_row(feed) if rows == 1 else self._many_rows(feed, positions, keys)
        for index in range(w.layer_count):
            x = w.decoder_layer(attend, x, index)
        hidden, index = read_positions(x, feed)
        return place_logits(w.logits(TORCH, hidden), index, feed)

    def _one_row(self, feed: Feed) -> "Attention":
        slot, position, width = feed.slots[0], feed.positions[0], feed.width
        end = position + width
        return Attention(
            engine=self,
            rows=slice(slot, slot + 1),
            written=(slot, slice(position, end)),
            keys=end,
            self_mask=self.table[None, :, position:end, :end],  # a view, for all layers
            cross_rows=self.cross[:, :, slot : slot + 1, :, : self.source_lengths[slot]],
            cross_mask=None,
        )

    def _many_rows(self, feed: Feed, positions: torch.Tensor, keys: int) -> "Attention":
        """Several rows: read in place over the span of slots they occupy when it is not much wider
        than they are (the scheduler keeps rows in slot order), else gathered by slot."""
        width, device = feed.width, self.device
        slots = torch.tensor(feed.slots, device=device)
        span = span_of(feed.slots)
        place = None
        if span is not None:  # in place: slots between the rows run along, their outputs unread
            rows = span
            read = list(range(span.start, span.stop))
            if feed.slots != read:  # idle slots between the rows, or rows out of slot order
                place = slots - span.start  # [R] where each fed row sits in the span
                spread = torch.arange(width, device=device).repeat(len(read), 1)  # idle slots: any valid positions
                spread[place] = positions
                positions_read = spread
            else:
                positions_read = positions
            cross_rows = self.cross[:, :, rows]
        else:  # scattered slots: their keys and values are gathered (the cross-attention ones once per row set)
            rows, read, positions_read = slots, feed.slots, positions
            if self._cross_rows is None or self._cross_rows[0] != feed.slots:
                self._cross_rows = (feed.slots, self.cross[:, :, slots])
            cross_rows = self._cross_rows[1]
        table = self.table
        mask = table[:, positions_read.reshape(-1), :keys].view(len(table), len(read), width, keys).transpose(0, 1)
        lengths = [max(1, self.source_lengths[slot]) for slot in read]
        cross_mask = key_padding_mask(lengths, max(lengths), self.weights.dtype, device)  # [A, 1, 1, S] or None
        return Attention(engine=self, rows=rows, written=(slots[:, None], positions), keys=keys, self_mask=mask,
                         cross_rows=cross_rows[:, :, :, :, : max(lengths)], cross_mask=cross_mask, place=place)


@dataclass
class Attention(TorchVerbs):
    """Where one forward pass's rows live in the engine's cache, worked out once for all layers, and
    the verbs of a decoder layer over them (its self- and cross-attention read and write there).

    Attention runs over A rows of the cache: the R fed rows, or (``place``) the span of slots they
    occupy, idle slots included; ``place`` says where each fed row sits in that span.
    """

    engine: NativeEngine
    rows: slice | torch.Tensor  # the slots read: a slice (views) or an index (a gather)
    written: tuple  # where the fed positions' q, k, v go in [slots, C]: (slot, slice) for one row, else indices
    keys: int  # key positions 0 .. keys - 1
    self_mask: torch.Tensor  # [A, H or 1, W, keys]
    cross_rows: torch.Tensor  # [layers, 2, A, H, S, dk]
    cross_mask: torch.Tensor | None  # [A, 1, 1, S] where rows' sources differ in length
    place: torch.Tensor | None = None  # [R] each fed row's index among the A rows, when A > R

    def _spread(self, query: torch.Tensor) -> torch.Tensor:
        """[R, ...] -> [A, ...]: the fed rows' queries among the attended rows (zeros elsewhere)."""
        if self.place is None:
            return query
        spread = query.new_zeros((self.self_mask.shape[0], *query.shape[1:]))
        spread[self.place] = query
        return spread

    def _fed(self, attended: torch.Tensor) -> torch.Tensor:
        """[A, ...] -> [R, ...]: the fed rows' results."""
        return attended if self.place is None else attended[self.place]

    def self_attention(self, layer: int, hidden: torch.Tensor, weight: Matrix,
                       bias: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        """Causal self-attention of the fed positions: hidden [N, d] @ weight [d, 3 * inner] (+ bias)
        gives their q, k, v, which go into the cache (straight from the matmul for one row) -> [N, inner]."""
        cache = self.engine.qkv[layer]  # [slots, C, 3, H, dk]
        width = self.self_mask.shape[2]
        rows = len(hidden) // width
        if isinstance(self.written[1], slice):  # one row: its positions are one block of its slot
            weight.into(cache[self.written].view(width, -1), hidden, bias)
            query = cache[self.rows, self.keys - width : self.keys, 0]  # [1, W, H, dk]
        else:
            qkv = weight.addmm(bias, hidden).view(rows, width, *cache.shape[2:])
            cache[self.written] = qkv
            query = qkv[:, :, 0]  # [R, W, H, dk]
        seen = cache[self.rows, : self.keys, 1:]  # [A, keys, 2, H, dk]: a view, or a gather of k and v
        attended = F.scaled_dot_product_attention(
            self._spread(query).transpose(1, 2), seen[:, :, 0].transpose(1, 2), seen[:, :, 1].transpose(1, 2),
            attn_mask=self.self_mask, scale=scale)
        return self._fed(attended).transpose(1, 2).reshape(rows * width, -1)

    def cross_attention(self, layer: int, query: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Attention over the rows' encoder outputs; query [N, inner] -> [N, inner]."""
        w = self.engine.weights
        width = self.self_mask.shape[2]
        rows = len(query) // width
        query = query.view(rows, width, w.heads, w.d_kv).transpose(1, 2)
        keys, values = self.cross_rows[layer]
        attended = F.scaled_dot_product_attention(self._spread(query), keys, values, attn_mask=self.cross_mask,
                                                  scale=scale)
        return self._fed(attended).transpose(1, 2).reshape(rows * width, -1)
