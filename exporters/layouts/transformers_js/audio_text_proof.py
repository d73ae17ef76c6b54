"""transformers.js's audio-language proof (the layout is `audio_text.py`): eager greedy `generate()` on the sample's
prompt and audio features, and on two chunks of audio (the sample's features, then the same rolled by half a chunk:
Voxtral's audio encoder takes any number) or on audio half again as long (Granite Speech's takes any length: the
sample's features, then their first half again, with as many audio tokens as its projector gives them), then Node
running `GENERATE` on the folder alone for each: its processor on a tone of as many chunks (of as many samples) must
give features of the sample's shape and as many audio tokens, and generation from the sample's own ids and features
must give eager's tokens.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.audio_text import STACKED
from exporters.capture.image_text import longer_audio, takes_any_length
from exporters.capture.multimodal_runner import two_chunk_prompt, two_chunks
from exporters.layouts.base import read_json
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_script
from exporters.layouts.transformers_js.audio_text import PROOF_EMIT, PROOF_FEED, generate_script
from exporters.layouts.transformers_js.dtypes import judged, proof_runs, said_runs
from exporters.upstream.multimodal_runner import AudioEncoder


def _eager(model: Any, ids: torch.Tensor, features: torch.Tensor, steps: int, token: Any) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from `ids` and `features`, and the sample Node reads."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                             input_features=features.to(device, model.dtype), max_new_tokens=steps,
                             min_new_tokens=steps, do_sample=False, num_beams=1)
    sample = {"ids": ids[0].tolist(), "shape": list(features.shape), "features": features.flatten().tolist()}
    return {"tokens": out[0].tolist(), "sample": sample,
            "audio_tokens": int((ids[0] == token).sum()) if isinstance(token, int) else None}


def reference(model: Any, context: RuntimeContext, steps: int) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from the sample's prompt and audio, then from two chunks
    (see the module)."""
    ids, features = context.generate_inputs.get("input_ids"), context.generate_inputs.get("input_features")
    if not isinstance(ids, torch.Tensor) or not isinstance(features, torch.Tensor):
        return {"unverified": "the sample has no prompt and audio for transformers.js's audio-text-to-text model"}
    ids, features = ids[:1], features[:1].detach().float()
    token = getattr(model.config, "audio_token_id", None)
    runs = [_eager(model, ids, features, steps, token)]
    if isinstance(token, int) and token in ids[0].tolist() and takes_any_length(model):
        longer = longer_audio(features)
        with torch.no_grad():
            count = int(AudioEncoder(model).eval()(longer.to(model.device, model.dtype)).shape[1])
        runs.append(_eager(model, audio_run(ids, token, count), longer, steps, token))
    elif isinstance(token, int) and token in ids[0].tolist():
        runs.append(_eager(model, two_chunk_prompt(ids, token), two_chunks(features), steps, token))
    return {"audio_text": True, "steps": steps, "runs": runs}


def audio_run(ids: torch.Tensor, token: int, count: int) -> torch.Tensor:
    """The first row's run of audio tokens made `count` long where it stands.

    Example:
        >>> audio_run(torch.tensor([[1, 9, 9, 5]]), 9, 3).tolist()
        [[1, 9, 9, 9, 5]]
    """
    row = ids[0].tolist()
    first, had = row.index(token), row.count(token)
    return torch.tensor([row[:first] + [token] * count + row[first + had:]])


def _samples(directory: Path, shape: list[int]) -> int | None:
    """How many audio samples give features of `shape` where the folder's extractor stacks log-mel frames in pairs
    (Granite Speech's `melspec_kwargs`: `length // hop + 1` frames, an odd last one dropped), else None (Voxtral's
    chunks: the script counts them)."""
    melspec = read_json(directory / "preprocessor_config.json").get("melspec_kwargs")
    if not isinstance(melspec, dict) or not isinstance(melspec.get("hop_length"), int):
        return None
    return int(shape[1]) * STACKED * melspec["hop_length"]


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext,
          modules: Path, version: str) -> RuntimeProof:
    """Node runs `GENERATE` on `directory` with each run's ids and features (see the module); a folder with dtype
    files (`dtypes.proof_runs`) is loaded once more per dtype, generating from the first run's audio, each file
    giving at least the greedy tokens its variant's budget asks."""
    config = read_json(directory / "config.json")
    steps, token = reference["steps"], config.get("audio_token_id", config.get("audio_token_index"))
    said, done = [], []
    for dtype, asked in proof_runs(directory, context.target.validation, steps):
        on = f" with dtype {dtype}" if dtype and dtype != "fp32" else ""
        script = generate_script(json.dumps(str(directory.parent)), json.dumps(directory.name), steps, PROOF_FEED,
                                 PROOF_EMIT, dtype=dtype)
        for run in reference["runs"] if not done else reference["runs"][:1]:
            with tempfile.TemporaryDirectory(prefix="tjs-audio-text-") as scratch:
                sample = Path(scratch) / "sample.json"
                sample.write_text(json.dumps(run["sample"]), encoding="utf-8")
                spec = {"sample": str(sample)}
                if (samples := _samples(directory, run["sample"]["shape"])) is not None:
                    spec["samples"] = samples
                got, why = run_script(["node"], script, spec, folder=directory,
                                      timeout_s=child_timeout(context), links={"node_modules": modules})
            chunks = run["sample"]["shape"][0]
            audio = f"{chunks} chunk{'s' if chunks > 1 else ''} of audio"
            if spec.get("samples"):  # audio of any length: its features' frames
                audio = f"audio of {run['sample']['shape'][1]} feature frames"
            if not isinstance(got, dict):
                return RuntimeProof(layout.runtime, "failed", f"transformers.js failed on {audio}{on}: {why}")
            processed = got.get("processed") or {}
            shape, count = run["sample"]["shape"], run.get("audio_tokens")
            made = sum(1 for i in processed.get("ids") or [] if i == token)
            if processed.get("features") != shape or (count is not None and made != count):
                return RuntimeProof(layout.runtime, "failed", (
                    f"transformers.js's processor made features {processed.get('features')} and {made} audio tokens "
                    f"of {audio}; the model takes {shape} and {count}"))
            equal, short = judged(run["tokens"], got.get("tokens"), len(run["sample"]["ids"]), steps,
                                  asked, f" from {audio}{on}")
            if short:
                return RuntimeProof(layout.runtime, "failed", short)
            if not done:
                said.append(f"{count} from {audio}")
        done.append((dtype, equal, asked))
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (transformers.js {version}, Node.js, "
                                                  "AutoModelForAudioTextToText, its processor's audio tokens: "
                                                  f"{', '.join(said)})" + said_runs(done, steps))
