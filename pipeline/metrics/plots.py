"""PNG plots for reports and sweeps (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first


def latency_histogram(latencies_ms, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(latencies_ms, bins=40, color="#4C72B0")
    ax.set_xlabel("latency per record (ms)")
    ax.set_ylabel("records")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def actor_throughput(per_actor: dict[str, float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * max(len(per_actor), 1)))
    names = list(per_actor)
    ax.barh(range(len(names)), [per_actor[n] for n in names], color="#55A868")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("output tokens/s of decoding time")
    ax.set_title("throughput per actor")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_quality(points: list[dict], metric: str, path: Path, title: str) -> Path:
    """Latency (x) against quality (y) for every sweep point, the Pareto front joined by a line."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["latency_ms"])
    others = [p for p in points if not p["pareto"]]
    ax.scatter([p["latency_ms"] for p in others], [p[metric] for p in others], color="#999999", label="grid point")
    ax.plot([p["latency_ms"] for p in front], [p[metric] for p in front], "o-", color="#C44E52",
            label="Pareto front")
    for p in points:
        ax.annotate(p["point"], (p["latency_ms"], p[metric]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean latency per record (ms)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
