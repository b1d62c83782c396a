"""Add remote server… in the Models panel (pytest-qt, offscreen): a second real llamadesk (B, the tiny model behind
an API key) is listed, picked, named and added to the desktop's roster; the desktop's own server then relays a chat
for that name to B, and answers what B answers itself."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

import openai  # noqa: E402
import tomllib  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialog, QLineEdit  # noqa: E402

from app.gui.main import Desktop  # noqa: E402
from app.gui.panels.models import NAME, UPSTREAM  # noqa: E402
from engine.config import load  # noqa: E402
from tests.app.qtasync import run, until  # noqa: E402
from tests.conftest import LiveServer  # noqa: E402

KEY = "b-server-key-0123456789"
HI = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def upstream(assets, tmp_path_factory):
    """B: another llamadesk serving the tiny model, which asks for an API key."""
    srv = LiveServer(["--model", str(assets["tiny"]), "--api-key", KEY], "", tmp_path_factory.mktemp("remote-b"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def refused_port():
    """A loopback port bound but never listening: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def desktop(loop, assets, tmp_path_factory):
    """A: the desktop serving the tiny model itself (so the upstream's own name is taken here)."""
    tmp = tmp_path_factory.mktemp("remote-a")
    (tmp / "llamadesk.toml").write_text("")
    d = Desktop(load(["--config", str(tmp / "llamadesk.toml"), "--port", "0", "--model", str(assets["tiny"]),
                      "--models-dir", str(tmp / "models"), "--cache-disk", "0"]))
    run(loop, d.start())
    yield d
    run(loop, d.quit())


def click_and_wait(loop, button, pred, timeout: float = 30.0) -> None:
    """Click with the loop running (as every click in the app is), then wait until pred()."""
    async def go():
        button.click()
        await until(pred, timeout)
    run(loop, go(), timeout + 5)


