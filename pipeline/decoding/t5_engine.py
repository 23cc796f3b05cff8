"""The native engine for the T5 family: T5, T5 v1.1 / Flan-T5 and mT5 (the BiLD paper's models).

Its own forward pass over a preallocated per-slot cache, in the style of gpt-fast. At batch size 1
a decode step reads the decoder's weights once and is memory-bound, so everything else is cut:

- ``T5Weights`` reads the Hugging Face checkpoint once and lays it out for decoding: q, k and v
  fused into one matrix; each RMSNorm's weight folded into the linear that follows it (exact:
  (x * w) @ W == x @ (diag(w) W)); matrices stored [in, out], which a CPU's matmul reads faster
  for one row than ``F.linear``'s [out, in]; the cross-attention keys and values of every decoder
  layer fused into one matrix, applied once per record when it is admitted;
- the relative position bias is one table per capacity, [H, C, C] with the causal mask folded
  in: a forward pass takes one slice (one view at batch size 1) for all layers;
- a row's q, k and v are written straight into its slot ([slots, C, 3, H, dk] per layer), so the
  cache costs no copy; a rollback is only a shorter length (engine.py);
- the output head projects only the positions whose logits are read.

Everything is plain device-agnostic torch (CPU or CUDA; float32, bfloat16, float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.models.t5.modeling_t5 import T5Attention

from pipeline.decoding.engine import Engine, Feed, place_logits, read_positions

SUPPORTED = {"T5ForConditionalGeneration": "t5", "MT5ForConditionalGeneration": "mt5"}


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why this engine cannot run ``model``, or None when it can."""
    name = type(model).__name__
    if SUPPORTED.get(name) != getattr(model.config, "model_type", None):
        return f"no native engine for {name} ({model.config.model_type})"
    if model.config.dense_act_fn not in ACT2FN:
        return f"unknown activation {model.config.dense_act_fn!r}"
    return None


@dataclass
class _Layer:
    """One transformer layer's matrices, [in, out], norms folded in. Encoder layers have no cross_*."""

    qkv: torch.Tensor  # [d, 3 * inner]
    out: torch.Tensor  # [inner, d]
    ff_in: torch.Tensor  # [d, d_ff] (or [d, 2 * d_ff]: gate and linear, for gated activations)
    ff_out: torch.Tensor  # [d_ff, d]
    cross_q: torch.Tensor | None = None  # [d, inner]
    cross_out: torch.Tensor | None = None  # [inner, d]


