"""What a method's decode should cost, part by part, beside what it took: `bench`'s prediction.

Three models price a method's counted calls and rounds (rounds.ROUND_PARTS), each from measurements taken
between the records of the same run:

- *in the loop* (the prediction): each part's seconds as the scheduler runs it on the real engines, from
  scripted records (rounds.RoundSampler), plus each record's own admissions against the scripted one's;
- *parts alone*: each engine call timed in its regime (cost.py: a step after a step, a verification after
  small steps, a first step after an admission), the admissions, and the scheduler's Python alone
  (rounds.scheduler_python, engines that compute nothing); what it misses is what the parts cost each other
  when they alternate (caches, Python run between runtime calls);
- *isolated*: each call alone after an admission and a prefill, the model used until 2026-12-07.

``allowance`` asks what the in-the-loop costs allow a drafting method at batch 1 with the acceptance it
measured, window by window, against plain `large` steps.
"""

from __future__ import annotations

import torch

from pipeline.bench.cost import SMALL_BEFORE_VERIFY, interpolate
from pipeline.bench.harness import markdown_table
from pipeline.bench.rounds import ROUND_PARTS, RoundSampler, round_counts, scheduler_python
from pipeline.decoding.config import DecodingConfig
from pipeline.decoding.stats import DecodeStats


class EngineTime:
    """The seconds a method's decodes spent in the engines' calls and admissions, decode by decode (the rest of
    a decode is the scheduler's): what the parts are measured against."""

    def __init__(self, pair):
        self.engines = [pair.engine(role, 1) for role in ("small", "large")]
        self.spent: list[tuple[float, float]] = []  # (calls, admissions) per decode

    def wrap(self, decode):
        def timed_decode(ids):
            before = [(engine.forward_seconds, engine.admit_seconds) for engine in self.engines]
            output = decode(ids)
            self.spent.append((sum(e.forward_seconds - f for e, (f, _) in zip(self.engines, before)),
                               sum(e.admit_seconds - a for e, (_, a) in zip(self.engines, before))))
            return output

        return timed_decode

    def last(self, decodes: int) -> tuple[float, float]:
        """(calls, admissions) summed over the last ``decodes`` decodes."""
        calls, admissions = zip(*self.spent[-decodes:])
        return sum(calls), sum(admissions)


def price(counts: list[float], seconds: dict[str, float]) -> dict[str, float]:
    """Seconds per part of ROUND_PARTS for ``counts`` of each."""
    return {part: count * seconds[part] for part, count in zip(ROUND_PARTS, counts)}


def parts_alone(method: str, stats: DecodeStats, counts: list[float], cost: dict, admission: dict[str, float],
                python: dict[str, float]) -> dict[str, float]:
    """The same parts priced from their pieces alone: engine calls timed in their regime (cost.py), the
    records' admissions and first steps, and the scheduler's Python alone (``python``)."""
    records, small_admissions, plain, drafting, verifications, drafted = counts
    plain_step = cost["small_step_s"] if method == "small" else cost["large_step_s"]
    role = "small" if method == "small" else "large"
    verified = interpolate(cost["large_verify_s"], (drafted + verifications) / verifications) if verifications else 0.0
    pieces = {"record": records * (admission[role] + cost["cold_extra_s"][role]),
              "small admission": small_admissions * (admission["small beside large"] + cost["cold_extra_s"]["small"]),
              "plain": plain * plain_step, "draft": drafting * cost["small_step_s"],
              "verify": verifications * verified, "drafted position": 0.0}
    return {part: pieces[part] + value for part, value in price(counts, python).items()}


def isolated_seconds(stats: DecodeStats, records: int, cost: dict, admission: dict[str, float]) -> float:
    """What the model predicted until 2026-12-07: every call at its isolated cost (after an admission and a
    prefill), a verification's width the mean over all large calls, both admissions for every record of a
    drafting method, and nothing for the scheduler."""
    seconds = stats.small_calls * cost["isolated_small_s"]
    if stats.large_calls:
        width = (stats.draft_tokens + stats.large_tokens) / stats.large_calls
        seconds += stats.large_calls * interpolate(cost["isolated_s"], width)
    roles = ("large", "small beside large") if stats.small_calls and stats.large_calls else \
        ("large",) if stats.large_calls else ("small",)
    return seconds + records * sum(admission[role] for role in roles)


