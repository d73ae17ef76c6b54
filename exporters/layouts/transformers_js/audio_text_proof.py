"""transformers.js's audio-language proof (the layout is `audio_text.py`): eager greedy `generate()` on the sample's
prompt and audio features, and on two chunks of audio (the sample's features, then the same rolled by half a chunk:
the audio encoder takes any number), then Node running `GENERATE` on the folder alone for each: its processor on a
tone of as many chunks must give features of the sample's shape and as many audio tokens, and generation from the
sample's own ids and features must give eager's tokens.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.multimodal_runner import two_chunk_prompt, two_chunks
from exporters.layouts.base import read_json
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_script
from exporters.layouts.transformers_js.audio_text import PROOF_EMIT, PROOF_FEED, generate_script
from exporters.layouts.transformers_js.dtypes import equal_new, proof_runs, said_runs


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
    if isinstance(token, int) and token in ids[0].tolist():
        runs.append(_eager(model, two_chunk_prompt(ids, token), two_chunks(features), steps, token))
    return {"audio_text": True, "steps": steps, "runs": runs}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext,
          modules: Path, version: str) -> RuntimeProof:
    """Node runs `GENERATE` on `directory` with each run's ids and features (see the module); a folder with dtype
    files (`dtypes.proof_runs`) is loaded once more per dtype, generating from the first run's audio, each file
    giving at least the greedy tokens its variant's budget asks."""
    steps, token = reference["steps"], read_json(directory / "config.json").get("audio_token_id")
    said, done = [], []
    for dtype, asked in proof_runs(directory, context.target.validation, steps):
        on = f" with dtype {dtype}" if dtype and dtype != "fp32" else ""
        script = generate_script(json.dumps(str(directory.parent)), json.dumps(directory.name), steps, PROOF_FEED,
                                 PROOF_EMIT, dtype=dtype)
        for run in reference["runs"] if not done else reference["runs"][:1]:
            with tempfile.TemporaryDirectory(prefix="tjs-audio-text-") as scratch:
                sample = Path(scratch) / "sample.json"
                sample.write_text(json.dumps(run["sample"]), encoding="utf-8")
                got, why = run_script(["node"], script, {"sample": str(sample)}, folder=directory,
                                      timeout_s=child_timeout(context), links={"node_modules": modules})
            chunks = run["sample"]["shape"][0]
            audio = f"{chunks} chunk{'s' if chunks > 1 else ''} of audio"
            if not isinstance(got, dict):
                return RuntimeProof(layout.runtime, "failed", f"transformers.js failed on {audio}{on}: {why}")
            processed = got.get("processed") or {}
            shape, count = run["sample"]["shape"], run.get("audio_tokens")
            made = sum(1 for i in processed.get("ids") or [] if i == token)
            if processed.get("features") != shape or (count is not None and made != count):
                return RuntimeProof(layout.runtime, "failed", (
                    f"transformers.js's processor made features {processed.get('features')} and {made} audio tokens "
                    f"of {audio}; the model takes {shape} and {count}"))
            want, tokens = run["tokens"], got.get("tokens")
            equal = steps if tokens == want else equal_new(want, tokens, len(run["sample"]["ids"]))
            if equal < asked:
                return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy from "
                                    f"{audio}{on}" + ("" if asked == steps else f", {asked} asked")
                                    + f": transformers.js {tokens}, eager {want}")
            if not done:
                said.append(f"{count} from {audio}")
        done.append((dtype, equal, asked))
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (transformers.js {version}, Node.js, "
                                                  "AutoModelForAudioTextToText, its processor's audio tokens: "
                                                  f"{', '.join(said)})" + said_runs(done, steps))
