"""What ``submit`` uploads: the working directory (this checkout by default) without ``.venv``, ``.git``,
``runs`` and caches, the ``pipeline`` package if the directory lacks it, and the job file, with its presets
merged in, under ``_bild_job/``."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.jobs.load import job_data

JOB_DIR = "_bild_job"  # where the job file lands inside the uploaded working directory
MAX_UPLOAD_BYTES = 100 * 1024 * 1024  # keep well under Ray's package limit
PIPELINE_DIR = Path(__file__).resolve().parents[1]  # the `pipeline` package this module belongs to

# Never uploaded (gitignore syntax). The working directory's .gitignore and .rayignore are honoured as well.
# /docs/: the checkout's documentation and its measured tables and plots, which no job reads.
DEFAULT_EXCLUDES = [
    ".git/", ".venv/", "venv/", "__pycache__/", "*.pyc", "*.egg-info/", ".pytest_cache/", "build/", "dist/",
    "runs/", "/.gl/", ".ipynb_checkpoints/", "*.safetensors", "*.bin", "*.pt", "*.ckpt", "/docs/",
    "/benchmarks/", "/tests/",  # measured tables and outputs, and the test suite: for readers, not for the workers
]


class PackageError(Exception):
    """The working directory cannot be uploaded: it is not a directory, or too big after excludes."""


@dataclass
class Package:
    """A staged working directory ready to upload, and the job file's path inside it."""

    directory: Path
    job_file: str  # relative to directory, POSIX
    size_bytes: int
    source: str  # what was staged, for the user


def stage_package(job_path: str | Path, staging: Path, working_dir: str | Path | None = None,
                  excludes: list[str] | tuple = (), limit: int = MAX_UPLOAD_BYTES) -> Package:
    """Fill ``staging`` with the working directory (default: this checkout) minus excludes, the
    ``pipeline`` package (if the directory lacks it) and a copy of the job file under ``_bild_job/``."""
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)
    root = Path(working_dir).resolve() if working_dir is not None else project_root()
    size = 0
    if root is not None:
        if not root.is_dir():
            raise PackageError(f"--working-dir {root} is not a directory")
        # The ignore files are applied here and not copied: Ray must not re-apply them to the job file.
        spec = _path_spec(DEFAULT_EXCLUDES + _ignore_lines(root) + list(excludes)
                          + [f"/{JOB_DIR}/", "/.gitignore", "/.rayignore"])
        size += _copy_tree(root, staging, spec, limit)
        source = str(root)
    else:
        source = "the installed pipeline package"
    if not (staging / "pipeline" / "__init__.py").is_file():
        spec = _path_spec(DEFAULT_EXCLUDES + list(excludes))
        size += _copy_tree(PIPELINE_DIR, staging / "pipeline", spec, limit - size)
    target = staging / JOB_DIR / Path(job_path).name
    target.parent.mkdir(parents=True, exist_ok=True)
    # The job with its presets merged in, so it runs wherever configs/ is not uploaded.
    target.write_text(yaml.safe_dump(job_data(job_path), sort_keys=False, allow_unicode=True))
    size += target.stat().st_size
    return Package(staging, target.relative_to(staging).as_posix(), size, source)


def runtime_env_for(package: Package, env_vars: dict[str, str] | None = None) -> dict:
    """The Ray Jobs ``runtime_env`` that uploads the package (and sets the job's environment variables)."""
    runtime_env: dict = {"working_dir": str(package.directory), "excludes": list(DEFAULT_EXCLUDES)}
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return runtime_env


def relative_path_warnings(job) -> list[str]:
    """Local relative paths resolve on the cluster, inside the uploaded working directory."""
    warnings = []
    for key, value in (("input.path", job.input.path), ("output.path", job.output.path),
                       ("models.small", job.models.small), ("models.large", job.models.large),
                       ("models.tokenizer", job.models.tokenizer)):
        if not value or "://" in value or Path(value).is_absolute():
            continue
        if key in ("input.path", "output.path") or Path(value).exists():
            warnings.append(
                f"warning: {key} {value!r} is a relative path; on the cluster it is resolved inside the job's "
                "temporary working directory (use an absolute path or a URL such as s3://...)"
            )
    return warnings


def project_root() -> Path | None:
    """The source checkout that holds this package, or None when it is installed elsewhere."""
    root = PIPELINE_DIR.parent
    pyproject = root / "pyproject.toml"
    try:
        if 'name = "bild-pipeline"' in pyproject.read_text(encoding="utf-8"):
            return root
    except OSError:
        pass
    return None


def _path_spec(lines: list[str]):
    try:
        from ray._private.thirdparty.pathspec import PathSpec
    except ImportError:  # pragma: no cover - Ray moved its vendored copy
        from pathspec import PathSpec
    return PathSpec.from_lines("gitwildmatch", lines)


def _ignore_lines(root: Path) -> list[str]:
    lines = []
    for name in (".gitignore", ".rayignore"):
        try:
            lines += (root / name).read_text(encoding="utf-8").splitlines()
        except OSError:
            pass
    return lines


def _copy_tree(src: Path, dst: Path, spec, limit: int) -> int:
    """Copy src into dst, skipping what spec matches; return bytes copied (error over limit)."""
    total = 0
    sizes: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        kept = []
        for name in sorted(dirnames):
            rel = (rel_dir / name).as_posix()
            if not spec.match_file(rel + "/") and not (Path(dirpath) / name).is_symlink():
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = (rel_dir / name).as_posix()
            if spec.match_file(rel):
                continue
            source = Path(dirpath) / name
            if not source.is_file():
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            size = target.stat().st_size
            total += size
            sizes.append((size, rel))
            if total > limit:
                biggest = ", ".join(f"{r} ({s / 2**20:.1f} MiB)" for s, r in sorted(sizes, reverse=True)[:5])
                raise PackageError(
                    f"the working directory {src} is over {limit / 2**20:.0f} MiB after excludes; "
                    f"biggest files: {biggest}. Leave them out with --exclude PATTERN (or .rayignore), "
                    "and put data and models in shared storage."
                )
    return total
