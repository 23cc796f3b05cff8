"""The shipped jobs (jobs/*.yaml), their presets (configs/), the CNN/DM sample and the helper scripts.

Every job must validate once its presets are merged; the sample job runs end to end on tiny models.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pipeline.jobs import load_job
from pipeline.jobs.presets import merge_presets
from support import REPO

JOBS = sorted((REPO / "jobs").glob("*.yaml"))
PRESETS = sorted((REPO / "configs").rglob("*.yaml"))
# The presets that carry the paper's Table 1 (others, e.g. written by `bild-pipeline tune`, may join them).
PAPER_PRESET = re.compile(r"^(cnn_dm|xsum|wmt14_de_en|iwslt17_de_en)_(aligned|unaligned)_(quality|fast)$")
PAPER_PRESETS = [path for path in PRESETS if PAPER_PRESET.match(path.stem)]
SAMPLE = REPO / "data" / "cnn_dm_sample" / "test.parquet"
FRANK = REPO.parent / "shared" / "data" / "cnndm_frank_test" / "frank_cnndm_test.jsonl"

# The paper's Table 1 (Kim et al. 2023), (rollback, fallback) per task, alignment and operating point,
# as the preset files must carry it (sources are named in each file).
TABLE_1 = {
    ("iwslt17_de_en", "unaligned", "quality"): (2, 0.6), ("iwslt17_de_en", "unaligned", "fast"): (3, 0.5),
    ("iwslt17_de_en", "aligned", "quality"): (3, 0.9), ("iwslt17_de_en", "aligned", "fast"): (4, 0.6),
    ("wmt14_de_en", "unaligned", "quality"): (2, 0.6), ("wmt14_de_en", "unaligned", "fast"): (3, 0.5),
    ("wmt14_de_en", "aligned", "quality"): (2, 0.8), ("wmt14_de_en", "aligned", "fast"): (5, 0.6),
    ("xsum", "unaligned", "quality"): (3, 0.5), ("xsum", "unaligned", "fast"): (5, 0.3),
    ("xsum", "aligned", "quality"): (2, 0.6), ("xsum", "aligned", "fast"): (5, 0.4),
    ("cnn_dm", "unaligned", "quality"): (3, 0.4), ("cnn_dm", "unaligned", "fast"): (6, 0.2),
    ("cnn_dm", "aligned", "quality"): (3, 0.3), ("cnn_dm", "aligned", "fast"): (6, 0.2),
}
PAPER_JOBS = {  # job -> (task, small model, large model)
    "cnn_dm": ("summarization", "kssteven/T5-small-cnndm", "kssteven/T5-large-cnndm"),
    "xsum": ("summarization", "kssteven/T5-small-xsum", "kssteven/T5-large-xsum"),
    "wmt14_de_en": ("translation", "kssteven/mT5-small-wmt2014-de-en", "kssteven/mT5-large-wmt2014-de-en"),
    "iwslt17_de_en": ("translation", "kssteven/mT5-small-iwslt2017-de-en", "kssteven/mT5-large-iwslt2017-de-en"),
}


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def write_job(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def shared_data(path: Path) -> Path:
    """A file of ../shared/data (the data folder beside the checkout). Where it is absent the test is
    skipped, except in CI (CI=true), which has it: there a missing folder fails instead of passing unseen."""
    if not path.is_file():
        message = f"{path} is not here (../shared/data beside the checkout)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{message}; CI must provide it")
        pytest.skip(message)
    return path


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


CATALOG = set(PAPER_JOBS) | {"cnn_dm_sample", "nightly_de_en"}  # the jobs of issue 7


def test_the_catalog_is_there():
    assert CATALOG <= {path.stem for path in JOBS}
    assert len(PAPER_PRESETS) == len(TABLE_1)


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_every_job_validates_with_its_presets(path):
    """load_job on each shipped job merges its presets: the thresholds come from them."""
    job = load_job(path)
    data = raw(path)
    if path.stem not in CATALOG and not data.get("presets"):
        return  # a job without presets: validating is all there is to check
    assert job.name == path.stem
    assert data.get("presets"), "thresholds come from a preset"
    own = data.get("decoding") or {}
    assert not {"fallback_threshold", "rollback_threshold"} & set(own), "the job must not shadow its preset"
    preset = merge_presets({"presets": data["presets"]}, path)["decoding"]
    assert job.decoding.fallback_threshold == preset["fallback_threshold"]
    assert job.decoding.rollback_threshold == preset["rollback_threshold"]
    assert job.decoding.method == "bild"


@pytest.mark.parametrize("name", sorted(PAPER_JOBS))
def test_paper_jobs(name):
    task, small, large = PAPER_JOBS[name]
    path = REPO / "jobs" / f"{name}.yaml"
    job = load_job(path, ["output.path=s3://elsewhere/run/"])
    assert job.task == task
    assert (job.models.small, job.models.large) == (small, large)
    assert job.models.tokenizer, "the tokenizer the authors' scripts use"
    assert job.input.path.startswith(("hf://datasets/", "s3://")) and "test" in job.input.path
    assert job.input.format == "parquet" and job.input.reference_column
    assert job.output.path == "s3://elsewhere/run/", "the output is configurable"
    if task == "summarization":
        assert job.prompt == "summarize: {text}"
    preset = Path(raw(path)["presets"][0]).name
    assert preset == f"{name}_unaligned_quality.yaml"


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_names_its_source_and_validates(preset, tmp_path):
    text = preset.read_text(encoding="utf-8")
    assert text.startswith("#"), "a preset opens with a comment saying where its numbers come from"
    if preset in PAPER_PRESETS:
        assert "# source:" in text and "2302.07863" in text and "not checked" in text
    job = load_job(write_job(tmp_path / "job.yaml", {"presets": [str(preset)], "name": "p", "input": {"path": "x"},
                                                     "models": {"small": "s", "large": "l"},
                                                     "output": {"path": "y"}}))
    if preset in PAPER_PRESETS:
        assert set(raw(preset)) == {"decoding"}
        assert job.decoding.method == "bild" and job.decoding.do_sample is False


def test_presets_carry_table_1():
    found = {}
    for preset in PAPER_PRESETS:
        task, alignment, point = preset.stem.rsplit("_", 2)
        decoding = raw(preset)["decoding"]
        found[(task, alignment, point)] = (decoding["rollback_threshold"], decoding["fallback_threshold"])
    assert found == TABLE_1


def test_cli_validate_accepts_every_job():
    """`bild-pipeline validate --schema-only jobs/*.yaml`, as CI runs it: every shipped job is valid with its
    presets (the jobs for a cluster name hub models and buckets this machine cannot reach)."""
    from pipeline.cli import main

    result = CliRunner().invoke(main, ["validate", "--schema-only", *map(str, JOBS)])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (job") == len(JOBS)


def test_the_jobs_that_run_here_pass_every_check():
    """The shipped jobs on shipped data and models pass `validate`'s checks of paths, columns and models too."""
    from pipeline.cli import main

    result = CliRunner().invoke(main, ["validate", str(REPO / "jobs" / "demo.yaml"),
                                       str(REPO / "jobs" / "nightly_ct2.yaml")])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------
