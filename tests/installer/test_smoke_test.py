"""installer/smoke_test.py, the check every bundle build ends with, run against this checkout's llamadesk (a
launcher script standing where a bundle's executable would): it serves the starter set's files, and a placement
the build does not have fails it after every other check passed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import llama

REPO = Path(__file__).resolve().parents[2]


def _smoke_test(assets, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """installer/smoke_test.py with flags, run against this checkout's llamadesk serving the test assets."""
    exe = tmp_path / "bin" / "llamadesk"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\ncd "{REPO}" && exec "{sys.executable}" -m app "$@"\n')
    exe.chmod(0o755)
    models = assets["smollm2"].parent  # the test assets share the starter set's file names
    return subprocess.run([sys.executable, str(REPO / "installer" / "smoke_test.py"), str(exe), "--models",
                           str(models), *flags], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})


@pytest.mark.skipif(sys.platform == "win32", reason="a shell launcher stands in for the bundle")
def test_the_smoke_test_serves_the_starter_set_and_checks_where_the_model_runs(assets, tmp_path):
    llama.init_backend(assets["smollm2"])
    if llama.gpu_devices():
        pytest.skip("this llama-cpp-python has a GPU: the model would run there (installer/gpu_check.py covers it)")
    r = _smoke_test(assets, tmp_path, "--expect-device", "Vulkan")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "chat: " in out and "Paris" in out
    assert "embeddings: 2 vectors of 384" in out
    assert "speech round trip: " in out
    # a CPU build: every layer of SmolLM2 on the CPU, which --expect-device Vulkan refuses
    assert "the chat model runs on local (0/31 layers offloaded), not all on a Vulkan device" in r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="a shell launcher stands in for the bundle")
@pytest.mark.parametrize("flag, value, said", [
    ("--expect-variant", "sse42", "the CPU variant in use is not sse42"),
    ("--expect-excluded", "sapphirerapids: killed by SIGILL", "no CPU variant was excluded as "
                                                              "'sapphirerapids: killed by SIGILL'")])
def test_the_smoke_test_checks_the_cpu_variant_it_is_told_to_expect(assets, tmp_path, flag, value, said):
    """The test wheel is a native build (no variants): what oldcpu_smoke.sh and faulty_variant_smoke.sh expect
    of a bundle is not there, and the smoke test says so after serving everything."""
    r = _smoke_test(assets, tmp_path, flag, value)
    assert r.returncode == 1 and "speech round trip: " in r.stdout, r.stdout + r.stderr
    assert said in r.stderr
