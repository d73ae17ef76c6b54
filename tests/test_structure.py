"""The library's shape: one adapter to upstream, one error hierarchy, small rooms, and examples that run."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("exporters", "action", "bot")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        module = importlib.import_module(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{package}.")]
    return sorted(set(names) - {"action.__main__"})


def _imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_only_the_adapter_imports_upstream_exporters():
    importers = sorted(
        str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if any(name == "transformers.exporters" or name.startswith("transformers.exporters.")
               for name in _imports_of(path))
    )
    assert importers and all(name.startswith("exporters/upstream/") for name in importers), importers


def test_every_error_is_in_one_exported_hierarchy():
    import exporters
    from exporters import errors

    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
               if issubclass(obj, Exception) and obj.__module__ == errors.__name__]
    assert len(classes) >= 8
    for cls in classes:
        assert issubclass(cls, errors.ExportActionError), cls
        assert cls.__name__ in errors.__all__ and cls.__name__ in exporters.__all__, cls
        assert getattr(exporters, cls.__name__) is cls
    # no public error class is defined outside errors.py (private ones are internal signals, e.g. to pydantic)
    for package in ("exporters",):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            defined = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and not n.name.startswith("_")
                       and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in n.bases)]
            private_module = path.name.startswith("_") and path.name != "__init__.py"  # e.g. recipe/_base.py
            assert path.name == "errors.py" or private_module or not defined, f"{path}: {defined}"


def test_rooms_stay_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    assert sizes["exporters/run/pipeline.py"] < 350
    big = {name: n for name, n in sizes.items() if n > 450}
    assert not big, big


def test_the_library_speaks_no_front_end_language():
    """Library messages name options (`trust_remote_code`), never one front end's flags."""
    flags = ("--trust-remote-code", "--token", "--repo-id", "--config ", "--target ", "pass --")
    offenders = []
    for path in (ROOT / "exporters").rglob("*.py"):
        if path.name in ("cli.py",):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("Error"):
                text = ast.unparse(node)
                offenders += [f"{path.name}: {flag}" for flag in flags if flag in text]
    assert not offenders, offenders


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_run(module):
    imported = importlib.import_module(module)
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


# --- The layout by stage (#28): packages by stage, dependencies one way, no import cycles ---------------------------

