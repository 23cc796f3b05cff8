"""The native engine's BART family: BART, mBART, Marian (opus-mt) and M2M100 / NLLB.

``BartWeights`` reads one of these Hugging Face checkpoints once and lays it out for decoding
(native.py has the engine). The four share one layer design and differ in a few switches:

| family | norms | embedding norm | final norm | positions |
|---|---|---|---|---|
| BART | after each sub-layer | yes | no | learned, offset 2 |
| mBART | before each sub-layer | yes | yes | learned, offset 2 |
| Marian | after each sub-layer | no | no | sinusoidal |
| M2M100 / NLLB | before each sub-layer | no | yes | sinusoidal from padding_idx + 1 (pad tokens: none) |

Every row reads its own positions, so rows of different lengths share a pass. Where a LayerNorm
feeds only the next matrix (norms before each sub-layer, the final norm before the head) its
weight and bias are folded into that matrix and its bias; q, k and v are fused into one matrix;
every decoder layer's cross-attention keys and values come from one matmul per record. Its layers
are written once, against verbs (torch_verbs.py), for the native engine and the onnx engine's graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

from pipeline.decoding.engines.native import Matrix, NativeWeights
from pipeline.decoding.engines.torch_verbs import TORCH


@dataclass(frozen=True)
class _Family:
    model_type: str
    pre_norm: bool  # LayerNorm before each sub-layer (and a final one), else after each
    positions: str  # "learned" (offset 2), "sinusoidal" (Marian), "m2m100" (from padding_idx + 1)


FAMILIES = {
    "BartForConditionalGeneration": _Family("bart", pre_norm=False, positions="learned"),
    "MBartForConditionalGeneration": _Family("mbart", pre_norm=True, positions="learned"),
    "MarianMTModel": _Family("marian", pre_norm=False, positions="sinusoidal"),
    "M2M100ForConditionalGeneration": _Family("m2m_100", pre_norm=True, positions="m2m100"),
}


def head_size(config) -> int:
    """The width of one attention head."""
    return config.d_model // config.decoder_attention_heads


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why BartWeights cannot run ``model``, or None when it can."""
    name = type(model).__name__
    family = FAMILIES.get(name)
    if family is None or family.model_type != getattr(model.config, "model_type", None):
        return f"not a BART-family model ({name}, {model.config.model_type})"
    if model.config.activation_function not in ACT2FN:
        return f"unknown activation {model.config.activation_function!r}"
    return None


@dataclass
class _Layer:
    """One layer's matrices [in, out] and biases; a pre-norm's LayerNorm folded into the next matrix,
    a post-norm's kept as (weight, bias). Encoder layers have no cross_*."""

    qkv: Matrix
    qkv_bias: torch.Tensor
    out: Matrix
    out_bias: torch.Tensor
    fc1: Matrix
    fc1_bias: torch.Tensor
    fc2: Matrix
    fc2_bias: torch.Tensor
    attention_norm: tuple | None = None  # post-norm: the LayerNorms after each sub-layer
    feed_forward_norm: tuple | None = None
    cross_q: Matrix | None = None
    cross_q_bias: torch.Tensor | None = None
    cross_out: Matrix | None = None
    cross_out_bias: torch.Tensor | None = None
    cross_norm: tuple | None = None


