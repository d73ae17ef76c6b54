"""A runtime proof reads only what this run wrote (issue #45 §1-§3): nothing a model repo or a planted folder holds
becomes a runtime's config, and no library it names is ever loaded.

- §1: a repo whose `modules.json` lists a module at `"."` (or a path out of the folder) gets nothing copied for it:
  not its root `genai_config.json` naming a `custom_ops_library`, not the library (a `.safetensors` name).
- §2: `hf-export validate` of a planted folder whose `genai_config.json` names a `custom_ops_library` refuses it
  before ONNX Runtime GenAI opens the folder: the library is never loaded and the target is never `passed`.
- §3: a module path through a linked folder (`st/.docker`, `st` a link) copies nothing from where the link points.

The planted library is a real shared library built with gcc whose constructor writes a marker file: the marker's
absence shows it was never loaded (dlopen runs the constructor). One export through the real CLI, shared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.models import save_ascii_bpe_tokenizer, tiny_llama

pytestmark = pytest.mark.slow

RECIPE = {"export_format": "onnx", "mode": "generation", "dynamic": True}
OUTSIDE = b"do not copy me: a file of the linked home folder"
# A custom-ops library ONNX Runtime accepts (RegisterCustomOps returns no error): loaded, it would run silently.
LIBRARY_SOURCE = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *marker = fopen(MARKER, "w");
    if (marker) { fputs("loaded", marker); fclose(marker); }
}
void *RegisterCustomOps(void *options, const void *api) { return 0; }
"""


def build_library(path: Path, marker: Path) -> Path:
    """A shared library at `path` whose constructor writes `marker` when it is loaded."""
    source = path.with_suffix(".c")
    source.write_text(LIBRARY_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(path), str(source)], check=True,
                   capture_output=True)
    source.unlink()
    return path


def _files_holding(folder: Path, data: bytes) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and not p.is_symlink() and data in p.read_bytes())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny Llama whose repo plants a GenAI config and its library at the root, listed by `modules.json` as the
    module `"."`, and a module `st/.docker` where `st` links to a home folder; exported once through the CLI."""
    root = tmp_path_factory.mktemp("trust")
    marker = root / "loaded.marker"
    model_dir = tiny_llama(root / "model", RECIPE, initializer_range=0.3)
    save_ascii_bpe_tokenizer(model_dir)
    build_library(model_dir / "planted.safetensors", marker)
    genai = {"model": {"type": "llama", "decoder": {"session_options": {"custom_ops_library": "planted.safetensors"},
                                                    "filename": "model.onnx"}}}
    (model_dir / "genai_config.json").write_text(json.dumps(genai))
    home = root / "home"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_bytes(b'{"auths": "' + OUTSIDE + b'"}')
    (model_dir / "st").symlink_to(home)
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    modules = [{"idx": 0, "path": ""}, {"idx": 1, "path": "."}, {"idx": 2, "path": "st/.docker"},
               {"idx": 3, "path": "1_Pooling"}]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    out = root / "out"
    done = run_cli("run", "--no-bench", str(model_dir), "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return {"root": root, "model_dir": model_dir, "out": out, "report": report, "marker": marker,
            "output": done.stdout + done.stderr, "returncode": done.returncode}


def test_modules_json_copies_no_root_file_and_nothing_through_a_link(planted):
    """§1 and §3 through `hf-export run`: the module `"."` and the linked `st/.docker` copy nothing (each refusal a
    finding naming its JSON path in modules.json); the real module folder is copied; nothing planted ran."""
    assert planted["returncode"] == 0, planted["output"][-4000:]
    (target,) = planted["report"]["targets"]
    folder = planted["out"] / target["name"]
    assert target["status"] == "passed", target
    assert not (folder / "planted.safetensors").exists()
    assert not _files_holding(planted["out"], OUTSIDE) and not list(planted["out"].rglob(".docker"))
    assert not _files_holding(planted["out"], b"custom_ops_library")
    assert "custom_ops_library" not in (folder / "genai_config.json").read_text()  # the export's own
    assert (folder / "1_Pooling" / "config.json").read_text() == '{"pooling_mode_cls_token": true}'
    listed = [entry["path"] for entry in target["files"]]  # what a PR would upload
    assert not [p for p in listed if "planted" in p or ".docker" in p], listed
    findings = "\n".join(target["findings"])
    assert "modules.json[1].path" in findings and "'.'" in findings, findings
    assert "modules.json[2].path" in findings and "st/.docker" in findings, findings
    (proof,) = [p for p in target["runtimes"] if p["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "passed", proof  # GenAI ran the config the export wrote
    assert not planted["marker"].exists()


def test_validate_refuses_a_planted_custom_ops_library_before_genai_opens_the_folder(planted, tmp_path):
    """§2 through `hf-export validate`: a folder this run did not write whose genai_config.json names a
    `custom_ops_library` fails, with the key's JSON path, and the library is never loaded."""
    (target,) = planted["report"]["targets"]
    out = tmp_path / "planted-out"
    folder = out / target["name"]
    shutil.copytree(planted["out"] / target["name"], folder)
    marker = tmp_path / "validate.marker"
    build_library(folder / "libplanted.so", marker)
    genai = json.loads((folder / "genai_config.json").read_text())
    genai["model"]["decoder"]["session_options"]["custom_ops_library"] = "libplanted.so"
    (folder / "genai_config.json").write_text(json.dumps(genai))
    done = run_cli("validate", str(planted["model_dir"]), str(out))
    report = json.loads((out / "report.json").read_text())
    (result,) = report["targets"]
    assert done.returncode != 0 and result["status"] == "failed", done.stdout[-3000:] + done.stderr[-3000:]
    assert not marker.exists(), "the planted library was loaded"
    message = result["error"]["message"]
    assert "model.decoder.session_options.custom_ops_library" in message, message
    assert "libplanted.so" in message, message  # the native library itself is named too
    (proof,) = [p for p in result["runtimes"] if p["runtime"] == "ONNX Runtime GenAI"]
    assert proof["status"] == "failed" and "custom_ops_library" in proof["detail"], proof


