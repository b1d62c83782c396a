"""The desktop app offscreen (pytest-qt): the real server on the qasync loop, the real tiny GGUF."""
from __future__ import annotations

import asyncio
import re
import json
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from PySide6.QtGui import QGuiApplication  # noqa: E402

from app.gui.main import Desktop  # noqa: E402
from app.gui.single import InstanceGuard  # noqa: E402
from app.gui.window import PANELS  # noqa: E402
from engine.config import load  # noqa: E402
from tests.app.qtasync import next_signal  # noqa: E402


@pytest.fixture(scope="module")
def gui(qapp, loop, assets, tmp_path_factory):
    """A started Desktop serving the tiny model on a free port, and a runner for its loop."""
    tmp = tmp_path_factory.mktemp("gui")
    cfg_path = tmp / "llamadesk.toml"
    cfg_path.write_text("# hand-written\n")
    config = load(["--config", str(cfg_path), "--port", "0", "--model", str(assets["tiny"]),
                   "--models-dir", str(tmp / "models"), "--asr", str(assets["whisper"]), "--tts", str(assets["piper"])])
    desktop = Desktop(config)

    def run(coro, timeout: float = 60):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))

    run(desktop.start())
    desktop.run_loop = run
    desktop.cfg_path = cfg_path
    yield desktop
    if desktop.host.service is not None:
        run(desktop.quit())


def http_get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_window_has_every_panel(gui):
    w = gui.window
    assert list(w.panels) == list(PANELS)
    for name in PANELS:
        w.show_panel(name)
        assert w.stack.currentWidget() is w.panels[name]
    assert w.api_url().startswith("http://127.0.0.1:") and w.api_url().endswith("/v1")
    assert gui.bridge.state() == "serving"


def test_chat_reply_streams_into_the_panel_and_equals_the_servers_greedy_answer(gui):
    chat = gui.window.panels["Chat"]
    chat.new_chat()
    chat.temperature.setValue(0)
    chat.max_tokens.setValue(40)
    chat.system.setPlainText("")
    chat.input.setPlainText("hello there")
    deltas = []
    gui.bridge.chat_delta.connect(lambda cid, text: deltas.append(text))

    async def scenario():
        done = next_signal(gui.bridge.chat_done)
        chat.send()
        await done
        body = {"model": "", "messages": [{"role": "user", "content": "hello there"}], "temperature": 0,
                "max_tokens": 40}
        req = urllib.request.Request(gui.host.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(req, timeout=30).read()))
    answer = gui.run_loop(scenario())
    assert len(deltas) >= 1
    assert chat.reply_text() == answer["choices"][0]["message"]["content"]
    assert "tok/s" in chat.messages[-1]["meta"]


def test_stop_aborts_the_reply_in_the_engine(gui):
    chat = gui.window.panels["Chat"]
    chat.new_chat()
    chat.temperature.setValue(0)
    chat.max_tokens.setValue(3000)
    chat.input.setPlainText("Tell me a long story")  # greedy on the tiny model: ~1300 tokens before EOS

    async def scenario():
        first = next_signal(gui.bridge.chat_delta)
        done = next_signal(gui.bridge.chat_done)
        chat.send()
        await first
        engine_id = gui.bridge.engine_stream_id(chat.current)
        chat.stop()
        info = (await done)[1]
        streams = (await asyncio.to_thread(http_get, gui.host.url + "/v1/streams"))["streams"]
        return engine_id, info, streams
    engine_id, info, streams = gui.run_loop(scenario())
    assert info["finish_reason"] == "cancelled"
    mine = next(s for s in streams if s["id"] == engine_id)
    assert mine["state"] == "done" and mine["finish_reason"] == "cancelled" and mine["gen_tokens"] < 1000
    assert not any(s["state"] in ("queued", "prefill", "decode") for s in streams)
    assert chat.send_button.isEnabled() and not chat.stop_button.isEnabled()


