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
from engine.backends import (OK, OK_FLOAT, Outcome, Variant, Verdicts, choose, cpu_variants, is_quantized,
                             run_probe)


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

    def probe(v: Variant) -> Outcome:
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
    other = choose(_three(tmp_path), lambda v: calls.append(v.name) or Outcome(), Verdicts(verdicts.path, "cpu-2"))
    assert other.variant.name == "sapphirerapids" and calls[-1] == "sapphirerapids"


def test_a_child_that_fails_because_of_its_variant_is_conclusive_and_one_that_cannot_tell_is_not(tmp_path):
    v = _three(tmp_path)[0]
    failed = run_probe(v, tmp_path / "m.gguf",
                       command=_child("import sys; print('no such op', file=sys.stderr); sys.exit(6)"))
    assert failed == Outcome("exit status 6 no such op")
    no_model = run_probe(v, tmp_path / "m.gguf",
                         command=_child("import sys; print('cannot load m.gguf', file=sys.stderr); sys.exit(4)"))
    assert no_model == Outcome("exit status 4 cannot load m.gguf", conclusive=False)
    hung = run_probe(v, tmp_path / "m.gguf", timeout=1.0, command=_child("import time; time.sleep(30)"))
    assert hung == Outcome("no answer in 1 s", conclusive=False)
    assert run_probe(v, tmp_path / "m.gguf", command=_child("pass")) == Outcome()


def test_a_probe_that_cannot_tell_leaves_its_variant_in_use_and_nothing_remembered(tmp_path):
    """A model the child cannot load (a truncated GGUF) or a slow start says nothing about the CPU: before, every
    variant was remembered as failed and later starts ran the baseline, 50 times slower."""
    verdicts = Verdicts(tmp_path / "cpu-variants.json", "cpu")
    choice = choose(_three(tmp_path), lambda v: run_probe(v, tmp_path / "m.gguf", command=_child(
        "import sys; sys.exit(4)")), verdicts)
    assert choice.variant.name == "sapphirerapids" and choice.excluded == []
    assert choice.describe() == "CPU variant sapphirerapids (unprobed: exit status 4)"
    assert not verdicts.path.exists() and Verdicts(verdicts.path, "cpu").get("sapphirerapids") is None
    # the next start, with a model that loads, probes for real
    again = choose(_three(tmp_path), lambda v: Outcome(), Verdicts(verdicts.path, "cpu"))
    assert again.note is None and Verdicts(verdicts.path, "cpu").get("sapphirerapids") == OK


def test_a_pass_with_a_float_model_is_probed_again_for_a_quantized_one(tmp_path):
    """The AMX kernel that faults is a quantized matmul: an F16 model's probe never runs it."""
    path = tmp_path / "cpu-variants.json"
    probed = []

    def probe(v: Variant) -> Outcome:
        probed.append(v.name)
        return Outcome("killed by SIGILL") if v.name == "sapphirerapids" and len(probed) > 1 else Outcome()
    choose(_three(tmp_path), probe, Verdicts(path, "cpu"), quantized=False)
    assert Verdicts(path, "cpu").get("sapphirerapids") == OK_FLOAT
    choose(_three(tmp_path), probe, Verdicts(path, "cpu"), quantized=False)  # trusted for another float model
    assert probed == ["sapphirerapids"]
    crash = choose(_three(tmp_path), probe, Verdicts(path, "cpu"), quantized=True)
    assert probed == ["sapphirerapids", "sapphirerapids", "icelake"]
    assert crash.variant.name == "icelake" and crash.excluded == [("sapphirerapids", "killed by SIGILL")]
    assert Verdicts(path, "cpu").get("sapphirerapids") == "killed by SIGILL"


def test_quantized_is_read_from_the_gguf(assets, tmp_path):
    assert is_quantized(assets["smollm2"])  # Q4_1
    assert not is_quantized(assets["minilm"])  # F16
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03")
    assert not is_quantized(tmp_path / "junk.gguf") and not is_quantized(tmp_path / "missing.gguf")


