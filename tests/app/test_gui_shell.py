"""The desktop shell offscreen (pytest-qt): the window appearing before the models load, quitting without a
tray, the headless fallback when Qt's platform plugin cannot load, the status bar, the menus, the benchmark's
progress and cancel, long labels at 900x600, and the theme."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

import openai  # noqa: E402
from PySide6.QtGui import QKeySequence, QPalette  # noqa: E402
from PySide6.QtWidgets import QApplication, QFrame, QMessageBox  # noqa: E402

from app.gui import theme  # noqa: E402
from app.gui import window as window_module  # noqa: E402
from app.gui.main import Desktop  # noqa: E402
from app.qtprobe import debian_package  # noqa: E402
from engine import llama  # noqa: E402
from engine.config import load  # noqa: E402
from engine.system import VERSION  # noqa: E402
from tests.app.qtasync import next_signal, run, until  # noqa: E402

Role = QPalette.ColorRole


def make_desktop(folder: Path, assets, *flags: str) -> Desktop:
    """A Desktop (not started) serving the tiny model on a free port, its config file in folder."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "llamadesk.toml"
    if not cfg.exists():
        cfg.write_text("")
    return Desktop(load(["--config", str(cfg), "--port", "0", "--model", str(assets["tiny"]), "--models-dir",
                         str(folder / "models"), "--cache-disk", "0", *flags]))


@pytest.fixture(scope="module")
def gui(loop, assets, tmp_path_factory):
    """A started Desktop shared by the tests that leave it serving."""
    desktop = make_desktop(tmp_path_factory.mktemp("shell"), assets)
    run(loop, desktop.start())
    yield desktop
    if desktop.host.service is not None:
        run(loop, desktop.quit())


