"""Which engines a job can name (models.engine), one line each: what it is, and where its code lives.

A *pair engine* runs the small and the large model and serves the scheduler's verbs (engine.py); its module
defines ``unsupported_reason(model)``, ``prepare(model, quantize)`` and ``build(model, prepared, slots)``, and
where a model cannot run on it the pair runs on ``falls_back_to``. A *whole decoder* decodes ids by itself (one
model alone, CTranslate2); its module defines ``open_decoder(spec, config, threads)``. Either way the stage
and ``generate`` hold a ``Decoder`` (decoder.py), opened by ``decoders.open_decoder``.

Adding an engine: its module, and one line here. Pure data (no torch): config.py and the job schema read
the names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineEntry:
    module: str  # where its code lives (imported when a job uses it)
    help: str  # one line for the job schema and --engine
    falls_back_to: str | None = None  # pair engines: where a model it cannot run goes
    pair: bool = True  # False: a whole decoder (one model decodes alone)


ENGINE_ENTRIES: dict[str, EngineEntry] = {
    "native": EngineEntry("pipeline.decoding.engines.native_pair", falls_back_to="hf",
                          help="our own forward pass where the architecture has one (the T5 and BART families), "
                               "else Hugging Face's modules (logged once per actor)"),
    "hf": EngineEntry("pipeline.decoding.engines.hf_engine", help="always Hugging Face's modules"),
    "onnx": EngineEntry("pipeline.decoding.engines.onnx_engine", falls_back_to="native",
                        help="the native engine with its decoder step run by onnxruntime (CPU, float32; the "
                             "fastest on a CPU)"),
    "ct2": EngineEntry("pipeline.decoding.ct2_decoder", pair=False,
                       help="CTranslate2 (methods large and small: the model decodes alone; converted once per "
                            "checkpoint into models.ct2_cache; a converted CTranslate2 folder is taken as it is)"),
}
AUTO = "native"  # what models.engine auto runs: the native engine where it can, else Hugging Face's

PAIR_ENGINES: tuple[str, ...] = ("auto", *(name for name, entry in ENGINE_ENTRIES.items() if entry.pair))
ENGINES: tuple[str, ...] = (*PAIR_ENGINES, *(name for name, entry in ENGINE_ENTRIES.items() if not entry.pair))


def entry(name: str) -> EngineEntry:
    """The entry of engine ``name`` ("auto" is AUTO's)."""
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINE_ENTRIES[AUTO if name == "auto" else name]


def engines_help(names: tuple[str, ...] = ENGINES) -> str:
    """One help text for models.engine and --engine: each of ``names`` with its line."""
    lines = [f"{name}: {'as ' + AUTO if name == 'auto' else entry(name).help}" for name in names]
    return "; ".join(lines) + "."
