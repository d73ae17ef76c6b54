"""A runtime's own words on why an artifact does not load or run reach the report (ExecuTorch prints them on stderr
and raises a bare code), and its chatter does not reach the terminal. Each check runs in a fresh interpreter whose
stderr is a pipe, as the CLI's is under a runner (pytest's own capture of file descriptor 2 would sit in between)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import ROOT


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.fixture(scope="module")
def sort_program(tmp_path_factory):
    """A real ExecuTorch program that needs a kernel its runtime does not have (`aten::sort.values`; Qwen2.5-VL's
    vision tower needs it too)."""
    from executorch.exir import to_edge_transform_and_lower

    class Sort(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x).values

    manager = to_edge_transform_and_lower(torch.export.export(Sort(), (torch.tensor([3, 1, 2]),))).to_executorch()
    path = tmp_path_factory.mktemp("pte") / "sort.pte"
    path.write_bytes(manager.buffer)
    return path


def test_a_missing_kernel_is_named_in_the_error_and_not_printed(sort_program):
    result = run_python(f"""
        from executorch.runtime import Runtime
        from exporters.errors import describe_error
        from exporters.validate.native_log import native_messages

        program = Runtime.get().load_program({str(sort_program)!r})
        try:
            with native_messages():
                program.load_method("forward")
        except RuntimeError as err:
            print(describe_error(err))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "error: 0x:14" in result.stdout  # all the exception itself says
    assert "(runtime log: kernel 'aten::sort.values' not found" in result.stdout
    assert "operator_registry.cpp" not in result.stderr  # caught, not printed


def test_native_chatter_is_dropped_and_other_output_written_out():
    result = run_python("""
        import os, sys
        from exporters.errors import describe_error
        from exporters.validate.native_log import native_messages

        with native_messages():
            os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file /sys/devices/soc0/image_version\\n")
            print("a warning from Python", file=sys.stderr)
        try:
            with native_messages():
                os.write(2, b"[method.cpp:1493] arg 0 with type id 1\\n")
                raise ValueError("plain")
        except ValueError as err:
            print(describe_error(err))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == "a warning from Python\n"
    assert result.stdout == "ValueError: plain\n"  # no failure line from the runtime: no note