def test_settings_save_a_toml_that_a_fresh_start_reads_back(gui):
    panel = gui.window.panels["Settings"]
    panel.refresh()
    _, widget, source = panel.fields["streams"]
    assert source.text() == "default"
    widget.setValue(3)
    _, chunk, _ = panel.fields["chunk"]
    chunk.setValue(256)
    assert panel.save()
    text = gui.cfg_path.read_text()
    assert "# hand-written" in text and "authoritative = true" in text
    fresh = load(["--config", str(gui.cfg_path)])
    assert (fresh.streams, fresh.sources["streams"]) == (3, "toml")
    assert (fresh.chunk, fresh.sources["chunk"]) == (256, "toml")
    assert [m.name for m in fresh.models] == ["tiny-random-llama"]


def test_settings_apply_reloads_in_process(gui):
    panel = gui.window.panels["Settings"]

    async def scenario():
        reloaded = next_signal(gui.bridge.reloaded)
        panel.save_and_apply()
        await reloaded
        return await asyncio.to_thread(http_get, gui.host.url + "/v1/models")
    models = gui.run_loop(scenario())
    assert models["data"][0]["streams"] == 3  # saved by the previous test, now live
    assert gui.host.config.sources["streams"] == "toml"
    panel.refresh()
    assert panel.fields["streams"][2].text() == "settings file"  # the Settings panel words the source "toml"


def test_settings_serve_on_the_local_network_makes_a_key_to_copy(gui):
    from PySide6.QtGui import QGuiApplication
    panel = gui.window.panels["Settings"]
    panel.refresh()
    assert not panel.network.isChecked() and not panel.copy_key.isVisibleTo(panel)
    panel.network.setChecked(True)
    values = panel.values()
    assert values["host"] == "0.0.0.0" and len(values["api_key"]) >= 24
    assert panel.copy_key.isVisibleTo(panel) and values["api_key"] in panel.key_line.text()
    panel.copy_key.click()
    assert QGuiApplication.clipboard().text() == values["api_key"]
    panel.network.setChecked(False)
    assert panel.values()["host"] == "127.0.0.1" and not panel.copy_key.isVisibleTo(panel)
    panel.refresh()  # back to the running configuration
    assert panel.values()["api_key"] is None


def test_tray_actions(gui):
    tray = gui.tray
    assert [a.text() for a in tray.menu.actions() if a.text()] == ["Open window", "Copy API URL", "Pause serving",
                                                                     "Quit"]
    QGuiApplication.clipboard().clear()
    tray.copy_action.trigger()
    assert QGuiApplication.clipboard().text() == gui.window.api_url()

    async def pause_resume():
        url = gui.host.url
        await gui.bridge.toggle_serving()
        paused = gui.host.url
        state = gui.bridge.state()
        await gui.bridge.toggle_serving()
        health = await asyncio.to_thread(http_get, gui.host.url + "/health")
        return url, paused, state, health
    url, paused, state, health = gui.run_loop(pause_resume())
    assert url and paused is None and state == "paused" and health["status"] == "ok"
    gui.bridge.on_tick()
    assert tray.state == "serving" and "serving" in tray.toolTip()
    assert tray.pause_action.text() == "Pause serving"


def test_closing_the_window_keeps_serving(gui, monkeypatch):
    monkeypatch.setattr("app.gui.window.tray_available", lambda: True)  # a desktop with a tray (offscreen has none)
    gui.window.show()
    gui.window.close()
    assert not gui.window.isVisible()
    r = gui.run_loop(asyncio.to_thread(http_get, gui.host.url + "/v1/models"))
    assert r["data"][0]["id"] == "tiny-random-llama"
    gui.tray.open_action.trigger()
    assert gui.window.isVisible()


def test_models_panel_loads_and_unloads_a_gguf(gui, assets):
    panel = gui.window.panels["Models"]

    progress = []
    gui.bridge.load_progress.connect(lambda name, f: progress.append((name, f)))

    async def scenario():
        changed = next_signal(gui.bridge.models_changed)
        await gui.bridge.load_model(str(assets["minilm"]))
        await changed
        await asyncio.sleep(0.05)  # progress arrives through the loop
        names = panel.card_names()
        changed = next_signal(gui.bridge.models_changed)
        await gui.bridge.unload_model("all-MiniLM-L6-v2-f16")
        await changed
        return names, panel.card_names()
    loaded, after = gui.run_loop(scenario())
    assert loaded == ["tiny-random-llama", "all-MiniLM-L6-v2-f16"]
    fractions = [f for name, f in progress if name == "all-MiniLM-L6-v2-f16"]
    assert fractions and fractions[-1] == 1.0 and fractions == sorted(fractions)  # the load showed its progress
    assert not gui.window.load_bar.isVisible()
    assert after == ["tiny-random-llama"]


