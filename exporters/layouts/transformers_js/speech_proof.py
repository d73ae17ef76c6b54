"""transformers.js's speech proof (the layout is `speech.py`): eager greedy `generate()` on the sample's spectrogram
(Moonshine's waveform), then Node running `TRANSCRIBE` on the folder alone with that spectrogram (waveform); the last `steps` tokens must be eager's
(with dtype files, `dtypes.py`: the folder loaded once per dtype, each file giving the greedy tokens its variant's
budget asks).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from exporters.capture.generation_settings import greedy
from exporters.layouts.child import RuntimeContext, RuntimeProof, child_timeout, run_script
from exporters.layouts.transformers_js.dtypes import equal_new, proof_runs, said_runs
from exporters.layouts.transformers_js.speech import EMIT, PROOF_FEATURES, transcribe_script


def reference(model: Any, context: RuntimeContext, steps: int) -> dict[str, Any]:
    """Eager greedy generation of exactly `steps` tokens from the sample's spectrogram, or Moonshine's waveform
    (`input_values`), see the module."""
    name = "input_features" if "input_features" in context.generate_inputs else "input_values"
    features = context.generate_inputs.get(name)
    if not isinstance(features, torch.Tensor):
        return {"unverified": "the sample has no spectrogram `input_features` (nor waveform `input_values`) for "
                              "transformers.js's speech models"}
    features = features[:1].detach().float()  # as transformers.js's extractor makes them (a float16 graph casts inside)
    weight = next(model.parameters())
    # the repo's settings made greedy, as validation's: a multilingual Whisper that names no language gets one pinned
    # (English where it has it), as transformers.js's generate() defaults to English; unpinned, eager would detect one
    config = greedy(context.generation_config or model.generation_config, max_new_tokens=steps)
    config.min_new_tokens = steps
    with torch.no_grad():
        out = model.generate(**{name: features.to(weight.device, weight.dtype)}, generation_config=config)
    return {"speech": True, "steps": steps, "tokens": out[0, -steps:].tolist(),
            "features": {"shape": list(features.shape), "data": features.flatten().tolist()}}


def prove(layout: Any, directory: Path, reference: dict[str, Any], context: RuntimeContext,
          modules: Path, version: str) -> RuntimeProof:
    """Node runs `TRANSCRIBE` on `directory` with the sample's spectrogram, once per dtype the folder holds
    (`dtypes.proof_runs`): its own graphs' last `steps` ids must be eager's, each dtype file's the greedy tokens its
    variant's budget asks."""
    want, steps, done = reference["tokens"], reference["steps"], []
    for dtype, asked in proof_runs(directory, context.target.validation, steps):
        on = f" with dtype {dtype}" if dtype and dtype != "fp32" else ""
        script = transcribe_script(json.dumps(str(directory.parent)), json.dumps(directory.name), PROOF_FEATURES,
                                   steps, EMIT, dtype=dtype)
        with tempfile.TemporaryDirectory(prefix="tjs-speech-") as scratch:
            features = Path(scratch) / "features.json"
            features.write_text(json.dumps(reference["features"]), encoding="utf-8")
            got, why = run_script(["node"], script, {"features": str(features)}, folder=directory,
                                  timeout_s=child_timeout(context), links={"node_modules": modules})
        if got is None:
            return RuntimeProof(layout.runtime, "failed", f"transformers.js failed{on}: {why}")
        new = got[-steps:]
        equal = equal_new(want, new, 0)
        if equal < asked:
            return RuntimeProof(layout.runtime, "failed", f"{equal}/{steps} tokens equal eager greedy{on}" + (
                "" if asked == steps else f", {asked} asked") + f": transformers.js {new}, eager {want}")
        done.append((dtype, equal, asked))
    return RuntimeProof(layout.runtime, "passed", f"{steps}/{steps} tokens (transformers.js {version}, Node.js, "
                                                  "AutoModelForSpeechSeq2Seq)" + said_runs(done, steps))
