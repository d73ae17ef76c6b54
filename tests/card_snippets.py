"""The model card's snippets run as written: the card's code blocks, extracted from its Exports section, each run
by the venv's Python in a fresh process against the Hub emulator (`HF_ENDPOINT`), which holds the target folders at
the commit the snippets pin. Nothing in a snippet is replaced.

Example:
    >>> card_snippets("x\\n\\noptimum:\\n\\n```python\\nprint(1)\\n```\\n")
    [('optimum', 'python', 'print(1)')]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests import cli_launcher
from tests.servers.hub import HubEmulator
from tests.servers.hub_fixtures import TEST_TOKEN

BLOCK = re.compile(r"^(?P<runtime>[^\n`]+):\n\n```(?P<language>\w+)\n(?P<code>.*?)\n```$", re.M | re.S)


def card_snippets(card: str) -> list[tuple[str, str, str]]:
    """`(runtime, language, code)` of every snippet in the card, in order."""
    return [(m["runtime"], m["language"], m["code"]) for m in BLOCK.finditer(card)]


def upload_exports(hub: HubEmulator, repo_id: str, out: Path, names: list[str]) -> str:
    """A new repo holding `exports/<name>/` of each target as the run wrote it; returns the commit that holds them."""
    files = {f"exports/{name}/{path.relative_to(out / name).as_posix()}": path.read_bytes()
             for name in names for path in sorted((out / name).rglob("*")) if path.is_file()}
    hub.create_model_repo(repo_id, files, author="alice")
    return hub.head(repo_id)


def exports_card(repo_id: str, out: Path, commit: str, publish_failed: bool = False) -> str:
    """The card's Exports section for the run in `out`, its snippets pinned to `commit` (`publish_failed`: its
    passing targets where another failed, as `hf-export run --publish-failed`)."""
    from exporters.publish.plan import plan_publish
    from exporters.publish.texts import card_section

    return card_section(plan_publish(repo_id, out, publish_failed=publish_failed), commit)


def image_home(tmp_path: Path) -> Path:
    """A home folder for `run_snippet` holding the `image.jpg` a vision snippet reads (its working directory)."""
    import numpy as np
    from PIL import Image

    home = tmp_path / "home"
    home.mkdir()
    Image.fromarray((np.random.default_rng(0).random((40, 48, 3)) * 255).astype("uint8")).save(home / "image.jpg")
    return home


def audio_home(tmp_path: Path, seconds: float = 2.0) -> Path:
    """A home folder for `run_snippet` holding the `audio.wav` a speech snippet reads (its working directory): a
    440 Hz tone at 16 kHz, 16-bit mono."""
    import wave

    import numpy as np

    home = tmp_path / "home"
    home.mkdir()
    rate = 16000
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(int(rate * seconds)) / rate)
    with wave.open(str(home / "audio.wav"), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((tone * 32767).astype(np.int16).tobytes())
    return home


def run_snippet(code: str, hub: HubEmulator, home: Path, prompt: str | None = None,
                timeout: float = 600, python: str | None = None) -> subprocess.CompletedProcess:
    """`code` as written, in a fresh venv Python process whose `huggingface_hub` talks to `hub` (a scratch cache),
    started as `python -c code` (warm: forked from the CLI launcher before anything of the snippet's ran); `prompt`,
    when given, goes on the snippet's documented prompt line (`# your prompt`), the one line a user edits. `python`:
    another interpreter (a side environment's, for a runtime the product's venv must not hold)."""
    from exporters.publish.snippets import PROMPT_LINE

    if prompt is not None and PROMPT_LINE in code:
        code = code.replace(PROMPT_LINE, f"prompt = {json.dumps(prompt)}  # your prompt")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0", "HF_TOKEN": TEST_TOKEN}
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE", "HF_TOKEN_PATH"):
        env.pop(name, None)
    if python is not None:  # another environment: none of this one's paths, and a cold interpreter of its own
        env["PYTHONPATH"] = ""
        return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=home,
                              timeout=timeout)
    # the venv's `python -c code`, forked from this worker's CLI launcher (tests/cli_launcher.py), which imported only
    # the environment-blind part of the stack (torch, numpy, ...): the snippet imports huggingface_hub, transformers
    # and the runtime itself, with its own environment, as a user's interpreter does (#48: ~4.5 CPU s a snippet)
    return cli_launcher.launch([], {**env, "PYTHONUNBUFFERED": "1"}, home, timeout, code=code).done


def run_js_card(code: str, folder: Path, scratch: Path, timeout: float = 300) -> str:
    """A transformers.js card script as written, by Node in `scratch`, with the target `folder` copied where the
    card's download line puts it (`model/exports/<name>`) and the installed transformers.js beside it; returns what it
    printed (the run must exit 0).

    Example:
        printed = run_js_card(code, out / "tjs", tmp_path)  # doctest: +SKIP
    """
    import shutil

    from exporters.layouts.transformers_js import home as transformers_js_home

    shutil.copytree(folder, scratch / "model" / "exports" / folder.name)
    (scratch / "node_modules").symlink_to(transformers_js_home() / "node_modules", target_is_directory=True)
    (scratch / "card.mjs").write_text(code, encoding="utf-8")
    done = subprocess.run(["node", "card.mjs"], cwd=scratch, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (code, done.stderr[-3000:])
    return done.stdout.strip()


LOADED_LIBRARIES = """
import json, sys
print(json.dumps(sorted({line.split()[-1].rsplit("/", 1)[-1] for line in open("/proc/self/maps")
                         if "/executorch/" in line and ".so" in line})))
"""


def executorch_libraries(imports: str) -> set[str]:
    """The executorch native libraries (file names) a fresh Python of this environment has loaded after running
    `imports` (read from Linux's /proc/self/maps): what a card's imports and a proof's child load, compared.

    Example:
        executorch_libraries("import executorch.kernels.quantized\n")  # doctest: +SKIP
    """
    done = subprocess.run([sys.executable, "-c", imports + LOADED_LIBRARIES], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))
