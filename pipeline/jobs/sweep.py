"""`bild-pipeline sweep` and `tune`: the latency-quality trade-off over BiLD's two thresholds.

A sweep is a job whose every record is decoded under every grid point (plus the `large` and
`small` baselines) by the same actor, one loaded pair for the whole grid, so that latencies are
measured side by side. Each point is then scored like a run; the Pareto front (lower latency,
higher quality) is marked, and `tune` picks the fastest point within a quality budget.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as pads
import yaml

from pipeline.decoding.config import DecodingConfig
from pipeline.jobs.report import _numeric_table, read_run, run_quality
from pipeline.jobs.run import Points, run_job
from pipeline.jobs.schema import JobConfig
from pipeline.metrics.summary import bild_behaviour

PRIMARY_METRIC = {"translation": "bleu", "summarization": "rougeL"}


def grid_points(base: DecodingConfig, fallbacks: list[float], rollbacks: list[float],
                windows: list[int] | None = None, cascades: dict[str, list[float]] | None = None,
                leniences: list[float] | None = None) -> Points:
    """`large`, `small`, then one `bild` point per (fallback, rollback[, window]), named after them;
    then one `cascade` point per (rule, alpha) of ``cascades`` (``cascade_chow_a0.3``) and one
    `speculative` point per lenience (``speculative_l0.2``; lossy above 0).

    ``windows`` (values of max_draft_tokens) is a third grid axis of the bild points; without it every
    point keeps the job's window and the names stay ``bild_fb{a}_rb{b}``.
    """
    points = [("large", dataclasses.replace(base, method="large")),
              ("small", dataclasses.replace(base, method="small"))]
    for fallback in fallbacks:
        for rollback in rollbacks:
            for window in windows or [None]:
                name = f"bild_fb{fallback:g}_rb{rollback:g}" + (f"_w{window}" if window is not None else "")
                settings = dict(method="bild", fallback_threshold=fallback, rollback_threshold=rollback)
                if window is not None:
                    settings["max_draft_tokens"] = window
                points.append((name, dataclasses.replace(base, **settings)))
    for rule, alphas in (cascades or {}).items():
        for alpha in alphas:
            points.append((f"cascade_{rule}_a{alpha:g}",
                           dataclasses.replace(base, method="cascade", deferral=rule, deferral_threshold=alpha)))
    for lenience in leniences or []:
        points.append((f"speculative_l{lenience:g}", dataclasses.replace(base, method="speculative", lenience=lenience)))
    return tuple(points)


def pareto_flags(points: list[dict], metric: str) -> list[bool]:
    """True for points no other point beats: latency <= and quality >= with one of them strict."""
    flags = []
    for p in points:
        dominated = any(
            o["latency_ms"] <= p["latency_ms"] and o[metric] >= p[metric]
            and (o["latency_ms"] < p["latency_ms"] or o[metric] > p[metric])
            for o in points if o is not p
        )
        flags.append(not dominated)
    return flags


def score_points(run_path: str, task: str, storage_options: dict | None = None) -> list[dict]:
    """One row per sweep point: quality, mean latency, speedup over `large`, BiLD rates."""
    run = read_run(run_path, storage_options)
    manifest = run.manifest
    numeric = _numeric_table(run, extra=("point",))
    # Each point's quality: the statistics its rows carry (quality_stats), summed, as a report's are.
    quality_by_point = {}
    for name in sorted(set(numeric["point"].to_pylist()) - {None}):
        scores, scored = run_quality(run, task, where=pads.field("point") == name)
        if scored:
            quality_by_point[name] = scores
    ok = numeric.filter(pc.is_null(numeric["error"]))
    table = []
    for name in (manifest or {}).get("sweep_points", {}) or sorted(set(ok["point"].to_pylist())):
        rows = ok.filter(pc.equal(ok["point"], name))
        if not rows.num_rows:
            continue
        table.append({"point": name, "records": rows.num_rows,
                      "latency_ms": pc.mean(rows["latency_ms"]).as_py(),
                      **(manifest or {}).get("sweep_points", {}).get(name, {}),
                      **quality_by_point.get(name, {}), **bild_behaviour(rows)})
    large = next((p for p in table if p["point"] == "large"), None)
    for point in table:
        point["speedup_vs_large"] = large["latency_ms"] / point["latency_ms"] if large else None
    metric = PRIMARY_METRIC[task]
    if all(metric in p for p in table):
        for point, flag in zip(table, pareto_flags(table, metric)):
            point["pareto"] = flag
    return table


def run_sweep(job: JobConfig, fallbacks: list[float], rollbacks: list[float], address: str | None = None,
              windows: list[int] | None = None, verbose: bool = False, progress: bool = False,
              cascades: dict[str, list[float]] | None = None, leniences: list[float] | None = None):
    points = grid_points(job.decoding.to_config(), fallbacks, rollbacks, windows, cascades, leniences)
    summary = run_job(job, address=address, points=points, verbose=verbose, progress=progress)
    table = score_points(job.output.path, job.task, job.output.storage_options)
    return summary, table


def write_sweep(table: list[dict], task: str, out_dir: str | Path, title: str) -> list[Path]:
    from pipeline.metrics import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metric = PRIMARY_METRIC[task]
    (out / "sweep.json").write_text(json.dumps({"task": task, "metric": metric, "points": table}, indent=2,
                                               default=str))
    columns = ["point", metric, "latency_ms", "speedup_vs_large", "small_token_share", "fallbacks_per_100_tokens",
               "rollbacks_per_100_tokens", "deferral_share", "pareto"]
    lines = [f"# Sweep: {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for point in table:
        cells = [f"{point.get(c):.3f}" if isinstance(point.get(c), float) else str(point.get(c, "")) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if table and all(metric in p for p in table):
        lines += ["", "Each method's frontier (its points no faster point of the same method beats):", "",
                  "| method | point | " + metric + " | latency_ms | speedup_vs_large |", "|---|---|---|---|---|"]
        families: dict[str, list[dict]] = {}
        for point in table:
            families.setdefault(plots.method_family(point), []).append(point)
        for family, members in families.items():
            for point in plots.frontier(members, metric):
                lines.append(f"| {family} | {point['point']} | {point[metric]:.2f} | {point['latency_ms']:.1f} | "
                             f"{point.get('speedup_vs_large') or 0:.2f} |")
    made = [out / "sweep.json", out / "sweep.md"]
    if table and all(metric in p and "pareto" in p for p in table):
        made.append(plots.latency_quality(table, metric, out / "sweep.png", f"{title}: latency vs {metric}"))
        lines += ["", "![latency vs quality](sweep.png)"]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    return made


def pick_point(table: list[dict], metric: str, max_drop: float, method: str | None = None) -> dict:
    """The fastest point (of ``method``, where given) whose quality is at most `max_drop` below the `large`
    baseline's."""
    large = next((p for p in table if p["point"] == "large"), None)
    if large is None or metric not in large:
        raise ValueError(f"the sweep has no scored `large` point for {metric}")
    allowed = [p for p in table if p.get(metric) is not None and p[metric] >= large[metric] - max_drop
               and (method is None or p.get("method", p["point"]) == method)]
    if not allowed:
        raise ValueError(f"no {method or ''} point of the sweep is within {max_drop:g} {metric} of `large`")
    return min(allowed, key=lambda p: p["latency_ms"])


def preset_yaml(point: dict, metric: str, max_drop: float, source: str) -> str:
    keys = {"bild": ("fallback_threshold", "rollback_threshold"),
            "cascade": ("deferral", "deferral_threshold", "draft_window", "fallback_threshold"),
            "speculative": ("lenience", "draft_window", "fallback_threshold")}.get(point.get("method"), ())
    # The windows as measured (decoding.adaptive_draft): a preset runs the point as the sweep timed it.
    windows = ("max_draft_tokens", "adaptive_draft") if keys else ()
    decoding = {key: point[key] for key in ("method", *keys, *windows) if key in point}
    header = (f"# Chosen by `bild-pipeline tune` from {source}: the fastest point with {metric} at most "
              f"{max_drop:g} below `large`.\n# {point['point']}: {metric} {point[metric]:.2f}, "
              f"latency {point['latency_ms']:.1f} ms, speedup {point.get('speedup_vs_large') or 0:.2f}x.\n")
    return header + yaml.safe_dump({"decoding": decoding}, sort_keys=False)

