"""Check that a GPU build of llamadesk runs a model on the GPU and answers as the CPU does.

Serves one GGUF twice in one headless llamadesk (`--gpu auto`): as `gpu` (gpu_layers = "auto": as many layers
as fit the GPU) and as `cpu` (gpu_layers = 0), asks both the same prompts greedily through the openai client,
and checks that the texts are equal (where they part, it reports the CPU's two likeliest tokens there) and
that /v1/models puts `gpu` on a GPU device with all its layers and `cpu` on none. On a CI GPU runner or a
desktop alike; on lavapipe (Mesa's software Vulkan device) only with GGML_VK_VISIBLE_DEVICES=0, since
ggml-vulkan passes over a Vulkan device of type CPU unless it is named.

Usage: python installer/gpu_check.py [--model GGUF] [--max-tokens N]
Exit status: 0 passed, 1 failed, 2 no GPU device (a CPU-only build, or no driver: nothing to check).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "llamadesk" / "test-assets" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ("Name three colours of the rainbow.", "What is the capital of France? Answer in one sentence.",
           "Write a haiku about the sea.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models(base: str) -> dict[str, dict]:
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        return {m["id"]: m for m in json.loads(r.read())["data"]}


def start(model: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    """A headless llamadesk serving model as `gpu` and `cpu`, once it answers /v1/models."""
    config = tmp / "llamadesk.toml"
    config.write_text(f'[[models]]\nname = "gpu"\npath = "{model}"\ndefault = true\nctx = 1024\nstreams = 1\n\n'
                      f'[[models]]\nname = "cpu"\npath = "{model}"\nctx = 1024\nstreams = 1\ngpu_layers = 0\n')
    port = _free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "XDG_DATA_HOME": str(tmp / "data")}
    proc = subprocess.Popen([sys.executable, "-m", "app", "--no-gui", "--config", str(config), "--port", str(port),
                             "--gpu", "auto", "--cache-disk", "0", "--access-log", "off"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            _models(base)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("llamadesk did not start:\n" + (tmp / "server.log").read_text()[-3000:])
            time.sleep(0.5)


def cpu_choices_where_they_part(client, prompt: str, max_tokens: int, at: int) -> list[tuple[str, float]]:
    """The CPU's two likeliest tokens (and log-probabilities) at the token holding character at of its answer:
    a near tie there means the backends' rounding, not a wrong kernel, parted the texts."""
    r = client.chat.completions.create(model="cpu", messages=[{"role": "user", "content": prompt}], temperature=0,
                                       max_tokens=max_tokens, logprobs=True, top_logprobs=2)
    end = 0
    for token in r.choices[0].logprobs.content:
        end += len(token.token)
        if end > at:
            return [(c.token, round(c.logprob, 3)) for c in token.top_logprobs]
    return []


def check(base: str, max_tokens: int) -> dict:
    """The two models' placements and greedy answers, and whether they pass."""
    import openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    models = _models(base)
    gpu, cpu = models["gpu"], models["cpu"]
    report = {"gpu": {"devices": gpu["devices"], "gpu_layers": gpu["gpu_layers"]},
              "cpu": {"devices": cpu["devices"], "gpu_layers": cpu["gpu_layers"]}, "prompts": []}
    same = True
    for prompt in PROMPTS:
        texts = {}
        for name in ("gpu", "cpu"):
            r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                               temperature=0, max_tokens=max_tokens)
            texts[name] = r.choices[0].message.content
        same = same and texts["gpu"] == texts["cpu"] and len(texts["cpu"]) > 0
        same_chars = len(os.path.commonprefix([texts["gpu"], texts["cpu"]]))
        entry = {"prompt": prompt, **texts, "equal": texts["gpu"] == texts["cpu"], "same_chars": same_chars}
        if not entry["equal"]:
            entry["cpu_top2_where_they_part"] = cpu_choices_where_they_part(client, prompt, max_tokens, same_chars)
        report["prompts"].append(entry)
    layers = gpu["gpu_layers"]
    report["on_gpu"] = layers["offloaded"] == layers["total"] > 0 and gpu["devices"][0] not in ("local", "CPU")
    report["cpu_on_cpu"] = cpu["gpu_layers"]["offloaded"] == 0 and cpu["devices"] == ["local"]
    report["passed"] = same and report["on_gpu"] and report["cpu_on_cpu"]
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL, help=f"the GGUF to serve (default: {MODEL})")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llamadesk-gpu-check-") as d:
        proc, base = start(args.model.resolve(), Path(d))
        try:
            report = check(base, args.max_tokens)
        finally:
            proc.terminate()
            proc.wait(60)
        log = (Path(d) / "server.log").read_text(errors="replace")
        report["log"] = [ln for ln in log.splitlines() if "layers on" in ln or "GPU:" in ln or "offloaded" in ln]
    print(json.dumps(report, indent=1))
    if report["gpu"]["devices"] == ["local"]:
        print("no GPU device: this llama-cpp-python offers none (a CPU-only build, or no GPU driver)",
              file=sys.stderr)
        return 2
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
