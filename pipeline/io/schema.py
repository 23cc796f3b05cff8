"""The output table's columns (docs/design.md §2), built once: every writer and reader takes them here.

The per-record counters come from the decoding statistics type, so a counter added there is a
column here without a second list to keep in step.
"""

from __future__ import annotations

from dataclasses import fields

import pyarrow as pa

from pipeline.decoding.stats import DecodeStats

STATS_COLUMNS = [field.name for field in fields(DecodeStats)]

OUTPUT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("prediction", pa.string()),
        ("reference", pa.string()),
        ("error", pa.string()),
        ("method", pa.string()),
        ("input_tokens", pa.int32()),
        ("truncated", pa.bool_()),
        # Sentences the record was split into and decoded as units (input.segment: sentence; the row's
        # counters are their sums), else 1.
        ("segments", pa.int32()),
        *[(name, pa.int32()) for name in STATS_COLUMNS],
        ("latency_ms", pa.float64()),
        # The row's flags (decoding/generator.py): the output ran to decoding.max_new_tokens without EOS;
        # its tail loops (its last n tokens or words, n <= 4, repeated 3 times); source tokens that became
        # the tokenizer's unknown token. Null on error rows (unknown_tokens: where the input never encoded).
        ("stopped_by_budget", pa.bool_()),
        ("repetition", pa.bool_()),
        ("unknown_tokens", pa.int32()),
        ("job_name", pa.string()),
        ("config_hash", pa.string()),
        ("worker", pa.string()),  # host:pid of the actor that decoded the row (per-actor throughput)
        ("engine", pa.string()),  # the engine that ran the models: "native", "hf", "onnx" or "ct2"
        ("quantize", pa.string()),  # how its weights were multiplied: "none" or "int8" (models.quantize)
        # What ran, as its engines say (Engine.attention_path, Engine.int8_scheme): "model", or the onnx
        # engine's "kernel" or "onnxruntime"; the int8 scheme (e.g. "fbgemm-int8-per-channel"), null in float.
        ("attention", pa.string()),
        ("int8_scheme", pa.string()),
        # The actor call that decoded the row: when it began (Unix seconds) and how long its decoding
        # took, report.baseline's passes excluded. Every row of a call carries the same two values;
        # the union of a worker's calls is its busy time.
        ("call_started_at", pa.float64()),
        ("call_seconds", pa.float64()),
        # report.baseline: the same record decoded by the baseline method too, on the same actor
        # and in the same call (side by side); null where the record was not paired.
        ("baseline_method", pa.string()),
        ("baseline_engine", pa.string()),  # what ran it (report.baseline_engine, default: the job's engine)
        ("baseline_prediction", pa.string()),
        ("baseline_error", pa.string()),
        ("baseline_output_tokens", pa.int32()),
        ("baseline_latency_ms", pa.float64()),
        # The row's quality statistics against its reference, counted by the actor that wrote it
        # (metrics.quality: sacrebleu's BLEU then chrF sufficient statistics, or ROUGE F-measures, in
        # stat_columns order); null without a reference or on error. A report sums them, so scoring
        # a run of any size is a sum of columns; rows without them (older runs) are counted then.
        ("quality_stats", pa.list_(pa.float64())),
        # Where the record came from (io/fragments.py): its file's path inside input.path and its row there, from
        # 0. A resume reads these two columns, not the ids, to know what is done.
        ("input_file", pa.string()),
        ("input_row", pa.int64()),
        # input.language_check (io/language.py): the language the record's text was detected in (ISO 639-1) and
        # how sure the detector was (its probability); null where the check was off. `skipped`: "language" where
        # input.language_check skip returned the record untranslated (its prediction is its text), else null.
        ("detected_language", pa.string()),
        ("language_confidence", pa.float64()),
        ("skipped", pa.string()),
    ]
)
SWEEP_SCHEMA = OUTPUT_SCHEMA.append(pa.field("point", pa.string()))  # sweeps: which grid point

# What reports and sweeps bring to the driver for every row: counters, times, errors, who decoded
# it and its reference; not the texts the models wrote, nor the labels every row of a run repeats.
NOT_NUMERIC = ("id", "prediction", "method", "input_tokens", "truncated", "job_name", "config_hash",
               "baseline_prediction", "quality_stats", "input_file", "input_row")
NUMERIC_COLUMNS = [name for name in OUTPUT_SCHEMA.names if name not in NOT_NUMERIC]
