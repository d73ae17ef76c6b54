"""Keep every third-party image pinned by digest, with the digests in one place: docker/base-images.json.

A tag (`python:3.11-slim-bookworm`) moves whenever its publisher rebuilds it; a digest names the bytes. Every image
the project builds on or runs in is written `name:tag@sha256:<digest>` (the tag for the reader, the digest for the
pull), and the digest must be the one `docker/base-images.json` records for that `name:tag`:

    docker/base-images.json ──► Dockerfile         FROM / ARG defaults, `# syntax=` directives
      (name:tag → digest)   ──► docker/*.Dockerfile, examples/**/Dockerfile
                            ──► .github/workflows, examples/workflows   container:, services:, `uses: docker://`

This project's own release images (`own` in the file: `ghcr.io/hf/export-action`) are exempt: the examples name them
by the major tag their users follow, and the release pins them by digest itself (release.yml).

Usage:
    python docker/pin_images.py [--root DIR]           check (offline): exit 0 all pinned, 1 problems (each listed)
    python docker/pin_images.py --update [NAME:TAG]...  resolve the tags again (`docker buildx imagetools inspect`,
                                                        or `crane digest`) and rewrite the file and every reference;
                                                        needs a registry; exit 2 when none can be reached

Example:
    >>> split("python:3.11-slim-bookworm@sha256:" + "ab" * 32)
    ('python:3.11-slim-bookworm', 'sha256:abababababababababababababababababababababababababababababababab')
    >>> split("python:3.11-slim-bookworm")
    ('python:3.11-slim-bookworm', None)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import yaml

LOCK = Path("docker") / "base-images.json"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SKIPPED_DIRS = {"node_modules", "__pycache__"}  # and every hidden folder (.git, .venv, .cache)
ARG = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


@dataclass(frozen=True)
class Reference:
    """An image named in a file: where (`file:line`, what names it) and the image as written."""

    file: str
    line: int
    where: str
    image: str


def split(image: str) -> tuple[str, str | None]:
    """`name:tag@sha256:…` → (`name:tag`, `sha256:…`); without a digest → (`image`, None)."""
    name, _, digest = image.partition("@")
    return name, digest or None


def repository(name: str) -> str:
    """The image's repository, without its tag: `ghcr.io/hf/export-action:1-bot` → `ghcr.io/hf/export-action`."""
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _files(root: Path) -> tuple[list[Path], list[Path]]:
    dockerfiles, workflows = [], []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") or d == ".github")
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        here = Path(folder)
        for name in sorted(names):
            if name == "Dockerfile" or name.endswith(".Dockerfile"):
                dockerfiles.append(here / name)
            elif name.endswith((".yml", ".yaml")) and here.name == "workflows":
                workflows.append(here / name)
    return dockerfiles, workflows


def dockerfile_references(path: Path, root: Path) -> list[Reference]:
    """The `# syntax=` directive and every FROM's image (ARGs replaced by their defaults; stages skipped)."""
    found: list[Reference] = []
    args: dict[str, tuple[str, int] | None] = {}
    stages: set[str] = set()
    rel = str(path.relative_to(root))
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        directive = re.match(r"#\s*syntax\s*=\s*(\S+)", line)
        if directive:
            found.append(Reference(rel, number, "# syntax=", directive.group(1)))
            continue
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        keyword = words[0].upper()
        if keyword == "ARG" and len(words) > 1:
            name, has_default, default = words[1].partition("=")
            args[name] = (default, number) if has_default else None
        elif keyword == "FROM":
            operands = [w for w in words[1:] if not w.startswith("--")]
            image = operands[0]
            if len(operands) >= 3 and operands[1].upper() == "AS":
                stages.add(operands[2].lower())
            used = ARG.findall(image)
            missing = [name for name in used if args.get(name) is None]
            if missing:
                found.append(Reference(rel, number, f"FROM (ARG {missing[0]} has no default)", image))
                continue
            resolved = ARG.sub(lambda m: args[m.group(1)][0], image)
            if resolved.lower() not in stages and resolved != "scratch":
                # an image from an ARG default is written (and pinned) on the ARG's line
                at, where = (args[used[0]][1], f"ARG {used[0]} (FROM)") if used else (number, "FROM")
                found.append(Reference(rel, at, where, resolved))
    return found


