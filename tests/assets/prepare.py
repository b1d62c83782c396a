"""Prepare the real models the test suite runs on, from PyPI wheels only, into a cache dir.

Idempotent: each asset is written atomically and skipped when already present, so a second
run costs nothing. Usage: python -m tests.assets.prepare [--dest DIR]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from app import pypi_models  # the models the starter set (app/starter.py) is made of too
from tests.assets import tiny_gguf
from tests.assets import reranker_gguf  # SmolLM2 as a Qwen3-style reranker
from tests.assets import templates_sdist  # llama.cpp's real chat templates
from tests.assets import mmproj_gguf  # a vision projector for SmolLM2

# Which wheel holds each model, and how it is made: app/pypi_models.py (see README "Test models").
VAD = pypi_models.WheelModel("silero-vad==6.2.3", "silero_vad.onnx",
                             pypi_models.copied("silero_vad/data/silero_vad.onnx"))

SMOLLM2 = pypi_models.SMOLLM2.name
MINILM = pypi_models.MINILM.name
TINY = "tiny-random-llama.gguf"
RERANKER = f"SmolLM2-135M-Instruct-reranker-v{reranker_gguf.VERSION}.gguf"  # a new version when the recipe changes


def default_dest() -> Path:
    """Where the assets are cached unless LLAMADESK_TEST_ASSETS says otherwise."""
    env = os.environ.get("LLAMADESK_TEST_ASSETS")
    return Path(env) if env else Path.home() / ".cache" / "llamadesk" / "test-assets"


def prepare(dest: Path) -> dict[str, Path]:
    """Make sure every test model exists under dest; return their paths by short name."""
    wheels = dest / "_wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = {"smollm2": pypi_models.SMOLLM2.prepare(dest, wheels),
             "minilm": pypi_models.MINILM.prepare(dest, wheels), "tiny": dest / TINY}
    pypi_models.atomic(paths["tiny"], lambda tmp: tiny_gguf.write(tmp))
    paths["reranker"] = dest / RERANKER
    pypi_models.atomic(paths["reranker"], lambda tmp: reranker_gguf.convert(paths["smollm2"], tmp))
    paths["vad"] = VAD.prepare(dest, wheels)
    paths["piper"] = pypi_models.PIPER.prepare(dest, wheels)
    paths["whisper"] = pypi_models.WHISPER.prepare(dest, wheels)
    paths["templates"] = dest / templates_sdist.DIRNAME
    pypi_models.atomic(paths["templates"], lambda tmp: templates_sdist.extract(wheels, tmp))
    paths["mmproj"] = dest / f"mmproj-tiny-mlp-v{mmproj_gguf.VERSION}.gguf"
    pypi_models.atomic(paths["mmproj"], lambda tmp: mmproj_gguf.write(tmp))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dest", type=Path, default=default_dest())
    prepare(ap.parse_args().dest)


if __name__ == "__main__":
    main()
