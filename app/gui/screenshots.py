"""Render every panel, light and dark, at 1440x900 and 900x600, with a model loaded and streams running.

Usage: python -m app.gui.screenshots OUT_DIR --model FILE.gguf [--asr DIR] [--tts DIR]   (what `make screenshots`
runs, under Xvfb when it has xvfb-run, else offscreen). Files: <panel>.png (light, 1440x900), <panel>-dark.png,
<panel>-900x600.png, <panel>-dark-900x600.png, and benchmark-running.png (a run half way).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import qasync  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app import logs  # noqa: E402
from app.gui import theme  # noqa: E402
from app.gui.main import Desktop  # noqa: E402
from app.gui.window import PANELS  # noqa: E402
from engine.config import load  # noqa: E402
from engine.requests import SamplingParams  # noqa: E402

QUESTIONS = ["Write a short poem about the sea.", "Explain what a CPU cache is.", "List five fruits and their colors.",
             "Describe a sunrise in the mountains."]
SIZES = ((1440, 900), (900, 600))
THEMES = ("light", "dark")


def file_name(panel: str, theme_name: str, size: tuple[int, int]) -> str:
    dark = "-dark" if theme_name == "dark" else ""
    small = "" if size == SIZES[0] else f"-{size[0]}x{size[1]}"
    return f"{panel.lower()}{dark}{small}.png"


async def grab_all(desktop: Desktop, out: Path, panels: tuple[str, ...]) -> int:
    """Every panel in every theme and size; how many files were written."""
    w = desktop.window
    app = QApplication.instance()
    written = 0
    for theme_name in THEMES:
        theme.apply(app, theme_name)
        for size in SIZES:
            w.resize(*size)
            for name in panels:
                w.show_panel(name)
                await asyncio.sleep(0.3)  # layout, repaint, and the 1 Hz tick for live panels
                w.grab().save(str(out / file_name(name, theme_name, size)), "PNG", 0)  # 0: smallest file
                written += 1
    theme.apply(app, "light")
    w.resize(*SIZES[0])
    return written


async def next_emission(signal, pred=lambda *a: True):
    fut = asyncio.get_running_loop().create_future()

    def on(*args):
        if pred(*args) and not fut.done():
            fut.set_result(args)
    signal.connect(on)
    try:
        return await fut
    finally:
        signal.disconnect(on)


async def shoot(desktop: Desktop, out: Path) -> int:
    await desktop.start()
    w = desktop.window
    w.resize(*SIZES[0])
    bridge = desktop.bridge
    # four concurrent streams so the dashboard and swimlane show the engine at work
    chats = [bridge.chat(None, [{"role": "user", "content": q}], SamplingParams(temperature=0.7, max_tokens=400,
                                                                                 seed=1)) for q in QUESTIONS]
    await asyncio.sleep(4.5)
    for _ in range(120):  # a busy machine decodes slowly: wait (up to a minute) for text in the swimlane
        if desktop.host.service.stats()["gen_tokens"] >= 60:
            break
        await asyncio.sleep(0.5)
    written = await grab_all(desktop, out, ("Dashboard",))
    for cid in chats:  # seen: no need to wait for their last tokens
        bridge.stop_chat(cid)
    while desktop.host.service.stats()["active_streams"] or desktop.host.service.stats()["queued_streams"]:
        await asyncio.sleep(0.2)
    chat = w.panels["Chat"]
    chat.system.setPlainText("You are a helpful assistant.")
    chat.temperature.setValue(0)
    chat.input.setPlainText("What is the capital of France?")
    done = next_emission(bridge.chat_done)
    chat.send()
    await done
    studio = w.panels["Speech"]
    if all(desktop.bridge.speech_models().values()):
        studio.text.setPlainText("The weather is nice today. I would like a cup of coffee. Please open the window.")
        spoken = next_emission(bridge.speech_ready)
        studio.speak()
        await spoken
        heard = next_emission(bridge.transcript_ready)
        studio.transcribe_last_speech()
        await heard
    w.show_panel("Benchmark")
    bench = w.panels["Benchmark"]
    bench.refresh()
    finished = asyncio.ensure_future(next_emission(bridge.bench_done))
    halfway = next_emission(bridge.bench_progress, lambda p: len(p["rows"]) >= 2)
    bench.run()
    await halfway
    await asyncio.sleep(0.3)
    w.grab().save(str(out / "benchmark-running.png"), "PNG", 0)
    await finished
    models = w.panels["Models"]
    first = models.cards.itemAt(0).widget()
    if hasattr(first, "settings_button"):
        first.settings_button.setChecked(True)  # show the per-model settings form
    settings = w.panels["Settings"]
    if hasattr(settings, "network"):
        settings.network.setChecked(True)  # show the local-network switch with its generated key (not saved)
    written += await grab_all(desktop, out, tuple(p for p in PANELS if p != "Dashboard"))
    await desktop.quit()
    return written + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--asr")
    ap.add_argument("--tts")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logs.setup("info")  # as the app has it: the Logs panel shows the run
    app = QApplication([])
    app.setStyle("Fusion")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "llamadesk.toml"
        cfg.write_text("")
        speech = (["--asr", args.asr] if args.asr else []) + (["--tts", args.tts] if args.tts else [])
        # two streams: the dashboard shows two decoding and two queued, and the benchmark takes three tests
        config = load(["--config", str(cfg), "--port", "0", "--model", args.model, "--models-dir", tmp,
                       "--streams", "2", *speech])
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        desktop = Desktop(config)
        with loop:
            written = loop.run_until_complete(shoot(desktop, args.out))
    print(f"wrote {written} screenshots to {args.out} ({QApplication.platformName()})")


if __name__ == "__main__":
    main()