def allowance(stats: DecodeStats, records: int, parts: dict[str, float], large_parts: dict[str, float],
              most: int) -> dict:
    """What the in-the-loop costs (``parts``, and `large`'s) allow a drafting method at batch 1 with the
    acceptance ``stats`` measured (c: drafts per small call, a: drafts kept of those judged), window by window,
    against `large`: a round of window k makes 1 + sum (c a)^i tokens for sum_{i<k} c^i drafting steps and a
    verification of sum_{i<=k} c^i drafted positions."""
    c = stats.draft_tokens / stats.small_calls if stats.small_calls else 0.0
    judged = stats.small_tokens + stats.rollbacks
    a = stats.small_tokens / judged if judged else 1.0
    tokens = stats.output_tokens / records  # per record
    large_seconds = large_parts["record"] + tokens * large_parts["plain"]
    speeds = {0: large_seconds / (parts["record"] + tokens * parts["plain"])}
    for k in range(1, most + 1):
        made = 1 + sum((c * a) ** i for i in range(1, k + 1))
        round_seconds = (sum(c**i for i in range(k)) * parts["draft"] + parts["verify"]
                         + sum(c**i for i in range(1, k + 1)) * parts["drafted position"])
        speeds[k] = large_seconds / (parts["record"] + parts["small admission"] + tokens * round_seconds / made)
    best = max(speeds, key=speeds.__getitem__)
    return {"draft_rate": c, "kept_share": a, "speed_by_window": speeds, "best_window": best,
            "best_speed_vs_large": speeds[best]}


def price_methods(pair, configs: dict[str, DecodingConfig], outputs: dict[str, list], measured: dict[str, float],
                  engine_time: dict[str, EngineTime], rounds: RoundSampler, cost: dict,
                  admission: dict[str, dict[str, float]], input_ids: torch.Tensor) -> dict:
    """Each of our methods' predictions beside its measurement (``outputs``: its last repetition's
    DecodeOutputs; ``measured``: its seconds per repetition; ``admission``: seconds per record by role, "run"
    the mean over the run's records and "scripted" the scripted record's), and what the costs allow `bild`
    where it ran with fixed windows."""
    python, loop, priced = {}, {}, {}
    run, scripted = admission["run"], admission["scripted"]
    widths = cost["large_verify_s"]  # what a drafted position adds to a verification: the slope over its positions
    drafted_position = (widths[max(widths)] - widths[1]) / (max(widths) - 1)
    for name, config in configs.items():
        python[name] = scheduler_python(pair, config, input_ids)
        loop[name] = rounds.parts(config, drafted_position,
                                  scripted["small beside large"] + cost["cold_extra_s"]["small"])
    for name, config in configs.items():
        stats = DecodeStats.total(output.stats for output in outputs[name])
        records = len(outputs[name])
        drafted = sum(1 for output in outputs[name] if output.stats.small_calls)
        counts = round_counts(config.method, stats, records, drafted)
        parts = price(counts, loop[name])
        role = "small" if config.method == "small" else "large"  # the records' own admissions, not the script's
        parts["record"] += records * (run[role] - scripted[role])
        parts["small admission"] += drafted * (run["small beside large"] - scripted["small beside large"])
        calls, admissions = engine_time[name].last(records)
        priced[name] = {"records": records, "measured_s": measured[name], "predicted_s": sum(parts.values()),
                        "parts_s": parts,
                        "alone_s": sum(parts_alone(config.method, stats, counts, cost, run, python[name]).values()),
                        "isolated_s": isolated_seconds(stats, records, cost, run),
                        "measured_parts_s": {"engine calls": calls, "admissions": admissions,
                                             "the rest": measured[name] - calls - admissions}}
    report = {"methods": priced, "loop_parts_s": loop, "python_s": python}
    fixed = next((name for name, config in configs.items() if config.method == "bild" and not config.adaptive_draft), None)
    if fixed and "large" in configs:
        stats = DecodeStats.total(output.stats for output in outputs[fixed])
        report["allowance"] = {"method": fixed, **allowance(stats, len(outputs[fixed]), loop[fixed], loop["large"],
                                                            configs[fixed].max_draft_tokens)}
    return report