def test_per_model_settings_reload_the_model(gui, assets):
    """A card's Settings… form: Apply loads the model again with the chosen shape and saves it."""
    panel = gui.window.panels["Models"]

    def card(name):
        return next(panel.cards.itemAt(i).widget() for i in range(panel.cards.count())
                    if getattr(panel.cards.itemAt(i).widget(), "name", None) == name)

    async def scenario():
        changed = next_signal(gui.bridge.models_changed)
        await gui.bridge.load_model(str(assets["minilm"]))
        await changed
        c = card("all-MiniLM-L6-v2-f16")
        c.settings_button.click()
        slot = gui.host.service.roster.loaded["all-MiniLM-L6-v2-f16"]
        assert c.settings.isVisibleTo(panel) and (c.streams.value(), c.ctx.value()) == (slot.settings.streams, slot.ctx)
        chosen = 2 if slot.settings.streams != 2 else 1
        c.streams.setValue(chosen)
        c.ctx.setValue(256)
        changed = next_signal(gui.bridge.models_changed)
        c.apply.click()
        await changed
        shown = (card("all-MiniLM-L6-v2-f16").values["streams"].text(), chosen,
                 gui.host.service.roster.loaded["all-MiniLM-L6-v2-f16"].settings.streams)
        changed = next_signal(gui.bridge.models_changed)
        await gui.bridge.unload_model("all-MiniLM-L6-v2-f16")
        await changed
        return shown
    shown = gui.run_loop(scenario())
    card_text, chosen, served = shown
    assert card_text == str(chosen) and served == chosen  # reloaded with the chosen shape, and the card says so
    saved = load(["--config", str(gui.cfg_path)])
    entry = next(m for m in saved.models if m.name == "all-MiniLM-L6-v2-f16")
    assert (entry.streams, entry.ctx) == (chosen, 256)
    assert "# hand-written" in gui.cfg_path.read_text()


def test_logs_panel_and_diagnostics(gui):
    logs = gui.window.panels["Logs"]
    import logging
    logging.getLogger("llamadesk.test").warning("a line for the logs panel")
    gui.run_loop(asyncio.sleep(0.1))
    assert "a line for the logs panel" in logs.view.toPlainText()
    logs.search.setText("no such text anywhere")
    assert logs.view.toPlainText() == ""
    logs.search.setText("")
    logs.copy_diagnostics()
    diag = QGuiApplication.clipboard().text()
    assert "llamadesk 0.1.0" in diag and "llama.cpp:" in diag and '"streams"' in diag


def test_speech_studio_speaks_transcribes_and_draws_spans(gui):
    import pyqtgraph as pg
    panel = gui.window.panels["Speech"]
    panel.refresh()
    assert panel.speak_button.isEnabled() and "joe" in [panel.voice.itemText(i) for i in range(panel.voice.count())]
    panel.text.setPlainText("The weather is nice today. Please open the window.")

    async def scenario():
        spoken = next_signal(gui.bridge.speech_ready)
        panel.speak()
        await spoken
        heard = next_signal(gui.bridge.transcript_ready)
        segments_seen.clear()
        panel.transcribe_last_speech()
        return (await heard)[1]
    segments_seen: list[int] = []
    gui.bridge.transcript_segment.connect(lambda rid, seg: segments_seen.append(panel.table.rowCount()))
    result = gui.run_loop(scenario())
    assert len(panel.last_speech["samples"]) / panel.last_speech["rate"] > 2.0
    assert "weather" in result["text"].lower() and "window" in result["text"].lower()
    assert panel.table.rowCount() == len(result["segments"]) >= 1
    assert segments_seen == list(range(1, len(result["segments"]) + 1))  # the table grew a row per decoded span
    regions = [i for i in panel.wave.getPlotItem().items if isinstance(i, pg.LinearRegionItem)]
    assert len(regions) == len(result["spans"]) >= 1
    gui.run_loop(asyncio.sleep(1.2))  # the dashboard updates once a second
    speech_line = gui.window.panels["Dashboard"].speech.text()
    assert "speech to text: <b>whisper-tiny.en</b>" in speech_line and "text to speech: <b>piper" in speech_line
    jobs = gui.host.service.stats()["asr"]["jobs"]
    assert jobs >= 1 and re.search(rf"{jobs} jobs, RTF 0\.\d+", speech_line), speech_line
    srt = panel.subtitles("srt")
    assert srt.startswith("1\n00:00:0") and "-->" in srt and panel.subtitles("vtt").startswith("WEBVTT")


