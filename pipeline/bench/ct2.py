"""CTranslate2 as a baseline for our benchmarks: both models of a pair converted and loaded as
`CT2Model`s (pipeline/decoding/engines/ct2_engine.py), in float32 and in int8, beside our own engines."""

from __future__ import annotations

from pathlib import Path

from pipeline.decoding.engines.ct2_engine import CT2Model, available

__all__ = ["CT2Model", "available", "convert_pair"]


def convert_pair(pair, work_dir: str | Path, *, threads: int = 1, compute_type: str = "float32") -> dict[str, CT2Model]:
    """{"small": ..., "large": ..., "small_int8": ..., "large_int8": ...}: both models of a ModelPair as
    CTranslate2 would run them, in `compute_type` and in int8.

    Each model is saved (with the pair's tokenizer) under `work_dir` and converted from there, so a
    pair built in memory converts as well as one loaded from a folder.
    """
    converted = {}
    for role in ("small", "large"):
        saved = Path(work_dir) / role
        getattr(pair, role).save_pretrained(saved)
        pair.tokenizer.save_pretrained(saved)
        converted[role] = CT2Model.convert(saved, Path(work_dir) / f"{role}-ct2", threads=threads,
                                           compute_type=compute_type)
        converted[f"{role}_int8"] = converted[role].with_compute_type("int8", Path(work_dir) / f"{role}-ct2", threads)
    return converted
