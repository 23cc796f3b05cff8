"""What every benchmark shares: methods run side by side on the same inputs, timed with the
device synchronized; the quality of their outputs; the run's environment and Markdown tables.

docs/design.md §5: these machines are shared and noisy, so a benchmark compares methods measured in
one run, interleaved, and reports ratios, never absolute times compared across runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch

from pipeline.metrics.interleaving import balanced_orders
from pipeline.metrics.quality import TranslationScores, translation_scores

T = TypeVar("T")


def sync_device(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a timing covers it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device, run: Callable[[], T]) -> tuple[T, float]:
    """(what ``run`` returned, its wall seconds, the device's queued work included)."""
    sync_device(device)
    start = time.perf_counter()
    result = run()
    sync_device(device)
    return result, time.perf_counter() - start


@dataclass
class Measured:
    """One method's side-by-side measurements."""

    seconds: list[list[float]] = field(default_factory=list)  # [repetition][input]
    results: list[list[Any]] = field(default_factory=list)  # what it returned, [repetition][input]

    @property
    def last(self) -> list[Any]:
        """What it returned for each input in the last repetition."""
        return self.results[-1]

    @property
    def repeats(self) -> int:
        return len(self.seconds)

    @property
    def all_seconds(self) -> list[float]:
        return [seconds for repetition in self.seconds for seconds in repetition]

    @property
    def total_seconds(self) -> float:
        return sum(self.all_seconds)

    def repetition_seconds(self) -> list[float]:
        return [sum(repetition) for repetition in self.seconds]


def interleave(methods: Mapping[str, Callable[[int], Any]], inputs: int, repeats: int, device: torch.device, *,
               warm_up: bool = True, between_inputs: Callable[[], None] | None = None) -> dict[str, Measured]:
    """Every method on every input (``method(index)``), ``repeats`` times.

    Each input's turn runs the methods back to back, the turns taking balanced_orders in turn, so
    that no method always runs first or in one other's wake; a slow phase of the machine hits all
    of them alike. ``warm_up`` runs each method once on input 0 before the measurements;
    ``between_inputs`` runs after each input's turn, outside the timings."""
    if warm_up:
        for method in methods.values():
            method(0)
    measured = {name: Measured() for name in methods}
    names, orders, turn = list(methods), balanced_orders(len(methods)), 0
    for _ in range(repeats):
        for each in measured.values():
            each.seconds.append([])
            each.results.append([])
        for index in range(inputs):
            for name in (names[place] for place in orders[turn % len(orders)]):
                result, seconds = timed(device, partial(methods[name], index))
                measured[name].seconds[-1].append(seconds)
                measured[name].results[-1].append(result)
            turn += 1
            if between_inputs is not None:
                between_inputs()
    return measured


def score_outputs(tokenizer, outputs: Sequence[Sequence[int]], references: Sequence[str]) -> TranslationScores:
    """BLEU and chrF of generated token ids, decoded, against the first references."""
    texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]
    return translation_scores(texts, references[: len(texts)])


def environment(pair) -> dict:
    """Where a benchmark ran: the report keys that say so."""
    return {"device": str(pair.device), "engine": pair.engine_kind, "dtype": pair.dtype_name, "quantize": pair.quantize,
            "torch_threads": torch.get_num_threads()}


def environment_line(report: dict) -> str:
    weights = report["dtype"] + (" with int8 matrices" if report.get("quantize") == "int8" else "")
    line = (f"device {report['device']}, {weights}, torch threads {report['torch_threads']}, "
            f"engine {report.get('engine')}")
    return line + (f", CTranslate2 {report['ct2']}" if report.get("ct2") else "")


def bleu_line(report: dict) -> list[str]:
    """The sacrebleu signature under a table with BLEU, as sacrebleu asks scores to be reported."""
    return ["", f"BLEU: sacrebleu {report['bleu_signature']}"] if report.get("bleu_signature") else []


def format_number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return "" if value is None else str(value)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                   cell: Callable[[Any], str] = format_number) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines


def dict_table(columns: Sequence[str], rows: Iterable[dict], cell: Callable[[Any], str] = format_number) -> list[str]:
    """A table of report rows (dicts), one column per key; a row without a key leaves its cell empty."""
    return markdown_table(columns, ([row.get(column) for column in columns] for row in rows), cell)
