"""Where each model runs, in the desktop (pytest-qt, offscreen): SmolLM2 served here and SmolLM2 served with `--rpc`
on a real rpc-server (llama.cpp's, `make rpc-server`); the Models panel's cards and the benchmark name the device."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from app.gui.main import Desktop  # noqa: E402
from app.gui.panels.models import ModelCard, runs_on  # noqa: E402
from engine.config import load  # noqa: E402
from engine.models import gguf  # noqa: E402
from tests.app.qtasync import run, until  # noqa: E402
from tests.server import test_rpc  # noqa: E402

rpc_binary = test_rpc.rpc_binary  # the fixture: llama.cpp's rpc-server, built once into the cache


@pytest.fixture(scope="module")
def rpc_port(rpc_binary):
    """An rpc-server on 127.0.0.1, for the module."""
    port = test_rpc._free_port()
    proc = test_rpc.start_rpc_server(rpc_binary, port)
    yield port
    proc.kill()
    proc.wait(10)
    proc.stderr.close()


@pytest.fixture(scope="module")
def desktop(loop, assets, rpc_port, tmp_path_factory):
    """The desktop with --rpc: smollm2-rpc takes it (all its layers on the rpc-server), smollm2-here opts out."""
    tmp = tmp_path_factory.mktemp("devices")
    entry = f'path = "{assets["smollm2"]}"\nctx = 1024\nstreams = 1\n'
    (tmp / "llamadesk.toml").write_text(f'[[models]]\nname = "smollm2-here"\n{entry}default = true\nrpc = ""\n\n'
                                        f'[[models]]\nname = "smollm2-rpc"\n{entry}')
    d = Desktop(load(["--config", str(tmp / "llamadesk.toml"), "--port", "0", "--rpc", f"127.0.0.1:{rpc_port}",
                      "--threads", "1", "--models-dir", str(tmp / "models"), "--cache-disk", "0"]))
    run(loop, d.start(), 120)
    yield d
    run(loop, d.quit())


def get(loop, desktop, path: str) -> dict:
    """GET the desktop's own server (it runs on the loop: the client waits in a thread)."""
    def fetch() -> dict:
        with urllib.request.urlopen(desktop.host.url + path, timeout=30) as r:
            return json.loads(r.read())
    return run(loop, asyncio.to_thread(fetch))


def cards(panel) -> dict[str, ModelCard]:
    return {c.name: c for c in (panel.cards.itemAt(i).widget() for i in range(panel.cards.count()))
            if isinstance(c, ModelCard)}


def layers(assets) -> int:
    """SmolLM2's layers as llama.cpp counts them: its blocks and the output head."""
    return int(gguf.read_metadata(assets["smollm2"])["llama.block_count"]) + 1


def test_the_models_panel_says_where_each_model_runs(loop, desktop, rpc_port, assets):
    w = desktop.window
    w.resize(1440, 900)
    w.show_panel("Models")
    panel = w.panels["Models"]
    panel.refresh()
    run(loop, until(lambda: set(cards(panel)) == {"smollm2-here", "smollm2-rpc"} and
                    all(c.isVisible() for c in cards(panel).values())))
    here, rpc = cards(panel)["smollm2-here"].runs_on, cards(panel)["smollm2-rpc"].runs_on
    listed = {m["id"]: m for m in get(loop, desktop, "/v1/models")["data"]}
    assert listed["smollm2-rpc"]["devices"] == [f"RPC 127.0.0.1:{rpc_port}", "CPU"]
    assert rpc.full_text() == f"RPC 127.0.0.1:{rpc_port} · all {layers(assets)} layers"
    assert rpc.toolTip() == rpc.full_text() and not rpc.is_elided()
    assert listed["smollm2-here"]["devices"] == ["local"]
    stats = get(loop, desktop, "/v1/stats")["hardware"]
    variant = stats.split("; CPU variant ", 1)[1].split(";")[0].split()[0] if "; CPU variant " in stats else None
    assert here.full_text() == (f"CPU ({variant})" if variant else "CPU")  # the variant in use, where there is one

    w.resize(900, 600)  # the row elides rather than widen the window
    run(loop, until(lambda: w.width() == 900 and rpc.width() < 900))
    assert rpc.fontMetrics().horizontalAdvance(rpc.text()) <= rpc.contentsRect().width()


def test_the_benchmark_names_the_device_it_ran_on(loop, desktop, rpc_port):
    w = desktop.window
    w.resize(1440, 900)
    w.show_panel("Benchmark")
    panel = w.panels["Benchmark"]
    panel.refresh()
    panel.model.setCurrentText("smollm2-rpc")
    assert panel.model.currentText() == "smollm2-rpc"
    records = []
    desktop.bridge.bench_done.connect(records.append)

    async def click_and_wait():  # with the loop running, as every click in the app is
        panel.run_button.click()
        await until(lambda: records, 300)
    try:
        run(loop, click_and_wait(), 310)
    finally:
        desktop.bridge.bench_done.disconnect(records.append)
    record = records[0]
    assert record["state"] == "done", record
    bench = get(loop, desktop, "/bench")
    model = next(m for m in get(loop, desktop, "/v1/models")["data"] if m["id"] == "smollm2-rpc")
    assert bench["history"][-1]["devices"] == model["devices"] == [f"RPC 127.0.0.1:{rpc_port}", "CPU"]
    assert bench["history"][-1]["gpu_layers"] == model["gpu_layers"]
    where = f"RPC 127.0.0.1:{rpc_port} · all {model['gpu_layers']['total']} layers"
    assert f"threads, {where}): pp512" in panel.history.item(0).text()
    assert panel.status.full_text().startswith("done in ") and f" on {where} · " in panel.status.full_text()
    assert bench["history"][-1]["hardware"] in panel.history.item(0).toolTip()


@pytest.mark.parametrize("model, variant, shown", [
    ({"devices": ["local"], "gpu_layers": {"offloaded": 0, "total": 31}}, "zen4", "CPU (zen4)"),
    ({"devices": ["Vulkan0 (llvmpipe)", "CPU"], "gpu_layers": {"offloaded": 31, "total": 31}}, "zen4",
     "Vulkan0 (llvmpipe) · all 31 layers"),
    ({"devices": ["Vulkan0 (llvmpipe)", "CPU"], "gpu_layers": {"offloaded": 20, "total": 31}}, None,
     "Vulkan0 (llvmpipe) · 20/31 layers · the rest on CPU"),
])
def test_gpu_devices_and_the_layers_they_hold_are_named(model, variant, shown):
    assert runs_on(model, variant) == shown
