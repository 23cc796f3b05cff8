"""A small/large pair of Hugging Face models that share one vocabulary."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from pipeline.decoding.config import DTYPE_NAMES, ModelSpec
from pipeline.decoding.engine import Engine
from pipeline.decoding.engines import registry
from pipeline.decoding.engines.native_pair import native_weights, unsupported_reason as native_unsupported_reason
from pipeline.decoding.pair_check import IncompatiblePairError, check_configs, check_pair
from pipeline.decoding.rules import engine_problem

__all__ = ["ModelPair", "build_engine", "load_model", "native_unsupported_reason", "native_weights", "prepare",
           "resolve_device", "resolve_dtype", "resolve_engine"]
log = logging.getLogger(__name__)

# The torch dtype of each name config.DTYPE_NAMES allows ("auto" is resolved per device below).
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if name != "auto"}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto" means bfloat16 on a GPU that supports it, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load_model(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a hub id or a local ``save_pretrained`` folder as a seq2seq or causal LM, in eval mode."""
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto_class.from_pretrained(
        name_or_path, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code
    )
    return model.to(device).eval()


def _vocabulary_size(model: PreTrainedModel) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


@dataclass
class ModelPair:
    """The small (drafting) and large (verifying) model, their shared tokenizer and device.

    ``engine_request`` asks for the engine the pair decodes on (engine.py; the job key
    ``models.engine``): ``auto`` and ``native`` take the native engine where both models have one
    and fall back to Hugging Face's modules with one log line; ``hf`` always runs Hugging Face's.
    ``engine_kind`` says which one runs. ``engine(role, slots)`` builds them.
    """

    small: PreTrainedModel
    large: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    engine_request: str = "auto"
    quantize: str = "none"  # config.QUANTIZE_NAMES: "int8" runs int8 matrices where they pay (engines/int8.py)
    _engines: dict = field(default_factory=dict, init=False, repr=False)
    _prepared: dict = field(default_factory=dict, init=False, repr=False)  # role -> prepare()'s

    def __post_init__(self) -> None:
        check_compatible(self.small, self.large)
        self.is_encoder_decoder = bool(self.large.config.is_encoder_decoder)
        self.eos_token_ids = _eos_token_ids(self.large, self.tokenizer)
        self.decoder_start_token_id = getattr(self.large.config, "decoder_start_token_id", None)
        if self.is_encoder_decoder and self.decoder_start_token_id is None:
            raise IncompatiblePairError("the large model's config has no decoder_start_token_id")
        # A small model cut out of the large one (pipeline/training/shrink.py) keeps its encoder:
        # then one encoder pass serves both decoders.
        self.shares_encoder = self.is_encoder_decoder and same_encoder(self.small, self.large)
        self.engine_kind = resolve_engine(self.engine_request, {"small": self.small, "large": self.large})
        problem = engine_problem(self.engine_kind, self.quantize, self.device.type, self.dtype_name)
        if problem:  # the job schema asked before the device and engine were resolved
            resolved = "" if self.engine_kind == self.engine_request else \
                f" (models.engine {self.engine_request!r} runs this pair on the {self.engine_kind} engine)"
            raise ValueError(problem + resolved)

    @property
    def dtype_name(self) -> str:
        """What the reports say the weights are: the models' torch dtype, e.g. "float32"."""
        return str(self.large.dtype).removeprefix("torch.")

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "ModelPair":
        """The pair a job, the CLI or a decoding actor describes."""
        return cls.from_pretrained(spec.small, spec.large, tokenizer=spec.tokenizer, dtype=spec.dtype,
                                   device=spec.device, trust_remote_code=spec.trust_remote_code, engine=spec.engine,
                                   quantize=spec.quantize)

    @classmethod
    def from_pretrained(
        cls,
        small: str,
        large: str,
        *,
        tokenizer: str | None = None,
        dtype: str | torch.dtype = "float32",
        device: str = "auto",
        trust_remote_code: bool = False,
        engine: str = "auto",
        quantize: str = "none",
    ) -> "ModelPair":
        """Load both models by hub id or local folder; the tokenizer defaults to the large model's."""
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        shared_tokenizer = check_pair(small, large, tokenizer, trust_remote_code)  # before loading any weights
        load = dict(dtype=torch_dtype, device=torch_device, trust_remote_code=trust_remote_code)
        return cls(
            small=load_model(small, **load),
            large=load_model(large, **load),
            tokenizer=shared_tokenizer,
            device=torch_device,
            engine_request=engine,
            quantize=quantize,
        )

    def engine(self, role: str, slots: int) -> Engine:
        """The engine of the ``role`` ("small" or "large") model with room for ``slots`` rows.

        Built once per (role, slots) and reused: decoding on one pair is sequential, and every
        admitted row starts from an empty slot. The native engines share one prepared copy of
        each model's weights.
        """
        key, model = (role, slots), getattr(self, role)
        if key not in self._engines:
            if role not in self._prepared:
                self._prepared[role] = prepare(model, self.engine_kind, self.quantize)
            self._engines[key] = build_engine(model, self.engine_kind, slots, prepared=self._prepared[role])
        return self._engines[key]

    def decoder_prefix(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A request's decoder prefix [P]: the start token (encoder-decoder) or the prompt itself.

        A model whose generation config forces the first token (``forced_bos_token_id``: mBART's and
        NLLB's target language, BART-CNN's <s>) gets it in the prefix, as generate() forces it."""
        if not self.is_encoder_decoder:
            return input_ids.cpu()
        forced = getattr(self.large.generation_config, "forced_bos_token_id", None)
        return torch.tensor([self.decoder_start_token_id] + ([forced] if forced is not None else []), dtype=torch.long)


def resolve_engine(requested: str, models: dict[str, PreTrainedModel]) -> str:
    """The pair engine ``models`` (role -> model) run on: ``requested`` where every model runs on it, else the
    first engine down its registry line's falls_back_to that runs them all. A fallback is logged once, with why;
    the output is never wrong, only slower."""
    if not registry.entry(requested).pair:
        raise ValueError(f"a model pair's engine is one of {', '.join(registry.PAIR_ENGINES)}, got {requested!r}")
    name, why = registry.AUTO if requested == "auto" else requested, {}
    while True:
        missing = {role: reason for role, model in models.items() if (reason := _module(name).unsupported_reason(model))}
        if not missing:
            break
        why, name = missing, registry.entry(name).falls_back_to
    if why:
        shown = "the Hugging Face" if name == "hf" else f"the {name}"
        log.warning("engine %s: running on %s engine (%s)", requested, shown,
                    "; ".join(f"{role}: {reason}" for role, reason in why.items()))
    return name


def _module(engine: str):
    """A pair engine's module (its registry line): unsupported_reason, prepare and build."""
    return importlib.import_module(registry.entry(engine).module)


def prepare(model: PreTrainedModel, kind: str, quantize: str = "none"):
    """What ``model``'s engines of ``kind`` share whatever their slots (the native engine's weights, int8 where
    ``quantize`` asks; the onnx engine's sessions; nothing for Hugging Face's)."""
    return _module(kind).prepare(model, quantize)


def build_engine(model: PreTrainedModel, kind: str, slots: int, quantize: str = "none", *, prepared=None) -> Engine:
    """An engine of ``kind`` (a pair engine) for ``model`` with ``slots`` rows, its matrices ``quantize``d; or on
    ``prepared`` (``prepare``'s result, quantized as it was prepared)."""
    if prepared is not None and quantize != "none":
        raise ValueError("build_engine: pass quantize or prepared, not both (prepared weights are quantized already)")
    prepared = prepare(model, kind, quantize) if prepared is None else prepared
    return _module(kind).build(model, prepared, slots)


def same_encoder(small: PreTrainedModel, large: PreTrainedModel) -> bool:
    """Whether both models hold the very same encoder (same weights, shapes and config)."""
    small_encoder, large_encoder = small.get_encoder(), large.get_encoder()
    if small_encoder is large_encoder:
        return True
    small_state, large_state = small_encoder.state_dict(), large_encoder.state_dict()
    if small_state.keys() != large_state.keys():
        return False
    if any(small_state[k].shape != large_state[k].shape for k in small_state):
        return False
    same_settings = all(
        getattr(small.config, name, None) == getattr(large.config, name, None)
        for name in ("num_layers", "encoder_layers", "d_model", "num_heads", "feed_forward_proj", "layer_norm_epsilon",
                     "relative_attention_num_buckets", "relative_attention_max_distance")
    )
    return same_settings and all(torch.equal(small_state[k], large_state[k]) for k in small_state)


def check_compatible(small: PreTrainedModel, large: PreTrainedModel) -> None:
    """Raise IncompatiblePairError unless the two models can draft for / verify each other."""
    check_configs(small.config, large.config)
    if _vocabulary_size(small) != _vocabulary_size(large):
        raise IncompatiblePairError(
            f"the small and large model have different vocabularies ({_vocabulary_size(small)} vs "
            f"{_vocabulary_size(large)} output logits); BiLD needs a pair that shares one tokenizer"
        )
    if small.config.is_encoder_decoder and (
        small.config.decoder_start_token_id != large.config.decoder_start_token_id
    ):
        raise IncompatiblePairError(
            f"the models start decoding from different tokens (decoder_start_token_id "
            f"{small.config.decoder_start_token_id} vs {large.config.decoder_start_token_id})"
        )
