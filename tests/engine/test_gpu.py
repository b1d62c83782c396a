"""--gpu auto / --gpu-layers: the layer sizes read from the GGUF, the decision how many layers go to the GPU, the
flag and roster key, where /v1/models says a model runs; and, with a GPU build, the model on the GPU answering
as on the CPU (installer/gpu_check.py)."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import gguf as gguf_package
import pytest

from engine import llama
from engine.config import ConfigError, load
from engine.models import gguf, gpu
from engine.models.loaded import LoadedModel, ModelSettings
from engine.models.manager import ModelManager

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _tensor_bytes(path: Path) -> dict[str, int]:
    """The gguf package's own sizes of each tensor (an independent reader)."""
    return {t.name: int(t.n_bytes) for t in gguf_package.GGUFReader(path).tensors}


def _load(tmp_path: Path, argv: list[str], toml: str = ""):
    path = tmp_path / "llamadesk.toml"
    path.write_text(toml)
    return load(["--config", str(path), *argv])


def _block_count(path: Path) -> int:
    meta = gguf.read_metadata(path)
    return int(meta[f"{meta['general.architecture']}.block_count"])


@pytest.mark.parametrize("name", ["smollm2", "tiny"])
def test_the_layers_are_the_blocks_and_the_head_of_the_tensor_table(assets, name):
    path = assets[name]
    sizes = _tensor_bytes(path)
    layers = gpu.model_layers(path)
    assert len(layers.blocks) == _block_count(path) and layers.count == _block_count(path) + 1
    for i, size in enumerate(layers.blocks):
        own = [n for n in sizes if n.startswith(f"blk.{i}.")]
        assert 0 <= size - sum(sizes[n] for n in own) < 32 * len(own)  # each tensor padded to the alignment
    tied = "output.weight" not in sizes  # SmolLM2: the head is a copy of the token embeddings
    head = sizes["output_norm.weight"] + sizes["token_embd.weight" if tied else "output.weight"]
    assert 0 <= layers.output - head < 64
    assert sum(layers.blocks) + layers.output <= path.stat().st_size


def test_the_fit_takes_the_head_then_blocks_from_the_last_each_with_its_kv(assets):
    layers = gpu.model_layers(assets["smollm2"])
    kv, reserve = 3 * MIB, 200 * MIB
    five = reserve + layers.output + sum(layers.blocks[-5:]) + 5 * kv  # the head and the last five blocks
    assert gpu.fit_layers(five, layers, kv, reserve) == 6
    assert gpu.fit_layers(five - 1, layers, kv, reserve) == 5
    assert gpu.fit_layers(five - 1, layers, 0, reserve + 5 * kv - 1) == 6  # the byte short was the KV's
    assert gpu.fit_layers(reserve + layers.output, layers, kv, reserve) == 1
    assert gpu.fit_layers(reserve + layers.output - 1, layers, kv, reserve) == 0
    assert gpu.fit_layers(reserve - 1, layers, kv, reserve) == 0
    assert gpu.fit_layers(1 << 40, layers, kv, reserve) == layers.count


def _device(free: int, name: str = "Vulkan0", description: str = "llvmpipe") -> llama.GpuDevice:
    return llama.GpuDevice(name, description, free, 2 * free)


def test_the_decision_splits_over_the_devices_and_a_count_overrides_it(assets):
    layers = gpu.model_layers(assets["smollm2"])
    need = layers.output + sum(layers.blocks)
    half = need // 2 + 1
    both = [_device(half), _device(half, "Vulkan1", "Vulkan1")]
    placed = gpu.decide(both, layers, 0, 0, None)
    assert placed.offloaded == placed.gpu_layers == placed.total == layers.count
    assert placed.devices == ("Vulkan0 (llvmpipe)", "Vulkan1")
    assert gpu.decide(both[:1], layers, 0, 0, None).offloaded < layers.count  # one of them is not enough
    everything = gpu.decide(both[:1], layers, 0, 0, gpu.ALL)
    assert everything.gpu_layers == layers.count and everything.why == "--gpu-layers all"  # not "-1"
    assert gpu.decide(both[:1], layers, 0, 0, 10_000).gpu_layers == layers.count
    assert gpu.decide(both[:1], layers, 0, 0, 7).gpu_layers == 7
    none = gpu.decide(both, layers, 0, 0, 0)
    assert none.gpu_layers == 0 and none.devices == ()
    cpu = gpu.decide([], layers, 0, 0, gpu.ALL)
    assert cpu.gpu_layers == 0 and cpu.devices == () and "no GPU device" in cpu.why


def test_auto_counts_the_kv_cache_of_ctx_times_streams(assets):
    path = assets["smollm2"]
    small = gguf.footprint(path, 512, 1, "f16", 512)
    device = [_device(gpu.MARGIN + small.compute + small.weights + small.kv)]  # room for it all at 512 x 1
    one = gpu.place(path, 512, 1, "f16", 512, "auto", "auto", device)
    assert one.offloaded == one.total == _block_count(path) + 1
    four = gpu.place(path, 2048, 4, "f16", 512, "auto", "auto", device)  # 16x the KV cache
    assert 0 < four.offloaded < one.offloaded
    q8 = gpu.place(path, 2048, 4, "q8_0", 512, "auto", "auto", device)  # a smaller KV element: more layers
    assert four.offloaded < q8.offloaded
    assert gpu.place(path, 2048, 4, "f16", 512, "auto", "all", device).gpu_layers == one.total
    assert gpu.place(path, 512, 1, "f16", 512, "auto", 3, device).gpu_layers == 3
    assert gpu.place(path, 512, 1, "f16", 512, "off", "all", device).gpu_layers == 0


