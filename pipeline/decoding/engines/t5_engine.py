"""The native engine's T5 family: T5, T5 v1.1 / Flan-T5 and mT5 (the BiLD paper's models).

``T5Weights`` reads a Hugging Face T5 checkpoint once and lays it out for decoding (native.py has
the engine): q, k and v fused into one matrix; each RMSNorm's weight folded into the matrix that
follows it (exact: (x * w) @ W == x @ (diag(w) W)); the final norm and, with tied embeddings, the
d^-0.5 rescaling folded into the output head; the relative position bias of each capacity one
table [H, C, C] with the causal mask folded in, computed once, not per layer. Its layers are
written once, against verbs (torch_verbs.py), for the native engine and the onnx engine's graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.models.t5.modeling_t5 import T5Attention

from pipeline.decoding.engines.native import Matrix, NativeWeights

SUPPORTED = {"T5ForConditionalGeneration": "t5", "MT5ForConditionalGeneration": "mt5"}


def head_size(config) -> int:
    """The width of one attention head."""
    return config.d_kv


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why T5Weights cannot run ``model``, or None when it can."""
    name = type(model).__name__
    if SUPPORTED.get(name) != getattr(model.config, "model_type", None):
        return f"not a T5-family model ({name}, {model.config.model_type})"
    if model.config.dense_act_fn not in ACT2FN:
        return f"unknown activation {model.config.dense_act_fn!r}"
    return None


@dataclass
class _Layer:
    """One transformer layer's matrices, [in, out], norms folded in. Encoder layers have no cross_*."""

    qkv: Matrix  # [d, 3 * inner]
    out: Matrix  # [inner, d]
    ff_in: Matrix  # [d, d_ff] (or [d, 2 * d_ff]: gate and linear, for gated activations)
    ff_out: Matrix  # [d_ff, d]
    cross_q: Matrix | None = None  # [d, inner]
    cross_out: Matrix | None = None  # [inner, d]


class T5Weights(NativeWeights):
    """A T5 checkpoint's weights, laid out once for decoding (shared by every engine of a model)."""

    attention_scale = 1.0  # T5 does not scale q.k
    position_bias = True  # relative positions, in self_mask
    lookup_embedding = True  # (embed below)

    @torch.no_grad()
    def __init__(self, model: PreTrainedModel, quantize: str = "none"):
        super().__init__(model, unsupported_reason(model), quantize)
        config = self.config = model.config
        self.d_model, self.heads, self.d_kv = config.d_model, config.num_heads, head_size(config)
        self.encoder_heads = self.heads
        self.eps = config.layer_norm_epsilon
        self.gated = bool(config.is_gated_act)
        self.act_name = config.dense_act_fn

        def matrix(*linears, norm=None) -> Matrix:
            weight = torch.cat([linear.weight.float() for linear in linears])  # [out, in]
            if norm is not None:
                weight = weight * norm.weight.float()[None, :]
            return self.layer_matrix(weight)

        def feed_forward(block) -> tuple[torch.Tensor, torch.Tensor]:
            dense = block.DenseReluDense
            inputs = (dense.wi_0, dense.wi_1) if self.gated else (dense.wi,)
            return matrix(*inputs, norm=block.layer_norm), matrix(dense.wo)

        def attention(layer) -> torch.Tensor:
            return matrix(layer.SelfAttention.q, layer.SelfAttention.k, layer.SelfAttention.v, norm=layer.layer_norm)

        self.encoder_embedding = model.encoder.embed_tokens.weight.detach()
        self.encoder_layers = []
        for block in model.encoder.block:
            ff_in, ff_out = feed_forward(block.layer[1])
            self.encoder_layers.append(_Layer(qkv=attention(block.layer[0]), out=matrix(block.layer[0].SelfAttention.o),
                                              ff_in=ff_in, ff_out=ff_out))
        self.encoder_final_norm = model.encoder.final_layer_norm.weight.detach()
        self.encoder_bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach()

        self.decoder_embedding = model.decoder.embed_tokens.weight.detach()
        self.decoder_layers = []
        for block in model.decoder.block:
            cross = block.layer[1]
            ff_in, ff_out = feed_forward(block.layer[2])
            self.decoder_layers.append(_Layer(
                qkv=attention(block.layer[0]), out=matrix(block.layer[0].SelfAttention.o), ff_in=ff_in, ff_out=ff_out,
                cross_q=matrix(cross.EncDecAttention.q, norm=cross.layer_norm),
                cross_out=matrix(cross.EncDecAttention.o)))
        self.layer_count = len(self.decoder_layers)
        # Every layer's cross-attention keys and values from one matmul: [d, layers * 2 * inner].
        self.cross_kv = matrix(*[linear for block in model.decoder.block
                                 for linear in (block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v)])
        self.decoder_bias = model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach()
        # The final norm's weight and (tied embeddings) the d^-0.5 rescaling, folded into the head.
        head = model.lm_head.weight.float() * model.decoder.final_layer_norm.weight.float()[None, :]
        if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
            head = head * self.d_model**-0.5
        self.head = self.layer_matrix(head)  # [d, V]

    # --- torch-only pieces (the onnx engine runs them in torch too) --------------------------------

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

    def source_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.encoder_embedding)

    def source_bias(self, width: int) -> torch.Tensor:
        """[1, H, S, S]: the encoder's relative position bias."""
        return self.bias_table(width, causal=False)[None]

    def self_mask(self, capacity: int) -> torch.Tensor:
        return self.bias_table(capacity, causal=True)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        # (relative positions: in the mask)
        return torch.index_select(self.decoder_embedding, 0, tokens.reshape(-1), out=out)

    # --- the layers, written once (torch_verbs.py: run in torch, or added to an ONNX graph) -------
    # Every norm's weight is folded into the matrix after it, so a norm here is the bare RMSNorm.

    def _feed_forward(self, verbs, x, layer: _Layer):
        """x + FF(norm(x))."""
        hidden = verbs.matmul(verbs.rms_norm(x, self.eps), layer.ff_in)
        hidden = verbs.gated(hidden, self.act_name) if self.gated else verbs.activation(hidden, self.act_name)
        return verbs.residual(x, hidden, layer.ff_out)

    def decoder_layer(self, verbs, x, index: int):
        layer, eps = self.decoder_layers[index], self.eps
        x = verbs.residual(x, verbs.self_attention(index, verbs.rms_norm(x, eps), layer.qkv), layer.out)
        query = verbs.matmul(verbs.rms_norm(x, eps), layer.cross_q)
        x = verbs.residual(x, verbs.cross_attention(index, query), layer.cross_out)
        return self._feed_forward(verbs, x, layer)

    def logits(self, verbs, hidden):
        return verbs.matmul(verbs.rms_norm(hidden, self.eps), self.head)

    def encoder_layer(self, verbs, x, index: int):
        layer = self.encoder_layers[index]
        x = verbs.residual(x, verbs.self_attention(verbs.rms_norm(x, self.eps), layer.qkv), layer.out)
        return self._feed_forward(verbs, x, layer)

    def encoder_output(self, verbs, x):
        return verbs.rms_norm(x, self.eps, self.encoder_final_norm)

    def cross_keys_values(self, verbs, encoded):
        return verbs.matmul(encoded, self.cross_kv)
