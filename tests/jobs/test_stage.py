"""The decoding stage (one model pair per actor, one output row per input row) called directly,
without Ray, and the job keys that set its batching."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from pipeline.decoding import BatchPolicy, DecodingConfig, ModelSpec
from pipeline.jobs.schema import ComputeSection
from pipeline.stage import DecodeStage, DecodeStageSpec, PairedBaseline
from support.pairs import TEXTS

MAX_NEW = 24
# Inputs of different lengths, so that batched rows finish at different times and others join.
INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut.",
                  "Die Sonne scheint.", "Ein alter Mann liest eine Zeitung auf der Bank vor dem Haus."]


def test_the_stage_decodes_a_call_together_with_the_same_rows_as_one_by_one(saved_tiny_pair):
    small, large = saved_tiny_pair
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, fallback_threshold=0.5, adaptive_draft=False)
    records = pa.table({"id": [f"r{i}" for i in range(8)], "text": INPUTS, "reference": ["x"] * 8,
                        "input_error": [None] * 7 + ["unreadable"]})
    tables = {}
    for size in (1, 4):
        spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu"), points=(("bild", config),),
                               prompt=None, job_name="t", config_hash="h", batch=BatchPolicy(size))
        tables[size] = DecodeStage(spec)(records).to_pylist()
    one, batched = tables[1], tables[4]
    assert [r["id"] for r in batched] == [r["id"] for r in one]
    same = ("prediction", "error", "output_tokens", "small_tokens", "large_tokens", "fallbacks", "rollbacks",
            "small_calls", "large_calls", "draft_tokens")
    assert [[r[k] for k in same] for r in batched] == [[r[k] for k in same] for r in one]
    assert batched[-1]["error"] == "unreadable"
    assert all(r["latency_ms"] > 0 for r in batched[:-1])


def test_job_compute_keys_map_onto_the_batch_policy():
    compute = ComputeSection()
    assert compute.verify_share == BatchPolicy().verify_share
    assert compute.records_per_actor_call() == 4 * compute.batch_size
    assert ComputeSection(batch_size=16, records_per_call=100).records_per_actor_call() == 100
    with pytest.raises(ValueError, match="verify_share"):
        ComputeSection(verify_share=0)


def test_a_baseline_on_another_engine_runs_on_that_engine(saved_tiny_pair):
    """report.baseline_engine hf beside a native job: the baseline pass gets a pair of its own on the Hugging
    Face engine (the rows say so), and greedy `large` gives the same texts on both."""
    small, large = saved_tiny_pair
    records = pa.table({"id": ["a", "b"], "text": INPUTS[:2], "reference": ["x", "y"], "input_error": [None, None]})
    large_config = DecodingConfig(method="large", max_new_tokens=MAX_NEW)
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu", engine="native"),
                           points=(("large", large_config),), prompt=None, job_name="t", config_hash="h",
                           baseline=PairedBaseline(large_config, ModelSpec(small, large, device="cpu", engine="hf"),
                                                   frozenset(["a", "b"])))
    stage = DecodeStage(spec)
    rows = stage(records).to_pylist()
    assert [row["engine"] for row in rows] == ["native"] * 2 and [row["baseline_engine"] for row in rows] == ["hf"] * 2
    assert sorted(stage._pairs) == ["hf", "native"]
    assert [row["baseline_prediction"] for row in rows] == [row["prediction"] for row in rows]


def test_record_by_record_the_passes_take_turns_going_first(saved_tiny_pair):
    """A job's point and its paired baseline swap places from record to record (across calls too), so that
    neither always meets the caches as the other left them; the rows are what a fixed order gives."""
    small, large = saved_tiny_pair
    records = pa.table({"id": ["a", "b", "c"], "text": INPUTS[:3], "reference": ["x"] * 3, "input_error": [None] * 3})
    bild = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, fallback_threshold=0.5, adaptive_draft=False)
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu"), points=(("bild", bild),), prompt=None,
                           job_name="t", config_hash="h",
                           baseline=PairedBaseline(DecodingConfig(method="large", max_new_tokens=MAX_NEW),
                                                   ModelSpec(small, large, device="cpu"), frozenset(["a", "b", "c"])))
    stage = DecodeStage(spec)
    ran = []
    for name, generator in stage.passes:
        generator.generate = (lambda texts, *args, name=name, decode=generator.generate, **kwargs:
                              ran.append(name) or decode(texts, *args, **kwargs))
    rows = stage(records).to_pylist() + stage(records.slice(0, 1)).to_pylist()
    assert ran == ["bild", "baseline", "baseline", "bild", "bild", "baseline", "baseline", "bild"]
    stage.calls_seen, ran[:] = 0, []  # calls of two records: each call's first record goes first with each pass
    for _ in range(4):
        stage(records.slice(0, 2))
    assert ran[::4] == ["bild", "baseline", "bild", "baseline"]
    batched = DecodeStage(dataclasses.replace(spec, batch=BatchPolicy(2)))  # a call's records decoded together: by call
    for name, generator in batched.passes:
        generator.generate = (lambda texts, *args, name=name, decode=generator.generate, **kwargs:
                              ran.append(name) or decode(texts, *args, **kwargs))
    ran[:] = []
    for _ in range(2):
        batched(records.slice(0, 2))
    assert ran == ["bild", "baseline", "baseline", "bild"]
    fixed = DecodeStage(spec)
    fixed.pass_orders = [[0, 1]]
    same = ("id", "prediction", "baseline_prediction", "small_tokens", "large_tokens", "fallbacks", "rollbacks")
    fixed_rows = fixed(records).to_pylist() + fixed(records.slice(0, 1)).to_pylist()
    assert [[row[key] for key in same] for row in rows] == [[row[key] for key in same] for row in fixed_rows]
