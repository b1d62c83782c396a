"""Soak: N clients for M minutes of mixed traffic against a llamadesk it starts itself on loopback.

Each client loops over a weighted mix of routes: chat buffered and streamed, completions buffered and
streamed, embeddings, GET /v1/models and GET /v1/stats; some streams are dropped mid-way (the client
closes the connection after a few chunks), as a client that goes away does. A sampler reads /v1/stats
every few seconds: the RSS series (memory.rss_bytes), live and queued streams, the scheduler's health.
At the end: requests and errors by route and type, latency percentiles, the RSS series and its growth,
and whether the server went back to idle (no stream left behind) and still answers a chat.

Bounded: stops at the deadline or after --max-requests per client, whichever comes first; each request
has a timeout. Not a test (nothing is asserted; the exit status is 1 when a 5xx, a leaked stream or a dead
scheduler was seen). Run: .venv/bin/python tests/bench/bench_soak.py [--clients 8 --minutes 2]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.assets.prepare import default_dest, prepare  # noqa: E402

WORDS = ("river mountain quiet engine number garden window yellow market silver planet morning letter "
         "history science orange simple travel forest battery castle doctor island kitchen").split()
# route -> weight in the mix
MIX = {"chat": 4, "chat_stream": 4, "completion": 2, "completion_stream": 2, "embeddings": 2, "models": 1, "stats": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llamadesk as its own process on 127.0.0.1, with a temporary config (chat model + embedding model)."""

    def __init__(self, model: Path, embed_model: Path | None, streams: int, ctx: int, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tempfile.TemporaryDirectory(prefix="llamadesk-soak-")
        cfg = Path(self.dir.name) / "soak.toml"
        toml = (f'models_dir = "{Path(self.dir.name) / "models"}"\n\n[[models]]\nname = "chat"\npath = "{model}"\n'
                f"default = true\nctx = {ctx}\nstreams = {streams}\n")
        if embed_model:
            toml += f'\n[[models]]\nname = "embed"\npath = "{embed_model}"\n'
        cfg.write_text(toml)
        self.log_path = Path(self.dir.name) / "server.log"
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "--cache-disk", "0",
               "--host", "127.0.0.1", "--port",
               str(self.port), "--log-level", "warning", "--access-log", "off"]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.embed = "embed" if embed_model else "chat"

    async def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.tail()}")
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200 and (await r.json())["status"] == "ok":
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"the server did not come up: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.dir.cleanup()


class Tally:
    """Outcomes by route: counts, latencies, and errors by type."""

    def __init__(self):
        self.ok: collections.Counter = collections.Counter()
        self.dropped: collections.Counter = collections.Counter()  # streams this client abandoned on purpose
        self.cut: collections.Counter = collections.Counter()  # requests still running at the deadline, cancelled
        self.errors: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.latency: dict[str, list[float]] = collections.defaultdict(list)

    def error(self, route: str, kind: str) -> None:
        self.errors[route][kind] += 1

    @property
    def server_errors(self) -> int:
        return sum(n for c in self.errors.values() for kind, n in c.items() if kind.startswith("HTTP 5"))


def _prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _error_kind(resp: aiohttp.ClientResponse) -> str:
    try:
        err = (await resp.json(content_type=None))["error"]
        return f"HTTP {resp.status} {err.get('code') or err.get('type')}"
    except (ValueError, KeyError, TypeError, aiohttp.ClientError):
        return f"HTTP {resp.status}"


async def _stream(resp: aiohttp.ClientResponse, drop_after: int | None) -> tuple[bool, str | None]:
    """Read an SSE reply: (dropped on purpose, error kind of an error event or None)."""
    chunks = 0
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            return False, f"stream error {event['error'].get('code') or event['error'].get('type')}"
        chunks += 1
        if drop_after is not None and chunks >= drop_after:
            resp.close()  # the client goes away mid-stream: the server must abort the generation
            return True, None
    return False, None


