"""Aggregate generation throughput at 1 and 4 concurrent streams, side by side in one run:

  (a) llamadesk  (b) llama-cpp-python's own server  (c) llama.cpp's llama-server --parallel 4

Same GGUF, same threads, same context per stream. Each request is a streamed /v1/completions
of a unique ~100-token prompt with 128 tokens forced (EOS suppressed), temperature 0. Levels
and systems are interleaved, the order rotated every rep; medians and paired ratios printed.
Also: time to first token of a 4th request arriving while 3 others stream.

Not a test (speed is measured here, never asserted). Run: make bench [BENCH_ARGS="--reps 5"]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.assets.prepare import default_dest, prepare  # noqa: E402

WORDS = ("river mountain quiet engine number garden window yellow market silver planet morning letter "
         "history science orange simple travel forest battery castle doctor island kitchen").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Story {seed}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(95)) for i in range(n)]


class System:
    """One server under test, started as its own process."""

    def __init__(self, name: str, cmd: list[str], port: int, extra: dict, env: dict | None = None):
        self.name, self.cmd, self.port, self.extra = name, cmd, port, extra
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(f"/tmp/bench-{name}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    async def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log.name}")
                try:
                    async with s.get(self.url + "/v1/models") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.name} did not come up; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def one_request(session: aiohttp.ClientSession, system: System, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **system.extra}
    t0 = time.perf_counter()
    ttft, usage, finish = None, None, None
    async with session.post(system.url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{system.name}: HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[5:])
            ch = (ev.get("choices") or [{}])[0]
            if ch.get("text") and ttft is None:
                ttft = time.perf_counter() - t0
            finish = ch.get("finish_reason") or finish
            usage = ev.get("usage") or usage
    return {"t0": t0, "t1": time.perf_counter(), "ttft": ttft, "tokens": (usage or {}).get("completion_tokens",
                                                                                           max_tokens),
            "finish": finish}


async def level(system: System, n: int, max_tokens: int, seed: int) -> dict:
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        t0 = time.perf_counter()
        reqs = await asyncio.gather(*[one_request(session, system, p, max_tokens) for p in prompts(n, seed)])
        wall = time.perf_counter() - t0
    gen = sum(r["tokens"] for r in reqs)
    return {"agg_tok_s": gen / wall, "wall": wall, "gen": gen, "ttft": statistics.median(r["ttft"] for r in reqs),
            "all_length": all(r["finish"] == "length" for r in reqs)}


async def late_arrival_ttft(system: System, max_tokens: int, seed: int) -> float:
    """TTFT of a 4th request sent once 3 others are streaming."""
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        ps = prompts(4, seed)
        running = [asyncio.create_task(one_request(session, system, p, max_tokens)) for p in ps[:3]]
        await asyncio.sleep(1.5)  # the three are past prefill and decoding
        late = await one_request(session, system, ps[3], 16)
        await asyncio.gather(*running)
    return late["ttft"]


def start_systems(args, model: Path) -> list[System]:
    t, ctx = str(args.threads), args.ctx
    systems = []
    if "llamadesk" in args.systems:
        port = free_port()
        cfg = Path("/tmp/bench-llamadesk.toml")
        cfg.write_text("")
        systems.append(System("llamadesk", [sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "-m",
                                            str(model), "--port", str(port), "--threads", t, "--streams", "4",
                                            "--ctx", str(ctx), "--log-level", "warning", "--cache-disk", "0"], port,
                              {"ignore_eos": True}))
    if "llama-cpp-python" in args.systems:
        port = free_port()
        # llama-cpp-python's server has no ignore_eos; suppress the EOG tokens with logit_bias instead.
        systems.append(System("llama-cpp-python", [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                                                   "--port", str(port), "--n_threads", t, "--n_threads_batch", t,
                                                   "--n_ctx", str(ctx), "--verbose", "False",
                                                   # its default (True) cuts concurrent streams short
                                                   "--interrupt_requests", "False"], port,
                              {"logit_bias": {str(i): -100 for i in args.eog_ids}}))
    if "llama-server" in args.systems:
        port = free_port()
        binary = args.llama_server or subprocess.run(
            ["bash", str(ROOT / "tests/bench/build_llama_server.sh")], check=True, capture_output=True,
            text=True, env={**os.environ, "PYTHON": sys.executable}).stdout.strip().splitlines()[-1]
        systems.append(System("llama-server", [binary, "-m", str(model), "--port", str(port), "-t", t, "-tb", t,
                                               "--parallel", "4", "-c", str(ctx * 4), "--no-webui"], port,
                              {"ignore_eos": True}))
    return systems


async def run(args) -> None:
    model = Path(args.model) if args.model else prepare(default_dest())["smollm2"]
    systems = start_systems(args, model)
    try:
        for s in systems:
            await s.wait_ready()
        for s in systems:  # untimed warm-up
            await level(s, 1, 16, seed=999)
        results: dict[tuple[str, int], list[dict]] = {}
        ttfts: dict[str, list[float]] = {s.name: [] for s in systems}
        seed = 0
        for rep in range(args.reps):
            order = systems[rep % len(systems):] + systems[:rep % len(systems)]
            for n in (1, 4) if rep % 2 == 0 else (4, 1):
                for s in order:
                    seed += 1
                    r = await level(s, n, args.max_tokens, seed)
                    results.setdefault((s.name, n), []).append(r)
                    print(f"rep {rep} {s.name:17s} x{n}: {r['agg_tok_s']:6.1f} tok/s  ttft {r['ttft']:.2f}s"
                          f"{'' if r['all_length'] else '  (some ended early!)'}", flush=True)
            for s in order:
                seed += 1
                ttfts[s.name].append(await late_arrival_ttft(s, args.max_tokens, seed))
        report(systems, results, ttfts, args, model)
    finally:
        for s in systems:
            s.stop()


def report(systems, results, ttfts, args, model) -> None:
    print(f"\nmodel {model.name}, threads {args.threads}, ctx/stream {args.ctx}, {args.max_tokens} tokens, "
          f"{args.reps} reps (medians)")
    print(f"{'system':18s} {'1 stream':>10s} {'4 streams':>10s} {'4/1':>6s} {'ttft@4':>8s} {'late ttft':>10s}")
    for s in systems:
        one = statistics.median(r["agg_tok_s"] for r in results[(s.name, 1)])
        four = statistics.median(r["agg_tok_s"] for r in results[(s.name, 4)])
        t4 = statistics.median(r["ttft"] for r in results[(s.name, 4)])
        print(f"{s.name:18s} {one:10.1f} {four:10.1f} {four / one:6.2f} {t4:7.2f}s {statistics.median(ttfts[s.name]):9.2f}s")
    names = [s.name for s in systems]
    if "llamadesk" in names:
        for other in (n for n in names if n != "llamadesk"):
            for n in (1, 4):
                ratios = [a["agg_tok_s"] / b["agg_tok_s"]
                          for a, b in zip(results[("llamadesk", n)], results[(other, n)])]
                print(f"llamadesk / {other} @ {n}: median {statistics.median(ratios):.2f} "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} paired reps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF to serve (default: the SmolLM2-135M test asset)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=2048, help="context per stream")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--systems", default="llamadesk,llama-cpp-python,llama-server")
    ap.add_argument("--llama-server", help="path of a llama-server binary (default: build one, cached)")
    ap.add_argument("--eog-ids", default="0,2,4", help="EOG token ids suppressed for llama-cpp-python")
    args = ap.parse_args()
    args.systems = args.systems.split(",")
    args.eog_ids = [int(x) for x in args.eog_ids.split(",")]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
