"""What makes a run one configuration: the settings that decide a row's tokens (decisive_settings, hashed into
the rows' config_hash), and the models' content; and the secrets a job holds, never written or printed (redact).

An output folder holds the rows of one configuration. Its manifest (run.json) records both halves
below (a local model folder by every byte of its files, a hub id by the commit its cache resolves to); a
resume compares them with the job it is handed and refuses (exit 2) where they differ, naming each key, so
that no report ever scores rows of two configurations as one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from typing import Any

from pipeline.decoding.config import CACHE_ROOT

__all__ = ["REDACTED", "ResumeMismatchError", "check_resume", "decisive_settings", "differences", "is_secret_key",
           "model_fingerprint", "models_content", "redact", "settings_hash"]

log = logging.getLogger(__name__)

# Each file's digest, kept with its size and mtime: a multi-GB checkpoint is read once per machine, not per run.
DIGEST_CACHE = CACHE_ROOT / "file-digests.json"
SCHEME = "sha256:"  # a local folder's fingerprint, every byte of every file; before 2026-12 there was no prefix
_LEGACY_ENDS_BYTES = 1 << 20  # the old scheme hashed files over 1 MiB by their first and last MiB only


def model_fingerprint(name: str) -> str:
    """A hash of a local model folder's content: each file's name, size and every byte ("sha256:..."); for a
    hub id, "name:ID@COMMIT" with the revision its local cache resolves to ("name:ID" where none can be had
    offline); "name:..." for anything else (a remote folder)."""
    if not os.path.isdir(name):
        return f"name:{name}" + (f"@{commit}" if (commit := _hub_commit(name)) else "")
    cache = _load_digests()
    digest = hashlib.sha256()
    for path, relative in _files(name):
        digest.update(f"{relative}\0{os.path.getsize(path)}\0".encode())
        digest.update(bytes.fromhex(_file_digest(path, cache)))
    _save_digests(cache)
    return SCHEME + digest.hexdigest()[:16]


def _files(folder: str):
    """(path, path relative to the folder) of every file not hidden, in a fixed order."""
    for parent, subfolders, files in sorted(os.walk(folder)):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for file in sorted(f for f in files if not f.startswith(".")):
            path = os.path.join(parent, file)
            yield path, os.path.relpath(path, folder)


def _file_digest(path: str, cache: dict[str, list]) -> str:
    stat, key = os.stat(path), os.path.abspath(path)
    if cache.get(key, [None, None, None])[:2] != [stat.st_size, stat.st_mtime_ns]:
        with open(path, "rb") as handle:
            cache[key] = [stat.st_size, stat.st_mtime_ns, hashlib.file_digest(handle, "sha256").hexdigest()]
    return cache[key][2]


def _load_digests() -> dict[str, list]:
    """{absolute path: [size, mtime in ns, sha256]}."""
    try:
        return json.loads(DIGEST_CACHE.read_text())
    except (OSError, ValueError):  # none yet, unreadable, or cut off: digests are computed again
        return {}


def _save_digests(cache: dict[str, list]) -> None:
    """Keep the digests of files that still exist; written whole under a temporary name, then renamed, so a
    concurrent run reads the old cache or the new one."""
    kept = {path: entry for path, entry in cache.items() if os.path.exists(path)}
    handle = None
    try:
        DIGEST_CACHE.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=DIGEST_CACHE.parent, delete=False, suffix=".partial") as handle:
            json.dump(kept, handle)
        os.replace(handle.name, DIGEST_CACHE)
    except OSError as exc:  # a read-only home: every run hashes again, nothing else changes
        log.debug("cannot keep file digests in %s: %s", DIGEST_CACHE, exc)
        if handle is not None:
            with contextlib.suppress(OSError):
                os.unlink(handle.name)


def _hub_commit(repo_id: str) -> str | None:
    """The commit a hub id's local cache resolves to (its default revision), or None (not cached, not a hub id)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, no huggingface_hub: no revision to record
        return None
    if not isinstance(found, str):
        return None
    parts = os.path.normpath(found).split(os.sep)
    return parts[-2] if len(parts) >= 3 and parts[-3] == "snapshots" else None


def legacy_fingerprint(name: str) -> str:
    """The fingerprint of outputs written before SCHEME (names, sizes, small files whole, larger ones by their
    first and last MiB), so that their resume is still checked, as weakly as it was."""
    digest = hashlib.sha256()
    for path, relative in _files(name):
        size = os.path.getsize(path)
        digest.update(f"{relative}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= _LEGACY_ENDS_BYTES:
                digest.update(handle.read())
            else:
                digest.update(handle.read(_LEGACY_ENDS_BYTES))
                handle.seek(size - _LEGACY_ENDS_BYTES)
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def _model_names(job) -> dict[str, str]:
    models = job.models
    named = {"models.small": models.small, "models.large": models.large, "models.tokenizer": models.tokenizer}
    return {key: value for key, value in named.items() if value}


def models_content(job) -> dict[str, str]:
    """{"models.small": fingerprint, "models.large": ..., "models.tokenizer": ...}, as run.json records it."""
    return {key: model_fingerprint(value) for key, value in _model_names(job).items()}


def _in_the_scheme_of(before: dict[str, str], now: dict[str, str], job) -> dict[str, str]:
    """`now`, each value as an older version recorded it where `before` holds one: a folder's partial hash, a
    hub id without its revision."""
    names, now = _model_names(job), dict(now)
    for key, old in before.items():
        if key not in now or key not in names:
            continue
        if not old.startswith(("name:", SCHEME)) and os.path.isdir(names[key]):
            now[key] = legacy_fingerprint(names[key])
        elif old.startswith("name:") and "@" not in old:
            now[key] = now[key].split("@", 1)[0]
    return now


class ResumeMismatchError(ValueError):
    """output.mode resume on an output written under another configuration."""


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """"key: old -> new" for every key whose value differs (a key only one side has included)."""
    missing = object()
    found = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key, missing), now.get(key, missing)
        if old != new:
            shown = ["(absent)" if value is missing else repr(value) for value in (old, new)]
            found.append(f"{key}: {shown[0]} -> {shown[1]}")
    return found


