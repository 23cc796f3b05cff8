"""Which settings go together: every rule once, in the words of the job file's keys.

The job schema asks them of the settings as written (device "auto" may be the CPU), preflight and the run of
what it finds; ModelPair and the CTranslate2 decoder ask them again of what was resolved (the device found,
the engine auto chose), for callers that skip the schema (the Python API). The engines only assert."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.decoding.names import PLAIN_METHODS

# A sampled record must depend on its id and seed alone; CTranslate2's sampling does not follow
# ctranslate2.set_random_seed (OpenNMT/CTranslate2#1757, seen here too), so ct2 decodes greedily only.
CT2_SAMPLING_UNSUPPORTED = (
    "decoding.do_sample with models.engine ct2: CTranslate2's sampling does not follow a seed "
    "(OpenNMT/CTranslate2#1757), so a record's output would not be reproducible; decode greedily or sample on "
    "our own engine")

# cascade's deferral_threshold: where each rule's alpha may lie (policies.deferral)
DEFERRAL_RANGES = {"chow": (0.0, 1.0), "diff": (-1.0, 1.0), "opt": (0.0, float("inf"))}
CASCADE_KEYS = ("deferral", "deferral_threshold")


def engine_problem(engine: str, quantize: str, device: str, dtype: str) -> str | None:
    """Why models.engine / quantize / device / dtype cannot run together (None: they can)."""
    off_cpu = device not in ("cpu", "auto")  # a GPU, mps...; auto may resolve to the CPU: asked again once resolved
    float32 = dtype in ("float32", "auto")
    if engine == "ct2":
        return "models.dtype float64 does not run on CTranslate2 (models.engine ct2)" if dtype == "float64" else None
    if engine == "onnx" and (off_cpu or not float32):
        return f"models.engine onnx runs on the CPU in float32; models.device is {device!r} and models.dtype {dtype!r}"
    if quantize == "int8":
        if engine == "hf":
            return "models.quantize int8 runs on the native or onnx engine; models.engine is 'hf'"
        if off_cpu or not float32:
            return (f"models.quantize int8 runs on the CPU in float32; models.device is {device!r} and "
                    f"models.dtype {dtype!r}")
    return None


def ct2_method_problem(methods: Iterable[str], do_sample: bool = False, key: str = "decoding.method") -> str | None:
    """Why CTranslate2 cannot decode with ``methods`` (None: it can): it runs one model alone, greedily."""
    drafting = sorted(set(methods) - set(PLAIN_METHODS))
    if drafting:
        return (f"models.engine ct2 runs methods {' and '.join(PLAIN_METHODS)} only (CTranslate2's Python API "
                f"cannot cut a decoder cache back to verify drafts); {key} is {', '.join(map(repr, drafting))}")
    return CT2_SAMPLING_UNSUPPORTED if do_sample else None


def decoding_problems(config) -> list[str]:
    """What does not fit together inside one config.DecodingConfig (which asks, as it is made)."""
    problems = []
    if config.deferral in DEFERRAL_RANGES:
        low, high = DEFERRAL_RANGES[config.deferral]
        if not low <= config.deferral_threshold <= high:
            problems.append(f"deferral_threshold for {config.deferral} must lie in [{low:g}, {high:g}], "
                            f"got {config.deferral_threshold}")
    if config.lenience and config.method != "speculative":
        problems.append(f"lenience is lossy speculative decoding's; method is {config.method!r}")
    return problems


def written_decoding_problem(written: dict, defaults) -> str | None:
    """What a job file's decoding: section sets that its method does not read: the cascade's keys elsewhere
    (``defaults``: DecodingConfig(); a sweep's or a baseline's config may carry them, as replace() keeps them)."""
    method = written.get("method", defaults.method)
    if method != "cascade":
        for key in CASCADE_KEYS:
            if written.get(key, getattr(defaults, key)) != getattr(defaults, key):
                return f"decoding.{key} is the cascade method's; decoding.method is {method!r}"
    return None


def language_check_problem(language_check: str, language: str, primary: str) -> str | None:
    """Why input.language_check cannot run with input.language (``primary``: its primary subtag, io.language's
    base_code) (None: it can): it compares ISO 639-1 codes."""
    if language_check != "off" and len(primary) != 2:
        return (f"input.language_check compares two-letter ISO 639-1 codes; input.language is {language!r} "
                "(e.g. de, en, pt-BR)")
    return None


def job_problems(*, method: str, engine: str, baseline: str | None, baseline_engine: str | None,
                 do_sample: bool, ratio_budget: bool) -> list[str]:
    """What does not fit together across a job's decoding:, models: and report: sections."""
    baseline_engine = baseline_engine or engine
    if baseline is not None and baseline == method and baseline_engine == engine:
        return ["report.baseline must differ from decoding.method (or run on another report.baseline_engine)"]
    ct2_methods = ([method] if engine == "ct2" else []) + ([baseline] if baseline and baseline_engine == "ct2" else [])
    if engine == "ct2" or baseline_engine == "ct2":
        problem = ct2_method_problem([method] if engine == "ct2" else [], do_sample)
        if problem:
            return [problem]
    if ct2_methods and ratio_budget:
        return ["decoding.max_new_tokens in its ratio form runs on the pair engines; CTranslate2 (models.engine "
                "or report.baseline_engine ct2) takes a number"]
    if baseline_engine == "ct2" and baseline not in (None, *PLAIN_METHODS):
        return [f"report.baseline_engine ct2 runs report.baseline large or small only; report.baseline is "
                f"{baseline!r}"]
    return []