# The CNN/DM sample


def test_cnn_dm_sample_data():
    assert SAMPLE.stat().st_size < 2 * 2**20
    table = pq.read_table(SAMPLE)
    assert table.schema.names == ["id", "article", "highlights"]
    assert table.num_rows == 250
    assert pc.count_distinct(table["id"]).as_py() == 250
    for column in table.schema.names:
        assert table[column].null_count == 0 and pc.min(pc.utf8_length(table[column])).as_py() > 0
    assert (SAMPLE.parent / "SOURCE.md").is_file()


def test_the_sample_is_what_the_script_makes():
    """data/cnn_dm_sample is the script's output from the FRANK source in ../shared (checked by its sha256)."""
    make = script("make_cnn_dm_sample")
    table = make.to_table(make.read_source(shared_data(FRANK)))
    assert table.equals(pq.read_table(SAMPLE))


@pytest.mark.slow
def test_cnn_dm_sample_job_end_to_end(ray_local, saved_tiny_pair, tmp_path, monkeypatch):
    from pipeline.io.storage import read_manifest, open_filesystem, read_output_table
    from pipeline.jobs.run import run_job

    monkeypatch.chdir(REPO)  # the job's input path is relative to the repository root
    small, large = saved_tiny_pair
    out = tmp_path / "run"
    overrides = [f"models.small={small}", f"models.large={large}", "models.device=cpu",
                 f"output.path={out}", "output.mode=overwrite", "input.limit=6", "decoding.max_new_tokens=8"]
    job = load_job(REPO / "jobs" / "cnn_dm_sample.yaml", overrides)
    summary = run_job(job)
    assert summary.decoded_now == 6 and summary.records_in_output == 6

    rows = read_output_table(str(out)).sort_by("id")
    sample = pq.read_table(SAMPLE).slice(0, 6).sort_by("id")
    assert rows["id"].to_pylist() == sample["id"].to_pylist(), "the first six ids, each once"
    assert rows["reference"].to_pylist() == sample["highlights"].to_pylist()
    assert rows["error"].null_count == 6
    assert set(rows["method"].to_pylist()) == {"bild"}
    for record in rows.to_pylist():
        assert record["small_tokens"] + record["large_tokens"] == record["output_tokens"] <= 8
    manifest = read_manifest(*open_filesystem(str(out)))
    assert manifest["status"] == "succeeded"
    assert manifest["job"]["decoding"]["rollback_threshold"] == 3.0  # from the preset
    assert manifest["job"]["decoding"]["fallback_threshold"] == 0.4


