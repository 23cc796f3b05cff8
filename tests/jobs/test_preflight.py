"""Checks before anything starts: `validate`, and `run` before Ray, name each bad path, column and model folder."""

from __future__ import annotations

import json
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main


def write_job(tmp_path, pair, **sections) -> str:
    small, large = pair
    data = {"name": "t", "input": {"path": str(tmp_path / "in.parquet"), "text_column": "de",
                                   "reference_column": "en"},
            "models": {"small": small, "large": large}, "output": {"path": str(tmp_path / "out")}}
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "job.yaml")


@pytest.fixture
def corpus(tmp_path):
    rows = {"id": ["1", "2"], "de": ["Ein Hund.", "Zwei Katzen."], "en": ["A dog.", "Two cats."]}
    pq.write_table(pa.table(rows), tmp_path / "in.parquet")
    (tmp_path / "in.csv").write_text("id,de,en\n1,Ein Hund.,A dog.\n")
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "1", "de": "Ein Hund."}) + "\n")
    return tmp_path


def validate(job: str, *overrides: str):
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["validate", job, *[item for o in overrides for item in ("--set", o)]])
    return result, time.perf_counter() - started


def test_a_job_on_real_files_and_a_real_pair_passes(corpus, saved_tiny_pair):
    result, _ = validate(write_job(corpus, saved_tiny_pair))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("override, message", [
    ("input.path=data/nope.parquet", "input.path 'data/nope.parquet' does not exist"),
    ("input.text_column=fr", "input.text_column 'fr' is not a column of"),
    ("input.reference_column=ref", "input.reference_column 'ref' is not a column of"),
])
def test_a_bad_input_path_or_column_is_named_in_seconds(corpus, saved_tiny_pair, override, message):
    result, seconds = validate(write_job(corpus, saved_tiny_pair), override)
    assert result.exit_code == 2 and message in result.output, result.output
    assert seconds < 5


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_columns_are_read_from_one_file_of_each_format(corpus, saved_tiny_pair, fmt):
    job = write_job(corpus, saved_tiny_pair, input={"path": str(corpus / f"in.{fmt}"), "format": fmt})
    assert validate(job)[0].exit_code == 0
    result, _ = validate(job, "input.text_column=fr")
    assert result.exit_code == 2 and "input.text_column 'fr' is not a column of" in result.output
    assert "(columns: id, de" in result.output


def test_bad_model_folders_are_named_with_what_they_lack(corpus, saved_tiny_pair, tmp_path, monkeypatch):
    small, large = saved_tiny_pair
    pickled = tmp_path / "pickled"
    shutil.copytree(large, pickled)
    for weights in pickled.glob("*.safetensors"):
        weights.rename(pickled / "pytorch_model.bin")
    untokenized = tmp_path / "untokenized"
    shutil.copytree(large, untokenized, ignore=shutil.ignore_patterns("tok*", "spiece*", "special*"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    job = write_job(corpus, saved_tiny_pair)
    cases = {f"models.small={tmp_path / 'nope'}": "no such folder",
             "models.small=models/nope": "'models/nope': no such local folder, and as a hub id it is not in this "
                                         "machine's cache",
             f"models.large={pickled}": "holds no *.safetensors weights (only pytorch_model.bin: convert it",
             f"models.large={untokenized}": "holds no tokenizer files"}
    for override, message in cases.items():
        result, seconds = validate(job, override)
        assert result.exit_code == 2 and message in result.output, (override, result.output)
        assert result.output.startswith(f"{job}: models.") and seconds < 5


def test_run_stops_before_ray_on_a_bad_path(corpus, saved_tiny_pair, monkeypatch):
    import pipeline.jobs.run as run_module

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(run_module, "connect_ray", no_ray)
    job = write_job(corpus, saved_tiny_pair)
    result = CliRunner().invoke(main, ["run", job, "--set", "input.text_column=fr"])
    assert result.exit_code == 2 and "input.text_column 'fr' is not a column" in result.output, result.output
    assert not (corpus / "out").exists()  # nothing written, not even the lease


def test_hub_ids_are_looked_up_and_named(monkeypatch):
    """A hub id not cached here: missing, gated, or shipping only pytorch_model.bin is named; one with
    safetensors passes. (The hub is faked: no machine here reaches it.)"""
    import types

    import httpx
    import huggingface_hub as hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from pipeline.jobs.preflight import _hub_problems

    def info(files):
        return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=f) for f in files])

    def answer(status: int):
        return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))

    answers = {"org/missing": RepositoryNotFoundError("404", response=answer(404)),
               "org/gated": GatedRepoError("401", response=answer(401)),
               "org/pickled": info(["config.json", "pytorch_model.bin"]),
               "org/fine": info(["config.json", "model.safetensors"])}

    def model_info(name, **_):
        answer = answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(hub, "model_info", model_info)
    assert "no such model on the hub" in _hub_problems("models.small", "org/missing")[0]
    assert "gated model on the hub" in _hub_problems("models.small", "org/gated")[0]
    assert "ships no safetensors weights" in _hub_problems("models.large", "org/pickled")[0]
    assert _hub_problems("models.large", "org/fine") == []
