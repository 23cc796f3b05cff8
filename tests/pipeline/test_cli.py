"""The one-off `generate` command and the tiny-pair helper, through click's runner."""

from __future__ import annotations

import json

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
    assert result.exit_code == 2 and "cannot load" in result.output


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
    from pipeline.tiny import FAMILIES

    family = next(p for p in tiny_pair.params if p.name == "family")
    assert tuple(family.type.choices) == FAMILIES


def test_tiny_pair_shape_choices_are_the_random_pairs_shapes():
    from pipeline.cli.models import tiny_pair
    from pipeline.random_pairs import SHAPES

    shape = next(p for p in tiny_pair.params if p.name == "shape")
    assert tuple(shape.type.choices) == tuple(SHAPES)