class T5Weights:
    """A T5 checkpoint's weights, laid out once for decoding (shared by every engine of a model)."""

    @torch.no_grad()
    def __init__(self, model: PreTrainedModel):
        config = model.config
        self.config = config
        self.dtype, self.device = model.dtype, model.device
        self.d_model, self.heads, self.d_kv = config.d_model, config.num_heads, config.d_kv
        self.inner = self.heads * self.d_kv
        self.eps = config.layer_norm_epsilon
        self.gated = bool(config.is_gated_act)
        self.act = ACT2FN[config.dense_act_fn]

        def matrix(*linears, norm=None) -> torch.Tensor:
            weight = torch.cat([linear.weight.float() for linear in linears])  # [out, in]
            if norm is not None:
                weight = weight * norm.weight.float()[None, :]
            return weight.t().contiguous().to(self.dtype)  # [in, out]

        def feed_forward(block) -> tuple[torch.Tensor, torch.Tensor]:
            dense = block.DenseReluDense
            inputs = (dense.wi_0, dense.wi_1) if self.gated else (dense.wi,)
            return matrix(*inputs, norm=block.layer_norm), matrix(dense.wo)

        self.encoder_embedding = model.encoder.embed_tokens.weight.detach()
        self.encoder_layers = []
        for block in model.encoder.block:
            attention = block.layer[0]
            ff_in, ff_out = feed_forward(block.layer[1])
            self.encoder_layers.append(_Layer(
                qkv=matrix(attention.SelfAttention.q, attention.SelfAttention.k, attention.SelfAttention.v,
                           norm=attention.layer_norm),
                out=matrix(attention.SelfAttention.o), ff_in=ff_in, ff_out=ff_out))
        self.encoder_final_norm = model.encoder.final_layer_norm.weight.detach()
        self.encoder_bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach()

        self.decoder_embedding = model.decoder.embed_tokens.weight.detach()
        self.decoder_layers = []
        for block in model.decoder.block:
            attention, cross = block.layer[0], block.layer[1]
            ff_in, ff_out = feed_forward(block.layer[2])
            self.decoder_layers.append(_Layer(
                qkv=matrix(attention.SelfAttention.q, attention.SelfAttention.k, attention.SelfAttention.v,
                           norm=attention.layer_norm),
                out=matrix(attention.SelfAttention.o), ff_in=ff_in, ff_out=ff_out,
                cross_q=matrix(cross.EncDecAttention.q, norm=cross.layer_norm),
                cross_out=matrix(cross.EncDecAttention.o)))
        # Every layer's cross-attention keys and values from one matmul: [d, layers * 2 * inner].
        self.cross_kv = matrix(*[linear for block in model.decoder.block
                                 for linear in (block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v)])
        self.decoder_bias = model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach()
        # The final norm's weight and (tied embeddings) the d^-0.5 rescaling, folded into the head.
        head = model.lm_head.weight.float() * model.decoder.final_layer_norm.weight.float()[None, :]
        if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
            head = head * self.d_model**-0.5
        self.head = head.t().contiguous().to(self.dtype)  # [d, V]

    @classmethod
    def from_model(cls, model: PreTrainedModel) -> "T5Weights":
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(reason)
        return cls(model)

    # --- pieces of the forward pass ---------------------------------------------------------------

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """T5's RMSNorm without its weight (folded into the next matrix); half precision is normalized
        in float32, as Hugging Face's T5 does."""
        if x.dtype in (torch.float16, torch.bfloat16):
            return F.rms_norm(x.float(), (self.d_model,), eps=self.eps).to(x.dtype)
        return F.rms_norm(x, (self.d_model,), eps=self.eps)

    def feed_forward(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """x + FF(norm(x)). x: [N, d]"""
        hidden = self.norm(x) @ layer.ff_in
        if self.gated:
            gate, linear = hidden.chunk(2, dim=-1)
            hidden = self.act(gate) * linear
        else:
            hidden = self.act(hidden)
        return clamp_half(torch.addmm(x, hidden, layer.ff_out))

    def bias_table(self, capacity: int, causal: bool) -> torch.Tensor:
        """[H, C, C]: the relative position bias of query i and key j (and -inf for j > i if causal)."""
        position = torch.arange(capacity, device=self.device)
        relative = position[None, :] - position[:, None]  # key - query
        config = self.config
        bucket = T5Attention._relative_position_bucket(
            relative, bidirectional=not causal, num_buckets=config.relative_attention_num_buckets,
            max_distance=config.relative_attention_max_distance)
        embedding = self.decoder_bias if causal else self.encoder_bias
        table = F.embedding(bucket, embedding).permute(2, 0, 1).to(self.dtype)
        if causal:
            table = table.masked_fill(relative[None] > 0, float("-inf"))
        return table.contiguous()

    @torch.inference_mode()
    def encode(self, input_ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The encoder's output [J, S, d] for right-padded ``input_ids`` [J, S]."""
        rows, width = input_ids.shape
        heads, d_kv = self.heads, self.d_kv
        x = F.embedding(input_ids, self.encoder_embedding).view(rows * width, -1)
        bias = self.bias_table(width, causal=False)[None]  # [1, H, S, S]
        if min(lengths) < width:  # padded keys are never attended
            padding = torch.arange(width, device=self.device)[None, :] >= torch.tensor(lengths, device=self.device)[:, None]
            bias = bias.masked_fill(padding[:, None, None, :], float("-inf"))  # [J, H, S, S]
        for layer in self.encoder_layers:
            qkv = (self.norm(x) @ layer.qkv).view(rows, width, 3, heads, d_kv).transpose(1, 3)  # [J, H, 3, S, dk]
            attended = F.scaled_dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], attn_mask=bias, scale=1.0)
            x = clamp_half(torch.addmm(x, attended.transpose(1, 2).reshape(rows * width, -1), layer.out))
            x = self.feed_forward(x, layer)
        return (self.norm(x) * self.encoder_final_norm).view(rows, width, -1)


def clamp_half(x: torch.Tensor) -> torch.Tensor:
    """HF's T5 clamps float16 activations after every sub-layer (inf -> finite); so does this,
    the same way (a tensor bound: no host sync on a GPU)."""
    if x.dtype != torch.float16:
        return x
    largest = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), largest - 1000, largest).to(x.dtype)
    return torch.clamp(x, min=-limit, max=limit)