class BartWeights(NativeWeights):
    """A BART-family checkpoint's weights, laid out once for decoding (shared by every engine of a model)."""

    position_bias = False  # positions are in the embeddings; self_mask is only causal

    @torch.no_grad()
    def __init__(self, model: PreTrainedModel, quantize: str = "none"):
        super().__init__(model, unsupported_reason(model), quantize)
        config = model.config
        self.family = FAMILIES[type(model).__name__]
        self.d_model = config.d_model
        self.heads = config.decoder_attention_heads
        self.encoder_heads = config.encoder_attention_heads
        self.d_kv = head_size(config)
        self.attention_scale = self.d_kv**-0.5
        self.embed_scale = math.sqrt(self.d_model) if config.scale_embedding else 1.0
        self.act_name = config.activation_function
        self.pad = config.pad_token_id
        encoder, decoder = model.get_encoder(), model.get_decoder()
        self.eps = decoder.layers[0].final_layer_norm.eps

        self.encoder_embedding = encoder.embed_tokens.weight.detach()
        self.decoder_embedding = decoder.embed_tokens.weight.detach()
        self.encoder_positions = self._position_table(encoder.embed_positions)
        self.decoder_positions = self._position_table(decoder.embed_positions)
        self.encoder_embedding_norm = self._norm_of(getattr(encoder, "layernorm_embedding", None))
        self.decoder_embedding_norm = self._norm_of(getattr(decoder, "layernorm_embedding", None))
        self.encoder_final_norm = self._norm_of(getattr(encoder, "layer_norm", None))
        self.encoder_layers = [self._layer(layer, cross=False) for layer in encoder.layers]
        self.decoder_layers = [self._layer(layer, cross=True) for layer in decoder.layers]
        self.layer_count = len(self.decoder_layers)
        # Every layer's cross-attention keys and values from one matmul: [d, layers * 2 * d].
        linears = [linear for layer in decoder.layers for linear in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]
        self.cross_kv = self.layer_matrix(torch.cat([linear.weight.float() for linear in linears]))
        self.cross_kv_bias = torch.cat([linear.bias.float() for linear in linears]).to(self.dtype)
        # The head, with the final norm (pre-norm families) folded in and the final logits bias.
        head = model.get_output_embeddings().weight.float()  # [V, d]
        bias = getattr(model, "final_logits_bias", torch.zeros((1, head.shape[0]))).float()[0]
        final_norm = getattr(decoder, "layer_norm", None)
        if final_norm is not None:
            bias = bias + head @ final_norm.bias.float()
            head = head * final_norm.weight.float()[None, :]
        self.head, self.head_bias = self.layer_matrix(head), bias.to(self.dtype)
        self.final_normalized = final_norm is not None

    # --- reading the checkpoint -------------------------------------------------------------------

    def _position_table(self, module) -> torch.Tensor:
        """[P, d]: the vector added at positions 0 .. P-1 (a pad token itself gets none, M2M100 only)."""
        kind = self.family.positions
        if kind == "learned":
            return module.weight.detach()[2:].to(self.dtype)
        if kind == "sinusoidal":
            return module.weight.detach().to(self.dtype)
        count = module.num_positions + module.offset
        table = M2M100SinusoidalPositionalEmbedding.get_embedding(count + self.pad + 1, module.embedding_dim, self.pad)
        return table[self.pad + 1 :].to(self.dtype).to(self.device)

    def _norm_of(self, module) -> tuple | None:
        return None if module is None else (module.weight.detach(), module.bias.detach(), module.eps)

    def _matrix(self, *linears, norm=None) -> tuple[Matrix, torch.Tensor]:
        """(matrix [in, out], bias) of these linears side by side. With the LayerNorm before them
        (pre-norm families) folded in: (w * x + b) @ W + c == x @ (diag(w) W) + (b @ W + c)."""
        weight = torch.cat([linear.weight.float() for linear in linears])  # [out, in]
        bias = torch.cat([linear.bias.float() for linear in linears])
        if norm is not None and self.family.pre_norm:
            bias = bias + weight @ norm.bias.float()
            weight = weight * norm.weight.float()[None, :]
        return self.layer_matrix(weight), bias.to(self.dtype)

    def _layer(self, layer, cross: bool) -> _Layer:
        attention = layer.self_attn
        post = not self.family.pre_norm
        qkv, qkv_bias = self._matrix(attention.q_proj, attention.k_proj, attention.v_proj, norm=layer.self_attn_layer_norm)
        out, out_bias = self._matrix(attention.out_proj)
        fc1, fc1_bias = self._matrix(layer.fc1, norm=layer.final_layer_norm)
        fc2, fc2_bias = self._matrix(layer.fc2)
        built = _Layer(qkv=qkv, qkv_bias=qkv_bias, out=out, out_bias=out_bias, fc1=fc1, fc1_bias=fc1_bias, fc2=fc2,
                       fc2_bias=fc2_bias, attention_norm=self._norm_of(layer.self_attn_layer_norm) if post else None,
                       feed_forward_norm=self._norm_of(layer.final_layer_norm) if post else None)
        if cross:
            built.cross_q, built.cross_q_bias = self._matrix(layer.encoder_attn.q_proj, norm=layer.encoder_attn_layer_norm)
            built.cross_out, built.cross_out_bias = self._matrix(layer.encoder_attn.out_proj)
            built.cross_norm = self._norm_of(layer.encoder_attn_layer_norm) if post else None
        return built

    # --- torch-only pieces (the onnx engine runs them in torch too) --------------------------------

    def _embedded(self, tokens, positions, embedding, table, norm) -> torch.Tensor:
        """Token embeddings (scaled) plus position vectors, then the embedding LayerNorm if any. [N, d]"""
        position_vectors = table[positions]
        if self.family.positions == "m2m100":  # a pad token gets no position (create_position_ids_from_input_ids)
            position_vectors = position_vectors.masked_fill((tokens == self.pad)[..., None], 0.0)
        x = (F.embedding(tokens, embedding) * self.embed_scale + position_vectors).view(tokens.numel(), -1)
        return self._normalized(TORCH, x, norm) if norm is not None else x

    def source_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows, width = input_ids.shape
        positions = torch.arange(width, device=self.device).expand(rows, -1)
        return self._embedded(input_ids, positions, self.encoder_embedding, self.encoder_positions,
                              self.encoder_embedding_norm).view(rows, width, -1)

    def self_mask(self, capacity: int) -> torch.Tensor:
        position = torch.arange(capacity, device=self.device)
        future = position[None, :] > position[:, None]  # key after query
        return torch.zeros((1, capacity, capacity), dtype=self.dtype, device=self.device).masked_fill(future, float("-inf"))

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if int(positions.max()) >= len(self.decoder_positions):
            raise ValueError(f"position {int(positions.max())} is past the model's {len(self.decoder_positions)} positions")
        x = self._embedded(tokens, positions, self.decoder_embedding, self.decoder_positions, self.decoder_embedding_norm)
        return x if out is None else out.copy_(x)

    # --- the layers, written once (torch_verbs.py: run in torch, or added to an ONNX graph) -------

    def _normalized(self, verbs, x, norm: tuple | None = None):
        """LayerNorm: with its weight and bias (norm), or bare (a pre-norm whose weight is folded)."""
        return verbs.layer_norm(x, self.eps) if norm is None else verbs.layer_norm(x, norm[2], norm[0], norm[1])

    def _sublayer(self, verbs, x, output, weight, bias, norm: tuple | None):
        """The residual around a sub-layer whose last matrix is (weight, bias): x + output @ W + b,
        then the post-norm's LayerNorm where the family has one."""
        x = verbs.residual(x, output, weight, bias)
        return self._normalized(verbs, x, norm) if norm is not None else x

    def _input(self, verbs, x):
        """What a sub-layer's first matrix reads: LayerNorm(x) (folded weight) before, x after."""
        return self._normalized(verbs, x) if self.family.pre_norm else x

    def _feed_forward(self, verbs, x, layer: _Layer):
        hidden = verbs.activation(verbs.matmul(self._input(verbs, x), layer.fc1, layer.fc1_bias), self.act_name)
        return self._sublayer(verbs, x, hidden, layer.fc2, layer.fc2_bias, layer.feed_forward_norm)

    def decoder_layer(self, verbs, x, index: int):
        layer, scale = self.decoder_layers[index], self.attention_scale
        attended = verbs.self_attention(index, self._input(verbs, x), layer.qkv, layer.qkv_bias, scale)
        x = self._sublayer(verbs, x, attended, layer.out, layer.out_bias, layer.attention_norm)
        query = verbs.matmul(self._input(verbs, x), layer.cross_q, layer.cross_q_bias)
        x = self._sublayer(verbs, x, verbs.cross_attention(index, query, scale), layer.cross_out,
                           layer.cross_out_bias, layer.cross_norm)
        return self._feed_forward(verbs, x, layer)

    def logits(self, verbs, hidden):
        if self.final_normalized:
            hidden = self._normalized(verbs, hidden)
        return verbs.matmul(hidden, self.head, self.head_bias)

    def encoder_layer(self, verbs, x, index: int):
        layer, scale = self.encoder_layers[index], (self.d_model // self.encoder_heads) ** -0.5
        attended = verbs.self_attention(self._input(verbs, x), layer.qkv, layer.qkv_bias, scale)
        x = self._sublayer(verbs, x, attended, layer.out, layer.out_bias, layer.attention_norm)
        return self._feed_forward(verbs, x, layer)

    def encoder_output(self, verbs, x):
        return x if self.encoder_final_norm is None else self._normalized(verbs, x, self.encoder_final_norm)

    def cross_keys_values(self, verbs, encoded):
        return verbs.matmul(encoded, self.cross_kv, self.cross_kv_bias)