FOUNDATION = {"errors", "status", "redact", "fsutil", "hashing", "files", "version", "quiet"}
FRONT_DOORS = {"", "cli", "auto"}  # exporters/__init__, the CLI, AutoHfExporter: they may import anything
# Each stage package and the packages it may import (besides itself and the foundation).
STAGE_RULES = {
    "recipe": set(),
    "upstream": set(),
    "report": {"recipe"},
    "capture": {"recipe", "upstream"},
    "export": {"capture", "recipe", "upstream"},
    # each deployment runtime's package: its files are written after the export's graphs, with its helpers
    "layouts": {"export", "capture", "recipe", "upstream"},
    "validate": {"layouts", "capture", "recipe", "upstream", "report.results"},
    "run": {"layouts", "export", "validate", "capture", "report", "recipe", "upstream"},
    "init": {"run", "publish", "validate", "capture", "report", "recipe"},
    "publish": {"layouts", "report", "recipe"},
}
# Third-party modules a library module may import inside a function, because loading them at start-up costs
# seconds or native memory that most runs never use (the front doors may defer anything).
DEFERRED_STACK = ("onnx", "onnx_ir", "onnxruntime", "onnxscript", "executorch", "torchao", "onnxruntime_genai",
                  # torch's ONNX exporter, which loads onnxscript when imported
                  "torch.onnx",
                  # upstream modules that load ExecuTorch or torchao when imported
                  "transformers.exporters.quantizers", "transformers.exporters.exporter_executorch",
                  # upstream's fusions for ONNX Runtime, which load onnxscript
                  "transformers.exporters.onnxruntime_fusions",
                  "transformers.exporters.runners.runner_executorch")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _our_imports(path: Path) -> list[tuple[str, int, bool, list[str]]]:
    """(imported module of ours, line, inside a function, names) for every import in `path`, whatever its place."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    local = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in local, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((base, node.lineno, id(node) in local, [alias.name for alias in node.names]))
    return [item for item in found if item[0].split(".")[0] in PACKAGES]


def _stage(module: str) -> str:
    """'capture' for exporters.capture.inputs; 'foundation' for exporters.errors; '' for a front door."""
    parts = module.split(".")[1:]
    if not parts or (len(parts) == 1 and parts[0] in FRONT_DOORS):
        return ""
    return "foundation" if len(parts) == 1 and parts[0] in FOUNDATION else parts[0]


def _library_files() -> list[Path]:
    return sorted((ROOT / "exporters").rglob("*.py"))


def test_the_library_is_packages_by_stage():
    loose = sorted(p.name for p in (ROOT / "exporters").glob("*.py")
                   if p.stem not in FOUNDATION | FRONT_DOORS | {"__init__"})
    assert not loose, f"modules outside a stage package: {loose}"
    assert set(STAGE_RULES) <= {p.name for p in (ROOT / "exporters").iterdir() if (p / "__init__.py").exists()}


def test_each_stage_imports_only_the_stages_below_it():
    broken = []
    for path in _library_files():
        stage = _stage(_module_name(path))
        if stage == "":
            continue
        for imported, line, _, names in _our_imports(path):
            if not imported.startswith("exporters"):
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {imported} (the library never imports a "
                              "front end)")
                continue
            targets = [f"{imported}.{name}" for name in names] if imported == "exporters" else [imported]
            for target in targets:
                other = _stage(target)
                allowed = {stage, "foundation"} | (STAGE_RULES.get(stage, set()) if stage != "foundation" else set())
                if stage == "foundation":
                    allowed = {"foundation"} if target == "exporters.errors" else {"foundation"}
                dotted = ".".join(target.split(".")[1:3])
                if other not in allowed and dotted not in allowed:
                    broken.append(f"{path.relative_to(ROOT)}:{line} ({stage}) imports {target} ({other or 'a front door'})")
    assert not broken, "\n".join(broken)


def test_the_foundation_imports_nothing_of_ours_but_errors():
    """The foundation is what every stage may use: it imports only the error hierarchy and the file names."""
    for name in FOUNDATION:
        path = ROOT / "exporters" / f"{name}.py"
        if path.exists():
            imported = {module for module, *_ in _our_imports(path)}
            assert imported <= {"exporters.errors", "exporters.files"}, (name, imported)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    modules = {_module_name(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            edges = set()
            for imported, _, _, names in _our_imports(path):
                for target in [f"{imported}.{n}" for n in names] + [imported]:
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target and target != _module_name(path):
                        edges.add(target)
                        break
            graph[_module_name(path)] = edges
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_our_modules_are_imported_at_the_top():
    """A file's top says what it depends on: only the front doors defer an import of ours (to keep `hf-export check`
    free of torch); library modules defer only the heavy runtimes (DEFERRED_STACK), each with a comment."""
    local = []
    for path in _library_files():
        if _stage(_module_name(path)) == "":
            continue
        local += [f"{path.relative_to(ROOT)}:{line} {module}" for module, line, inside, _ in _our_imports(path)
                  if inside]
    assert not local, "\n".join(local)


def test_private_names_stay_in_their_package():
    crossing = []
    for path in _library_files():
        here = _stage(_module_name(path)) or _module_name(path)
        for imported, line, _, names in _our_imports(path):
            there = _stage(imported) or imported
            crossing += [f"{path.relative_to(ROOT)}:{line} takes {imported}.{name}" for name in names
                         if name.startswith("_") and not name.startswith("__") and there != here]
    assert not crossing, "\n".join(crossing)


def test_a_library_module_defers_only_the_heavy_runtimes_and_says_why():
    """Inside a library function, only the runtimes most runs never load (DEFERRED_STACK) are imported, each with a
    comment on its line or the line above saying why; everything else is imported at the top."""
    offenders = []
    for path in _library_files():
        if _stage(_module_name(path)) == "":
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                deferred = any(module == name or module.startswith(name + ".") for name in DEFERRED_STACK)
                commented = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                if not (deferred and commented):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    assert not offenders, "\n".join(offenders)


def _stack_loaded_by(modules: str) -> str:
    """What of the stack a fresh interpreter holds after importing `modules` (comma-separated), as printed."""
    code = (f"import sys, {modules}; "
            "print(sorted(m for m in ('torch', 'transformers', 'onnx', 'executorch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_recipe_publish_and_report_stages_load_no_torch():
    """`hf-export check`, the bot's intake and publishing never pay for the stack."""
    loaded = _stack_loaded_by("exporters.recipe.load, exporters.publish, exporters.report.build, "
                              "exporters.report.aggregate")
    assert loaded == "[]", loaded


