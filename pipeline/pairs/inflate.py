"""Function-preserving inflation of a trained T5-family pair to real checkpoints' shapes.

A decode step's cost is set by a model's shapes, its quality by its weights. Random weights at real
shapes (random_shapes.py) time a step but draft nothing worth keeping, so BiLD's acceptance there means
nothing. A trained T5 can instead be grown to a larger shape *without changing what it computes*:

- every width is zero-padded: the residual stream's extra channels start at zero and stay zero,
  because every matrix that writes into them is zero there;
- added attention heads and feed-forward units have zero weights (their output projections are
  zero, so whatever they attend to adds nothing; relu/gelu/silu map 0 to 0);
- added layers are all zero: a residual branch whose weights are zero adds nothing;
- each RMSNorm's mean of squares now runs over ``d`` channels of which ``d0`` are non-zero, so its
  weight is divided by sqrt(d / d0) and its epsilon multiplied by d0 / d: the normalized values of
  the original channels are then exactly what they were;
- with tied embeddings T5 scales the decoder's output by d^-0.5 before the head: the decoder's final
  norm makes up sqrt(d / d0) of it.

Padding adds zero terms to every dot product, so logits move only by float summation order (about
1e-6 relative). Zero rows and channels are ordinary weights to every dense kernel we run (int8 scales
are clamped, never zero), so a step is priced by its shape, as a random model's of that shape would be.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, T5Config, T5ForConditionalGeneration

# name -> {role: the shape the role's model grows to}; d_kv stays the source's (64 in T5's shapes).
SHAPES = {
    "t5": {  # T5-small / T5-large (Raffel et al. 2020), the BiLD paper's pair
        "small": dict(d_model=512, d_ff=2048, num_heads=8, num_layers=6, num_decoder_layers=6),
        "large": dict(d_model=1024, d_ff=4096, num_heads=16, num_layers=24, num_decoder_layers=24),
    },
    "t5-base": {  # T5-small / T5-base
        "small": dict(d_model=512, d_ff=2048, num_heads=8, num_layers=6, num_decoder_layers=6),
        "large": dict(d_model=768, d_ff=3072, num_heads=12, num_layers=12, num_decoder_layers=12),
    },
}
SHAPE_KEYS = ("d_model", "d_ff", "num_heads", "num_layers", "num_decoder_layers")
# Activations that map 0 to 0, so that zero feed-forward units stay silent.
ZERO_PRESERVING_ACTIVATIONS = {"relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish"}


class InflationError(ValueError):
    """The model cannot be inflated to the shape asked for without changing its function."""


def inflate_t5(model: T5ForConditionalGeneration, **shape: int) -> T5ForConditionalGeneration:
    """``model`` grown to ``shape`` (any of SHAPE_KEYS; the others stay), computing the same function."""
    config = model.config
    _check(model, shape)
    grown = T5Config.from_dict({**config.to_dict(), **shape})
    ratio = grown.d_model / config.d_model
    grown.layer_norm_epsilon = config.layer_norm_epsilon / ratio
    grown.dropout_rate = 0.0
    grown.dtype = "float32"
    with torch.device("meta"):
        target = T5ForConditionalGeneration(grown)
    state = {name: torch.zeros(tensor.shape, dtype=torch.float32) for name, tensor in target.state_dict().items()}
    for name, tensor in model.state_dict().items():
        corner = tuple(slice(0, size) for size in tensor.shape)
        state[name][corner] = tensor.float()  # every original weight in the top-left corner of its grown self
        if name.endswith("layer_norm.weight"):
            state[name][corner] /= math.sqrt(ratio)
    if _scales_decoder_outputs(config):  # the head's d^-0.5 grew smaller by sqrt(ratio): the final norm makes it up
        state["decoder.final_layer_norm.weight"] *= math.sqrt(ratio)
    target.load_state_dict(state, assign=True)
    target.tie_weights()
    target.generation_config = GenerationConfig.from_dict(model.generation_config.to_dict())
    return target.eval()


def _scales_decoder_outputs(config: T5Config) -> bool:
    return bool(getattr(config, "scale_decoder_outputs", config.tie_word_embeddings))


def _check(model, shape: dict[str, int]) -> None:
    config = model.config
    if type(model) is not T5ForConditionalGeneration or config.model_type != "t5":
        raise InflationError(f"only T5 models inflate (RMS norm, no biases); got {type(model).__name__} "
                             f"({config.model_type}): a LayerNorm centres by the mean, so zero padding changes it")
    unknown = sorted(set(shape) - set(SHAPE_KEYS))
    if unknown:
        raise InflationError(f"unknown shape keys {unknown}; the shape is {', '.join(SHAPE_KEYS)}")
    for key, size in shape.items():
        if size < getattr(config, key):
            raise InflationError(f"{key} {size} is below the model's {getattr(config, key)}: inflation only grows")
    if config.dense_act_fn not in ZERO_PRESERVING_ACTIVATIONS:
        raise InflationError(f"activation {config.dense_act_fn!r} does not map 0 to 0")


def inflate_pair(small: str | Path, large: str | Path, out_dir: str | Path, shapes: str = "t5",
                 overrides: dict[str, dict[str, int]] | None = None) -> tuple[Path, Path]:
    """Inflate a saved pair to ``SHAPES[shapes]`` (each role's keys replaced by ``overrides[role]``)
    into OUT_DIR/small and OUT_DIR/large: float32 safetensors, the tokenizer beside each."""
    if shapes not in SHAPES:
        raise InflationError(f"shapes {shapes!r}: one of {', '.join(SHAPES)}")
    written = []
    for role, source in (("small", small), ("large", large)):
        shape = {**SHAPES[shapes][role], **(overrides or {}).get(role, {})}
        model = T5ForConditionalGeneration.from_pretrained(source, dtype=torch.float32, use_safetensors=True)
        target = Path(out_dir) / role
        inflate_t5(model, **shape).save_pretrained(target)
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
        written.append(target)
    return written[0], written[1]
