"""The native engine as the registry sees it (registry.py): which models it runs (the T5 and BART families),
their weights laid out once per model (int8 where asked), and an engine of any number of slots on them."""

from __future__ import annotations

from transformers import PreTrainedModel

from pipeline.decoding.engines import bart_engine, t5_engine
from pipeline.decoding.engines.native import NativeEngine, NativeWeights

# The model families it runs: each module has unsupported_reason(model), head_size(config) and a weights class.
NATIVE_FAMILIES = ((t5_engine, t5_engine.T5Weights), (bart_engine, bart_engine.BartWeights))


def family_of(model: PreTrainedModel):
    """The family module that runs ``model``, or None."""
    return next((family for family, _ in NATIVE_FAMILIES if family.unsupported_reason(model) is None), None)


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why no native engine runs ``model`` (None when one does)."""
    if family_of(model) is not None:
        return None
    return f"no native engine for {type(model).__name__} ({model.config.model_type})"


def native_weights(model: PreTrainedModel, quantize: str = "none") -> NativeWeights:
    """``model``'s weights laid out by its family for the native engine (int8 where ``quantize`` asks)."""
    for family, weights in NATIVE_FAMILIES:
        if family.unsupported_reason(model) is None:
            return weights(model, quantize)
    raise ValueError(unsupported_reason(model))


def prepare(model: PreTrainedModel, quantize: str = "none") -> NativeWeights:
    return native_weights(model, quantize)


def build(model: PreTrainedModel, prepared: NativeWeights, slots: int) -> NativeEngine:
    return NativeEngine(prepared, slots)
