"""merge_presets: job files pull reusable YAML fragments (configs/) in with a top-level `presets:` list."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.jobs import JobConfig, JobFileError, apply_overrides, load_job
from pipeline.jobs.presets import deep_merge, merge_presets

JOB = {
    "name": "t",
    "input": {"path": "in.parquet"},
    "models": {"small": "s", "large": "l"},
    "output": {"path": "out/"},
}


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture()
def layout(tmp_path):
    """jobs/job.yaml beside configs/, as in the repository."""
    write(tmp_path / "configs" / "a.yaml", {"decoding": {"method": "bild", "fallback_threshold": 0.4,
                                                         "rollback_threshold": 3.0, "max_new_tokens": 64}})
    write(tmp_path / "configs" / "b.yaml", {"decoding": {"rollback_threshold": 6.0},
                                            "compute": {"actors": 4, "gpus_per_actor": 1}})
    return tmp_path


def test_presets_merge_in_order_and_the_job_wins(layout):
    job_path = layout / "jobs" / "job.yaml"
    data = {**JOB, "presets": ["../configs/a.yaml", "../configs/b.yaml"],
            "decoding": {"max_new_tokens": 8}, "compute": {"actors": 2}}
    merged = merge_presets(data, job_path)
    assert "presets" not in merged
    assert merged["decoding"] == {"method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 6.0,
                                  "max_new_tokens": 8}  # b over a, the job over both
    assert merged["compute"] == {"actors": 2, "gpus_per_actor": 1}  # merged key by key
    assert merged["name"] == "t"
    JobConfig.model_validate(merged)
    assert data["presets"] == ["../configs/a.yaml", "../configs/b.yaml"], "the input is not modified"


def test_overrides_apply_after_presets(layout):
    data = merge_presets({**JOB, "presets": ["../configs/a.yaml"]}, layout / "jobs" / "job.yaml")
    job = JobConfig.model_validate(apply_overrides(data, ["decoding.fallback_threshold=0.9"]))
    assert job.decoding.fallback_threshold == 0.9 and job.decoding.rollback_threshold == 3.0


def test_paths_are_relative_to_the_job_file_not_the_working_directory(layout, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    merged = merge_presets({**JOB, "presets": ["../configs/a.yaml"]}, layout / "jobs" / "job.yaml")
    assert merged["decoding"]["fallback_threshold"] == 0.4
    absolute = merge_presets({**JOB, "presets": [str(layout / "configs" / "b.yaml")]}, "job.yaml")
    assert absolute["decoding"] == {"rollback_threshold": 6.0}


def test_lists_and_scalars_replace_whole():
    assert deep_merge({"a": [1, 2], "b": {"c": 1, "d": 2}}, {"a": [3], "b": {"d": None}}) == {
        "a": [3], "b": {"c": 1, "d": None}}


def test_a_job_without_presets_is_unchanged(layout):
    assert merge_presets(dict(JOB), layout / "job.yaml") == JOB
    assert merge_presets({**JOB, "presets": None}, layout / "job.yaml") == JOB
    assert merge_presets({**JOB, "presets": []}, layout / "job.yaml") == JOB


@pytest.mark.parametrize(
    "presets, content, expected",
    [
        ("../configs/a.yaml", None, "expected a list"),
        (["../configs/missing.yaml"], None, "cannot read the preset file"),
        ([3], None, "expected the path of a preset file"),
        ([""], None, "expected the path of a preset file"),
        (["../configs/bad.yaml"], "decoding: [unclosed", "not valid YAML"),
        (["../configs/bad.yaml"], "- a\n- b\n", "must be a mapping"),
        (["../configs/bad.yaml"], "presets: [x.yaml]\n", "cannot include other presets"),
        (["../configs/bad.yaml"], "decodng: {method: bild}\n", "unknown key(s) decodng"),
    ],
)
def test_bad_presets_name_the_key_and_the_file(layout, presets, content, expected):
    if content is not None:
        write(layout / "configs" / "bad.yaml", content)
    job_path = layout / "jobs" / "job.yaml"
    with pytest.raises(JobFileError) as error:
        merge_presets({**JOB, "presets": presets}, job_path)
    message = str(error.value)
    assert "presets" in message and str(job_path) in message and expected in message


def test_an_empty_preset_file_adds_nothing(layout):
    write(layout / "configs" / "empty.yaml", "# nothing yet\n")
    assert merge_presets({**JOB, "presets": ["../configs/empty.yaml"]}, layout / "jobs" / "job.yaml") == JOB


def test_load_job_merges_presets_under_the_job_and_set_on_top(layout):
    """load_job(path) itself merges the presets: under the job file's keys, with --set applied last."""
    job_path = write(layout / "jobs" / "job.yaml", {**JOB, "presets": ["../configs/a.yaml", "../configs/b.yaml"],
                                                    "decoding": {"max_new_tokens": 8}})
    job = load_job(job_path)
    assert job.decoding.fallback_threshold == 0.4, "from preset a"
    assert job.decoding.rollback_threshold == 6.0, "preset b over preset a"
    assert job.decoding.max_new_tokens == 8, "the job over the presets"
    assert job.compute.actors == 4 and job.compute.gpus_per_actor == 1
    assert load_job(job_path, ["decoding.max_new_tokens=4"]).decoding.max_new_tokens == 4, "--set over the job"


def test_load_job_names_a_bad_preset(layout):
    """A preset's problem surfaces from load_job naming the job file and the presets key."""
    job_path = write(layout / "jobs" / "job.yaml", {**JOB, "presets": ["../configs/missing.yaml"]})
    with pytest.raises(JobFileError, match=r"presets\[0\].*cannot read the preset file") as error:
        load_job(job_path)
    assert str(job_path) in str(error.value)
