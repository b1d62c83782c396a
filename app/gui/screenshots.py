"""Render every panel with a model loaded and streams running, offscreen, into PNG files.

Usage: python -m app.gui.screenshots OUT_DIR --model FILE.gguf   (what `make screenshots` runs)
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

from app.gui.main import Desktop  # noqa: E402
from app.gui.window import PANELS  # noqa: E402
from engine.config import load  # noqa: E402
from engine.requests import SamplingParams  # noqa: E402

QUESTIONS = ["Write a short poem about the sea.", "Explain what a CPU cache is.", "List five fruits and their colors.",
             "Describe a sunrise in the mountains."]


async def shoot(desktop: Desktop, out: Path) -> None:
    await desktop.start()
    w = desktop.window
    w.resize(1280, 800)
    bridge = desktop.bridge
    # four concurrent streams so the dashboard and swimlane show the engine at work
    for q in QUESTIONS:
        bridge.chat(None, [{"role": "user", "content": q}], SamplingParams(temperature=0.7, max_tokens=400, seed=1))
    await asyncio.sleep(4.5)
    w.show_panel("Dashboard")
    await asyncio.sleep(0.3)
    w.grab().save(str(out / "dashboard.png"))
    while desktop.host.service.stats()["active_streams"]:
        await asyncio.sleep(0.2)
    chat = w.panels["Chat"]
    chat.system.setPlainText("You are a helpful assistant.")
    chat.temperature.setValue(0)
    done = asyncio.get_running_loop().create_future()
    bridge.chat_done.connect(lambda *_: done.done() or done.set_result(True))
    for question in ("What is the capital of France?",):
        chat.input.setPlainText(question)
        chat.send()
        await done
    studio = w.panels["Speech"]
    if all(desktop.bridge.speech_models().values()):
        studio.text.setPlainText("The weather is nice today. I would like a cup of coffee. Please open the window.")
        heard = asyncio.get_running_loop().create_future()
        bridge.transcript_ready.connect(lambda *_: heard.done() or heard.set_result(True))
        spoken = asyncio.get_running_loop().create_future()
        bridge.speech_ready.connect(lambda *_: spoken.done() or spoken.set_result(True))
        studio.speak()
        await spoken
        studio.transcribe_last_speech()
        await heard
    bench = asyncio.get_running_loop().create_future()
    bridge.bench_done.connect(lambda *_: bench.done() or bench.set_result(True))
    w.show_panel("Benchmark")
    w.panels["Benchmark"].refresh()
    w.panels["Benchmark"].run()
    await bench
    models = w.panels["Models"]
    first = models.cards.itemAt(0).widget()
    if hasattr(first, "settings_button"):
        first.settings_button.setChecked(True)  # show the per-model settings form
    w.panels["Settings"].network.setChecked(True)  # show the local-network switch with its generated key
    for name in PANELS:
        w.show_panel(name)
        await asyncio.sleep(0.3)
        if name != "Dashboard":
            w.grab().save(str(out / f"{name.lower()}.png"))
    await desktop.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--asr")
    ap.add_argument("--tts")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    app = QApplication([])
    app.setStyle("Fusion")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "llamadesk.toml"
        cfg.write_text("")
        speech = (["--asr", args.asr] if args.asr else []) + (["--tts", args.tts] if args.tts else [])
        config = load(["--config", str(cfg), "--port", "0", "--model", args.model, "--models-dir", tmp, *speech])
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        desktop = Desktop(config)
        with loop:
            loop.run_until_complete(shoot(desktop, args.out))
    print(f"wrote {len(PANELS)} screenshots to {args.out}")


if __name__ == "__main__":
    main()