@pytest.mark.parametrize("where", [
    ["model", "decoder", "session_options"],
    ["model", "decoder"],
    ["model", "embedding", "session_options"],
    [],
])
def test_a_custom_ops_library_key_is_refused_wherever_it_appears(where):
    from exporters.validate.folder_trust import code_loading_keys

    config = {"model": {"decoder": {"session_options": {"log_id": "x", "provider_options": []},
                                    "filename": "model.onnx"}}}
    node = config
    for key in where:
        node = node.setdefault(key, {})
    node["custom_ops_library"] = "ops.so"
    (refused,) = code_loading_keys(config)
    assert ".".join([*where, "custom_ops_library"]) in refused


def test_genai_keys_naming_paths_or_libraries_are_refused_and_ours_pass():
    from exporters.layouts.genai.config import genai_config
    from exporters.validate.folder_trust import code_loading_keys
    from transformers import GenerationConfig, LlamaConfig

    ours = genai_config(LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, vocab_size=64),
                        GenerationConfig(eos_token_id=2, pad_token_id=3))
    assert code_loading_keys(ours) == []
    hostile = json.loads(json.dumps(ours))
    options = hostile["model"]["decoder"]["session_options"]
    options["provider_options"] = [{"QNN": {"backend_path": "libQnnHtp.so"}}]
    options["ep.context_file_path"] = "/tmp/x"  # a session config entry GenAI hands to ONNX Runtime
    options["enable_profiling"] = "/tmp/profile"
    hostile["model"]["decoder"]["filename"] = "../../elsewhere/model.onnx"
    refused = "\n".join(code_loading_keys(hostile))
    for path in ("provider_options[0].QNN.backend_path", "session_options.ep.context_file_path",
                 "session_options.enable_profiling", "model.decoder.filename"):
        assert path in refused, refused


def test_only_files_this_run_wrote_or_copied_are_read_by_a_runtime(tmp_path):
    """§1b: the inventory a run takes of a target folder (what the export wrote, what the allow-list copied) is the
    whole of what a runtime may read: a file it does not hold, a changed config, a copied genai_config.json, a link,
    or a native library is refused."""
    from exporters.validate.folder_trust import screen_folder, take_inventory

    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"\x08\x07graph")
    (folder / "genai_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    inventory = take_inventory(folder, written=["model.onnx", "genai_config.json"], copied=["tokenizer.json"])
    assert screen_folder(folder, inventory) == []
    (folder / "extra.json").write_text("{}")
    (folder / "tokenizer.json").write_text('{"changed": 1}')
    build_library(folder / "lib.so", tmp_path / "never")
    (folder / "link.json").symlink_to(folder / "genai_config.json")
    refused = "\n".join(screen_folder(folder, inventory))
    for name in ("extra.json", "tokenizer.json", "lib.so", "link.json"):
        assert name in refused, refused
    copied = take_inventory(folder, written=["model.onnx"], copied=["tokenizer.json", "genai_config.json"])
    assert "genai_config.json" in "\n".join(screen_folder(folder, copied))


def test_module_paths_are_resolved_without_following_a_link_at_any_component(tmp_path):
    """§3: every component of a module path is checked, not only the last."""
    from exporters import fsutil
    from exporters.errors import ModelSourceError

    source = tmp_path / "model"
    (tmp_path / "home" / ".docker").mkdir(parents=True)
    source.mkdir()
    (source / "st").symlink_to(tmp_path / "home")
    with pytest.raises(ModelSourceError, match="st.* is a link"):
        fsutil.model_subfolder(source, "st/.docker")
    (source / "real" / "inner").mkdir(parents=True)
    assert fsutil.model_subfolder(source, "real/inner") == source / "real" / "inner"
    assert fsutil.model_subfolder(source, "missing") is None


def test_a_module_at_the_root_copies_no_runtime_config_into_a_folder_the_export_left_without_one(tmp_path):
    """§1 where the export wrote no genai_config.json (a graph GenAI cannot feed): the repo's own is never copied in,
    nor a library under a module's weights name."""
    from exporters.export.folder_files import complete_folder

    source = tmp_path / "model"
    (source / "2_Dense").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "genai_config.json").write_text('{"model": {"decoder": {"session_options": '
                                              '{"custom_ops_library": "planted.safetensors"}}}}')
    build_library(source / "planted.safetensors", tmp_path / "never")
    build_library(source / "2_Dense" / "model.safetensors", tmp_path / "never")
    (source / "modules.json").write_text(json.dumps([{"path": "."}, {"path": "./"}, {"path": "2_Dense"}]))
    target = tmp_path / "target"
    target.mkdir()
    notes: list[str] = []
    copied = complete_folder(target, source, notes)
    assert sorted(copied) == ["config.json", "modules.json"], copied
    assert sorted(p.name for p in target.rglob("*")) == ["config.json", "modules.json"]
    assert [note.split(":")[0] for note in notes] == ["modules.json[0].path", "modules.json[1].path",
                                                      "modules.json[2].path"], notes
    assert "2_Dense/model.safetensors is not a safetensors file" in notes[2]