def check_resume(previous: dict | None, current: dict, output_path: str, job=None) -> None:
    """Refuse to resume `output_path`, whose manifest is `previous`, under the configuration `current`
    (the manifest about to be written, for `job`) where any decisive setting or model content differs. A
    manifest from before these were recorded (or none: a fresh output) is accepted; model content an older
    version recorded is compared as that version computed it."""
    if not previous or "decisive_settings" not in previous:
        return
    before, now = previous.get("models_content", {}), current["models_content"]
    if job is not None:
        now = _in_the_scheme_of(before, now, job)
    changed = differences(previous["decisive_settings"], current["decisive_settings"])
    changed += [f"{line} (the model's files changed)" for line in differences(before, now)]
    if changed:
        raise ResumeMismatchError(
            f"output.path {output_path!r} holds rows of another configuration; resuming would mix two in one "
            f"run. Changed: {'; '.join(changed)}. Put the changed settings back, or write to a new output.path "
            f"(or set output.mode: overwrite to discard the rows there).")


# --- the settings that decide a row, hashed ---------------------------------------------------------------------

# Settings a row's tokens do not depend on: how much is decoded, where things are kept, credentials.
_NOT_DECISIVE = {"input.limit", "input.storage_options", "models.ct2_cache", "report.baseline_records",
                 "input.target_language"}  # the last: what the report counts, never a row
_DECISIVE_SECTIONS = ("task", "prompt", "input", "models", "decoding", "report")


def _decides_nothing(name: str, resolved: dict) -> bool:
    """Keys added after runs were recorded, left out where they change no row (so those runs resume and keep
    their config_hash): input.segment none, input.language_check off, and input.language, which only the
    sentence splitter and the language check read; input.markup none."""
    segmented = resolved["input"].get("segment") == "sentence"
    checked = resolved["input"].get("language_check", "off") != "off"
    return {"input.segment": not segmented, "input.language_check": not checked,
            "input.markup": resolved["input"].get("markup", "none") == "none",
            "input.language": not (segmented or checked)}.get(name, False)


def decisive_settings(job) -> dict[str, Any]:
    """{dotted key: value} of every setting that decides the rows (engine and quantize included: onnx int8
    and native int8 quantize differently, so their tokens can differ)."""
    resolved = job.redacted()
    flat: dict[str, Any] = {}
    for section in _DECISIVE_SECTIONS:
        value = resolved[section]
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, item in items:
            name = section if key is None else f"{section}.{key}"
            if name not in _NOT_DECISIVE and not _decides_nothing(name, resolved):
                flat[name] = item
    return flat


def settings_hash(job) -> str:
    """A short hash of decisive_settings (the rows' config_hash column)."""
    blob = json.dumps(decisive_settings(job), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --- secrets, never written or printed ------------------------------------------------------------------------

# Keys whose values are secrets: "key", "secret", "token", "aws_secret_access_key", "session_token",
# "api_key", "password" ... but not "max_new_tokens" or "id_column".
_SECRET_KEY = re.compile(r"(^|_)(key|token|secret|password|passwd|credentials?)$|secret|password|private_key", re.I)
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """Whether a config key (its last dotted part) names a secret."""
    return bool(_SECRET_KEY.search(str(key).split(".")[-1]))


# Storage options shown as they are in run.json and printed configs: where the data lives, never how one
# signs in. Every other storage option (aws_access_key_id, a token, a credentials file) is redacted.
STORAGE_OPTIONS_SHOWN = frozenset({"endpoint_url", "endpoint", "region", "region_name", "profile", "profile_name",
                                   "anon", "use_ssl", "client_kwargs"})


def redact(value: Any, in_storage_options: bool = False) -> Any:
    """Replace the values of secret-looking keys anywhere in a nested structure, and of every storage option
    outside STORAGE_OPTIONS_SHOWN."""
    if isinstance(value, dict):
        shown = {}
        for key, item in value.items():
            hidden = (in_storage_options and key not in STORAGE_OPTIONS_SHOWN) or is_secret_key(key)
            nested = in_storage_options or key == "storage_options"
            shown[key] = REDACTED if hidden and item not in (None, "") else redact(item, nested)
        return shown
    if isinstance(value, list):
        return [redact(item, in_storage_options) for item in value]
    return value
