"""The one-off `generate` command and the tiny-pair helper, through click's runner."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from pipeline.cli import main


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    result = CliRunner().invoke(main, ["tiny-pair", str(out), "--family", "t5"])
    assert result.exit_code == 0, result.output
    return out / "small", out / "large"


def test_generate_prints_output_and_statistics(saved_pair):
    small, large = saved_pair
    result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large), "--method", "bild",
                                       "--max-new-tokens", "12", "--device", "cpu", "Ein Hund läuft."])
    assert result.exit_code == 0, result.output
    assert "prediction:" in result.output
    assert "fallbacks=" in result.output and "rollbacks=" in result.output and "output_tokens=12" in result.output


def test_generate_json_and_a_bad_record(saved_pair):
    small, large = saved_pair
    result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large), "--json",
                                       "--method", "speculative", "--max-new-tokens", "6", "Hallo", " "])
    assert result.exit_code == 1  # one record failed
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [row["error"] is None for row in rows] == [True, False]
    assert rows[0]["small_tokens"] + rows[0]["large_tokens"] == rows[0]["output_tokens"]


def test_generate_refuses_a_bad_setting_with_exit_2(saved_pair):
    small, large = saved_pair
    result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large),
                                       "--temperature", "0", "x"])
    assert result.exit_code == 2 and "temperature" in result.output


def test_generate_refuses_a_missing_model_with_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["generate", "--small", str(tmp_path / "nope"), "--large",
                                       str(tmp_path / "nope"), "x"])
    assert result.exit_code == 2 and f"models.small '{tmp_path / 'nope'}': no such folder" in result.output


@pytest.mark.parametrize("prompt, message", [("translate:", "must contain {text}"),
                                             ("{lang}: {text}", "may hold no field but {text} (found 'lang')")])
def test_generate_holds_its_prompt_to_the_job_files_rule(saved_pair, prompt, message):
    """A template without {text} would send the models the template alone; one with another field would fail
    after the models load: both exit 2 before anything loads, as in a job file."""
    small, large = saved_pair
    result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large), "--prompt", prompt,
                                       "Hallo"])
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_generate_decodes_as_a_job_file_says(saved_pair, tmp_path, monkeypatch):
    """--job takes the job's models, decoding settings, prompt and batch size; options given override them;
    a warm-up call comes first, so no record's latency_ms holds the first call's set-up; errors on stderr."""
    from pipeline.decoding import Generator

    small, large = saved_pair
    job = write_job(tmp_path, models={"small": str(small), "large": str(large), "device": "cpu"},
                    decoding={"method": "bild", "rollback_threshold": 1.0, "max_new_tokens": 5},
                    compute={"batch_size": 3}, prompt="translate: {text}")
    seen = []
    original = Generator.generate

    def spy(self, texts, seeds=None, batch=None):
        seen.append((list(texts), self.config, batch.batch_size))
        return original(self, texts, seeds, batch=batch)

    monkeypatch.setattr(Generator, "generate", spy)
    result = CliRunner().invoke(main, ["generate", "--job", str(job), "--fallback-threshold", "0.7", "Hallo", ""])
    assert result.exit_code == 1, result.output  # the empty text's row failed
    assert "error:      input text is empty" in result.stderr and "error:" not in result.stdout
    (warm_up, _, _), (texts, config, batch_size) = seen
    assert warm_up == ["warm up"] and texts == ["translate: Hallo", ""] and batch_size == 3
    assert (config.rollback_threshold, config.fallback_threshold, config.max_new_tokens) == (1.0, 0.7, 5)


def test_generate_on_either_engine_gives_the_same_output(saved_pair):
    small, large = saved_pair
    outputs = {}
    for engine in ("native", "hf"):
        result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large), "--json",
                                           "--engine", engine, "--max-new-tokens", "10", "Ein Hund läuft."])
        assert result.exit_code == 0, result.output
        outputs[engine] = json.loads(result.output.splitlines()[-1])
    for record in outputs.values():
        record.pop("latency_ms")
    assert outputs["native"] == outputs["hf"]
    result = CliRunner().invoke(main, ["generate", "--small", str(small), "--large", str(large), "--engine", "x", "y"])
    assert result.exit_code == 2 and "--engine" in result.output


def test_tiny_pair_offers_every_family_of_pipeline_tiny():
    from pipeline.cli.models import tiny_pair
    from pipeline.pairs.tiny import FAMILIES

    family = next(p for p in tiny_pair.params if p.name == "family")
    assert tuple(family.type.choices) == FAMILIES


def test_tiny_pair_shape_choices_are_the_random_pairs_shapes():
    from pipeline.cli.models import tiny_pair
    from pipeline.pairs.random_shapes import SHAPES

    shape = next(p for p in tiny_pair.params if p.name == "shape")
    assert tuple(shape.type.choices) == tuple(SHAPES)


# ---------------------------------------------------------------------------------------------
# Job commands (`validate`, `run`): what exits 2, and what the message names (or must not show)

SECRET = "AKIA-do-not-print-7f3e"


def write_job(tmp_path, name="job.yaml", **sections):
    """A job file in tmp_path: a small valid job with `sections` merged in (a section of None drops it)."""
    import yaml

    data = {"name": "t", "input": {"path": str(tmp_path / "in.parquet"), "reference_column": "ref"},
            "models": {"small": "s", "large": "l", "device": "cpu"},
            "decoding": {"method": "bild", "max_new_tokens": 4},
            "compute": {"actors": 1, "batch_size": 2},
            "output": {"path": str(tmp_path / "out"), "mode": "overwrite"}}
    for section, values in sections.items():
        if values is None:
            data.pop(section)
        else:
            data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def write_input(tmp_path, ids):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ids, "text": ["Ein Hund läuft."] * len(ids), "ref": ["A dog runs."] * len(ids)}),
                   tmp_path / "in.parquet")


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(
    "sections, key",
    [({"decoding": {"methd": "bild"}}, "decoding.methd: unknown key"),
     ({"compute": {"actors": 0}}, "compute.actors"),
     ({"decoding": {"max_new_tokens": "many"}}, "decoding.max_new_tokens"),
     ({"output": None}, "output: Field required"),
     ({"models": {"quantize": "int4"}}, "models.quantize"),
     ({"models": {"quantize": "int8", "engine": "hf"}}, "models.quantize int8 runs on the native or onnx engine"),
     ({"models": {"quantize": "int8", "device": "cuda"}}, "models.quantize int8 runs on the CPU")],
    ids=["unknown-key", "out-of-range", "wrong-type", "missing-section", "quantize", "int8-on-hf", "int8-on-gpu"],
)
def test_a_bad_job_file_exits_2_naming_the_key(tmp_path, command, sections, key):
    """validate and run refuse a bad job file with exit code 2 and name the offending key (before Ray)."""
    result = CliRunner().invoke(main, [command, str(write_job(tmp_path, **sections))])
    assert result.exit_code == 2, result.output
    assert key in result.stderr and "invalid job file" in result.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(
    "assignment, key",
    [(f"input.storage_options.secret=[{SECRET}", "input.storage_options.secret"),  # not valid YAML
     (f"input.storage_options.secret:{SECRET}", "input.storage_options.secret"),  # no "="
     (f"input.storage_options={{key: x, secret: [{SECRET}", "input.storage_options"),
     (f"input={{path: x, storage_options: {{secret: {SECRET}", "input"),  # a whole section that did not parse
     (f"output.storage_options.token.x={SECRET}", "output.storage_options.token"),  # token is not a section
     (f"models.api_key=[{SECRET}", "models.api_key")],  # a secret-looking key outside storage_options
    ids=["bad-yaml", "no-equals", "bad-yaml-mapping", "bad-yaml-section", "not-a-section", "secret-looking-key"],
)
def test_a_bad_set_names_the_key_but_never_shows_a_secret(tmp_path, command, assignment, key):
    """A --set that cannot be applied exits 2 naming its key path, and never echoes a value that may be a
    secret (under storage_options or a secret-looking key, the rule the manifest's redaction uses)."""
    job = write_job(tmp_path, output={"storage_options": {"token": "t"}})
    result = CliRunner().invoke(main, [command, str(job), "--set", assignment])
    assert result.exit_code == 2, result.output
    assert key in result.stderr and "--set" in result.stderr
    assert SECRET not in result.output


def test_a_bad_set_of_an_ordinary_key_shows_its_value(tmp_path):
    """Redaction is for secrets only: a bad value of an ordinary key is shown, to help fix it."""
    result = CliRunner().invoke(main, ["validate", str(write_job(tmp_path)), "--set", "decoding.method=[large"])
    assert result.exit_code == 2 and "decoding.method=[large" in result.stderr and "not valid YAML" in result.stderr


def test_run_refuses_existing_output_in_error_mode_with_exit_2(saved_tiny_pair, tmp_path):
    """output.mode: error and an output that already holds results: exit 2, and the results stay untouched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io.storage import data_path

    write_input(tmp_path, ["a", "b"])
    existing = tmp_path / data_path("out") / "part-0.parquet"
    existing.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a"]}), existing)
    small, large = saved_tiny_pair
    result = CliRunner().invoke(main, ["run", str(write_job(tmp_path, output={"mode": "error"},
                                                            models={"small": small, "large": large}))])
    assert result.exit_code == 2, result.output
    assert "already holds results" in result.stderr and "output.mode is 'error'" in result.stderr
    assert pq.read_table(existing)["id"].to_pylist() == ["a"]


@pytest.mark.slow
def test_run_refuses_duplicate_ids_with_exit_2(ray_local, saved_tiny_pair, tmp_path):
    """Duplicate input ids stop `run` with exit 2 naming an id, before anything is decoded."""
    from pipeline.io.storage import open_filesystem, output_files

    small, large = saved_tiny_pair
    write_input(tmp_path, ["a", "b", "a"])
    result = CliRunner().invoke(main, ["run", str(write_job(tmp_path, models={"small": small, "large": large}))])
    assert result.exit_code == 2, result.output
    assert "more than once" in result.stderr and "'a' x2" in result.stderr
    assert output_files(*open_filesystem(str(tmp_path / "out"))) == []


@pytest.fixture(scope="module")
def mismatched_pair(tmp_path_factory):
    """A tiny T5 pair whose small model has 8 more vocabulary entries than the large one."""
    from pipeline.pairs.tiny import VOCAB_SIZE, build_pair, save_models

    small, large, tokenizer = build_pair("t5", small="noisy")
    small.resize_token_embeddings(VOCAB_SIZE + 8)
    return tuple(map(str, save_models(tmp_path_factory.mktemp("mismatched"), small, large, tokenizer)))


def test_run_refuses_an_incompatible_pair_with_exit_2_before_starting_ray(mismatched_pair, tmp_path, monkeypatch):
    """A small and large model without a shared vocabulary: `run` exits 2 saying so, from the two
    configs alone, before Ray starts or the output is touched (not 1 with a traceback from an actor)."""
    import pipeline.jobs.run as run_module

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start for an incompatible pair")

    monkeypatch.setattr(run_module, "connect_ray", no_ray)
    small, large = mismatched_pair
    write_input(tmp_path, ["a", "b"])
    job = write_job(tmp_path, models={"small": small, "large": large})
    result = CliRunner().invoke(main, ["run", str(job)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"{job}: models.small and models.large: the small and large model have "
                                    "different vocabularies")


@pytest.mark.slow
def test_an_int8_run_says_so_in_its_rows_and_summary(ray_local, saved_tiny_pair, tmp_path):
    """models.quantize: int8 reaches the actors: every row's `quantize` column and the summary say int8."""
    from pipeline.io.storage import read_output_table

    small, large = saved_tiny_pair
    write_input(tmp_path, ["a", "b", "c"])
    job = write_job(tmp_path, models={"small": small, "large": large})
    result = CliRunner().invoke(main, ["run", str(job), "--set", "models.quantize=int8"])
    assert result.exit_code == 0, result.output
    assert "engine: native, weights int8" in result.output
    rows = read_output_table(str(tmp_path / "out"), columns=["id", "quantize", "error"]).to_pylist()
    assert sorted(row["id"] for row in rows) == ["a", "b", "c"]
    assert {row["quantize"] for row in rows} == {"int8"} and {row["error"] for row in rows} == {None}


@pytest.mark.slow
def test_generate_with_the_demo_job_gives_the_jobs_tokens(ray_local, tmp_path):
    """`generate --job jobs/demo.yaml` decodes as the demo job does (onnx int8, its preset's thresholds):
    the same predictions for the same sentences."""
    import pyarrow.parquet as pq

    from pipeline.io.storage import read_output_table
    from pipeline.jobs import load_job
    from pipeline.jobs.run import run_job
    from support import REPO

    cwd = os.getcwd()
    os.chdir(REPO)  # the demo job's paths are relative to the repository
    try:
        job = load_job("jobs/demo.yaml", ["input.limit=6", "compute.actors=1", "report.baseline=null",
                                          f"output.path={tmp_path / 'out'}"])
        run_job(job)
        rows = read_output_table(str(tmp_path / "out"), columns=["id", "prediction"]).to_pylist()
        source = pq.read_table(job.input.path, columns=["id", "de"]).to_pylist()[:6]
        result = CliRunner().invoke(main, ["generate", "--job", "jobs/demo.yaml", "--json",
                                           *[row["de"] for row in source]])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    generated = [json.loads(line)["prediction"] for line in result.stdout.splitlines() if line.startswith("{")]
    by_id = {row["id"]: row["prediction"] for row in rows}
    assert generated == [by_id[row["id"]] for row in source]


@pytest.mark.parametrize("command, new, old, dest, value", [
    ("sweep", "--fallback-threshold", "--fallback", "fallback", "0.3"),
    ("sweep", "--rollback-threshold", "--rollback", "rollback", "2"),
    ("sweep", "--max-draft-tokens", "--window", "window", "4"),
    ("sweep", "--ray-address", "--address", "address", "head:6379"),
    ("run", "--ray-address", "--address", "address", "head:6379"),
    ("report", "--baseline-run", "--baseline", "baseline", "runs/large"),
    ("bench-loop", "--limit", "--inputs", "num_inputs", "3"),
    ("bench-pipeline", "--limit", "--records", "records", "3"),
    ("submit", "--dashboard", "--address", "address", "http://head:8265"),
    ("status", "--dashboard", "--address", "address", "http://head:8265"),
])
def test_one_name_per_idea_and_the_old_spelling_still_works(command, new, old, dest, value):
    """Options renamed so that one idea has one name across commands: the old spelling is a contract for a
    release (it parses to the same value), and --help shows the new name only."""
    cmd = main.commands[command]
    required = {"sweep": ["job.yaml"], "run": ["job.yaml"], "report": ["runs/x"],
                "bench-loop": ["--small", "s", "--large", "l"], "bench-pipeline": [], "submit": ["job.yaml"],
                "status": ["raysubmit_x"]}[command]
    for spelling in (new, old):
        context = cmd.make_context(command, [*required, spelling, value])
        assert str(context.params[dest]) == value, spelling
    shown = CliRunner().invoke(main, [command, "--help"]).output
    assert f"{new} " in shown and f"{old} " not in shown.replace(new, "")


def test_options_that_do_nothing_are_not_offered_and_generate_offers_ct2():
    report_help = CliRunner().invoke(main, ["report", "--help"]).output
    assert "--verbose" not in report_help and "--address" not in report_help
    assert main.commands["report"].make_context("report", ["runs/x", "--verbose", "--address", "a"])  # still parse
    engine = next(p for p in main.commands["generate"].params if p.name == "engine")
    assert "ct2" in engine.type.choices


def test_validation_speaks_in_the_projects_words(tmp_path):
    result = CliRunner().invoke(main, ["validate", "--schema-only", str(write_job(tmp_path)),
                                       "--set", "decoding.lenience=0.2"])
    assert result.exit_code == 2 and "lenience is lossy speculative decoding's" in result.stderr
    assert "Value error" not in result.stderr


def test_generate_with_a_segmenting_job_decodes_sentence_by_sentence(saved_pair, tmp_path):
    """--job of a job with input.segment: sentence decodes each text as that job's stage does: its sentences
    one by one, put back in their places."""
    small, large = saved_pair
    models = {"small": str(small), "large": str(large), "device": "cpu"}
    job = write_job(tmp_path, models=models, input={"segment": "sentence", "language": "de"},
                    decoding={"method": "bild", "max_new_tokens": 6})
    document = "Ein Hund läuft.\n\nZwei Männer spielen Fußball."
    whole = CliRunner().invoke(main, ["generate", "--job", str(job), "--json", document])
    alone = CliRunner().invoke(main, ["generate", "--job", str(job), "--set", "input.segment=none", "--json",
                                      "Ein Hund läuft.", "Zwei Männer spielen Fußball."])
    assert whole.exit_code == 0 and alone.exit_code == 0, whole.output + alone.output
    first, second = (json.loads(line)["prediction"] for line in alone.stdout.splitlines())
    assert json.loads(whole.stdout.splitlines()[-1])["prediction"] == f"{first}\n\n{second}"