def test_chat_mic_fills_the_input_and_speaker_reads_the_reply(gui):
    chat = gui.window.panels["Chat"]
    studio = gui.window.panels["Speech"]
    chat.new_chat()
    chat.messages.append({"role": "assistant", "content": "<think>hm</think>Please open the window.", "meta": ""})
    studio_before = studio.transcript

    async def scenario():
        spoken = next_signal(gui.bridge.speech_ready)
        assert chat.read_aloud()
        await spoken
        heard = next_signal(gui.bridge.transcript_ready)
        chat.transcribe_into_input(chat.last_speech["wav"])
        await heard
    gui.run_loop(scenario())
    assert "window" in chat.input.toPlainText().lower()
    assert studio.transcript is studio_before  # the studio ignored the chat's transcription


def test_catalog_panel_lists_filters_and_badges(gui):
    from engine.catalog.entries import load_catalog
    panel = gui.window.panels["Catalog"]
    gui.window.show_panel("Catalog")
    entries = load_catalog()
    assert panel.table.rowCount() == len(entries)
    panel.kind.setCurrentText("asr")
    assert panel.table.rowCount() == sum(e.kind == "asr" for e in entries)
    panel.kind.setCurrentText("all kinds")
    panel.filter.setText("qwen3")
    shown = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]
    assert shown and all("qwen3" in n for n in shown)
    from app.gui.panels.catalog import FIT
    assert {panel.table.item(r, FIT).text() for r in range(panel.table.rowCount())} <= {"fits", "tight", "too big"}
    assert "GiB RAM" in panel.box.text()
    panel.filter.setText("")


def test_catalog_panel_imports_a_gguf_that_is_then_served_on_demand(gui, assets, tmp_path):
    panel = gui.window.panels["Catalog"]
    gui.window.show_panel("Catalog")
    panel.refresh()
    assert "No other GGUFs" in panel.local.text()
    src = tmp_path / "my-own-model.gguf"
    src.write_bytes(assets["tiny"].read_bytes())

    async def scenario():
        changed = next_signal(gui.bridge.models_changed)
        gui.bridge.import_gguf(str(src))
        await changed
        await asyncio.sleep(0.05)
    gui.run_loop(scenario())
    assert "my-own-model" in panel.local.text()
    models = gui.window.panels["Models"]
    listed = {m["id"]: m["state"] for m in gui.bridge.models()}
    assert listed["my-own-model"] == "unloaded"
    assert any(getattr(models.cards.itemAt(i).widget(), "name", None) == "my-own-model"
               for i in range(models.cards.count()))  # a line with Load


def test_benchmark_panel_runs_and_keeps_history(gui):
    import pyqtgraph as pg
    panel = gui.window.panels["Benchmark"]
    panel.refresh()
    assert panel.model.currentText() == "tiny-random-llama"

    async def scenario():
        done = next_signal(gui.bridge.bench_done)
        panel.run()
        return (await done)[0]
    record = gui.run_loop(scenario(), timeout=120)
    assert record["state"] == "done" and panel.run_button.isEnabled()
    assert [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())][:2] == ["pp512", "tg128"]
    assert float(panel.table.item(0, 1).text()) > 0
    assert any(isinstance(i, pg.BarGraphItem) for i in panel.chart.getPlotItem().items)
    assert panel.history.count() == 1 and "tiny-random-llama" in panel.history.item(0).text()


