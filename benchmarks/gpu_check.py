"""The CUDA paths, run for real on a machine with a GPU (CI has none: there the same recipes fail with a clear
DeviceError, which the test suite checks).

Builds a tiny Llama and a tiny BERT, then runs the real CLI with targets on `device: cuda` (dynamo, ONNX through
onnxruntime-gpu's CUDA provider, ExecuTorch's CUDA backend; float32 and float16, generation and single graph),
`device: auto`, and a `--device cpu` override of a cuda recipe. Then the checkpoints owners ship (issue #46): the
instruct-shaped bfloat16 checkpoint of tests/test_shipped_checkpoints.py (shards, tied embeddings, 128k vocabulary,
sampling on in its generation config) with the plainest dynamo and ONNX targets on `device: cuda`, and with `--big`
TinyLlama-1.1B's shape at full depth (bfloat16, 3 shards; benchmarks/bench_peers.py's) as a dynamo target on the GPU. Prints each target's verdict and writes the reports
under OUT. First it records the stack it runs on and checks it is the CUDA image's (docker build --build-arg
VARIANT=cuda ...: see the Dockerfile's header): one ONNX Runtime, onnxruntime-gpu with its CUDA provider, every
distribution pinned as constraints-cuda.txt says, ExecuTorch's CUDA backend importable.

Usage: python benchmarks/gpu_check.py OUT_DIR [--big]
Recorded results: benchmarks/RESULTS.md ("GPU check").
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LLAMA_RECIPE = [
    {"name": "dynamo-cuda", "export_format": "dynamo", "mode": "generation", "dynamic": True, "device": "cuda"},
    {"name": "onnx-cuda", "export_format": "onnx", "mode": "generation", "dynamic": True, "device": "cuda"},
    {"name": "dynamo-cuda-fp16", "export_format": "dynamo", "mode": "generation", "dynamic": True, "device": "cuda",
     "dtype": "float16"},
]
SHIPPED_RECIPE = [
    {"name": "dynamo", "export_format": "dynamo", "mode": "generation", "dynamic": True, "device": "cuda"},
    {"name": "onnx", "export_format": "onnx", "mode": "generation", "dynamic": True, "device": "cuda"},
]
BIG_RECIPE = [{"name": "dynamo", "export_format": "dynamo", "mode": "generation", "dynamic": True, "device": "cuda"}]
BERT_RECIPE = [
    {"name": "dynamo-auto", "export_format": "dynamo", "dynamic": True, "device": "auto"},
    {"name": "onnx-auto", "export_format": "onnx", "dynamic": True, "device": "auto"},
    {"name": "executorch-cuda", "export_format": "executorch", "backend": "cuda", "device": "cuda"},
]


def environment() -> dict:
    """The stack this runs on, and whether it is the CUDA image's (`image_checks`: name -> passed, detail)."""
    import importlib
    import shutil
    from importlib import metadata

    import onnxruntime
    import torch  # first: onnxruntime-gpu finds the CUDA libraries torch's wheels bring

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    ort_dists = {name: version(name) for name in ("onnxruntime", "onnxruntime-gpu") if version(name)}
    try:
        importlib.import_module("executorch.backends.cuda.cuda_partitioner")
        et_cuda = "importable"
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        et_cuda = f"{type(err).__name__}: {err}"
    pins = subprocess.run([sys.executable, str(ROOT / "docker" / "check_pins.py"),
                           str(ROOT / "constraints-cuda.txt"), "--allow", "export-action"],
                          capture_output=True, text=True)
    providers = onnxruntime.get_available_providers()
    checks = {
        "one ONNX Runtime, the GPU build": (list(ort_dists) == ["onnxruntime-gpu"], ort_dists),
        "ONNX Runtime's CUDA provider": ("CUDAExecutionProvider" in providers, providers),
        "torch sees the GPU": (torch.cuda.is_available(), torch.version.cuda),
        "ExecuTorch's CUDA backend": (et_cuda == "importable", et_cuda),
        "every distribution pinned (constraints-cuda.txt)": (pins.returncode == 0,
                                                             (pins.stdout + pins.stderr).strip()[-800:]),
    }
    return {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "onnxruntime": onnxruntime.__version__, "onnxruntime_dists": ort_dists, "ort_providers": providers,
        "executorch": version("executorch"), "triton": version("triton"), "cxx": shutil.which("g++") or shutil.which("c++"),
        "image_checks": {name: {"passed": bool(ok), "detail": detail} for name, (ok, detail) in checks.items()},
    }


def run(model: Path, out: Path, *extra: str) -> dict:
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "exporters.cli", "run", str(model), "--out", str(out), "--quiet",
                             *extra], capture_output=True, text=True, cwd=ROOT)
    elapsed = time.time() - started
    print(f"$ hf-export run {model.name} {' '.join(extra)}  -> exit {result.returncode} in {elapsed:.0f} s")
    print(result.stderr[-1500:] if result.returncode not in (0, 1) else "")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    for target in report.get("targets", []):
        error = (target.get("error") or {}).get("message") or "; ".join(target.get("unverified") or [])
        parity = (target.get("generation") or {}).get("status", "-")
        dtypes = "/".join(str(target.get(k)) for k in ("checkpoint_dtype", "load_dtype", "artifact_dtype"))
        print(f"  {target['name']:<18} {target['status']:<10} device={target['device']:<5} parity={parity:<8} "
              f"dtypes={dtypes} {error[:300]}")
    return {"exit": result.returncode, "seconds": round(elapsed, 1), "report": report}


def main() -> None:
    from exporters.quiet import mute_import_chatter

    mute_import_chatter()
    from tests.models import tiny_bert, tiny_llama, write_recipe
    from tests.test_shipped_checkpoints import instruct_checkpoint

    out_root = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "gpu-check"))
    out_root.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env))
    for name, check in env["image_checks"].items():
        print(f"{'ok  ' if check['passed'] else 'FAIL'} {name}: {check['detail']}")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    results: dict = {"environment": env}

    def record(name: str, model: Path, *extra: str) -> None:
        """Run one, and write the summary so far (a run cut off by its time limit still leaves what it had)."""
        results[name] = run(model, out_root / name, *extra)
        summary = {k: v if k == "environment" else
                   {"exit": v["exit"], "seconds": v["seconds"],
                    "targets": {t["name"]: [t["status"], t["device"], t.get("artifact_dtype")]
                                for t in v["report"].get("targets", [])}}
                   for k, v in results.items()}
        (out_root / "gpu_check.json").write_text(json.dumps(summary, indent=2))

    llama = tiny_llama(work / "llama", LLAMA_RECIPE)
    record("llama-cuda", llama, "--jobs", "3")
    record("bert-auto", tiny_bert(work / "bert", BERT_RECIPE))
    record("llama-cpu-override", llama, "--device", "cpu", "--target", "dynamo-cuda")
    record("shipped-cuda", instruct_checkpoint(work / "shipped", recipe=SHIPPED_RECIPE), "--jobs", "2")
    if "--big" in sys.argv:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_peers import build_tinyllama

        big = work / "tinyllama"
        started = time.time()
        build_tinyllama(big, work / "tinyllama-facts.json")
        write_recipe(big, BIG_RECIPE)
        print(f"built the 1.1B checkpoint in {time.time() - started:.0f} s", flush=True)
        record("tinyllama-1.1b-cuda", big)
    print((out_root / "gpu_check.json").read_text())


if __name__ == "__main__":
    main()
