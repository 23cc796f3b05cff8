"""Checks before anything starts: what a job names exists and fits, each problem one line naming its key.

`validate` runs them, and `run` (and so `sweep`) before it takes the output's lease or starts Ray, so a
typo in a path, a column or a model folder costs seconds, not a cluster's start-up. They read only what
is cheap: a folder's listing, one input file's schema, the models' configs and tokenizers (no weights),
and the hub's cache; a hub id not cached here is looked up with a short timeout.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re

import fsspec

from pipeline.io.storage import InputError, input_files, missing_columns

# A hub id ("t5-small", "google/flan-t5-base"), as opposed to a folder path ("./models/x", "/data/m", "a/b/c").
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "vocab.json", "sentencepiece.bpe.model",
                    "source.spm")
HUB_TIMEOUT_SECONDS = 3.0


class PreflightError(InputError):
    """What a job names does not exist or does not fit (each problem one line naming its key): like any
    InputError, the job stops before anything starts."""


def check_job(job, listing=None, pair: bool = True) -> None:
    """Raise PreflightError listing every problem found (input, columns, models, and unless not `pair`,
    whether the pair shares a vocabulary). ``listing``: input_files' answer where the caller has it."""
    problems = input_problems(job.input, listing) + model_problems(job, pair)
    if problems:
        raise PreflightError("\n".join(problems))


def is_local(url: str) -> bool:
    return fsspec.core.split_protocol(url)[0] in (None, "file", "local")


def input_problems(input_config, listing=None) -> list[str]:
    """input.path holds files of input.format, and the first one has the id, text and reference columns.
    A remote input (s3://, hf://) is checked only where the caller listed it (`run`, which must)."""
    if listing is None and not is_local(input_config.path):
        return []
    try:
        fs, files = listing or input_files(input_config)
    except InputError as exc:
        return [str(exc)]
    try:
        names = _column_names(fs, files[0], input_config.format)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is named with the store's own words
        return [f"input.path: cannot read {files[0]} as {input_config.format} ({type(exc).__name__}: {exc})"]
    return missing_columns(input_config, names, files[0])


def _column_names(fs, file: str, format: str) -> list[str]:
    if format == "parquet":
        import pyarrow.parquet as pq

        from pipeline.io.storage import arrow_filesystem

        return pq.read_schema(file, filesystem=arrow_filesystem(fs)).names
    with fs.open(file, "rb") as handle:
        first = handle.readline(1 << 20).decode("utf-8-sig")
    if format == "csv":
        return next(csv.reader(io.StringIO(first)), [])
    return list(json.loads(first)) if first.strip() else []


def model_problems(job, pair: bool = True) -> list[str]:
    """The models the job loads (models_problems)."""
    return models_problems(job.models, _roles_loaded(job), pair)


def models_problems(models, roles=("small", "large"), pair: bool = True) -> list[str]:
    """Each model of `roles` (of a job's models section or a ModelSpec) is a local folder with a config,
    safetensors weights and (the tokenizer's) tokenizer files, or a hub id cached here or reachable; then,
    unless not `pair`, the pair must share a vocabulary."""
    problems = []
    for role in roles:
        problems += _model_problems(f"models.{role}", getattr(models, role), models.engine,
                                    needs_tokenizer=role == "large" and not models.tokenizer)
    if models.tokenizer:
        problems += _model_problems("models.tokenizer", models.tokenizer, "tokenizer", needs_tokenizer=True)
    if pair and not problems and len(roles) == 2:
        problems += _pair_problems(models)
    return problems


def _roles_loaded(job) -> list[str]:
    """CTranslate2 runs one model (methods large and small); every other engine loads the pair."""
    if job.models.engine != "ct2":
        return ["small", "large"]
    methods = {job.decoding.method, job.report.baseline} - {None}
    return [role for role in ("small", "large") if role in methods] or ["large"]