# --- Imports at the top (#49): a deferred import of ours is one that loads the stack, and says so -------------------

# What a module of ours may defer: these load seconds of native code (the stack) that `hf-export check`, `--help`,
# the bot's web process and the Action's list-targets never use.
STACK = ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime_genai", "onnxscript", "onnx_ir", "executorch",
         "torchao", "numpy")
LIGHT_DEFERRED_LIMIT = 5  # deferred imports of our light modules, in all (the bot's per-command web app and worker)


def _all_modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _top_level_imports(path: Path) -> set[str]:
    """Every module `path` imports when it is imported (function bodies and TYPE_CHECKING blocks left out), with
    `from a import b` also giving `a.b` (b may be a module)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([child for child in children if isinstance(child, ast.stmt | ast.excepthandler)])

    visit(ast.parse(path.read_text()).body)
    return found


def _loads_the_stack(modules: dict[str, Path]) -> dict[str, str | None]:
    """For each module of ours, the chain by which importing it loads the stack (None: it does not), read from the
    imports at each module's top (a package's `__init__` counts: importing `a.b` runs `a` first)."""
    chains: dict[str, str | None] = {}

    def chain(name: str, seen: tuple[str, ...]) -> str | None:
        if name in chains:
            return chains[name]
        if name in seen:
            return None
        found = None
        for imported in sorted(_top_level_imports(modules[name])):
            if imported.split(".")[0] in STACK:
                found = imported
                break
            parts = imported.split(".")
            ours = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            for other in (m for m in ours if m in modules and m != name):
                below = chain(other, seen + (name,))
                if below:
                    found = f"{other} -> {below}"
                    break
            if found:
                break
        chains[name] = found
        return found

    for name in modules:
        chain(name, ())
    return chains


def _deferred_imports_of_ours(path: Path) -> list[tuple[int, list[str]]]:
    """(line, the modules of ours it names) for every import inside a function of `path`."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, seen = [], set()
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if id(node) in seen or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            seen.add(id(node))
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in node.names] + [base]
            ours = [name for name in names if name.split(".")[0] in PACKAGES]
            if ours:
                found.append((node.lineno, ours))
    return found


def _has_reason(lines: list[str], line: int) -> bool:
    """A comment on the import's line, on a line of the same block of imports, or on the line above the block."""
    index = line - 1
    while index >= 0 and lines[index].strip().startswith(("from ", "import ")):
        if "#" in lines[index]:
            return True
        index -= 1
    return index >= 0 and lines[index].strip().startswith("#")


def test_a_deferred_import_of_ours_loads_the_stack_and_says_why():
    """Modules of ours are imported at the top of the file; one may be imported inside a function only where
    importing it loads the stack (torch, transformers, the runtimes: `hf-export check` and `--help` must not), with a
    comment saying why, and at most LIGHT_DEFERRED_LIMIT light ones in all, each also with its reason."""
    modules = _all_modules()
    stack = _loads_the_stack(modules)
    light, unexplained = [], []
    for name, path in sorted(modules.items()):
        lines = path.read_text().splitlines()
        for line, imported in _deferred_imports_of_ours(path):
            targets = {target for target in imported if target in modules}
            where = f"{path.relative_to(ROOT)}:{line} {sorted(targets)}"
            if not any(stack[target] for target in targets):
                light.append(where)
            if not _has_reason(lines, line):
                unexplained.append(where)
    assert len(light) <= LIGHT_DEFERRED_LIMIT, "import these at the top of the file (they load no part of the " \
                                               "stack):\n" + "\n".join(light)
    assert not unexplained, "say why each is deferred (a comment on its line or above):\n" + "\n".join(unexplained)


