"""installer/wheel.sh --carry-modules: a pip-built llama-cpp-python wheel has ggml's loadable modules in a root bin/
(and a second copy of the libraries in lib/); after it, they sit beside libggml, and the wheel installs and verifies."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = "llama_cpp_python-0.3.36"


def _pip_built_wheel(tmp: Path) -> Path:
    """A wheel laid out as scikit-build-core lays out llama-cpp-python's (small stand-in files)."""
    root = tmp / "src" / DIST
    files = {"llama_cpp/__init__.py": "", "llama_cpp/lib/libggml.so": "ggml", "llama_cpp/lib/libllama.so": "llama",
             "bin/libggml-cpu-haswell.so": "haswell", "bin/libggml-cpu-x64.so": "x64", "bin/libggml-rpc.so": "rpc",
             "lib/libllama.so": "llama", f"{DIST}.dist-info/METADATA":
             "Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n",
             f"{DIST}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-linux_x86_64\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    out = tmp / "wheels"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(out), str(root)], check=True, capture_output=True)
    return next(out.glob("*.whl"))


def _carry(wheel: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "installer/wheel.sh"), "--carry-modules", str(wheel)], capture_output=True,
                          text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_modules_move_beside_libggml_and_the_stray_folders_go(tmp_path):
    wheel = _pip_built_wheel(tmp_path)
    r = _carry(wheel)
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read(f"{DIST}.dist-info/RECORD").decode()
        assert z.read("llama_cpp/lib/libggml-cpu-haswell.so") == b"haswell"
    assert {"llama_cpp/lib/libggml-cpu-haswell.so", "llama_cpp/lib/libggml-cpu-x64.so",
            "llama_cpp/lib/libggml-rpc.so", "llama_cpp/lib/libggml.so", "llama_cpp/lib/libllama.so"} <= names
    assert not [n for n in names if n.startswith(("bin/", "lib/"))]
    assert "llama_cpp/lib/libggml-cpu-x64.so," in record and "bin/" not in record
    # the repacked wheel installs, the modules beside libggml and nothing at site-packages' root
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                          str(target), str(wheel)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert (target / "llama_cpp/lib/libggml-cpu-x64.so").read_text() == "x64"
    assert not (target / "bin").exists()

    # a second run finds nothing to move and leaves the wheel as it is
    before = wheel.read_bytes()
    assert _carry(wheel).returncode == 0 and wheel.read_bytes() == before
