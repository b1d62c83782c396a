"""The CPU-variant choice (engine/backends.py): variants ranked by their own score, a probe child that dies is
excluded with its signal named, verdicts remembered per CPU, and the decision made from real child processes."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine import backends
from engine.backends import Variant, Verdicts, choose, cpu_variants, run_probe


def _variant_lib(tmp: Path, name: str, score: int) -> Path:
    """A shared library that answers ggml_backend_score like a ggml CPU variant does."""
    src = tmp / f"{name}.c"
    src.write_text(f"int ggml_backend_score(void) {{ return {score}; }}\n")
    out = tmp / f"libggml-cpu-{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


@pytest.mark.skipif(sys.platform != "linux" or not shutil.which("cc"), reason="builds two tiny shared libraries")
def test_variants_are_ranked_by_their_own_score_and_zero_means_absent(tmp_path):
    for name, score in (("haswell", 20), ("sapphirerapids", 90), ("armv9", 0), ("x64", 1)):
        _variant_lib(tmp_path, name, score)
    (tmp_path / "libggml-base.so").write_bytes(b"not a variant")
    found = cpu_variants(tmp_path)
    assert [(v.name, v.score) for v in found] == [("sapphirerapids", 90), ("haswell", 20), ("x64", 1)]


def _child(code: str):
    """A probe command running `code` in a real child process (instead of loading a model)."""
    return lambda variant, model: [sys.executable, "-c", code]


def _three(tmp_path: Path) -> list[Variant]:
    return [Variant("sapphirerapids", tmp_path / "a.so", 90), Variant("icelake", tmp_path / "b.so", 60),
            Variant("x64", tmp_path / "c.so", 1)]


def test_a_child_killed_by_sigill_is_excluded_and_named(tmp_path):
    crash = _child(f"import os, signal; os.kill(os.getpid(), signal.{signal.SIGILL.name})")
    passes = _child("pass")
    calls = []

    def probe(v: Variant) -> str | None:
        calls.append(v.name)
        return run_probe(v, tmp_path / "m.gguf", command=crash if v.name == "sapphirerapids" else passes)

    verdicts = Verdicts(tmp_path / "cpu-variants.json", "cpu-1")
    choice = choose(_three(tmp_path), probe, verdicts)
    assert choice.variant.name == "icelake"
    assert choice.excluded == [("sapphirerapids", "killed by SIGILL")]
    assert calls == ["sapphirerapids", "icelake"]
    assert "sapphirerapids: killed by SIGILL" in choice.describe()

    # the next start on this CPU reads the verdicts: no child at all
    again = choose(_three(tmp_path), lambda v: calls.append(v.name) or "unexpected", Verdicts(verdicts.path, "cpu-1"))
    assert again.variant.name == "icelake" and calls == ["sapphirerapids", "icelake"]
    # another CPU (a new signature) probes again
    other = choose(_three(tmp_path), lambda v: calls.append(v.name), Verdicts(verdicts.path, "cpu-2"))
    assert other.variant.name == "sapphirerapids" and calls[-1] == "sapphirerapids"


def test_a_child_that_fails_or_hangs_is_excluded_with_the_reason(tmp_path):
    v = _three(tmp_path)[0]
    failed = run_probe(v, tmp_path / "m.gguf", command=_child("import sys; print('no such op', file=sys.stderr); sys.exit(6)"))
    assert failed == "exit status 6 no such op"
    hung = run_probe(v, tmp_path / "m.gguf", timeout=1.0, command=_child("import time; time.sleep(30)"))
    assert hung == "no answer in 1 s"
    assert run_probe(v, tmp_path / "m.gguf", command=_child("pass")) is None


def test_when_every_probe_fails_the_baseline_variant_is_used(tmp_path):
    choice = choose(_three(tmp_path), lambda v: "killed by SIGILL", Verdicts(None, "cpu"))
    assert choice.variant.name == "x64"
    assert [n for n, _ in choice.excluded] == ["sapphirerapids", "icelake", "x64"]


def test_an_unreadable_verdict_file_means_probing_again(tmp_path):
    path = tmp_path / "cpu-variants.json"
    path.write_text("{not json")
    probed = []
    choice = choose(_three(tmp_path), lambda v: probed.append(v.name), Verdicts(path, "cpu"))
    assert choice.variant.name == "sapphirerapids" and probed == ["sapphirerapids"]
    assert Verdicts(path, "cpu").get("sapphirerapids") == "ok"  # and the file is whole again


def test_the_signature_is_stable_and_the_native_build_has_no_variants():
    assert backends.cpu_signature() == backends.cpu_signature()
    assert len(backends.cpu_signature()) == 16
    # the test environment's wheel is the native build (Makefile): llama.cpp loads its one CPU backend
    assert cpu_variants(backends.library_dir()) == []