# ---------------------------------------------------------------------------------------------
# Helper scripts of the paper's jobs


def test_mirror_flattens_translation_pairs_with_stable_ids():
    mirror = script("mirror_translation_test")
    pairs = pa.table({"translation": [{"de": "Ein Hund.", "en": "A dog."}, {"de": "Zwei.", "en": "Two."}]})
    flat = mirror.flatten_translation(pairs, "wmt14-de-en-test")
    assert flat.to_pylist() == [
        {"id": "wmt14-de-en-test-000000", "de": "Ein Hund.", "en": "A dog."},
        {"id": "wmt14-de-en-test-000001", "de": "Zwei.", "en": "Two."},
    ]
    for name in ("wmt14", "iwslt17"):
        job = load_job(REPO / "jobs" / f"{name}_de_en.yaml")
        assert set(flat.schema.names) == {job.input.id_column, job.input.text_column, job.input.reference_column}


def test_convert_to_safetensors_makes_a_pickle_checkpoint_loadable(tmp_path):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from pipeline.pairs.tiny import build_pair

    _, large, tokenizer = build_pair("t5", seed=0, small="noisy")
    source = tmp_path / "bin"
    large.config.save_pretrained(source)
    tokenizer.save_pretrained(source)
    torch.save(large.state_dict(), source / "pytorch_model.bin")  # as the authors' checkpoints ship
    with pytest.raises(OSError):
        AutoModelForSeq2SeqLM.from_pretrained(source, use_safetensors=True)

    script("convert_to_safetensors").convert(str(source), str(tmp_path / "safe"))
    assert (tmp_path / "safe" / "model.safetensors").is_file()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "safe", use_safetensors=True)
    for key, value in large.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_preset_written_by_tune_is_a_preset(tmp_path):
    """`bild-pipeline tune --out configs/decoding/x.yaml` writes files that jobs can list under presets."""
    sweep = pytest.importorskip("pipeline.jobs.sweep")
    point = {"point": "bild fb=0.4 rb=3", "method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0,
             "max_draft_tokens": 10, "latency_ms": 12.0, "rougeL": 40.0, "speedup_vs_large": 1.5}
    preset = tmp_path / "configs" / "decoding" / "tuned.yaml"
    preset.parent.mkdir(parents=True)
    preset.write_text(sweep.preset_yaml(point, "rougeL", 0.5, "sweep.json"), encoding="utf-8")
    data = {**raw(REPO / "jobs" / "cnn_dm_sample.yaml"), "presets": ["../configs/decoding/tuned.yaml"]}
    job = load_job(write_job(tmp_path / "jobs" / "job.yaml", data))
    assert (job.decoding.fallback_threshold, job.decoding.rollback_threshold) == (0.4, 3.0)