class T5Engine(Engine):
    """A T5 decoder over ``slots`` rows, each with its own cache of self- and cross-attention."""

    kind = "native"

    def __init__(self, weights: T5Weights, slots: int):
        super().__init__(slots, weights.device)
        self.weights = weights
        self.layers = len(weights.decoder_layers)
        self.capacity = 0
        self.qkv = None  # [layers, slots, C, 3, H, dk]: each position's q, k, v as its matmul wrote them
        self.table = None  # [H, C, C]
        self.sources = 0
        self.cross = None  # [layers, 2, slots, H, S, dk]
        self.source_lengths = [0] * slots
        self._cross_rows = None  # (slots, cross keys/values of those rows) reused while they run together
        self._reserve(64)

    # --- memory -----------------------------------------------------------------------------------

    def _reserve(self, positions: int) -> None:
        """Room for ``positions`` decoder positions per slot (doubling, so growing is rare)."""
        if positions <= self.capacity:
            return
        w = self.weights
        capacity = max(positions, 2 * self.capacity)
        grown = torch.zeros((self.layers, self.slots, capacity, 3, w.heads, w.d_kv), dtype=w.dtype, device=self.device)
        if self.qkv is not None:
            grown[:, :, : self.capacity] = self.qkv
        self.qkv, self.capacity = grown, capacity
        self.table = w.bias_table(capacity, causal=True)

    def _reserve_sources(self, length: int) -> None:
        if length <= self.sources:
            return
        w = self.weights
        sources = max(length, 2 * self.sources)
        grown = torch.zeros((self.layers, 2, self.slots, w.heads, sources, w.d_kv), dtype=w.dtype, device=self.device)
        if self.cross is not None:
            grown[:, :, :, :, : self.sources] = self.cross
        self.cross, self.sources = grown, sources

    # --- rows joining -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None):
        """Run the encoder once for the newcomers (unless given) and store each decoder layer's
        cross-attention keys and values in their slots."""
        w = self.weights
        lengths = [len(ids) for ids in input_ids]
        if encoded is None:
            padded = torch.zeros((len(slots), max(lengths)), dtype=torch.long)
            for row, ids in enumerate(input_ids):
                padded[row, : len(ids)] = ids
            encoded = w.encode(padded.to(self.device), lengths)
        rows, width, _ = encoded.shape
        self._reserve_sources(width)
        kv = (encoded.reshape(rows * width, -1) @ w.cross_kv).view(rows, width, self.layers, 2, w.heads, w.d_kv)
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
        x = F.embedding(feed.tokens.to(self.device), w.decoder_embedding).view(rows * width, -1)  # [N, d]
        if rows == 1:
            attend = self._one_row(feed)
        else:
            attend = self._many_rows(feed, keys)
        for index, layer in enumerate(w.decoder_layers):
            x = clamp_half(torch.addmm(x, attend.self_attention(index, w.norm(x), layer.qkv), layer.out))
            query = (w.norm(x) @ layer.cross_q).view(rows, width, w.heads, w.d_kv).transpose(1, 2)
            x = clamp_half(torch.addmm(x, attend.cross_attention(index, query), layer.cross_out))
            x = w.feed_forward(x, layer)
        hidden, index = read_positions(x, feed)
        return place_logits(w.norm(hidden) @ w.head, index, feed)

    def _one_row(self, feed: Feed) -> "_Attention":
        slot, position, width = feed.slots[0], feed.positions[0], feed.width
        end = position + width
        return _Attention(
            engine=self,
            rows=slice(slot, slot + 1),
            written=(slot, slice(position, end)),
            keys=end,
            self_bias=self.table[None, :, position:end, :end],  # a view, for all layers
            cross_rows=self.cross[:, :, slot : slot + 1, :, : self.source_lengths[slot]],
            cross_mask=None,
        )

    def _many_rows(self, feed: Feed, keys: int) -> "_Attention":
        """Several rows: read in place over the span of slots they occupy when it is not much wider
        than they are (the scheduler keeps rows in slot order), else gathered by slot."""
        w, width, count = self.weights, feed.width, len(feed.slots)
        device = self.device
        slots = torch.tensor(feed.slots, device=device)
        positions = torch.tensor(feed.positions, device=device)[:, None] + torch.arange(width, device=device)
        first, last = min(feed.slots), max(feed.slots)
        place = None
        if last - first + 1 <= 2 * count:  # in place: slots between the rows run along, their outputs unread
            rows = slice(first, last + 1)
            read = list(range(first, last + 1))
            if feed.slots != read:  # idle slots between the rows, or rows out of slot order
                place = slots - first  # [R] where each fed row sits in the span
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
        bias = self.table[:, positions_read.reshape(-1), :keys].view(w.heads, len(read), width, keys).transpose(0, 1)
        lengths = [max(1, self.source_lengths[slot]) for slot in read]
        cross_mask = None
        if min(lengths) < max(lengths):
            beyond = torch.arange(max(lengths), device=device)[None, :] >= torch.tensor(lengths, device=device)[:, None]
            cross_mask = torch.zeros(beyond.shape, dtype=w.dtype, device=device).masked_fill(beyond, float("-inf"))
            cross_mask = cross_mask[:, None, None, :]  # [A, 1, 1, S]
        return _Attention(engine=self, rows=rows, written=(slots[:, None], positions), keys=keys, self_bias=bias,
                          cross_rows=cross_rows[:, :, :, :, : max(lengths)], cross_mask=cross_mask, place=place)