def test_dashboard_shows_where_reused_prompt_tokens_came_from(gui):
    gui.run_loop(asyncio.sleep(1.2))  # the dashboard updates once a second
    text = gui.window.panels["Dashboard"].cache.text()
    stats = gui.host.service.stats()
    assert f"prompt cache: <b>{stats['prefix_cache_reused_tokens']}</b> tokens reused" in text, text
    assert f"from RAM {stats['ram_reused_tokens']}" in text and "conversations in RAM" in text


def test_the_dashboard_charts_of_rates_and_counts_start_at_zero(gui):
    gui.run_loop(asyncio.sleep(1.2))  # a tick of real stats (an idle server's are zeros)
    dash = gui.window.panels["Dashboard"]
    for chart in (dash.gen, dash.prefill, dash.streams_chart):
        low, high = chart.getViewBox().viewRange()[1]
        assert -0.1 < low <= 0 and high - low >= 1, (chart, low, high)  # from 0 (its label shown), not ±0.5
        assert "x0." not in chart.getPlotItem().getAxis("left").labelString()  # no SI rescale of "tok/s"
    assert dash.memory.getViewBox().viewRange()[1][0] > 0  # memory is ranged to its values


def test_the_dashboard_streams_table_shows_whole_model_names(gui, assets):
    long_name = "SmolLM2-135M-Instruct.Q4_1-but-longer"  # a real GGUF stem and then some
    gui.window.show_panel("Dashboard")
    t = gui.window.panels["Dashboard"].table

    def post(path: str, body: dict) -> bytes:
        req = urllib.request.Request(gui.host.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=60).read()

    async def a_stream_shown():
        await asyncio.to_thread(post, "/v1/models/load", {"path": str(assets["tiny"]), "name": long_name})
        answer = asyncio.ensure_future(asyncio.to_thread(
            post, "/v1/chat/completions", {"model": long_name, "messages": [{"role": "user", "content": "A story"}],
                                           "max_tokens": 600, "temperature": 0, "ignore_eos": True}))
        while not any(t.item(r, 1) and t.item(r, 1).text() == long_name for r in range(t.rowCount())):
            await asyncio.sleep(0.1)  # the dashboard updates once a second
        await answer
    gui.window.resize(900, 600)  # the narrowest window
    try:
        gui.run_loop(a_stream_shown())
        gui.run_loop(asyncio.sleep(0.1))
        model = next(t.item(r, 1) for r in range(t.rowCount()) if t.item(r, 1).text() == long_name)
        assert model.toolTip() == long_name
        assert t.columnWidth(1) >= t.fontMetrics().horizontalAdvance(long_name)  # not "SmolLM2-13…"
        assert gui.window.width() == 900  # the table scrolls sideways; the window keeps its size
    finally:
        gui.window.resize(1200, 800)
        gui.run_loop(asyncio.to_thread(post, "/v1/models/unload", {"model": long_name}))


def test_a_second_launch_activates_the_first(loop):
    first = InstanceGuard("llamadesk-test-guard")
    assert first.listen()
    hits = []
    first.activate_requested.connect(lambda: hits.append(1))
    second = InstanceGuard("llamadesk-test-guard")
    assert second.other_running()
    for _ in range(50):
        loop.pump(0.02)
        if hits:
            break
    assert hits
    assert not InstanceGuard("llamadesk-test-nobody").other_running()


def test_quit_drains_stops_and_frees(gui):
    async def scenario():
        await gui.quit()
        return gui.host.service, gui.host.server
    service, server = gui.run_loop(scenario())
    assert service is None and server is None


def test_no_gui_never_imports_qt():
    code = ("import sys, app.main, app.headless, app.host, server.app, engine.service; "
            "assert not [m for m in sys.modules if m.startswith(('PySide6', 'qasync', 'pyqtgraph'))]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
