"""llama.cpp's collection of real chat templates (`models/templates/*.jinja`), taken from the sdist of the
llama-cpp-python release this project builds (Makefile: LLAMA_CPP_VERSION)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
TEMPLATES_IN_SDIST = PurePosixPath("vendor/llama.cpp/models/templates")
DIRNAME = "llama.cpp-templates"


def sdist(downloads: Path) -> Path:
    """The sdist in downloads, fetched with pip the first time."""
    path = downloads / SDIST_FILE
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "-d", str(downloads), SDIST], check=True)
    return path


def extract(downloads: Path, dest: Path) -> None:
    """Every template of the sdist as dest/<name>.jinja."""
    if dest.exists():  # what a failed earlier run left
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist(downloads)) as tf:
        for member in tf.getmembers():
            path = PurePosixPath(member.name)
            if member.isfile() and path.suffix == ".jinja" and path.parent.parts[1:] == TEMPLATES_IN_SDIST.parts:
                with tf.extractfile(member) as src, open(dest / path.name, "wb") as out:
                    shutil.copyfileobj(src, out)
    if not any(dest.iterdir()):
        raise RuntimeError(f"{SDIST_FILE} holds no {TEMPLATES_IN_SDIST}/*.jinja")