def test_a_remote_server_is_listed_picked_added_and_answers_through_the_desktop(loop, desktop, upstream,
                                                                                 refused_port):
    w = desktop.window
    w.show_panel("Models")
    panel = w.panels["Models"]
    panel.remote_button.click()
    dlg = panel.remote_dialog
    assert dlg.isVisible() and not dlg.add_button.isEnabled()
    asked = []
    desktop.bridge.remote_failed.connect(lambda url, why: asked.append(why))

    # nothing listens there: the reason in plain words, in the dialog
    dlg.url.setText(f"http://127.0.0.1:{refused_port}")
    click_and_wait(loop, dlg.list_button, lambda: len(asked) == 1)
    assert dlg.status.text().startswith("Cannot reach 127.0.0.1: connection refused"), dlg.status.text()
    assert dlg.table.rowCount() == 0 and not dlg.add_button.isEnabled() and dlg.list_button.isEnabled()

    # B with a wrong key, then with its key (masked in the field)
    dlg.url.setText(upstream.url)  # a bare host:port: its /v1
    dlg.key.setText("not-the-key-000")
    click_and_wait(loop, dlg.list_button, lambda: len(asked) == 2)
    assert "refused the API key (401)" in dlg.status.text()
    dlg.key.setText(KEY)
    assert dlg.key.echoMode() == QLineEdit.EchoMode.Password and KEY not in dlg.key.displayText()
    click_and_wait(loop, dlg.list_button, lambda: dlg.table.rowCount() > 0)
    upstream_ids = [m.id for m in upstream.client().with_options(api_key=KEY).models.list().data]
    assert [dlg.table.item(r, UPSTREAM).text() for r in range(dlg.table.rowCount())] == upstream_ids
    assert dlg.table.item(0, NAME).text() == upstream_ids[0] == "tiny-random-llama"  # the upstream id by default
    assert dlg.table.item(0, UPSTREAM).checkState() == Qt.CheckState.Checked and dlg.add_button.isEnabled()

    # the upstream's name is the desktop's own model's: refused, nothing written
    cfg = desktop.host.config.path
    before = cfg.read_bytes()
    click_and_wait(loop, dlg.add_button, lambda: len(asked) == 3)
    assert "already exists" in dlg.status.text() and dlg.isVisible() and cfg.read_bytes() == before

    dlg.table.item(0, NAME).setText("b-tiny")
    # a stream to the desktop's own model is running while the remote is added: it goes on to its end
    local = openai.OpenAI(base_url=desktop.host.url + "/v1", api_key="-", max_retries=0, timeout=120)
    finish, usage, first = [], [], threading.Event()

    def stream_locally() -> None:
        for chunk in local.chat.completions.create(model="tiny-random-llama", messages=HI, stream=True,
                                                   max_tokens=400, temperature=0, extra_body={"ignore_eos": True},
                                                   stream_options={"include_usage": True}):
            finish.extend(c.finish_reason for c in chunk.choices if c.finish_reason)
            usage.extend([chunk.usage] if chunk.usage else [])
            first.set()
    running = loop.run_in_executor(None, stream_locally)
    run(loop, until(first.is_set))
    click_and_wait(loop, dlg.add_button, lambda: not dlg.isVisible())
    run(loop, running, 120)
    local.close()
    assert finish == ["length"] and usage[0].completion_tokens == 400  # not cut by the add
    assert dlg.result() == QDialog.DialogCode.Accepted
    saved = [m for m in tomllib.loads(cfg.read_text())["models"] if m["name"] == "b-tiny"]
    assert saved == [{"name": "b-tiny", "backend": "remote", "url": upstream.url + "/v1",
                      "remote_model": "tiny-random-llama", "api_key": KEY}]

    # in the roster with its health, once the server has checked it
    def card():
        return next((c for c in panel.remote_cards() if c.name == "b-tiny"), None)
    run(loop, until(lambda: card() is not None and card().health.text().startswith("healthy")))
    assert "tiny-random-llama" in card().where.full_text() and upstream.url in card().where.full_text()

    # a chat through the desktop's own server to that name is B's own answer
    a = openai.OpenAI(base_url=desktop.host.url + "/v1", api_key="-", max_retries=0, timeout=60)
    b = openai.OpenAI(base_url=upstream.url + "/v1", api_key=KEY, max_retries=0, timeout=60)

    async def both():  # the desktop's server runs on the loop: its clients wait in threads
        return await asyncio.gather(
            asyncio.to_thread(a.chat.completions.create, model="b-tiny", messages=HI, **GREEDY),
            asyncio.to_thread(b.chat.completions.create, model="tiny-random-llama", messages=HI, **GREEDY),
            asyncio.to_thread(a.models.list))
    try:
        via_a, direct, listed = run(loop, both())
    finally:
        a.close()
        b.close()
    assert via_a.choices[0].message.content == direct.choices[0].message.content != ""
    assert {m.id: m.owned_by for m in listed.data}["b-tiny"] == "remote"


def test_removing_the_remote_entry_drops_it_from_the_listing_and_the_saved_roster(loop, desktop, upstream):
    """(After the test above added b-tiny.) Remove… on its card, confirmed: no longer listed or relayed here, not
    in the saved roster; B itself is untouched."""
    panel = desktop.window.panels["Models"]
    card = next(c for c in panel.remote_cards() if c.name == "b-tiny")

    async def remove() -> str:
        card.remove_button.click()
        box = panel.remove_dialog
        said = box.informativeText().replace("\u200b", "")
        box.button(box.StandardButton.Yes).click()
        await until(lambda: all(c.name != "b-tiny" for c in panel.remote_cards()))
        return said
    said = run(loop, remove())
    assert upstream.url in said and "tiny-random-llama" in said and "Nothing changes" in said
    assert all(m["name"] != "b-tiny" for m in tomllib.loads(desktop.host.config.path.read_text())["models"])
    a = openai.OpenAI(base_url=desktop.host.url + "/v1", api_key="-", max_retries=0, timeout=60)
    try:
        listed = run(loop, asyncio.to_thread(a.models.list))
        with pytest.raises(openai.NotFoundError):
            run(loop, asyncio.to_thread(a.chat.completions.create, model="b-tiny", messages=HI, **GREEDY))
    finally:
        a.close()
    assert "b-tiny" not in {m.id for m in listed.data}
    assert "tiny-random-llama" in {m.id for m in upstream.client().with_options(api_key=KEY).models.list().data}
