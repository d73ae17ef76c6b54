"""Recipes: the three forms, the config.json field, and a corpus of invalid recipes each pointing at its line."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from exporters.errors import RecipeError
from exporters.recipe.load import find_recipe, load_recipe_file, parse_recipe
from exporters.recipe.model import SCHEMA_PATH, recipe_json_schema
from tests.conftest import run_cli

INVALID = Path(__file__).parent / "recipes" / "invalid"

# file -> (JSON path, line, words the message must contain)
EXPECTED = {
    "01-not-json.json": ("$", 3, "not valid JSON"),
    "02-unknown-format.json": ("$.export_format", 2, "did you mean 'onnx'"),
    "03-missing-format.json": ("$.exports[0].export_format", 4, "missing 'export_format'"),
    "04-unknown-key.json": ("$.opset", 3, "did you mean 'opset_version'"),
    "05-wrong-format-key.json": ("$.backend", 3, "only of 'executorch'"),
    "06-bad-opset.json": ("$.opset_version", 3, "greater than or equal to 18"),
    "07-bad-name.json": ("$.exports[0].name", 4, "pattern"),
    "08-duplicate-names.json": ("$[1].name", 3, "used twice"),
    "09-empty-exports.json": ("$.exports", 3, "at least 1"),
    "10-bad-schema-version.json": ("$.schema_version", 2, "1"),
    "11-dim-min-gt-max.json": ("$.dynamic_shapes.input_ids.1", 4, "min (64) is larger than max (8)"),
    "12-dim-missing-name.json": ("$.dynamic_shapes.input_ids[1].name", 6, "missing required key 'name'"),
    "13-bad-axis-keyword.json": ("$.dynamic_shapes.input_ids[1]", 4, "'static' or 'auto'"),
    "14-bad-axis-index.json": ("$.dynamic_shapes.input_ids.seq", 4, "pattern"),
    "15-output-path-escape.json": ("$.output_path", 3, "inside the target's folder"),
    "16-output-path-absolute.json": ("$.output_path", 3, "not absolute"),
    "17-bad-mode.json": ("$.mode", 3, "'model' or 'generation'"),
    "18-bad-device.json": ("$.device", 3, "'cpu', 'cuda' or 'auto'"),
    "19-bad-dtype.json": ("$.dtype", 3, "'float32'"),
    "20-negative-atol.json": ("$.validation.atol", 5, "greater than or equal to 0"),
    "21-unknown-inputs-key.json": ("$.inputs.seq_len", 5, "did you mean 'sequence_length'"),
    "22-static-needs-len.json": ("$.generation.max_cache_len", 5, "cache_implementation 'static'"),
    "23-bad-type-dynamic.json": ("$.dynamic", 3, "valid boolean"),
    "24-component-unknown-key.json": ("$.components.decode.opset_version", 5, "not allowed here"),
    "25-not-object.json": ("$", 1, "JSON object or a list"),
    "26-fusions-need-optimize.json": ("$.ort_fusions", 4, "requires optimize"),
    "27-config-field.json": ("$.export_config.opset_version", 5, "valid integer"),
    "28-dim-two-ranges.json": ("$.dynamic_shapes.attention_mask.1", 5, "one name is one dimension"),
    "29-axis-outside-rank.json": ("$.dynamic_shapes.input_ids.2", 4, "axis 2 does not exist"),
    "30-reserved-target-name.json": ("$.exports[1].name", 5, "is reserved"),
    "31-component-dim-two-ranges.json": ("$.components.decode.dynamic_shapes.cache.layers.*.values.2", 8,
                                         "declared again"),
    "32-unknown-quantize-method.json": ("$.quantize.method", 4, "did you mean 'onnxruntime-dynamic'"),
    "33-quantizer-wrong-format.json": ("$.quantize.method", 4, "quantizes onnx exports, not executorch ones"),
    "34-calibration-without-inputs.json": ("$.exports[0].quantize.method", 7, "add \"inputs\": {\"calibration\""),
    "35-variant-wrong-format.json": ("$.variants[1]", 5, "does not apply to onnx targets"),
    "36-empty-calibration.json": ("$.inputs.calibration", 5, "either 'prompts'"),
    "37-xnnpack-bad-scheme.json": ("$.quantize.scheme", 5, "'8da8w' or '8da4w'"),
}


def _recipe_path(name: str, tmp_path: Path) -> Path:
    if name.startswith("27"):  # an export_config field inside config.json
        target = tmp_path / "config.json"
        shutil.copy(INVALID / name, target)
        return target
    return INVALID / name


def test_corpus_is_complete():
    assert sorted(p.name for p in INVALID.glob("*.json")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_invalid_recipe_names_path_and_line(name, tmp_path):
    path, line, words = EXPECTED[name]
    with pytest.raises(RecipeError) as caught:
        load_recipe_file(_recipe_path(name, tmp_path))
    err = caught.value
    assert (err.path, err.line) == (path, line), str(err)
    assert words in err.message
    assert f"(line {line})" in str(err)


def test_cli_check_reports_every_invalid_recipe_with_exit_2(tmp_path):
    for name in ("04-unknown-key.json", "11-dim-min-gt-max.json", "27-config-field.json"):
        path, line, words = EXPECTED[name]
        result = run_cli("check", str(_recipe_path(name, tmp_path)))
        assert result.returncode == 2, result.stderr
        assert f"line {line}, {path}" in result.stderr
        assert words in result.stderr
        assert "Traceback" not in result.stderr


def test_cli_check_rejects_bad_quantize_entries_with_their_path():
    # unknown method, a quantizer for the wrong format, calibration without inputs
    for name in ("32-unknown-quantize-method.json", "33-quantizer-wrong-format.json",
                 "34-calibration-without-inputs.json"):
        path, line, words = EXPECTED[name]
        result = run_cli("check", str(INVALID / name))
        assert result.returncode == 2, result.stderr
        text = " ".join(result.stderr.split())  # the terminal wraps long lines
        assert f"line {line}, {path}: " in text and words in text, result.stderr
        assert "Traceback" not in result.stderr


def test_cli_check_accepts_the_demo_recipe():
    result = run_cli("check", "examples/demo-model/export_config.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["dynamo:", "dynamo,", "generation", "mode", "onnx:", "onnx,", "generation",
                                     "mode", "executorch:", "executorch,", "generation", "mode"]


def test_three_forms_normalise_to_the_same_recipe():
    seed = {"export_format": "onnx", "dynamic": True, "opset_version": 18}
    as_seed = parse_recipe(json.dumps(seed))
    as_list = parse_recipe(json.dumps([seed]))
    as_full = parse_recipe(json.dumps({"schema_version": 1, "exports": [seed]}))
    assert as_seed == as_list == as_full
    assert as_seed.sha256() == as_full.sha256()
    target = as_seed.exports[0]
    assert (target.name, target.export_format, target.opset_version, target.dynamic) == ("onnx", "onnx", 18, True)


def test_full_form_with_every_section():
    recipe = parse_recipe(json.dumps({
        "schema_version": 1,
        "exports": [
            {"name": "edge", "export_format": "executorch", "backend": "xnnpack", "mode": "generation",
             "expected_components": ["prefill", "decode"], "device": "cpu", "dtype": "float32",
             "components": {"decode": {"dynamic_shapes": {"cache.layers.*.keys": {"2": {"name": "past", "max": 64}}},
                                       "validation": {"atol": 1e-2}}}},
            {"name": "server", "export_format": "onnx", "output_path": "onnx/model.onnx", "external_data": False,
             "keep_initializers_as_inputs": True, "export_params": True},
        ],
        "inputs": {"batch_size": 2, "sequence_length": 12, "prompt": "hello"},
        "generation": {"cache_implementation": "static", "max_cache_len": 64, "max_new_tokens": 4},
        "validation": {"atol": 1e-4, "formats": {"onnx": {"rtol": 1e-2}}},
    }))
    assert [t.name for t in recipe.exports] == ["edge", "server"]
    assert recipe.exports[0].components["decode"].validation.atol == 1e-2
    assert recipe.exports[1].output_path == "onnx/model.onnx"
    assert recipe.generation.max_cache_len == 64


def test_config_json_field_and_file_precedence(tmp_path):
    config = {"model_type": "llama", "export_config": {"export_format": "dynamo"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    recipe, file, notes = find_recipe(tmp_path)
    assert file.name == "config.json" and recipe.exports[0].export_format == "dynamo" and notes == []
    (tmp_path / "export_config.json").write_text(json.dumps({"export_format": "onnx"}))
    recipe, file, notes = find_recipe(tmp_path)
    assert file.name == "export_config.json" and recipe.exports[0].export_format == "onnx"
    assert len(notes) == 1 and "using export_config.json" in notes[0]
    assert find_recipe(tmp_path / "missing") is None if (tmp_path / "missing").mkdir() is None else False


def test_committed_json_schema_is_in_sync_and_validates_examples():
    import jsonschema

    committed = json.loads(SCHEMA_PATH.read_text())
    assert committed == json.loads(json.dumps(recipe_json_schema(), sort_keys=True)), (
        "exporters/recipe/export_config.schema.json is stale: run `python -m exporters.recipe`"
    )
    validator = jsonschema.Draft202012Validator(committed)
    validator.validate(json.loads(Path("examples/demo-model/export_config.json").read_text()))
    bad = {"schema_version": 1, "exports": [{"export_format": "onnx", "opset": 18}]}
    assert list(validator.iter_errors(bad)), "the schema must reject unknown keys too"


def test_auto_export_config_accepts_seed_fields():
    from exporters import AutoExportConfig

    config = AutoExportConfig.from_dict(
        {"export_format": "onnx", "opset_version": 18, "dynamic_shapes": {"input_ids": {"1": {"name": "s", "max": 32}}}}
    )
    assert type(config).__name__ == "OnnxConfig" and config.opset_version == 18
    assert config.dynamic_shapes["input_ids"][1].__name__ == "s"
    with pytest.raises(RecipeError) as caught:
        AutoExportConfig.from_dict({"export_format": "onnx", "opset": 18})
    assert caught.value.path == "$.opset"


def test_supports_export_format_warns_with_what_to_do():
    from exporters import AutoHfExporter

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert AutoHfExporter.supports_export_format({"export_format": "onnx"}) is True
        assert caught == []
        assert AutoHfExporter.supports_export_format({"export_format": "onxx"}) is False
        assert AutoHfExporter.supports_export_format({"dynamic": True}) is False
    messages = [str(w.message) for w in caught]
    assert "Did you mean 'onnx'" in messages[0] and "register_backend" in messages[0]
    assert "no 'export_format'" in messages[1]


def test_supports_export_format_half_registered():
    from transformers.exporters.auto import EXPORT_BACKENDS, ExportBackend
    from transformers.exporters.configs import DynamoConfig

    from exporters import AutoHfExporter

    EXPORT_BACKENDS["half"] = ExportBackend(DynamoConfig, None, None)
    try:
        with pytest.warns(UserWarning, match="only half-registered"):
            assert AutoHfExporter.supports_export_format({"export_format": "half"}) is False
    finally:
        del EXPORT_BACKENDS["half"]