async def one(session: aiohttp.ClientSession, server: Server, route: str, rng: random.Random, args,
              tally: Tally) -> None:
    url = server.url
    max_tokens = rng.randint(4, args.max_tokens)
    drop = rng.randint(1, 4) if route.endswith("_stream") and rng.random() < args.drop_rate else None
    t0 = time.perf_counter()
    try:
        if route in ("models", "stats"):
            async with session.get(url + ("/v1/models" if route == "models" else "/v1/stats")) as r:
                await r.read()
                if r.status != 200:
                    tally.error(route, await _error_kind(r))
                    return
        elif route == "embeddings":
            inputs = [_prompt(rng, rng.randint(3, 40)) for _ in range(rng.randint(1, 4))]
            async with session.post(url + "/v1/embeddings", json={"model": server.embed, "input": inputs}) as r:
                if r.status != 200:
                    tally.error(route, await _error_kind(r))
                    return
                await r.read()
        else:
            chat = route.startswith("chat")
            body = {"max_tokens": max_tokens, "temperature": rng.choice([0, 0.7, 1.0]),
                    "stream": route.endswith("_stream")}
            if chat:
                body["messages"] = [{"role": "user", "content": _prompt(rng, rng.randint(5, 60))}]
            else:
                body["prompt"] = _prompt(rng, rng.randint(5, 60))
            if body["stream"]:
                body["stream_options"] = {"include_usage": True}
            async with session.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body) as r:
                if r.status != 200:
                    tally.error(route, await _error_kind(r))
                    return
                if body["stream"]:
                    dropped, err = await _stream(r, drop)
                    if err:
                        tally.error(route, err)
                        return
                    if dropped:
                        tally.dropped[route] += 1
                        return
                else:
                    await r.json()
    except asyncio.CancelledError:  # the run's deadline (plus grace) passed: the client hangs up
        tally.cut[route] += 1
        raise
    except asyncio.TimeoutError:
        tally.error(route, "timeout")
        return
    except (aiohttp.ClientError, ConnectionError) as e:
        tally.error(route, type(e).__name__)
        return
    tally.ok[route] += 1
    tally.latency[route].append(time.perf_counter() - t0)


async def client(i: int, server: Server, args, deadline: float, tally: Tally) -> None:
    rng = random.Random(args.seed * 1000 + i)
    routes, weights = zip(*MIX.items())
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(args.max_requests):
            if time.monotonic() >= deadline:
                return
            await one(session, server, rng.choices(routes, weights)[0], rng, args, tally)


async def sampler(server: Server, deadline: float, every: float, series: list) -> None:
    """/v1/stats every `every` seconds until the deadline: (t, rss MB, active, queued, scheduler)."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        while True:
            try:
                async with s.get(server.url + "/v1/stats") as r:
                    st = await r.json()
                series.append((round(time.monotonic() - t0), st["memory"]["rss_bytes"] / 2**20, st["active_streams"],
                               st["queued_streams"], st.get("scheduler", {})))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
                series.append((round(time.monotonic() - t0), None, None, None, {"error": type(e).__name__}))
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))


async def settle(server: Server, timeout: float = 30) -> dict:
    """/v1/stats once no stream is live (or after timeout): what the run left behind."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        while True:
            async with s.get(server.url + "/v1/stats") as r:
                st = await r.json()
            if st["active_streams"] == 0 and st["queued_streams"] == 0 or time.monotonic() >= deadline:
                return st
            await asyncio.sleep(0.25)


async def final_chat(server: Server) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        async with s.post(server.url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}) as r:
            return f"HTTP {r.status}" + ("" if r.status == 200 else f": {(await r.text())[:200]}")


def _pct(vals: list[float], q: float) -> float:
    return statistics.quantiles(vals, n=100)[q - 1] if len(vals) >= 2 else (vals[0] if vals else 0.0)


