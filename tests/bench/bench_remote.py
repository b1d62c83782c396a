"""Aggregate throughput of 8 streams through a remote roster entry, side by side in one run:

  (a) direct: the client talks to replica B itself
  (b) one replica: the client talks to front A, whose roster entry relays to B
  (c) two replicas: the client talks to A, whose roster entry balances over B and C

B and C are llamadesk processes serving the same GGUF with one thread each, each pinned to its own core
(`taskset`), so two replicas stand for two machines; A (the relay) and the client are not pinned. Each request
is a streamed /v1/completions of a unique ~100-token prompt with 128 tokens forced, temperature 0. The three
paths are interleaved, the order rotated every rep; medians and paired ratios printed.

Not a test (speed is measured here, never asserted). Run: python tests/bench/bench_remote.py [--reps 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.assets.prepare import default_dest, prepare  # noqa: E402
from tests.bench.bench_concurrency import System, free_port, level  # noqa: E402


def backend(name: str, model: Path, core: int | None, streams: int, ctx: int) -> System:
    port = free_port()
    cfg = Path(f"/tmp/bench-remote-{name}.toml")
    cfg.write_text("")
    pin = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    return System(name, pin + [sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "-m", str(model),
                               "--port", str(port), "--threads", "1", "--streams", str(streams), "--ctx", str(ctx),
                               "--log-level", "warning", "--cache-disk", "0"], port, {"ignore_eos": True})


def front(name: str, tiny: Path, urls: list[str], upstream: str) -> System:
    """A llamadesk whose roster names one remote model `far` over urls (it serves the tiny model locally)."""
    port = free_port()
    cfg = Path(f"/tmp/bench-remote-{name}.toml")
    cfg.write_text('[[models]]\nname = "far"\nbackend = "remote"\n'
                   f"urls = {json.dumps([u + '/v1' for u in urls])}\n"
                   f'remote_model = "{upstream}"\n')
    return System(name, [sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "-m", str(tiny),
                         "--port", str(port), "--threads", "1", "--streams", "1", "--log-level", "warning",
                         "--cache-disk", "0"], port, {"ignore_eos": True, "model": "far"})


async def run(args) -> None:
    assets = prepare(default_dest())
    model = Path(args.model) if args.model else assets["smollm2"]
    b = backend("replica-b", model, 0, args.streams, args.ctx)
    c = backend("replica-c", model, 1, args.streams, args.ctx)
    one = front("front-one", assets["tiny"], [b.url], model.stem)
    two = front("front-two", assets["tiny"], [b.url, c.url], model.stem)
    paths = {"direct": b, "one replica": one, "two replicas": two}
    everything = [b, c, one, two]
    try:
        for s in everything:
            await s.wait_ready()
        for s in paths.values():  # untimed warm-up
            await level(s, 2, 16, seed=999)
        results: dict[str, list[dict]] = {n: [] for n in paths}
        seed = 0
        names = list(paths)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for n in order:
                seed += 1
                r = await level(paths[n], args.n, args.max_tokens, seed)
                results[n].append(r)
                print(f"rep {rep} {n:13s} x{args.n}: {r['agg_tok_s']:6.1f} tok/s  ttft {r['ttft']:.2f}s"
                      f"{'' if r['all_length'] else '  (some ended early!)'}", flush=True)
        report(results, args, model)
    finally:
        for s in everything:
            s.stop()


def report(results: dict[str, list[dict]], args, model: Path) -> None:
    print(f"\nmodel {model.name}, {args.n} streams, {args.max_tokens} tokens, 1 thread per replica, "
          f"{args.reps} reps (medians)")
    print(f"{'path':14s} {'tok/s':>8s} {'ttft':>7s}")
    for n, rs in results.items():
        print(f"{n:14s} {statistics.median(r['agg_tok_s'] for r in rs):8.1f} "
              f"{statistics.median(r['ttft'] for r in rs):6.2f}s")
    for a, b in (("one replica", "direct"), ("two replicas", "one replica"), ("two replicas", "direct")):
        ratios = [x["agg_tok_s"] / y["agg_tok_s"] for x, y in zip(results[a], results[b])]
        print(f"{a} / {b}: median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
              f"over {len(ratios)} paired reps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF the replicas serve (default: the SmolLM2-135M test asset)")
    ap.add_argument("--n", type=int, default=8, help="concurrent streams")
    ap.add_argument("--streams", type=int, default=8, help="streams per replica")
    ap.add_argument("--ctx", type=int, default=1024, help="context per stream")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
