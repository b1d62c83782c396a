"""`llamadesk bench -m model.gguf [--ref path/to/llama-bench]`: llama-bench's rows through llamadesk's
engine, and with --ref llama.cpp's own llama-bench on the same file, side by side."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.config import ConfigError, load
from engine.errors import EngineError
from engine.service import Service


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamadesk bench", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (0 = one per core)")
    p.add_argument("-s", "--streams", type=int, default=4, help="largest N of tg128@N")
    p.add_argument("--kv-dtype", default="f16", choices=("f16", "q8_0", "q4_0"))
    p.add_argument("--ref", help="a llama-bench binary to run on the same file for comparison")
    return p


def _llama_bench(binary: str, model: str, threads: int) -> dict[str, float]:
    """t/s of pp512 and tg128 from llama.cpp's llama-bench (JSON output)."""
    out = subprocess.run([binary, "-m", model, "-p", "512", "-n", "128", "-r", "3", "-t", str(threads), "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=3600).stdout
    rows = {}
    for r in json.loads(out):
        name = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        rows[name] = float(r["avg_ts"])
    return rows


def _print_step(p: dict) -> None:
    """Which test runs now, on stderr (the table on stdout stays clean); Ctrl+C cancels."""
    if p["current"]:
        print(f"[{p['step']}/{p['steps']}] {p['current']}…", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.ref and not Path(args.ref).is_file():
        print(f"llamadesk bench: error: --ref {args.ref}: no such llama-bench binary", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench.toml"
        cfg.write_text("")  # the user's roster stays out of it
        try:
            config = load(["--config", str(cfg), "--no-gui", "-m", args.model, "--threads", str(args.threads),
                           "--streams", str(args.streams), "--kv-dtype", args.kv_dtype, "--ctx", "1024"])
        except ConfigError as e:
            print(f"llamadesk bench: error: {e}", file=sys.stderr)
            return 2

        async def go() -> dict:
            svc = Service(config)
            await asyncio.to_thread(svc.load_models)
            svc.start()
            loop = asyncio.get_running_loop()
            with contextlib.suppress(NotImplementedError):  # Windows: Ctrl+C ends the process instead
                loop.add_signal_handler(signal.SIGINT, svc.bench.cancel)
            try:
                return await svc.bench.finish(svc.bench.begin(svc.roster.get(None)), _print_step)
            finally:
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(signal.SIGINT)
                await svc.stop()
        try:
            record = asyncio.run(go())
        except EngineError as e:
            print(f"llamadesk bench: error: {e.message}", file=sys.stderr)
            return 2
    if record["state"] == "cancelled":
        print(f"llamadesk bench: cancelled after {len(record['rows'])} of {record['steps']} tests", file=sys.stderr)
        return 130
    ref = {}
    if args.ref:
        try:
            ref = _llama_bench(args.ref, args.model, record["threads"])
        except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
            print(f"llamadesk bench: error: llama-bench failed: {e}", file=sys.stderr)
            return 2
    print(f"model {Path(record['file']).name} ({record['quant']}, {record['params'] / 1e6:.0f}M params), "
          f"kv {record['kv_dtype']}, threads {record['threads']}")
    print(record["hardware"])
    head = f"{'test':10s} {'llamadesk t/s':>18s}" + (f" {'llama-bench t/s':>16s} {'ratio':>6s}" if ref else "")
    print(head)
    for r in record["rows"]:
        line = f"{r['test']:10s} {r['t_s']:10.2f} ± {r['t_s_std']:5.2f}"
        if ref and r["test"] in ref:
            line += f" {ref[r['test']]:16.2f} {r['t_s'] / ref[r['test']]:6.2f}"
        print(line)
    return 0