def _model_problems(key: str, name: str, engine: str, needs_tokenizer: bool) -> list[str]:
    if os.path.isdir(name):
        files = set(os.listdir(name))
        if engine == "ct2" and "model.bin" in files:
            return []  # a converted CTranslate2 folder
        problems = []
        if engine != "tokenizer" and "config.json" not in files:
            problems.append(f"{key} {name!r} holds no config.json: not a saved model folder")
        elif engine != "tokenizer" and not any(f.endswith(".safetensors") for f in files):
            problems.append(f"{key} {name!r} holds no *.safetensors weights"
                            + (" (only pytorch_model.bin: convert it with scripts/convert_to_safetensors.py)"
                               if "pytorch_model.bin" in files else ""))
        if needs_tokenizer and not files.intersection(_TOKENIZER_FILES):
            problems.append(f"{key} {name!r} holds no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...): "
                            "save one beside the model or set models.tokenizer")
        return problems
    if os.path.exists(name):
        return [f"{key} {name!r} is a file, not a model folder"]
    if not _HUB_ID.match(name):
        return [f"{key} {name!r}: no such folder"]
    return _hub_problems(key, name)


def _hub_problems(key: str, name: str) -> list[str]:
    """A hub id: fine if its config is in this machine's cache; else ask the hub (a few seconds at most)."""
    import huggingface_hub as hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(hub.try_to_load_from_cache(name, "config.json"), str):
        return []
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return [f"{key} {name!r}: no such local folder, and as a hub id it is not in this machine's cache "
                "(HF_HUB_OFFLINE is set)"]
    try:
        info = hub.model_info(name, timeout=HUB_TIMEOUT_SECONDS, files_metadata=False)
    except GatedRepoError:
        return [f"{key} {name!r} is a gated model on the hub: accept its terms there and set HF_TOKEN"]
    except RepositoryNotFoundError:
        return [f"{key} {name!r}: no such local folder, and no such model on the hub (or a private one: set "
                "HF_TOKEN)"]
    except Exception as exc:  # noqa: BLE001 - no network, a proxy, a timeout: the id cannot be checked or loaded
        return [f"{key} {name!r}: no such local folder, and as a hub id it is not in this machine's cache and the "
                f"hub cannot be reached ({type(exc).__name__}); download it where the hub is reachable, or set "
                "HF_HOME to a cache that holds it"]
    files = {sibling.rfilename for sibling in info.siblings or []}
    if files and not any(f.endswith(".safetensors") for f in files):
        return [f"{key} {name!r} ships no safetensors weights on the hub (the loader reads only safetensors): "
                "convert it with scripts/convert_to_safetensors.py and point the job at the folder"]
    return []


def _pair_problems(models) -> list[str]:
    """The pair shares a vocabulary (decoding.check_pair: configs and tokenizers, no weights). Checked
    where both models (and the tokenizer) are local folders or in this machine's hub cache; a hub id
    fetched later is left to the actors, which make the same check before loading any weights (here it
    would wait on the hub)."""
    from pipeline.decoding import IncompatiblePairError, check_pair

    names = [models.small, models.large] + ([models.tokenizer] if models.tokenizer else [])
    if models.engine == "ct2" or not all(_readable_here(name) for name in names):
        return []
    try:
        check_pair(models.small, models.large, models.tokenizer, models.trust_remote_code)
    except IncompatiblePairError as exc:
        return [f"models.small and models.large: {exc}"]
    except (OSError, ValueError) as exc:
        return [f"models: cannot read the pair's configs or tokenizer ({' '.join(str(exc).split())[:300]})"]
    return []


def _readable_here(name: str) -> bool:
    """A local folder, or a hub id whose config is in this machine's cache."""
    if os.path.isdir(name):
        return True
    import huggingface_hub as hub

    return bool(_HUB_ID.match(name)) and isinstance(hub.try_to_load_from_cache(name, "config.json"), str)