@pytest.mark.parametrize("value, layers", [("auto", None), ("all", gpu.ALL), ("-1", gpu.ALL), ("0", 0),
                                           ("12", 12)])
def test_the_gpu_layers_flag(tmp_path, value, layers):
    cfg = _load(tmp_path, ["--gpu-layers", value])
    assert cfg.gpu_layers == value and cfg.sources["gpu_layers"] == "cli"
    assert gpu.requested(cfg.gpu_layers) == layers


@pytest.mark.parametrize("value", ["-2", "half", "1.5", "", " 3", "1_000"])
def test_a_bad_gpu_layers_flag_is_a_clear_error(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, ["--gpu-layers", value])
    assert "--gpu-layers" in str(e.value) and "auto, all, or a number of layers" in str(e.value)


def test_a_roster_entry_gpu_layers_overrides_the_global_one(tmp_path):
    toml = ('[[models]]\nname = "a"\npath = "/m/a.gguf"\ngpu_layers = 0\n\n'
            '[[models]]\nname = "b"\npath = "/m/b.gguf"\ngpu_layers = "all"\n\n'
            '[[models]]\nname = "c"\npath = "/m/c.gguf"\n')
    roster = ModelManager(_load(tmp_path, ["--gpu-layers", "9"], toml), run=None,
                          refuse_while_benching=lambda what: None)
    assert [roster.settings_for(m).gpu_layers for m in roster.config.models] == [0, "all", "9"]


@pytest.mark.parametrize("value", ["2.5", "true", "-3", '"some"', "[1]"])
def test_a_roster_entry_gpu_layers_is_checked(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, [], f'[[models]]\nname = "a"\npath = "/m/a.gguf"\ngpu_layers = {value}\n')
    assert "'gpu_layers' in [[models]] entry 1" in str(e.value)
    if value == "true":
        assert "entry 1: true;" in str(e.value)  # as the file spells it, not Python's True


def _settings(**kw) -> ModelSettings:
    return ModelSettings(streams=1, ctx=512, chunk=64, kv_dtype="f16", threads=1, default_max_tokens=8, **kw)


def test_a_model_says_where_it_runs(assets, caplog, monkeypatch):
    llama.init_backend(assets["smollm2"])
    if llama.gpu_devices():
        pytest.skip("this llama-cpp-python has a GPU: test_a_gpu_build_answers_as_the_cpu covers it")
    monkeypatch.setattr(gpu, "_said_no_gpu", False)
    caplog.set_level(logging.INFO, "llamadesk.engine")
    total = _block_count(assets["smollm2"]) + 1
    for _ in range(2):
        m = LoadedModel("s", assets["smollm2"], _settings(gpu_layers="all"))
        try:
            assert m.describe()["devices"] == ["local"]
            assert m.describe()["gpu_layers"] == {"offloaded": 0, "total": total}
        finally:
            m.free()
    said = [r.getMessage() for r in caplog.records if "no GPU device" in r.getMessage()]
    assert len(said) == 1 and "run on the CPU" in said[0]  # once per process, not per model


def test_a_gpu_build_answers_as_the_cpu(assets):
    llama.init_backend(assets["smollm2"])
    if not llama.gpu_devices():
        pytest.skip("no GPU device: this llama-cpp-python is a CPU build (installer/wheel.sh vulkan, cuda or metal "
                    "builds one that offloads)")
    r = subprocess.run([sys.executable, str(ROOT / "installer" / "gpu_check.py"), "--model", str(assets["smollm2"])],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr


def _compute_buffers(records: list[logging.LogRecord]) -> set[str]:
    """The devices llama.cpp made a context's compute buffers on ("CPU", "Vulkan0", …), from its log."""
    said = (r.getMessage().split(":", 1)[-1].split() for r in records if "compute buffer size" in r.getMessage())
    return {words[0] for words in said if words}


def test_a_model_with_no_layer_on_the_gpu_has_no_gpu_backend(assets, caplog):
    llama.init_backend(assets["smollm2"])
    if not llama.gpu_devices():
        pytest.skip("no GPU device: this llama-cpp-python is a CPU build")
    caplog.set_level(logging.INFO, "llamadesk.llama")
    buffers = {}
    for layers in (0, "all"):
        caplog.clear()
        m = LoadedModel("s", assets["smollm2"], _settings(gpu_layers=layers))
        m.free()
        buffers[layers] = _compute_buffers(caplog.records)
    gpu = {d.name for d in llama.gpu_devices()}
    assert buffers[0] and not buffers[0] & gpu  # else its prompts' big matmuls would still run there
    assert buffers["all"] & gpu
