"""What a job prints while it runs: one progress line, and Ray's own chatter kept in its log files.

Ray Data logs its operator tables every few seconds and every actor's output (weight-loading bars
among them) reaches the driver; a job's console would drown its result. Unless ``verbose``, Ray's
INFO output stays in Ray's log files (``/tmp/ray/session_latest/logs``); warnings and errors still
show, and a record that fails gets its ``error`` in its own output row.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import pyarrow.parquet as pq

from pipeline.io.storage import output_files
from pipeline.metrics.summary import decoding_rate
from pipeline.metrics.totals import actor_calls

PROGRESS_COLUMNS = ["output_tokens", "worker", "call_started_at", "call_seconds", "error"]


def quiet_ray(verbose: bool) -> None:
    """Ray Data's progress bars and INFO logs off (on with ``verbose``)."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = verbose
    context.print_on_execution_start = verbose
    for name in ("ray.data", "ray.data._internal.execution.streaming_executor"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    # Its only warning is that the progress bars are off, which is what was asked for.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.INFO if verbose else logging.ERROR)


class Progress:
    """Prints ``records done/total, tokens/s, ETA`` every ``interval`` seconds while a job writes its
    output files (counted from the files themselves); one rewritten line on a terminal, a line per
    change elsewhere. tokens/s is decoding's: over each actor's busy time (its calls), summed over
    the actors, so that Ray's start-up and model loading do not count against it."""

    interval_seconds = 5.0

    def __init__(self, fs, path: str, total: int, interval: float | None = None, stream=None):
        self.fs, self.path, self.total = fs, path, total
        self.interval = self.interval_seconds if interval is None else interval
        self.stream = stream or sys.stderr
        self.seen = set(output_files(fs, path))  # files of earlier attempts (resume) are not this run's
        self.records = 0
        self.calls: dict[str, dict[tuple[float, float], int]] = {}  # worker -> (start, seconds) -> tokens
        self.started = time.perf_counter()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self.stream.isatty():
            self.stream.write("\n")

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
            if self._count():
                self._show()

    def _count(self) -> bool:
        """Add the rows and output tokens of files written since the last look; whether any were (a file
        still being written is not yet: it is counted at a later look)."""
        counted = False
        for file in [file for file in output_files(self.fs, self.path) if file not in self.seen]:
            try:
                with self.fs.open(file, "rb") as handle:
                    rows = pq.read_table(handle, columns=PROGRESS_COLUMNS)
            except Exception:  # noqa: BLE001 - a file still being written: count it next time
                continue
            self.seen.add(file)
            counted = True
            self.records += rows.num_rows
            for worker, found in actor_calls(rows).items():  # a call's rows may span files
                for start, seconds, tokens in found:
                    known = self.calls.setdefault(worker, {})
                    known[start, seconds] = known.get((start, seconds), 0) + tokens
        return counted

    def decoding_rate(self) -> float:
        return decoding_rate({worker: [(start, seconds, tokens) for (start, seconds), tokens in found.items()]
                              for worker, found in self.calls.items()})

    def _show(self) -> None:
        elapsed = time.perf_counter() - self.started
        rate = self.records / elapsed if elapsed else 0.0
        left = f"ETA {(self.total - self.records) / rate:.0f} s" if rate and self.records < self.total else "ETA -"
        line = (f"decoding: {self.records}/{self.total} records ({100 * self.records / max(self.total, 1):.0f}%), "
                f"{self.decoding_rate():.0f} output tokens/s, {left}")
        self.stream.write(f"\r{line}" if self.stream.isatty() else f"{line}\n")
        self.stream.flush()