def workflow_references(path: Path, root: Path) -> list[Reference]:
    """Job containers, service containers and `uses: docker://` steps."""
    rel = str(path.relative_to(root))
    text = path.read_text()
    workflow = yaml.safe_load(text) or {}

    def line_of(image: str) -> int:
        for number, raw in enumerate(text.splitlines(), 1):
            if image in raw and not raw.lstrip().startswith("#"):
                return number
        return 0

    found = []
    for job_name, job in (workflow.get("jobs") or {}).items():
        containers = [("container", job.get("container"))]
        containers += [(f"services.{name}", spec) for name, spec in (job.get("services") or {}).items()]
        for where, spec in containers:
            image = spec.get("image") if isinstance(spec, dict) else spec
            if image:
                found.append(Reference(rel, line_of(image), f"jobs.{job_name}.{where}", str(image)))
        for step in job.get("steps") or []:
            uses = str(step.get("uses", ""))
            if uses.startswith("docker://"):
                image = uses.removeprefix("docker://")
                found.append(Reference(rel, line_of(uses), f"jobs.{job_name}.steps uses", image))
    return found


def references(root: Path) -> list[Reference]:
    """Every image reference in the repository's Dockerfiles and workflows."""
    dockerfiles, workflows = _files(root)
    found = [ref for path in dockerfiles for ref in dockerfile_references(path, root)]
    return found + [ref for path in workflows for ref in workflow_references(path, root)]


def load(root: Path) -> dict:
    return json.loads((root / LOCK).read_text())


def problems(root: Path) -> list[str]:
    """What breaks the rule, one line each (empty: every image pinned by the file's digest)."""
    lock = load(root)
    images, own = lock.get("images") or {}, set(lock.get("own") or {})
    found = []
    for name, entry in sorted(images.items()):
        if not DIGEST.fullmatch(str(entry.get("digest", ""))):
            found.append(f"{LOCK}: {name}: digest {entry.get('digest')!r} is not sha256:<64 lower-case hex digits> "
                         "(resolve it: python docker/pin_images.py --update, where a registry is reachable)")
    used = set()
    for ref in references(root):
        at = f"{ref.file}:{ref.line} ({ref.where})"
        name, digest = split(ref.image)
        if repository(name) in own:
            continue
        if "$" in ref.image:
            found.append(f"{at}: {ref.image} is given at build time: give the ARG a default pinned by digest")
            continue
        used.add(name)
        entry = images.get(name)
        if entry is None:
            found.append(f"{at}: {ref.image} is not in {LOCK}: add {name} there and run "
                         "`python docker/pin_images.py --update` where a registry is reachable")
        elif digest is None:
            found.append(f"{at}: {ref.image} is not pinned by digest: write {name}@{entry.get('digest')}")
        elif digest != entry.get("digest"):
            found.append(f"{at}: {ref.image} has another digest than {LOCK} ({entry.get('digest')}): "
                         "the file is the one place for digests")
    for name in sorted(set(images) - used):
        found.append(f"{LOCK}: {name} is used nowhere: remove it")
    return found


def resolve(name: str) -> str:
    """The digest `name:tag` points at now (the multi-platform index's), from a registry."""
    if shutil.which("docker"):
        done = subprocess.run(["docker", "buildx", "imagetools", "inspect", name, "--format", "{{json .Manifest}}"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return json.loads(done.stdout)["digest"]
    if shutil.which("crane"):
        done = subprocess.run(["crane", "digest", name], capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout.strip()
    raise RuntimeError(f"cannot resolve {name}: no registry answered (needs `docker buildx` or `crane`, and network)")


def update(root: Path, names: list[str]) -> list[str]:
    """Resolve `names` (default: every image in the file) and rewrite the file and every reference. What changed."""
    lock = load(root)
    images = lock["images"]
    changed = []
    for name in names or sorted(images):
        if name not in images:
            raise RuntimeError(f"{name} is not in {LOCK}: add an entry for it first")
        digest = resolve(name)
        if not DIGEST.fullmatch(digest):
            raise RuntimeError(f"{name}: the registry answered {digest!r}, not a sha256 digest")
        old = images[name].get("digest")
        images[name].update(digest=digest, resolved=date.today().isoformat(), source="registry (pin_images.py)")
        written = re.compile(rf"(?<![\w./-]){re.escape(name)}(?:@sha256:[0-9a-f]*)?(?![\w.:@-])")
        for ref in references(root):
            if split(ref.image)[0] != name:
                continue
            path = root / ref.file
            lines = path.read_text().split("\n")
            lines[ref.line - 1] = written.sub(f"{name}@{digest}", lines[ref.line - 1])
            path.write_text("\n".join(lines))
        if old != digest:
            changed.append(f"{name}: {old} → {digest}")
    (root / LOCK).write_text(json.dumps(lock, indent=2, ensure_ascii=False) + "\n")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--update", nargs="*", metavar="NAME:TAG", help="resolve these (default: all) again")
    args = parser.parse_args(argv)
    if args.update is not None:
        try:
            changed = update(args.root, args.update)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("\n".join(changed) or "every digest is current")
    found = problems(args.root)
    if found:
        print(f"{len(found)} image reference(s) break the digest rule ({LOCK} is the one place for digests):",
              file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{len(references(args.root))} image references, each pinned by the digest {LOCK} records (or this "
          "project's own release image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
