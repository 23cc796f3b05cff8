"""PNG plots for reports and sweeps (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first


SCATTER_POINTS = 20_000  # a scatter of more records shows no more, and draws for seconds


def _scattered(*columns, limit: int = SCATTER_POINTS) -> tuple[list, str]:
    """(columns, note): at most `limit` records of equally long columns, a fixed random sample when
    there are more (the note then says how many of how many)."""
    rows = len(columns[0])
    if rows <= limit:
        return list(columns), ""
    keep = np.sort(np.random.default_rng(0).choice(rows, limit, replace=False))
    return [np.asarray(column)[keep] for column in columns], f" ({limit:,} of {rows:,} records, sampled)"


def _saved(fig, path: Path) -> Path:
    """Lay out, write as PNG, close."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_histogram(latencies_ms, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(latencies_ms, bins=40, color="#4C72B0")
    ax.set_xlabel("latency per record (ms)")
    ax.set_ylabel("records")
    ax.set_title(title)
    return _saved(fig, path)


def actor_throughput(per_actor: dict[str, float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * max(len(per_actor), 1)))
    names = list(per_actor)
    ax.barh(range(len(names)), [per_actor[n] for n in names], color="#55A868")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("output tokens/s of decoding time")
    ax.set_title("throughput per actor")
    return _saved(fig, path)


def method_family(point: dict) -> str:
    """What a sweep point's frontier is drawn with: its method, a cascade's with its rule."""
    method = point.get("method") or point["point"]
    return f"cascade {point.get('deferral')}" if method == "cascade" else method


def frontier(points: list[dict], metric: str) -> list[dict]:
    """The points no faster-or-equal point of the list beats on ``metric``, by latency."""
    best, kept = float("-inf"), []
    for point in sorted(points, key=lambda p: (p["latency_ms"], -p[metric])):
        if point[metric] > best:
            kept.append(point)
            best = point[metric]
    return kept


def latency_quality(points: list[dict], metric: str, path: Path, title: str) -> Path:
    """Latency (x) against quality (y) for every sweep point: each method's own frontier as a line
    (a cascade's per rule), the overall Pareto front circled."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    families: dict[str, list[dict]] = {}
    for point in points:
        families.setdefault(method_family(point), []).append(point)
    for family, members in families.items():
        line = frontier(members, metric)
        shown = ax.plot([p["latency_ms"] for p in line], [p[metric] for p in line], "-", marker=".", label=family)
        ax.scatter([p["latency_ms"] for p in members], [p[metric] for p in members], s=10, color=shown[0].get_color())
    front = [p for p in points if p.get("pareto")]
    ax.scatter([p["latency_ms"] for p in front], [p[metric] for p in front], s=80, facecolors="none",
               edgecolors="#C44E52", label="Pareto front (all methods)")
    for p in points:
        ax.annotate(p["point"], (p["latency_ms"], p[metric]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean latency per record (ms)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _saved(fig, path)


def _share_histogram(shares, path: Path, xlabel: str, title: str, color: str) -> Path:
    """One share in [0, 1] per record, in 20 bins."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(shares, bins=20, range=(0.0, 1.0), color=color)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("records")
    ax.set_title(title)
    return _saved(fig, path)


def small_share_histogram(shares, path: Path) -> Path:
    """How much of each record the small model wrote (BiLD): one value per record decoded without error."""
    return _share_histogram(shares, path, "share of the record's output tokens written by the small model",
                            "small-model share per record", "#4C72B0")


def deferral_share_histogram(shares, path: Path) -> Path:
    """How often a cascade's deferral rule sent a record's drafts to the large model: one value per
    record that drafted (the run's overall share is the report's deferral_share)."""
    return _share_histogram(shares, path, "share of the record's drafted positions whose rule deferred",
                            "deferral rate per record (cascade)", "#8172B2")


def rates_vs_length(lengths, fallbacks_per_100, rollbacks_per_100, path: Path) -> Path:
    """Fallbacks and rollbacks per 100 output tokens of each record, against its output length."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    (lengths, fallbacks_per_100, rollbacks_per_100), note = _scattered(lengths, fallbacks_per_100, rollbacks_per_100)
    ax.scatter(lengths, fallbacks_per_100, s=8, alpha=0.5, color="#4C72B0", label="fallbacks / 100 tokens")
    ax.scatter(lengths, rollbacks_per_100, s=8, alpha=0.5, color="#C44E52", label="rollbacks / 100 tokens")
    ax.set_xlabel("output tokens of the record")
    ax.set_ylabel("per 100 output tokens")
    ax.set_title("where fallbacks and rollbacks happen" + note, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return _saved(fig, path)


def latency_vs_length(series: dict[str, tuple], path: Path) -> Path:
    """Latency of each record against its output length, one colour per method: name -> (lengths, latencies_ms)."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (name, (lengths, latencies)), colour in zip(series.items(), ("#4C72B0", "#DD8452", "#55A868")):
        (lengths, latencies), note = _scattered(lengths, latencies)
        ax.scatter(lengths, latencies, s=8, alpha=0.5, color=colour, label=name + note)
    ax.set_xlabel("output tokens of the record")
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency against output length")
    ax.legend(fontsize=8, loc="upper left")
    return _saved(fig, path)


def throughput_over_time(calls: dict[str, list[tuple[float, float, int]]], path: Path,
                         job_started: float | None = None) -> Path:
    """Each actor's output tokens/s per call, drawn over the call's span of the job's wall time:
    warm-up, stragglers and idle actors show. calls: worker -> [(start, seconds, tokens)]. With
    ``job_started`` (Unix seconds) the time axis starts with the job and its start-up is shaded."""
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    first_call = min((start for found in calls.values() for start, _, _ in found), default=0.0)
    origin = job_started if job_started is not None and job_started <= first_call else first_call
    if origin < first_call:
        ax.axvspan(0.0, first_call - origin, color="0.9", label="start-up (Ray, reading, loading models)")
    for worker, found in calls.items():
        xs, ys = [], []
        for start, seconds, tokens in found:
            rate = tokens / seconds if seconds > 0 else 0.0
            xs += [start - origin, start - origin + seconds, float("nan")]
            ys += [rate, rate, float("nan")]
        ax.plot(xs, ys, linewidth=2, label=worker)
    ax.set_xlabel("seconds since the job started" if origin < first_call else "seconds since the first call")
    ax.set_ylabel("output tokens/s in the call")
    ax.set_title("throughput per actor over the job")
    ax.legend(fontsize=7)
    return _saved(fig, path)