def test_when_every_probe_fails_the_baseline_variant_is_used(tmp_path):
    choice = choose(_three(tmp_path), lambda v: Outcome("killed by SIGILL"), Verdicts(None, "cpu"))
    assert choice.variant.name == "x64"
    assert [n for n, _ in choice.excluded] == ["sapphirerapids", "icelake"]  # not the one in use
    assert choice.describe().startswith("CPU variant x64 (the last resort: killed by SIGILL; excluded: ")


def test_without_a_model_the_best_variant_not_remembered_as_failing_is_used_unprobed(tmp_path):
    verdicts = Verdicts(tmp_path / "cpu-variants.json", "cpu")
    verdicts.put("sapphirerapids", "killed by SIGILL")
    choice = choose(_three(tmp_path), None, Verdicts(verdicts.path, "cpu"))
    assert choice.variant.name == "icelake" and choice.excluded == [("sapphirerapids", "killed by SIGILL")]
    assert Verdicts(verdicts.path, "cpu").get("icelake") is None  # nothing was learnt about it


def test_an_unreadable_verdict_file_means_probing_again(tmp_path):
    path = tmp_path / "cpu-variants.json"
    path.write_text("{not json")
    probed = []
    choice = choose(_three(tmp_path), lambda v: probed.append(v.name) or Outcome(), Verdicts(path, "cpu"))
    assert choice.variant.name == "sapphirerapids" and probed == ["sapphirerapids"]
    assert Verdicts(path, "cpu").get("sapphirerapids") == OK  # and the file is whole again


@pytest.mark.parametrize("text", ['{"cpu": "zen4"}', '["cpu"]', '{"cpu": {"zen4": 1, "icelake": "ok"}}', '7'])
def test_a_verdict_file_of_another_shape_is_read_as_far_as_it_makes_sense(tmp_path, text):
    """Well-formed JSON of another shape: it stopped every start with a TypeError."""
    path = tmp_path / "cpu-variants.json"
    path.write_text(text)
    verdicts = Verdicts(path, "cpu")
    assert verdicts.get("zen4") is None
    verdicts.put("zen4", OK)
    assert Verdicts(path, "cpu").get("zen4") == OK


VARIANT_BUILD = bool(list(backends.library_dir().glob("*ggml-cpu-*")))


def test_the_signature_is_stable():
    assert backends.cpu_signature() == backends.cpu_signature()
    assert len(backends.cpu_signature()) == 16


@pytest.mark.skipif(VARIANT_BUILD, reason="the wheel carries CPU variants (a bundle's)")
def test_the_native_build_has_no_variants_and_loads_as_before(tmp_path):
    # the test environment's wheel is the native build (Makefile): llama.cpp loads its one CPU backend
    assert cpu_variants(backends.library_dir()) == []
    assert backends.load(None, tmp_path).variant is None and not (tmp_path / "cpu-variants.json").exists()


_SERVE_WITH_THE_CHOICE = """
import sys, llama_cpp as L
from pathlib import Path
from engine import backends, system
choice = backends.load(Path(sys.argv[1]), Path(sys.argv[2]))
L.llama_backend_init()
model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
print(choice.variant.name if model else "no model")
print(system.hardware_line())
"""


@pytest.mark.skipif(not VARIANT_BUILD, reason="needs the variant wheel (installer/wheel.sh cpu)")
def test_a_variant_wheel_probes_its_best_variant_and_then_serves_with_it(assets, tmp_path):
    """With the real variant wheel: the best variant here passes a real probe child with a quantized model, the
    process that loads it (through the libggml copy libllama links) loads the model, and the hardware line names it."""
    best = cpu_variants(backends.library_dir())[0]
    model = assets["smollm2"]  # SmolLM2 Q4_1: quantized, as the AMX kernel that faults wants
    r = subprocess.run([sys.executable, "-c", _SERVE_WITH_THE_CHOICE, str(model), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    name, hardware = r.stdout.splitlines()[-2:]
    assert name == best.name
    assert f"; CPU variant {best.name}; " in hardware and hardware.rsplit("; ", 1)[1].startswith("llama.cpp: ")
    verdicts = Verdicts(tmp_path / "cpu-variants.json", backends.cpu_signature())
    assert verdicts.get(best.name) == "ok"