@dataclass
class _Attention:
    """Where one forward pass's rows live in the engine's cache, worked out once for all layers.

    Attention runs over A rows of the cache: the R fed rows, or (``place``) the span of slots they
    occupy, idle slots included; ``place`` says where each fed row sits in that span.
    """

    engine: T5Engine
    rows: slice | torch.Tensor  # the slots read: a slice (views) or an index (a gather)
    written: tuple  # where the fed positions' q, k, v go in [slots, C]: (slot, slice) for one row, else indices
    keys: int  # key positions 0 .. keys - 1
    self_bias: torch.Tensor  # [A, H, W, keys]
    cross_rows: torch.Tensor  # [layers, 2, A, H, S, dk]
    cross_mask: torch.Tensor | None  # [A, 1, 1, S] where rows' sources differ in length
    place: torch.Tensor | None = None  # [R] each fed row's index among the A rows, when A > R

    def _spread(self, query: torch.Tensor) -> torch.Tensor:
        """[R, ...] -> [A, ...]: the fed rows' queries among the attended rows (zeros elsewhere)."""
        if self.place is None:
            return query
        spread = query.new_zeros((self.self_bias.shape[0], *query.shape[1:]))
        spread[self.place] = query
        return spread

    def _fed(self, attended: torch.Tensor) -> torch.Tensor:
        """[A, ...] -> [R, ...]: the fed rows' results."""
        return attended if self.place is None else attended[self.place]

    def self_attention(self, layer: int, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Causal self-attention of the fed positions: hidden [N, d] @ weight [d, 3 * inner] gives their
        q, k, v, which go into the cache (straight from the matmul for one row) -> [N, inner]."""
        cache = self.engine.qkv[layer]  # [slots, C, 3, H, dk]
        rows, width = len(hidden) // self.self_bias.shape[2], self.self_bias.shape[2]
        if isinstance(self.written[1], slice):  # one row: its positions are one block of its slot
            torch.mm(hidden, weight, out=cache[self.written].view(width, -1))
            query = cache[self.rows, self.keys - width : self.keys, 0]  # [1, W, H, dk]
        else:
            qkv = (hidden @ weight).view(rows, width, *cache.shape[2:])
            cache[self.written] = qkv
            query = qkv[:, :, 0]  # [R, W, H, dk]
        seen = cache[self.rows, : self.keys, 1:]  # [A, keys, 2, H, dk]: a view, or a gather of k and v
        attended = F.scaled_dot_product_attention(
            self._spread(query).transpose(1, 2), seen[:, :, 0].transpose(1, 2), seen[:, :, 1].transpose(1, 2),
            attn_mask=self.self_bias, scale=1.0)  # T5 does not scale q.k
        return self._fed(attended).transpose(1, 2).reshape(rows * width, -1)

    def cross_attention(self, layer: int, query: torch.Tensor) -> torch.Tensor:
        """Attention over the rows' encoder outputs; query [R, H, W, dk] -> [N, inner]."""
        rows, _, width, _ = query.shape
        keys, values = self.cross_rows[layer]
        attended = F.scaled_dot_product_attention(self._spread(query), keys, values, attn_mask=self.cross_mask,
                                                  scale=1.0)
        return self._fed(attended).transpose(1, 2).reshape(rows * width, -1)
