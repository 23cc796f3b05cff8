"""`bench --compare-engines`: our `large` on the native engine and on the Hugging Face engine, same
pair, record by record in turn, with each engine's steps timed between the records; both must
write the same tokens."""

from __future__ import annotations

import dataclasses

from pipeline.bench.cost import CostSampler
from pipeline.bench.harness import interleave, markdown_table
from pipeline.decoding import DecodingConfig, Generator, ModelPair

KINDS = ("native", "hf")
STEPS = ("small", "large", "verify_5")  # a small step, a large step, a 5-draft verification


def compare_engines(pair: ModelPair, texts: list[str], config: DecodingConfig, repeats: int = 1) -> dict:
    pairs = {kind: dataclasses.replace(pair, engine_request=kind) for kind in KINDS}
    if pairs["native"].engine_kind != "native":
        return {"skipped": "no native engine for this pair"}
    large = dataclasses.replace(config, method="large", do_sample=False)
    generators = {kind: Generator(each, large) for kind, each in pairs.items()}
    samplers = {kind: CostSampler(each, texts[0], 4) for kind, each in pairs.items()}
    encoded = [generators["native"].encode(text)[0].to(pair.device) for text in texts]
    for sampler in samplers.values():
        sampler.warm_up()

    def sample_steps() -> None:
        for sampler in samplers.values():
            sampler.sample()

    runs = interleave({kind: (lambda index, g=generator: g.decode_ids(encoded[index]))
                       for kind, generator in generators.items()},
                      len(encoded), repeats, pair.device, between_inputs=sample_steps)
    steps = {kind: sampler.result() for kind, sampler in samplers.items()}
    step_ms = {kind: {"small": 1000 * s["small_step_s"], "large": 1000 * s["large_step_s"],
                      "verify_5": 1000 * s["large_verify_s"][5]} for kind, s in steps.items()}
    seconds = {kind: run.total_seconds for kind, run in runs.items()}
    same = sum(a.tokens == b.tokens for a, b in zip(runs["native"].last, runs["hf"].last))
    return {
        "records": len(texts), "repeats": repeats, "identical_records": same,
        "large_seconds": seconds, "large_speed_native_over_hf": seconds["hf"] / seconds["native"],
        "step_ms": step_ms,
        "step_speed_native_over_hf": {step: step_ms["hf"][step] / step_ms["native"][step] for step in STEPS},
    }


def render_engines(engines: dict) -> str:
    """The native-vs-Hugging-Face section of a bench report."""
    if "skipped" in engines:
        return f"**Engines**: {engines['skipped']}."
    ms, speed = engines["step_ms"], engines["step_speed_native_over_hf"]
    lines = [f"**Engines** (our `large` on each, record by record in turn; steps timed between the records): "
             f"native {engines['large_speed_native_over_hf']:.2f}x the speed of hf, "
             f"identical tokens in {engines['identical_records']} of {engines['records']} records", ""]
    lines += markdown_table(["step", "native ms", "hf ms", "native speed vs hf"],
                            [[step, f"{ms['native'][step]:.3f}", f"{ms['hf'][step]:.3f}", f"{speed[step]:.2f}x"]
                             for step in STEPS])
    return "\n".join(lines)
