"""installer/wheel.sh vulkan and VULKAN_HEADERS: the vendored ggml-vulkan.cpp needs Vulkan-Headers with
VK_EXT_layer_settings; headers named by VULKAN_HEADERS reach CMake as an absolute Vulkan_INCLUDE_DIR, and headers
without the extension (Debian 12's 1.3.239) or a folder without them stop the script before any build."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a bash script")


def _headers(root: Path, version: int, layer_settings: bool) -> Path:
    """An include folder whose vulkan_core.h declares VK_HEADER_VERSION version, with or without the extension."""
    core = root / "include" / "vulkan" / "vulkan_core.h"
    core.parent.mkdir(parents=True)
    text = f"#define VK_HEADER_VERSION {version}\n"
    if layer_settings:
        text += "#define VK_EXT_layer_settings 1\n"
    core.write_text(text)
    return root / "include"


def _args(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("VULKAN_HEADERS", "VULKAN_SDK")}
    return subprocess.run([str(REPO / "installer/wheel.sh"), "--args", "vulkan"], capture_output=True, text=True,
                          cwd=cwd, env={**base, **env}, timeout=60)


def test_headers_with_layer_settings_become_an_absolute_include_dir(tmp_path):
    include = _headers(tmp_path, 309, layer_settings=True)
    r = _args(tmp_path, VULKAN_HEADERS="include")  # named from where the caller stands
    assert r.returncode == 0, r.stderr
    args = r.stdout.split()
    assert "-DGGML_VULKAN=ON" in args and f"-DVulkan_INCLUDE_DIR={include}" in args


def test_headers_without_layer_settings_stop_the_script(tmp_path):
    include = _headers(tmp_path, 239, layer_settings=False)
    r = _args(tmp_path, VULKAN_HEADERS=str(include))
    assert r.returncode == 3 and r.stdout == ""
    assert "VK_HEADER_VERSION 239" in r.stderr and "VK_EXT_layer_settings" in r.stderr


def test_the_sdk_headers_are_checked_when_no_folder_is_named(tmp_path):
    _headers(tmp_path, 239, layer_settings=False)
    r = _args(tmp_path, VULKAN_SDK=str(tmp_path))
    assert r.returncode == 3 and str(tmp_path / "include" / "vulkan" / "vulkan_core.h") in r.stderr


def test_a_folder_without_headers_is_named(tmp_path):
    r = _args(tmp_path, VULKAN_HEADERS=str(tmp_path / "nowhere"))
    assert r.returncode == 3 and "nowhere" in r.stderr and "vulkan/vulkan_core.h" in r.stderr


def test_the_cpu_variant_takes_no_vulkan_folder(tmp_path):
    r = subprocess.run([str(REPO / "installer/wheel.sh"), "--args", "cpu"], capture_output=True, text=True,
                       env={**os.environ, "VULKAN_HEADERS": str(tmp_path)}, timeout=60)
    assert r.returncode == 0 and "Vulkan" not in r.stdout and "-DGGML_CPU_ALL_VARIANTS=ON" in r.stdout
