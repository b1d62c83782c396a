"""The Catalog panel's Hugging Face search offscreen (pytest-qt): search, a repo's files with quant / size / fit,
Download, against the hub stand-in (tests/hubstandin.py) and the real server on the qasync loop."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`


from app.gui.main import Desktop  # noqa: E402
from engine.config import load  # noqa: E402
from tests.app.qtasync import next_signal  # noqa: E402
from tests.hubstandin import HubStandIn, Repo  # noqa: E402

PB = 2 ** 50


@pytest.fixture(scope="module")
def hub(assets):
    tiny = assets["tiny"].read_bytes()
    srv = HubStandIn({"standin/Tiny-GGUF": Repo(files={"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": tiny,
                                                       "tiny-F16.gguf": tiny, "mmproj-F16.gguf": b"tower" * 100},
                                                reported_size={"tiny-F16.gguf": PB}, downloads=12),
                      "standin/Gated-GGUF": Repo(files={"gated-Q4_K_M.gguf": tiny}, gated=True)})
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def desktop(qapp, loop, assets, hub, tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("HF_ENDPOINT", hub.url)
    env.delenv("HF_TOKEN", raising=False)
    env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    tmp = tmp_path_factory.mktemp("gui-hub")
    (tmp / "llamadesk.toml").write_text("")
    config = load(["--config", str(tmp / "llamadesk.toml"), "--port", "0", "--model", str(assets["tiny"]),
                   "--models-dir", str(tmp / "models"), "--cache-disk", "0"])
    d = Desktop(config)

    def run(coro, timeout: float = 60):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))

    run(d.start())
    d.run_loop = run
    d.models_dir = tmp / "models"
    d.window.show_panel("Catalog")
    yield d
    run(d.quit())
    env.undo()


def cells(table, row: int) -> list[str]:
    return [table.item(row, c).text() for c in range(table.columnCount())]


def test_search_list_files_and_download(desktop):
    panel, bridge = desktop.window.panels["Catalog"], desktop.bridge

    async def search():
        got = next_signal(bridge.hub_results)
        panel.hub_query.setText("tiny")
        panel.search_hub()
        return await got
    query, repos = desktop.run_loop(search())
    assert query == "tiny" and [r["id"] for r in repos] == ["standin/Tiny-GGUF"]
    assert cells(panel.hub_repos, 0) == ["standin/Tiny-GGUF", "12", "0"]

    async def pick_repo():
        got = next_signal(bridge.hub_files)
        panel.hub_repos.selectRow(0)
        return await got
    desktop.run_loop(pick_repo())
    rows = {cells(panel.hub_models, r)[0]: cells(panel.hub_models, r) for r in range(panel.hub_models.rowCount())}
    assert set(rows) == {"Q4_K_M", "Q8_0", "F16"}
    assert rows["F16"][3] == "too big" and rows["Q4_K_M"][3] == "fits" and rows["Q4_K_M"][4] == "default"
    assert cells(panel.hub_models, panel.hub_models.currentRow())[0] == "Q4_K_M"  # the default is selected
    assert panel.hub_vision.isEnabled() and "mmproj-F16.gguf" in panel.hub_status.text()

    async def download():
        got = next_signal(bridge.models_changed)
        panel.hub_vision.setChecked(True)
        panel.pull_selected()
        await got
    desktop.run_loop(download())
    assert (desktop.models_dir / "tiny-Q4_K_M.gguf").exists()
    assert (desktop.models_dir / "mmproj-Tiny-F16.gguf").exists()
    panel.refresh()
    assert "'tiny-Q4_K_M'" in panel.hub_status.text()
    assert "tiny-Q4_K_M" in {m["id"] for m in bridge.models()}


def test_a_gated_repo_says_what_to_do(desktop):
    panel, bridge = desktop.window.panels["Catalog"], desktop.bridge

    async def scenario():
        got = next_signal(bridge.hub_files)
        panel.hub_query.setText("gated")
        results = next_signal(bridge.hub_results)
        panel.search_hub()
        await results
        panel.hub_repos.selectRow(0)
        await got
        failed = next_signal(bridge.hub_failed)
        panel.pull_selected()
        return await failed
    (message,) = desktop.run_loop(scenario())
    assert "HF_TOKEN" in message and panel.hub_status.text() == message
    assert not panel.hub_vision.isEnabled()  # this repo has no vision tower
