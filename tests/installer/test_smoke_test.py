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


@pytest.mark.skipif(sys.platform == "win32", reason="a shell launcher stands in for the bundle")
def test_the_smoke_test_serves_the_starter_set_and_checks_where_the_model_runs(assets, tmp_path):
    llama.init_backend(assets["smollm2"])
    if llama.gpu_devices():
        pytest.skip("this llama-cpp-python has a GPU: the model would run there (installer/gpu_check.py covers it)")
    exe = tmp_path / "bin" / "llamadesk"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\ncd "{REPO}" && exec "{sys.executable}" -m app "$@"\n')
    exe.chmod(0o755)
    models = assets["smollm2"].parent  # the test assets share the starter set's file names
    r = subprocess.run([sys.executable, str(REPO / "installer" / "smoke_test.py"), str(exe), "--models", str(models),
                        "--expect-device", "Vulkan"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "chat: " in out and "Paris" in out
    assert "embeddings: 2 vectors of 384" in out
    assert "speech round trip: " in out
    # a CPU build: every layer of SmolLM2 on the CPU, which --expect-device Vulkan refuses
    assert "the chat model runs on local (0/31 layers offloaded), not all on a Vulkan device" in r.stderr