def test_the_stack_is_seen_where_it_loads():
    """The scan above finds the stack behind the modules that load it, and none behind the light ones."""
    stack = _loads_the_stack(_all_modules())
    assert stack["exporters.run.pipeline"] and stack["exporters.capture.steps"] == "torch"
    assert stack["exporters.init.push"] and stack["exporters.upstream"]
    assert not any(stack[name] for name in ("exporters.recipe.load", "exporters.publish", "exporters.report.build",
                                            "exporters.errors", "bot.app", "action.main"))


# What reads a model folder without tracing: the adapter to upstream (transformers.exporters, torch's compiler,
# torchao, scipy: ~2 CPU-s and 130 MiB a process) is not behind them
READS_A_FOLDER = ("exporters.capture.source", "exporters.validate.folder_trust", "exporters.run.context")


def test_what_reads_a_folder_does_not_load_the_upstream_adapter():
    modules = _all_modules()
    stack = _loads_the_stack(modules)
    assert "exporters.upstream" in _top_level_imports(modules["exporters.capture.loading"])  # the model's loader
    assert not [name for name in READS_A_FOLDER if "exporters.upstream" in (stack[name] or "")], \
        {name: stack[name] for name in READS_A_FOLDER}
    # the real CLI: `hf-export --version` reads the tools' versions (exporters.run.context) and imports no more
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "exporters.cli", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "hf-export " in done.stdout, done.stdout + done.stderr[-2000:]
    imported = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "exporters.run.context" in imported
    assert not imported & {"exporters.upstream", "transformers.exporters", "torch._dynamo", "torchao"}, \
        sorted(imported & {"exporters.upstream", "transformers.exporters", "torch._dynamo", "torchao"})


def test_no_hand_written_patch_in_the_adapter():
    """A patch on upstream or the stack is laid by `exporters.upstream.patches` (`patched`, `patched_item`, or an
    ExitStack callback) and has a row in its table: no module of the adapter restores an attribute or an entry in a
    `finally` of its own (tests/test_upstream_patches.py checks each row is undone)."""
    restoring = []
    for path in sorted((ROOT / "exporters" / "upstream").glob("*.py")):
        if path.name == "patches.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Try):
                continue
            for statement in (child for final in node.finalbody for child in ast.walk(final)):
                targets = (statement.targets if isinstance(statement, (ast.Assign, ast.Delete))
                           else [statement.target] if isinstance(statement, ast.AugAssign) else [])
                called = ast.unparse(statement.func).rpartition(".")[2] if isinstance(statement, ast.Call) else ""
                calls = called.startswith(("set", "del", "pop"))  # setattr, setLevel, set_experts_implementation
                if calls or any(isinstance(t, (ast.Attribute, ast.Subscript, ast.Tuple)) for t in targets):
                    restoring.append(f"{path.relative_to(ROOT)}:{statement.lineno}")
    assert not restoring, "lay these with exporters.upstream.patches (and add a row to PATCHES):\n" + \
        "\n".join(restoring)


# --- A run is an object (#49): no function of the product takes more than 8 parameters ------------------------------

MAX_PARAMETERS = 8
# Still over, to be folded into an options object: none (the publish calls take `PublishOptions` / `Proposal`, the
# bot's enqueue a `Delivery`).
LONG_SIGNATURES_LEFT: set[str] = set()