def report(args, tally: Tally, series: list, after: dict, chat: str, wall: float) -> int:
    print(f"\nsoak: {args.clients} clients x {args.minutes} min ({wall:.0f} s), model {args.model_name}, "
          f"max_tokens <= {args.max_tokens}, drop rate {args.drop_rate}")
    print(f"{'route':18s} {'ok':>6s} {'dropped':>8s} {'errors':>7s} {'cut':>5s} {'p50 s':>7s} {'p95 s':>7s}")
    for route in MIX:
        lat = tally.latency.get(route, [])
        print(f"{route:18s} {tally.ok[route]:6d} {tally.dropped[route]:8d} {sum(tally.errors[route].values()):7d} "
              f"{tally.cut[route]:5d} {_pct(lat, 50):7.2f} {_pct(lat, 95):7.2f}")
    print("(dropped: streams the client closed mid-way on purpose; cut: requests cancelled at the deadline)")
    total = sum(tally.ok.values()) + sum(tally.dropped.values()) + sum(tally.cut.values()) \
        + sum(sum(c.values()) for c in tally.errors.values())
    print(f"{total} requests, {total / max(wall, 1e-9):.1f}/s")
    kinds = collections.Counter()
    for route, c in tally.errors.items():
        for kind, n in c.items():
            kinds[kind] += n
    print("errors by type:", ", ".join(f"{k}: {n}" for k, n in kinds.most_common()) or "none")
    for route, c in sorted(tally.errors.items()):
        if c:
            print(f"  {route}: " + ", ".join(f"{k}: {n}" for k, n in c.most_common()))
    print("RSS series (t s: MB, active/queued streams):")
    print("  " + "  ".join(f"{t}: {mb:.0f} ({a}/{q})" if mb is not None else f"{t}: {sch.get('error')}"
                           for t, mb, a, q, sch in series))
    rss = [mb for _, mb, _, _, _ in series if mb is not None]
    if len(rss) >= 2:
        half = rss[len(rss) // 2:]
        print(f"RSS: start {rss[0]:.0f} MB, peak {max(rss):.0f} MB, end {rss[-1]:.0f} MB; second half "
              f"{min(half):.0f}-{max(half):.0f} MB (growth over the second half {half[-1] - half[0]:+.0f} MB)")
    caches = [m.get("prompt_cache") or {} for m in after.get("models", [])]
    print(f"host-RAM prompt cache (part of the RSS, bounded by --cache-ram): "
          f"{sum(c.get('bytes', 0) for c in caches) / 2**20:.0f} MB in {sum(c.get('entries', 0) for c in caches)} "
          f"entries, {sum(c.get('evictions', 0) for c in caches)} evicted")
    sched = after.get("scheduler", {})
    leaked = after.get("active_streams", 0) + after.get("queued_streams", 0)
    print(f"after the run: {after.get('active_streams')} active, {after.get('queued_streams')} queued streams; "
          f"scheduler alive={sched.get('alive')} restarts={sched.get('restarts')} "
          f"tick_errors={sched.get('tick_errors')}; "
          f"rejected (503) {after.get('rejected_requests')}; a fresh chat: {chat}")
    bad = tally.server_errors or leaked or sched.get("alive") is False or not chat.startswith("HTTP 200")
    print("verdict:", "PROBLEMS (see above)" if bad else "ok: no 5xx, no stream left behind, the server still answers")
    return 1 if bad else 0


async def run(args) -> int:
    assets = prepare(default_dest()) if not (args.model and (args.embed_model or args.no_embed_model)) else {}
    model = Path(args.model) if args.model else assets[args.model_name]
    args.model_name = model.name
    embed = None if args.no_embed_model else Path(args.embed_model) if args.embed_model else assets["minilm"]
    server = Server(model, embed, args.streams, args.ctx, args.threads)
    try:
        await server.wait_ready()
        tally, series = Tally(), []
        t0 = time.monotonic()
        deadline = t0 + args.minutes * 60
        sampling = asyncio.create_task(sampler(server, deadline, args.sample_s, series))
        clients = [asyncio.create_task(client(i, server, args, deadline, tally)) for i in range(args.clients)]
        # no new request starts after the deadline; one still running after the grace period is cancelled
        _, late = await asyncio.wait(clients, timeout=args.minutes * 60 + args.grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        await sampling
        wall = time.monotonic() - t0
        after = await settle(server)
        chat = await final_chat(server)
        code = report(args, tally, series, after, chat, wall)
        if server.proc.poll() is not None:
            print(f"the server exited with {server.proc.returncode}:\n{server.tail()}")
            code = 1
        return code
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--model", help="chat GGUF to serve (default: a test asset, see --model-name)")
    ap.add_argument("--model-name", default="smollm2", choices=("smollm2", "tiny"),
                    help="which test asset to serve when --model is not given")
    ap.add_argument("--embed-model", help="embedding GGUF (default: the all-MiniLM-L6-v2 test asset)")
    ap.add_argument("--no-embed-model", action="store_true", help="embed with the chat model instead")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: the server's default)")
    ap.add_argument("--max-tokens", type=int, default=24, help="largest completion a request asks for")
    ap.add_argument("--drop-rate", type=float, default=0.3, help="share of streams the client abandons mid-way")
    ap.add_argument("--max-requests", type=int, default=10_000, help="per client, a bound besides the time")
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--grace-s", type=float, default=10.0,
                    help="after the deadline, seconds requests still running may take before they are cancelled")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between /v1/stats samples")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.clients < 1 or args.minutes <= 0:
        ap.error("--clients must be >= 1 and --minutes > 0")
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
