"""Prompt-cache traffic, side by side in one run: llamadesk (unified KV, shared prefixes, host-RAM cache) and
llama.cpp's llama-server -np 4 -kvu with its default --cache-ram, same GGUF, threads and context.

  (a) 8 concurrent chats sharing a ~700-token system prompt: a first burst, then two more bursts with
      other questions (prefilled tokens and mean time to first token per burst);
  (b) 8 conversations x 3 turns over 4 streams, each turn resending its history (more conversations
      than streams: evicted ones come back from RAM): prefilled tokens and wall time;
  (b2) the same with one shared ~700-token system prompt (a chat UI's fixed prompt) instead of one per
      conversation.

Prefilled tokens come from each response's llama-server `timings.prompt_n` (both servers report it).
Systems alternate scenario by scenario, the order rotated per rep; each rep runs on fresh servers.
Not a test (speed is measured here, never asserted). Run: python tests/bench/bench_cache.py [--reps 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT))

from tests.assets.prepare import default_dest, prepare  # noqa: E402
from tests.bench import shape_model  # noqa: E402
from tests.bench.bench_concurrency import System, free_port  # noqa: E402

SYSTEM = ("You are the help desk of a public library. You answer questions about opening hours, loans, "
          "reading rooms, the map collection, events for children and the digital archive. Be brief and "
          "friendly, and say when you do not know. ") * 9
QUESTIONS = ["Where are the maps?", "When do you open on Sunday?", "Can I renew a loan online?",
             "Is there a reading room?", "Do you have events for children?", "How do I use the archive?",
             "Can I print documents?", "Is there wifi?", "Where can I park?", "Do you lend e-books?",
             "How long is a loan?", "Can I bring food?", "Are dogs allowed?", "Is there a quiet room?",
             "Do you buy old books?", "Can I book a room?", "Who can get a card?", "Is it free?",
             "Do you have newspapers?", "Can I donate books?", "Are there lockers?", "Do you have a cafe?",
             "Can I scan photos?", "Is there a lift?"]


def start(name: str, args, model: Path) -> System:
    t, ctx, port = str(args.threads), args.ctx, free_port()
    if name == "llamadesk":
        cfg = Path("/tmp/bench-cache-llamadesk.toml")
        cfg.write_text("")
        return System(name, [sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "-m", str(model), "--port",
                             str(port), "--threads", t, "--streams", "4", "--ctx", str(ctx), "--log-level", "warning",
                             "--access-log", "off", "--cache-disk", "0"], port, {})  # each rep starts cold
    binary = args.llama_server or str(Path.home() / ".cache/llamadesk/llama.cpp-0.3.36/build/bin/llama-server")
    return System(name, [binary, "-m", str(model), "--port", str(port), "-t", t, "-tb", t, "-np", "4", "-kvu",
                         "-c", str(ctx * 4), "--no-webui"], port, {})


async def chat(session: aiohttp.ClientSession, s: System, messages: list[dict], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    ttft, text, timings = None, "", {}
    async with session.post(s.url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ch = json.loads(line[6:])
            for c in ch.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    text += piece
            timings = ch.get("timings") or timings
    return {"ttft": ttft or time.perf_counter() - t0, "text": text, "prompt_n": timings.get("prompt_n", 0),
            "cache_n": timings.get("cache_n", 0)}


async def shared_prompt(s: System, bursts: int = 3, width: int = 8) -> list[dict]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        for b in range(bursts):
            qs = QUESTIONS[b * width:(b + 1) * width]
            rs = await asyncio.gather(*(chat(session, s, [{"role": "system", "content": SYSTEM},
                                                          {"role": "user", "content": q}], 16) for q in qs))
            out.append({"prefilled": sum(r["prompt_n"] for r in rs), "ttft": statistics.mean(r["ttft"] for r in rs)})
    return out


async def conversations(s: System, n: int = 8, turns: int = 3, shared: bool = False) -> dict:
    t0 = time.perf_counter()
    prefilled = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        async def one(i: int) -> int:
            system = SYSTEM if shared else f"You are assistant number {i}. " + SYSTEM[:600]
            history = [{"role": "system", "content": system}]
            total = 0
            for t in range(turns):
                history.append({"role": "user", "content": QUESTIONS[(i * turns + t) % len(QUESTIONS)]})
                r = await chat(session, s, history, 32)
                history.append({"role": "assistant", "content": r["text"]})
                total += r["prompt_n"]
            return total
        prefilled = sum(await asyncio.gather(*(one(i) for i in range(n))))
    return {"prefilled": prefilled, "wall": time.perf_counter() - t0}


async def run(args) -> None:
    if args.shape:
        model = shape_model.ensure(args.shape, Path.home() / ".cache/llamadesk/bench-models")
    else:
        model = Path(args.model) if args.model else prepare(default_dest())["smollm2"]
    names = ["llamadesk", "llama-server"]
    scenarios = {"a": shared_prompt, "b": conversations, "b2": lambda s: conversations(s, shared=True)}
    res: dict[str, dict[str, list]] = {n: {k: [] for k in scenarios} for n in names}
    for rep in range(args.reps):
        order = names[rep % 2:] + names[:rep % 2]
        for scenario in scenarios:
            for name in order:
                s = start(name, args, model)
                try:
                    await s.wait_ready()
                    r = await scenarios[scenario](s)
                finally:
                    s.stop()
                res[name][scenario].append(r)
                print(f"rep {rep} {scenario} {name:12s} {r}", flush=True)
    print(f"\nmodel {model.name}, threads {args.threads}, ctx/stream {args.ctx}, {args.reps} reps (medians)")
    print(f"{'system':13s} {'(a) prefilled b1/b2/b3':>24s} {'(a) ttft b1/b2/b3':>20s} {'(b) prefilled':>14s} {'(b) wall':>9s}"
          f" {'(b2) prefilled':>15s} {'(b2) wall':>10s}")
    med = statistics.median
    for n in names:
        a, b, b2 = res[n]["a"], res[n]["b"], res[n]["b2"]
        pre = "/".join(f"{med(r[i]['prefilled'] for r in a):.0f}" for i in range(3))
        tt = "/".join(f"{med(r[i]['ttft'] for r in a):.2f}" for i in range(3))
        print(f"{n:13s} {pre:>24s} {tt:>20s} {med(r['prefilled'] for r in b):14.0f} {med(r['wall'] for r in b):8.1f}s"
              f" {med(r['prefilled'] for r in b2):15.0f} {med(r['wall'] for r in b2):9.1f}s")
    d, l = res["llamadesk"], res["llama-server"]
    for i in range(3):
        ratio = med(x[i]["prefilled"] for x in d["a"]) / max(1, med(x[i]["prefilled"] for x in l["a"]))
        tratio = med(x[i]["ttft"] for x in d["a"]) / med(x[i]["ttft"] for x in l["a"])
        print(f"(a) burst {i + 1}: llamadesk / llama-server prefilled {ratio:.2f}, mean TTFT {tratio:.2f}")
    for k in ("b", "b2"):
        walls = [x["wall"] / y["wall"] for x, y in zip(d[k], l[k])]  # paired: the same rep's fresh servers
        print(f"({k}) llamadesk / llama-server prefilled "
              f"{med(x['prefilled'] for x in d[k]) / max(1, med(y['prefilled'] for y in l[k])):.2f}, wall "
              f"{med(x['wall'] for x in d[k]) / med(y['wall'] for y in l[k]):.2f} (paired per rep: "
              + ", ".join(f"{w:.2f}" for w in walls) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF to serve (default: the SmolLM2-135M test asset)")
    ap.add_argument("--shape", choices=sorted(shape_model.SHAPES),
                    help="serve a random-weight GGUF of this model's shape instead (tests/bench/shape_model.py)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=2048, help="context per stream")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--llama-server", help="path of a llama-server binary (default: tests/bench/build_llama_server.sh's)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
