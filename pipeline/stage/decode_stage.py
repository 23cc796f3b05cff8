"""The Ray Data decoding stage: one model pair per actor, one output row per input row, always.

``DecodeStageSpec`` describes the stage (what to load, how to decode); ``DecodeStage`` is the
callable class Ray Data instantiates once per actor and calls with batches of records.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.decoding.config import BatchPolicy, DecodingConfig, ModelSpec
from pipeline.decoding.stats import GenerationResult
from pipeline.stage.in_flight import CallGuard, crash_error, kill_if_chosen
from pipeline.io.language import SKIPPED, LanguageCheck, detect
from pipeline.io.markup import MarkupError, parse_page
from pipeline.io.records import apply_prompt
from pipeline.io.schema import OUTPUT_SCHEMA, SWEEP_SCHEMA
from pipeline.io.segments import Unit, decode_records, documents_of, unit_key
from pipeline.metrics import quality as q
from pipeline.metrics.interleaving import balanced_orders

if TYPE_CHECKING:
    from pipeline.decoding import Generator, ModelPair

BASELINE = "baseline"  # the pass that decodes a job's paired records with report.baseline
DOCUMENT = "_document"  # input.segment sentence: a record's io.segments.Document (input.markup: its MarkedPage)
LANGUAGE = "_language"  # input.language_check: a record's io.language.Detected, beside its text


@dataclass(frozen=True)
class PairedBaseline:
    """report.baseline: a second method that decodes the job's first records beside the job's own, on the same
    actor and in the same calls (the rows' baseline_* columns)."""

    config: DecodingConfig
    models: ModelSpec  # the job's models on report.baseline_engine (default: models.engine)
    ids: frozenset[str]  # the records it also decodes


@dataclass(frozen=True)
class DecodeStageSpec:
    """Everything an actor needs, as plain data (it is shipped to every actor).

    ``points`` are the named decoding configurations to run on every record: one for a job,
    the whole grid for a sweep (so the loaded pair is reused across grid points, and all points
    of a record are timed side by side on the same actor).
    """

    models: ModelSpec
    points: tuple[tuple[str, DecodingConfig], ...]
    prompt: str | None
    job_name: str
    config_hash: str
    torch_threads: int = 1
    sweep: bool = False  # adds the `point` column
    batch: BatchPolicy = BatchPolicy(batch_size=1)  # compute's batching keys; > 1: a call's records decoded together
    baseline: PairedBaseline | None = None
    task: str = "translation"  # which quality statistics each row with a reference carries
    in_flight_registry: str | None = None  # the run's InFlightRecords actor (pipeline/stage/in_flight.py)
    segment: str = "none"  # input.segment: "sentence" decodes each record's sentences as units (io/segments.py)
    markup: str = "none"  # input.markup: html or xml pages, their text decoded and their markup kept (io/markup.py)
    language: str = "en"  # input.language: the sentence splitter's rules
    language_check: LanguageCheck | None = None  # input.language_check flag or skip (io/language.py)


def _segments(row: dict) -> int:
    """The row's `segments` column: its sentences where the job segments (0: an empty document), else 1."""
    if DOCUMENT not in row:
        return 1
    return len(row[DOCUMENT].sentences) if row[DOCUMENT] else 0


def _read_page(row: dict, markup: str, language: str, segment: str) -> None:
    """A record's page as its MarkedPage beside its text; markup that does not parse is the record's input error."""
    if row.get("input_error") or not isinstance(row.get("text"), str):
        return
    try:
        row[DOCUMENT] = parse_page(row["text"], markup, language, segment)
    except MarkupError as error:
        row["input_error"] = f"input.markup {markup}: {error}"


def _language_columns(detected, skipped: bool) -> dict:
    """A row's detected_language, language_confidence and skipped columns."""
    return {"detected_language": detected.language if detected else None,
            "language_confidence": detected.confidence if detected else None,
            "skipped": SKIPPED if skipped else None}


def record_seed(base_seed: int, record_id: str) -> int:
    """A per-record seed: the same for a record wherever and whenever it is decoded."""
    return (base_seed * 1_000_003 + zlib.crc32(record_id.encode("utf-8"))) % (2**63)


class DecodeStage:
    def __init__(self, spec: DecodeStageSpec, done_points: dict[str, list[str]] | None = None):
        import torch
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(max(1, spec.torch_threads))
        hf_logging.disable_progress_bar()  # one weight-loading bar per actor is noise in any log
        self.spec = spec
        self.done_points = {key: set(points) for key, points in (done_points or {}).items()}
        self._pairs: dict[str, ModelPair] = {}  # one loaded pair per pair engine the passes ask for
        self.generators = [(name, self._decoder(spec.models, config)) for name, config in spec.points]
        self.passes = self.generators + ([(BASELINE, self._decoder(spec.baseline.models, spec.baseline.config))]
                                         if spec.baseline else [])
        # The passes take turns in balanced orders, record by record (or call by call, where a call's records
        # are decoded together): a pass that always ran first (or after the same other pass) would meet the
        # caches in the same state every time, a bias on its paired speed. Call k's records take the orders from
        # the k-th on, so that the first record of a call, which meets what Ray did between the calls, goes
        # first with each pass in turn (counted by records, the demo's calls of 4 began with `bild` every time:
        # its first records ran 11% slower than the baseline's).
        self.pass_orders, self.calls_seen = balanced_orders(len(self.passes)), 0
        self.batch_policy = spec.batch
        self.schema = SWEEP_SCHEMA if spec.sweep else OUTPUT_SCHEMA
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.guard = CallGuard(spec.in_flight_registry, self.worker)
        for _, generator in self.passes:  # first-call set-up must not count as a record's latency
            generator.generate(["warm up", "warm up"], batch=self.batch_policy)
        for _, generator in self.passes:  # ... nor as what the window choosers measure: they learn what rounds
            generator.decoder.forget_measurements()  # cost from scripted ones instead, before the first record
        for _, generator in self.passes:
            generator.calibrate(self.batch_policy)

    def _decoder(self, models: ModelSpec, config: DecodingConfig) -> Generator:
        """A Generator over the Decoder of that engine (decoders.open_decoder; a pair engine's pair loaded once
        per engine); its ran() is what the output's columns say ran."""
        # Imported here, in the actor: a job's driver imports this module for the class alone, and torch with
        # transformers' model loading took 3 of its 4 s of imports, all before Ray started.
        from pipeline.decoding.decoders import open_generator

        return open_generator(models, config, threads=max(1, self.spec.torch_threads), pairs=self._pairs)

    def __call__(self, batch: pa.Table) -> pa.Table:
        records = batch.to_pylist()
        if self.spec.markup != "none":  # read once, for every pass: the stage's own key, never written
            for row in records:
                _read_page(row, self.spec.markup, self.spec.language, self.spec.segment)
        elif self.spec.segment == "sentence":  # split once, for every pass
            for row, document in zip(records, documents_of(records, self.spec.language)):
                row[DOCUMENT] = document
        if self.spec.language_check is not None:  # detected once, for every pass (another key of the stage's)
            for row in records:
                text = " ".join(row[DOCUMENT].sentences) if row.get(DOCUMENT) is not None else row["text"]
                if not row.get("input_error") and isinstance(text, str) and text.strip():
                    row[LANGUAGE] = detect(text)
        ids = [row["id"] for row in records]
        killers, retried = self.guard.begin(ids)  # a retry after a crash decodes record by record
        try:
            return self._decode_call(records, killers, retried)
        finally:
            self.guard.end(ids)

    def _decode_call(self, records: list[dict], killers: dict[str, str], retried: bool) -> pa.Table:
        """The call's output rows; a call retried after its actor died decodes record by record, each
        registered as alone in flight, and gives the records that killed an actor alone an error row."""
        check = self.spec.language_check
        skipped = {i for i, row in enumerate(records) if LANGUAGE in row and check.skips(row[LANGUAGE])}
        todo = {name: [i for i, row in enumerate(records) if name not in self.done_points.get(row["id"], ())
                       and row["id"] not in killers and i not in skipped] for name, _ in self.generators}
        todo[BASELINE] = [i for i, row in enumerate(records) if self.spec.baseline and row["id"] in self.spec.baseline.ids
                          and row["id"] not in killers and i not in skipped]
        results: dict[tuple[int, str], GenerationResult] = {
            (i, name): GenerationResult(prediction=None, error=crash_error(killers[row["id"]]), method=config.method)
            for i, row in enumerate(records) if row["id"] in killers for name, config in self.spec.points
            if name not in self.done_points.get(row["id"], ())}
        results.update({  # in another language: returned as it is, untranslated, not an error
            (i, name): GenerationResult(prediction=records[i]["text"], error=None, method=config.method,
                                        latency_ms=None)
            for i in skipped for name, config in self.spec.points
            if name not in self.done_points.get(records[i]["id"], ())})
        call, seconds = {"call_started_at": time.time()}, dict.fromkeys(todo, 0.0)
        first_order, self.calls_seen = self.calls_seen, self.calls_seen + 1
        if retried or self.batch_policy.batch_size == 1:  # record by record: a record's points side by side
            for i, row in enumerate(records):
                order = self.pass_orders[(first_order + i) % len(self.pass_orders)]
                with self.guard.alone(row["id"]) if retried else contextlib.nullcontext():
                    for name, generator in (self.passes[place] for place in order):
                        if i in todo[name]:
                            started = time.perf_counter()
                            results[(i, name)] = self._decode(generator, [row])[0]
                            seconds[name] += time.perf_counter() - started
        else:  # each point decodes the call's records together, the passes in the call's order
            order = self.pass_orders[first_order % len(self.pass_orders)]
            for name, generator in (self.passes[place] for place in order):
                started = time.perf_counter()
                for i, result in zip(todo[name], self._decode(generator, [records[i] for i in todo[name]])):
                    results[(i, name)] = result
                seconds[name] += time.perf_counter() - started
        call["call_seconds"] = sum(value for name, value in seconds.items() if name != BASELINE)
        rows = [self._output_row(records[i], name, results[(i, name)], results.get((i, BASELINE)), call)
                for i in range(len(records)) for name, _ in self.generators if (i, name) in results]
        self._add_quality_stats(rows)
        return pa.Table.from_pylist(rows, schema=self.schema)

    def _add_quality_stats(self, rows: list[dict]) -> None:
        """Each decoded row with a reference gets its quality statistics (a fraction of a millisecond
        beside its decoding), so that no report has to count them again."""
        scored = [row for row in rows if row["error"] is None and row["prediction"] is not None
                  and row["reference"] is not None and row["skipped"] is None]
        if scored:
            stats = q.row_statistics(self.spec.task, [row["prediction"] for row in scored],
                                     [row["reference"] for row in scored])
            for row, values in zip(scored, q.stats_matrix(self.spec.task, stats)):
                row["quality_stats"] = values.tolist()

    def _decode(self, generator: Generator, records: list[dict]) -> list[GenerationResult]:
        """One result per record: rows that failed to read keep their error; the rest are decoded
        together (batch_size > 1) or one by one, a segmented record's sentences as units among the
        others' and its result put back together from theirs (io/segments.py)."""
        kill_if_chosen([row["id"] for row in records])
        config = generator.config

        def decode(units: list[Unit]) -> list[GenerationResult]:
            texts = [apply_prompt(self.spec.prompt, unit.text) for unit in units]
            seeds = [record_seed(config.seed, unit_key(records[unit.record]["id"], unit.index)) for unit in units]
            return generator.generate(texts, seeds, batch=self.batch_policy, budgets=[unit.budget for unit in units])

        items = [None if row.get("input_error") else row["text"] if row.get(DOCUMENT) is None else row[DOCUMENT]
                 for row in records]
        return [GenerationResult(prediction=None, error=row["input_error"], method=config.method) if result is None
                else result for row, result in zip(records, decode_records(decode, items, config.method))]

    def _output_row(self, row: dict, point: str, result: GenerationResult, baseline: GenerationResult | None,
                    call: dict) -> dict:
        ran = dict(self.generators)[point].ran()  # what its decoder ran on, as of this call
        out = {
            "id": row["id"],
            "reference": row.get("reference"),
            "input_file": row.get("input_file"),
            "input_row": row.get("input_row"),
            **result.to_record(),
            "segments": _segments(row),
            "job_name": self.spec.job_name,
            "config_hash": self.spec.config_hash,
            "worker": self.worker,
            "engine": ran.engine,
            "quantize": ran.quantize,
            "attention": ran.attention,
            "int8_scheme": ran.int8_scheme,
            **call,
            **_language_columns(row.get(LANGUAGE), LANGUAGE in row and self.spec.language_check.skips(row[LANGUAGE])),
        }
        if baseline is not None:
            out.update(baseline_method=baseline.method, baseline_engine=self.passes[-1][1].ran().engine,
                       baseline_prediction=baseline.prediction,
                       baseline_error=baseline.error, baseline_output_tokens=baseline.stats.output_tokens,
                       baseline_latency_ms=baseline.latency_ms)
        if self.spec.sweep:
            out["point"] = point
        return out