def test_no_function_takes_more_than_eight_parameters():
    """What a run or a target carries travels as one object (`RunContext`, `Workbench`, `EagerModel`, `SavedTarget`),
    not as a long list of arguments. A command of a CLI (typer's `@app.command`) is exempt: its parameters are its
    flags."""
    long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if any("command" in ast.unparse(d) or "callback" in ast.unparse(d) for d in node.decorator_list):
                    continue
                names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                         if a.arg not in ("self", "cls")]
                where = f"{path.relative_to(ROOT)}:{node.name}"
                if len(names) > MAX_PARAMETERS and where not in LONG_SIGNATURES_LEFT:
                    long.append(f"{where} takes {len(names)}")
                assert where not in LONG_SIGNATURES_LEFT or len(names) > MAX_PARAMETERS, f"{where}: drop it from the list"
    assert not long, "pass one object instead:\n" + "\n".join(long)


# --- Deployment layouts (#49): one package per runtime, seen through one face, registered once ----------------------

# A runtime's API, as code: imported, or written into a child's or a snippet's code
RUNTIME_APIS = {"genai": ("onnxruntime_genai",), "executorch_llm": ("executorch.extension.llm.runner",),
                "transformers_js": ("@huggingface/transformers",), "optimum": ("optimum.onnxruntime", "optimum"),
                "sentence_transformers": ("sentence_transformers",)}
# a layout package whose runtime is another's (executorch's LLM runner binding holds TextLLMRunner and MultimodalRunner)
SAME_RUNTIME = {"executorch_multimodal": "executorch_llm"}


def _layout_package(path: Path) -> str | None:
    parts = path.relative_to(ROOT / "exporters").parts
    return parts[1] if parts[0] == "layouts" and len(parts) > 2 else None


def test_stages_see_layouts_only_through_their_face():
    """No stage imports a layout's internals (`exporters.layouts.genai.proof`): only `exporters.layouts`."""
    offenders = []
    for path in _library_files():
        if _stage(_module_name(path)) in ("layouts", ""):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line} imports {module}" for module, line, _, _ in _our_imports(path)
                      if module.startswith("exporters.layouts.")]
    assert not offenders, "\n".join(offenders)


def test_a_runtime_api_is_named_only_in_its_layout_and_the_upstream_adapter():
    offenders = []
    for path in _library_files():
        relative = path.relative_to(ROOT / "exporters").parts
        if relative[0] == "upstream":
            continue
        owner = _layout_package(path)
        tree = ast.parse(path.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        code = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        for layout, apis in RUNTIME_APIS.items():
            if layout in (owner, SAME_RUNTIME.get(owner)):
                continue
            for api in apis:
                named = [m for m in imported if m == api or m.startswith(api + ".")]
                named += [api for text in code if f"import {api}" in text or f"from {api}" in text
                          or (api.startswith("@") and f"'{api}'" in text)]
                offenders += [f"{path.relative_to(ROOT)} names {name} ({layout}'s runtime)" for name in named]
    assert not offenders, "\n".join(offenders)


def test_every_layout_is_registered_once_by_its_class():
    from exporters.layouts import LAYOUTS, Layout

    packages = sorted(p.name for p in (ROOT / "exporters" / "layouts").iterdir() if (p / "__init__.py").exists())
    registered = sorted(type(layout).__module__.rsplit(".", 1)[-1] for layout in LAYOUTS)
    assert registered == packages, (registered, packages)
    assert all(isinstance(layout, Layout) and layout.runtime and layout.install for layout in LAYOUTS)
    assert len({layout.runtime for layout in LAYOUTS}) == len(LAYOUTS) == len({type(x) for x in LAYOUTS})
    # the runtime names are typed once: in their layout's class, nowhere else in the library's code (the recipe's
    # `layout` values are the recipe's vocabulary: exporters/recipe/ declares them)
    for layout in LAYOUTS:
        typed = [str(path.relative_to(ROOT)) for path in _library_files() if path.parts[-2] != "recipe"
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and node.value == layout.runtime]
        package = f"exporters/layouts/{type(layout).__module__.rsplit('.', 1)[-1]}/"
        assert len(typed) == 1 and typed[0].startswith(package), (layout.runtime, typed)


def test_the_layouts_face_loads_no_torch():
    """publish and report read the layouts' names and snippets without paying for the stack."""
    loaded = _stack_loaded_by("exporters.layouts")
    assert loaded == "[]", loaded