def http(url: str, method: str = "GET", body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def is_refused(url: str) -> bool:
    """Whether nothing listens at url any more."""
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.URLError as e:
        return not isinstance(e, urllib.error.HTTPError)
    return False


def lightest_pixel(icon) -> int:
    """The lightness of the lightest opaque pixel of an icon drawn at 24 px."""
    img = icon.pixmap(24, 24).toImage()
    return max((img.pixelColor(x, y).lightness() for x in range(img.width()) for y in range(img.height())
                if img.pixelColor(x, y).alpha() > 200), default=-1)


# ---- starting and quitting ----------------------------------------------------------------------------------

def test_the_window_appears_at_once_with_a_loading_state_and_the_models_load_behind_it(loop, assets, tmp_path,
                                                                                       monkeypatch):
    from engine.service import Service
    held = threading.Event()  # the models' load waits for the test: what the window shows meanwhile is seen surely
    load_models = Service.load_models

    def held_load(service):
        assert held.wait(60), "the test never let the load go on"
        load_models(service)
    monkeypatch.setattr(Service, "load_models", held_load)
    desktop = make_desktop(tmp_path, assets)
    w = desktop.window

    async def scenario():
        task = asyncio.ensure_future(desktop.start())
        await until(w.isVisible, timeout=5)
        await asyncio.sleep(0.2)  # the load has been waiting a while: still loading, the window unchanged
        seen = (desktop.host.serving, w.loading, w.stack.currentWidget() is w.loading_page, w.sidebar.isEnabled(),
                w.state_label.text(), w.loading_page.what.text())
        held.set()
        await task
        return seen
    try:
        serving, loading, page_shown, sidebar_on, state, what = run(loop, scenario())
        assert not serving and loading and page_shown and not sidebar_on
        assert state == "● loading" and what == "Loading tiny-random-llama…"
        assert not w.loading and w.stack.currentWidget() is w.panels["Dashboard"] and w.sidebar.isEnabled()
        assert w.state_label.text() == "● serving" and w.url_label.full_text() == w.api_url() != ""
    finally:
        held.set()
        run(loop, desktop.quit())


def test_without_a_tray_closing_the_window_quits_after_saying_so_once(loop, assets, tmp_path, monkeypatch):
    monkeypatch.setattr(window_module, "tray_available", lambda: False)

    async def close_and_answer(desktop: Desktop, answers: list[str]):
        """Run the app, close its window once per answer (Cancel or Quit), return what was seen and run()'s code."""
        code = asyncio.ensure_future(desktop.run())
        await until(lambda: desktop.host.serving)
        url = desktop.host.url
        seen = []
        for answer in answers:
            desktop.window.dialog = None
            desktop.window.close()
            box = desktop.window.dialog
            seen.append((box is not None and box.isVisible(), box and box.text(), desktop.host.serving))
            if box is not None:
                button = QMessageBox.StandardButton.Ok if answer == "Quit" else QMessageBox.StandardButton.Cancel
                box.button(button).click()
                await asyncio.sleep(0.1)
                seen[-1] += (desktop.window.isVisible(),)
        return seen, await asyncio.wait_for(code, 30), url

    first = make_desktop(tmp_path, assets)
    seen, code, url = run(loop, close_and_answer(first, ["Cancel", "Quit"]))
    (shown, text, serving, visible_after_cancel), (shown_again, _, serving_again, _) = seen
    assert shown and "no system tray" in text and "quits" in text and serving
    assert visible_after_cancel  # Cancel: the window stays and keeps serving
    assert shown_again and serving_again  # not remembered until accepted
    assert code == 0 and first.host.service is None and not first.window.isVisible()
    assert is_refused(url + "/health")
    assert "close_quits_shown=true" in (tmp_path / "llamadesk-window.ini").read_text()

    second = make_desktop(tmp_path, assets)  # same config folder: the notice was seen
    seen, code, _ = run(loop, close_and_answer(second, ["-"]))
    assert seen == [(False, None, True)]  # no message box: it quit at once
    assert code == 0 and second.host.service is None


def test_the_quit_shortcut_and_the_menus(gui):
    w = gui.window
    menus = {a.text().replace("&", ""): [x.text() for x in a.menu().actions() if x.text()]
             for a in w.menuBar().actions()}
    assert list(menus) == ["File", "Server", "View", "Help"]
    assert menus["File"] == ["Open data folder", "Quit"]
    assert menus["Server"] == ["Serve", "Serve on local network", "Copy API URL"]
    assert menus["View"][0] == "Theme" and menus["View"][1:] == list(window_module.PANELS)
    assert menus["Help"] == ["About llamadesk"]
    assert w.quit_action.shortcut() == QKeySequence("Ctrl+Q")
    assert w.data_folder() == Path(os.environ["XDG_DATA_HOME"]) / "llamadesk"


def test_the_headless_fallback_when_the_platform_plugin_cannot_load(assets, tmp_path):
    """Qt's real xcb plugin, copied under another platform name ("xct", so Qt tries this copy alone) and made
    to need a library this machine lacks (libxcb-cursor.so.9): Qt fails to load it (and would abort); the app
    sees that in a child process, prints the library and its package, and serves headless; exit 0."""
    import PySide6
    qt = Path(PySide6.__file__).parent / "Qt"
    plugin = qt / "plugins" / "platforms" / "libqxcb.so"
    if not plugin.exists():
        pytest.skip("this PySide6 has no xcb platform plugin (not Linux)")
    code = plugin.read_bytes()
    cursor, key = b"libxcb-cursor.so.0\0", b"\x63xcb"  # the needed library; the key in the CBOR metadata
    assert code.count(cursor) == 1 and code.count(key) == 1
    platforms = tmp_path / "qt" / "plugins" / "platforms"
    platforms.mkdir(parents=True)
    (platforms / "libqxcb.so").write_bytes(code.replace(cursor, b"libxcb-cursor.so.9\0").replace(key, b"\x63xct"))
    (tmp_path / "qt" / "lib").symlink_to(qt / "lib")  # the copy's RUNPATH ($ORIGIN/../../lib) finds Qt as before
    cfg = tmp_path / "llamadesk.toml"
    cfg.write_text("")
    env = {**os.environ, "QT_QPA_PLATFORM": "xct", "QT_QPA_PLATFORM_PLUGIN_PATH": str(platforms),
           **{f"XDG_{d}_HOME": str(tmp_path / d.lower()) for d in ("CONFIG", "STATE")}}
    proc = subprocess.Popen([sys.executable, "-m", "app", "--config", str(cfg), "--port", "0", "--model",
                             str(assets["tiny"]), "--cache-disk", "0"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None:
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            m = re.search(r"serving the OpenAI API on (http://\S+)/v1", seen[-1])
            url = m and m.group(1)
        status, models = http(url + "/v1/models")
        assert status == 200 and models["data"][0]["id"] == "tiny-random-llama"
        assert http(url + "/shutdown", "POST", {})[0] == 202
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)  # everything the process wrote, up to its end
        proc.stderr.close()
    while not lines.empty():
        seen.append(lines.get())
    told = [line for line in seen if line.startswith("llamadesk: no window:")]
    assert len(told) == 1, "".join(seen)
    assert "libxcb-cursor.so.9" in told[0] and "sudo apt install libxcb-cursor9" in told[0]
    assert "serving headless" in told[0]
    assert not any("Traceback" in line for line in seen)


def test_the_package_named_for_a_missing_library_follows_debian_naming():
    assert debian_package("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert debian_package("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert debian_package("libxcb-keysyms.so.1") == "libxcb-keysyms1"
    assert debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert debian_package("libX11-xcb.so.1") == "libx11-xcb1"
    assert debian_package("libEGL.so.1") == "libegl1"
    assert debian_package("libglib-2.0.so.0") == "libglib2.0-0"


# ---- the status bar and the server menu ----------------------------------------------------------------------

def test_the_status_bar_stops_saying_loading_when_a_per_model_apply_finishes(loop, gui):
    w = gui.window
    states = []
    gui.bridge.state_changed.connect(states.append)
    try:
        async def scenario():
            await gui.bridge.reload_model("tiny-random-llama", {"ctx": 512})  # what a card's Apply runs
            return w.state_label.text()
        label = run(loop, scenario())
    finally:
        gui.bridge.state_changed.disconnect(states.append)
    assert "loading" in states
    assert label == "● serving"  # at once, not at a later change of state
    assert gui.host.service.roster.loaded["tiny-random-llama"].ctx == 512


def test_a_model_a_request_loads_on_demand_shows_a_progress_bar(loop, assets, tmp_path):
    (tmp_path / "llamadesk.toml").write_text(f'[[models]]\nname = "smol"\npath = "{assets["smollm2"]}"\n'
                                             'preload = false\n')
    desktop = make_desktop(tmp_path, assets)
    w = desktop.window
    seen = []
    desktop.bridge.load_progress.connect(
        lambda name, f: seen.append((name, w.load_bar.isVisible(), w.load_bar.format(), w.state_label.text())))

    async def scenario():
        await desktop.start()
        client = openai.OpenAI(base_url=desktop.host.url + "/v1", api_key="-", max_retries=0)
        reply = await asyncio.to_thread(lambda: client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=2))
        await asyncio.sleep(0.4)  # the next polls see the load has ended
        return reply
    try:
        reply = run(loop, scenario(), timeout=120)
    finally:
        run(loop, desktop.quit())
    assert reply.model == "smol"
    shown = [s for s in seen if s[0] == "smol" and s[1]]
    assert shown and all(fmt.startswith("loading smol") for _, _, fmt, _ in shown)
    assert any(state == "● loading" for *_, state in shown)
    assert not w.load_bar.isVisible()  # hidden once it ended


def test_the_serve_toggle_pauses_and_resumes_listening(loop, gui):
    w = gui.window
    url = gui.host.url

    async def scenario():
        paused = next_signal(gui.bridge.state_changed, lambda s: s == "paused")
        w.serve_button.click()
        await paused
        seen = (w.state_label.text(), w.serve_button.text(), w.serve_action.isChecked(), gui.host.url)
        refused = await asyncio.to_thread(is_refused, url + "/health")
        serving = next_signal(gui.bridge.state_changed, lambda s: s == "serving")
        w.serve_action.trigger()
        await serving
        health = await asyncio.to_thread(http, gui.host.url + "/health")
        return seen, refused, health
    (label, text, checked, paused_url), refused, health = run(loop, scenario())
    assert label == "● paused" and text == "Paused" and not checked and paused_url is None
    assert refused
    assert health == (200, {"status": "ok", "version": VERSION}) and gui.host.url == url
    assert w.serve_button.isChecked() and w.serve_button.text() == "Serving" and w.serve_action.isChecked()


def test_a_port_another_program_holds_leaves_the_window_up_not_serving_until_serving_is_pressed(loop, assets,
                                                                                                 tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    desktop = make_desktop(tmp_path, assets, "--port", str(port))
    notices: list[str] = []
    desktop.bridge.notice.connect(notices.append)
    try:
        run(loop, desktop.start())  # before: a PortInUse out of the setup-mode retry, and the process gone
        w = desktop.window
        run(loop, until(lambda: w.state_label.text() == "● paused"))
        assert desktop.host.service is not None and not desktop.host.serving  # the model is loaded
        assert f"not serving: port {port} on 127.0.0.1 is in use; choose another in Settings, then press Serving" \
            in notices
        w.serve_button.click()  # still taken: said again, nothing else changes
        run(loop, until(lambda: len(notices) >= 2))
        assert notices[-1] == f"not serving: port {port} on 127.0.0.1 is in use; choose another with --port"
        assert not desktop.host.serving
        holder.close()
        w.serve_button.click()
        run(loop, until(lambda: desktop.host.serving))
        assert run(loop, asyncio.to_thread(http, f"http://127.0.0.1:{port}/health"))[0] == 200  # off the loop
    finally:
        holder.close()
        run(loop, desktop.quit())


def test_serve_on_the_local_network_without_an_api_key_says_why_and_changes_nothing(loop, gui):
    w = gui.window
    w.dialog = None
    w.network_action.trigger()
    box = w.dialog
    assert box is not None and box.isVisible()
    assert "needs an API key" in box.text() and "anyone on your network" in box.informativeText()
    box.close()
    assert not w.network_action.isChecked() and gui.host.config.host == "127.0.0.1"
    assert run(loop, asyncio.to_thread(http, gui.host.url + "/health"))[0] == 200


def test_serve_on_the_local_network_with_an_api_key_listens_on_every_interface(loop, assets, tmp_path):
    desktop = make_desktop(tmp_path, assets, "--api-key", "s3cret")
    w = desktop.window

    async def scenario():
        await desktop.start()
        port = desktop.host.server.port
        on = next_signal(desktop.bridge.notice, lambda text: "local network" in text)
        w.network_action.trigger()
        await on
        wide = (desktop.host.server.host, desktop.host.server.port, w.network_action.isChecked())
        models = await asyncio.to_thread(http, f"http://127.0.0.1:{port}/v1/models", key="s3cret")
        off = next_signal(desktop.bridge.notice, lambda text: "this machine only" in text)
        w.network_action.trigger()
        await off
        return port, wide, models, (desktop.host.server.host, w.network_action.isChecked())
    try:
        port, wide, models, narrow = run(loop, scenario())
    finally:
        run(loop, desktop.quit())
    assert wide == ("0.0.0.0", port, True)  # same port: clients find it again
    assert models[0] == 200 and models[1]["data"][0]["id"] == "tiny-random-llama"
    assert narrow == ("127.0.0.1", False)


def test_about_names_the_version_and_the_llama_cpp_build(gui):
    w = gui.window
    w.about_action.trigger()
    box = w.dialog
    assert box.isVisible() and f"llamadesk {VERSION}" in box.text()
    assert "llama-cpp-python" in box.informativeText() and llama.system_info() in box.informativeText()
    box.close()


# ---- the benchmark -------------------------------------------------------------------------------------------

def test_the_benchmark_shows_each_step_and_fills_rows_as_each_test_ends(loop, gui, caplog):
    caplog.set_level(logging.INFO, logger="llamadesk")  # as the app's own logging setup has it
    w = gui.window
    panel = w.panels["Benchmark"]
    panel.refresh()
    seen = []

    def on_progress(p):  # connected after the panel's own slot: the panel has drawn the step by now
        seen.append((p["step"], p["steps"], p["current"], panel.table.rowCount(), panel.progress.format(),
                     panel.progress.value(), panel.cancel_button.isEnabled(), w.state_label.text()))
    gui.bridge.bench_progress.connect(on_progress)
    try:
        async def scenario():
            done = next_signal(gui.bridge.bench_done)
            panel.run()
            record = (await done)[0]
            await asyncio.sleep(0.1)  # the engine's log lines arrive through the loop
            return record
        record = run(loop, scenario(), timeout=180)
    finally:
        gui.bridge.bench_progress.disconnect(on_progress)
    assert record["state"] == "done"
    tests = [r["test"] for r in record["rows"]]
    steps = len(tests)
    assert tests[:2] == ["pp512", "tg128"] and steps >= 3
    starts = [s for s in seen if s[2] is not None]
    assert [s[0] for s in starts] == list(range(1, steps + 1)) and {s[1] for s in seen} == {steps}
    for step, _, current, rows, fmt, value, cancellable, state in starts:
        assert current == tests[step - 1] and fmt == f"step {step} of {steps}: {current}"
        assert rows == value == step - 1  # the rows of the tests done so far, before the run ends
        assert cancellable and state == "● benchmarking"
    assert seen[-1][2] is None and seen[-1][3] == steps
    assert panel.table.rowCount() == steps and float(panel.table.item(1, 1).text()) > 0
    assert panel.table.item(0, 3).text().startswith("prompt processing: reading a 512-token prompt")
    assert panel.table.item(1, 3).text().startswith("text generation: 128 tokens for one stream")
    assert panel.table.item(2, 3).text().startswith("text generation, 2 streams at once")
    assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert w.state_label.text() == "● serving"
    logs = w.panels["Logs"].view.toPlainText()
    assert f"benchmark tiny-random-llama, 1 of {steps}: pp512" in logs and "benchmark of tiny-random-llama done" in logs


def test_cancel_stops_the_benchmark_and_serving_resumes(loop, gui):
    w = gui.window
    panel = w.panels["Benchmark"]
    panel.refresh()
    history = len(gui.host.service.bench.history)

    def on_progress(p):
        if p["step"] == 2 and p["current"]:
            panel.cancel_button.click()
    gui.bridge.bench_progress.connect(on_progress)
    try:
        async def scenario():
            done = next_signal(gui.bridge.bench_done)
            panel.run()
            record = (await done)[0]
            label = w.state_label.text()
            reply = await asyncio.to_thread(lambda: openai.OpenAI(base_url=gui.host.url + "/v1", api_key="-",
                                                                  max_retries=0).chat.completions.create(
                model="", messages=[{"role": "user", "content": "hi"}], max_tokens=2))
            return record, label, reply, await asyncio.to_thread(http, gui.host.url + "/bench")
        record, label, reply, (_, bench) = run(loop, scenario(), timeout=180)
    finally:
        gui.bridge.bench_progress.disconnect(on_progress)
    assert record["state"] == "cancelled"
    done = len(record["rows"])
    assert 1 <= done < record["steps"] and [r["test"] for r in record["rows"]][0] == "pp512"
    assert panel.table.rowCount() == done and panel.progress.format() == f"cancelled after {done} of {record['steps']}"
    assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert label == "● serving" and not gui.host.service.bench.running
    assert reply.choices[0].message is not None  # the engine serves again
    assert bench["state"] == "cancelled" and bench["rows"] == record["rows"]
    assert len(bench["history"]) == history  # a cancelled run is no result


# ---- long labels ---------------------------------------------------------------------------------------------

def test_the_long_hardware_line_does_not_widen_the_window(loop, gui, monkeypatch):
    w = gui.window
    w.resize(900, 600)
    w.show_panel("Dashboard")
    run(loop, asyncio.sleep(0.2))
    width = w.width()
    import engine.service
    long = (engine.service.hardware_line() + " " + " ".join(f"AVX512_FEATURE_{i}" for i in range(60)) + " " +
            "X" * 300)  # llama.cpp's feature list, then a word longer than any window
    monkeypatch.setattr(engine.service, "hardware_line", lambda: long)  # what /v1/stats and each tick carry
    run(loop, next_signal(gui.bridge.stats_updated))
    dash = w.panels["Dashboard"]
    bench = w.panels["Benchmark"]
    bench.on_bench_done({"state": "done", "rows": [{"test": "pp512", "tokens": 512, "t_s": 1.0, "t_s_std": 0.1}],
                         "started": time.time(), "model": "m", "quant": "F32", "threads": 1, "seconds": 1.0,
                         "hardware": long})
    for name in ("Dashboard", "Benchmark"):
        w.show_panel(name)
        run(loop, asyncio.sleep(0.2))
        assert w.width() == width, name
    assert dash.hardware.toolTip() == long and dash.hardware.is_elided()
    assert long in bench.status.toolTip() and bench.status.is_elided()
    assert dash.minimumSizeHint().width() < 900 - w.sidebar.width()
    assert bench.minimumSizeHint().width() < 900 - w.sidebar.width()


# ---- the theme -----------------------------------------------------------------------------------------------

def discard(desktop: Desktop) -> None:
    """Drop a Desktop that was never started."""
    logging.getLogger().removeHandler(desktop.bridge.log_handler)
    desktop.window.deleteLater()


def choose_theme(loop, desktop: Desktop, name: str) -> None:
    """Pick a theme in the View menu, with the loop running, as a click would."""
    async def scenario():
        saved = next_signal(desktop.bridge.theme_saved)
        desktop.window.theme_actions[name].trigger()
        await saved
    run(loop, scenario())


def test_the_theme_switch_repaints_at_once_and_is_remembered(loop, gui, assets):
    app = QApplication.instance()
    w = gui.window
    system = QPalette(app.palette())
    cfg = gui.host.config.path
    before = cfg.read_bytes()

    styled = QFrame()  # a panel's widget with a style sheet naming palette colours
    styled.setStyleSheet("QFrame { background: palette(base); }")
    styled.resize(20, 20)
    styled.show()
    choose_theme(loop, gui, "dark")
    window, text = app.palette().color(Role.Window), app.palette().color(Role.WindowText)
    assert window.lightness() < 80 and text.lightness() > 180
    assert w.palette().color(Role.Window) == window  # the widgets took it
    assert w.sidebar.palette().color(Role.Base).lightness() < 80
    assert styled.grab().toImage().pixelColor(10, 10).lightness() < 80  # style sheets resolved anew
    chart = w.panels["Dashboard"].gen  # pyqtgraph caches its background: drawn anew too
    assert chart.grab().toImage().pixelColor(2, 2).lightness() < 80  # a corner: no line, axis or title there
    assert lightest_pixel(w.sidebar.item(0).icon()) > 180  # icons redrawn light on dark
    assert w.theme_actions["dark"].isChecked()
    again = make_desktop(cfg.parent, assets)  # the next start applies the remembered theme
    try:
        assert app.palette().color(Role.Window).lightness() < 80 and again.window.theme_actions["dark"].isChecked()
    finally:
        discard(again)

    choose_theme(loop, gui, "light")
    assert app.palette().color(Role.Window).lightness() > 200
    assert lightest_pixel(w.sidebar.item(0).icon()) < 100  # dark icons on light
    assert styled.grab().toImage().pixelColor(10, 10).lightness() > 200
    styled.deleteLater()
    flagged = make_desktop(cfg.parent, assets, "--theme", "dark")  # a --theme flag wins over the remembered one
    try:
        assert app.palette().color(Role.Window).lightness() < 80 and flagged.window.theme_actions["dark"].isChecked()
    finally:
        discard(flagged)

    choose_theme(loop, gui, "system")
    assert app.palette().color(Role.Window) == system.color(Role.Window)
    assert app.palette().color(Role.Text) == system.color(Role.Text)
    assert theme.current() == "system"
    assert cfg.read_bytes() == before  # a preference of the window: the settings file is not touched


def test_choosing_a_theme_leaves_command_line_flags_winning_over_the_settings_file(loop, assets, tmp_path):
    (tmp_path / "llamadesk.toml").write_text("streams = 2\n")
    desktop = make_desktop(tmp_path, assets, "--streams", "3")
    try:
        choose_theme(loop, desktop, "dark")
        row = desktop.window.panels["Settings"].rows["theme"]
        assert row.raw() == "dark" and row.source.text() == "this app"  # the form follows the View menu
        combo = row.editor
        combo.setCurrentIndex(combo.findData("light"))  # the Settings panel's switch, the other way in
    finally:
        discard(desktop)
        theme.apply(QApplication.instance(), "system")
    after = load(["--config", str(tmp_path / "llamadesk.toml"), "--streams", "3"])
    assert (after.streams, after.sources["streams"]) == (3, "cli")
    assert (tmp_path / "llamadesk.toml").read_text() == "streams = 2\n"
    assert "theme=light" in (tmp_path / "llamadesk-window.ini").read_text()  # remembered, apart from the file