def render_prediction(priced: dict, cost: dict) -> list[str]:
    """The prediction's Markdown: per method, measured beside the three models (ms per record) and the parts;
    the parts' costs in the loop and alone; the step costs by regime; what the costs allow `bild`."""
    lines = ["", "**Prediction beside result** (ms per record). *predicted*: the counted calls and rounds at what "
             "each part costs in the loop (scripted records on the real engines, between the records); *alone*: "
             "the same parts from engine calls timed in their regime and the scheduler's Python alone; "
             "*isolated*: every call alone after an admission (the model until 2026-12-07):", ""]
    header = ["method", "measured", "predicted", "measured/predicted", "alone", "measured/alone", "isolated",
              "measured/isolated", *ROUND_PARTS, "measured: engine calls", "admissions", "the rest"]
    rows = []
    for name, p in priced["methods"].items():
        per = lambda seconds: f"{1000 * seconds / p['records']:.3f}"  # noqa: E731
        rows.append([name, per(p["measured_s"]), per(p["predicted_s"]), f"{p['measured_s'] / p['predicted_s']:.2f}",
                     per(p["alone_s"]), f"{p['measured_s'] / p['alone_s']:.2f}",
                     per(p["isolated_s"]), f"{p['measured_s'] / p['isolated_s']:.2f}",
                     *[per(p["parts_s"][part]) for part in ROUND_PARTS],
                     *[per(value) for value in p["measured_parts_s"].values()]])
    lines += markdown_table(header, rows)
    lines += ["", "What each part costs (us): in the loop / the scheduler's Python alone", ""]
    lines += markdown_table(["method", *ROUND_PARTS], [
        [name, *[f"{1e6 * priced['loop_parts_s'][name][part]:.0f} / {1e6 * python[part]:.0f}" for part in ROUND_PARTS]]
        for name, python in priced["python_s"].items()])
    shown = [k for k in (1, 2, 3, 5, 8, max(cost["large_verify_s"])) if k in cost["large_verify_s"]]
    lines += ["", "Engine calls by regime (ms, medians of the timings between the records): a small step after "
              f"another {1000 * cost['small_step_s']:.3f}, alone after an admission {1000 * cost['isolated_small_s']:.3f}; "
              "a first step after an admission, over a warm one: "
              + ", ".join(f"{role} +{1000 * extra:.3f}" for role, extra in cost["cold_extra_s"].items()), ""]
    lines += markdown_table(["large call of k positions", *[f"k={k}" for k in shown]], [
        ["after a large call (warm)", *[f"{1000 * cost['verify_warm_s'][k]:.3f}" for k in shown]],
        [f"after {SMALL_BEFORE_VERIFY} small steps", *[f"{1000 * cost['large_verify_s'][k]:.3f}" for k in shown]],
        ["alone after an admission and a prefill", *[f"{1000 * cost['isolated_s'][k]:.3f}" for k in shown]],
    ])
    allowed = priced.get("allowance")
    if allowed:
        speeds = allowed["speed_by_window"]
        lines += ["", f"What the in-the-loop costs allow `bild` at batch 1 with the acceptance `{allowed['method']}` "
                  f"measured ({allowed['draft_rate']:.2f} drafts per small call, {allowed['kept_share']:.2f} of judged "
                  f"drafts kept): at best **{allowed['best_speed_vs_large']:.2f}x** our `large` (window "
                  f"{allowed['best_window']}); by window: " + ", ".join(f"{k} {v:.2f}x" for k, v in speeds.items())]
    return lines
