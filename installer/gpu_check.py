"""Check that a GPU build of llamadesk runs a model on the GPU and answers as the CPU does.

Serves one GGUF on the GPU (gpu_layers = "auto": as many layers as fit) and on the CPU (gpu_layers = 0) in one
headless llamadesk (`--gpu auto`), asks both the same prompts greedily through the openai client, and checks
that /v1/models puts the GPU copy on a GPU device with all its layers and the CPU copy on none, and that the
answers agree, twice:

- exact: the model's weights dequantized to F32 (gguf-py, into a temporary folder). Both backends then compute
  the same float matmuls and the greedy texts must be equal.
- as quantized: the GGUF as users run it. ggml's CPU kernels quantize the activations too (Q4_1 and Q4_0 weights
  meet Q8_1/Q8_0 activations) where a GPU shader dequantizes the weights, so the logits differ in their last
  digits and a greedy answer may part where two tokens are all but tied. Each text must be equal to the CPU's,
  or part where the CPU's two likeliest tokens are within --tie nats and the GPU goes on with the second.
  Where they part, the report gives the CPU's two choices there.

On a CI GPU runner or a desktop alike; on lavapipe (Mesa's software Vulkan device) only with
GGML_VK_VISIBLE_DEVICES=0, since ggml-vulkan passes over a Vulkan device of type CPU unless it is named.

Runs llamadesk from this checkout (with the python running this script), or a built bundle's executable (--exe).

Usage: python installer/gpu_check.py [--model GGUF] [--exe PATH/TO/llamadesk] [--max-tokens N] [--tie NATS]
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


def dequantized(model: Path, out: Path) -> Path:
    """model with every tensor in F32 (the keys as they are, file type ALL_F32): both backends' plain float path."""
    import gguf
    reader = gguf.GGUFReader(model)
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        # dequantize gives the rows as numpy lays them out (the GGUF's shape reversed); an F32 tensor comes flat
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype("float32")
        writer.add_tensor(t.name, data.reshape([int(n) for n in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def start(models: dict[str, Path], tmp: Path, exe: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A headless llamadesk (this checkout's, or the executable exe) serving each model as `<name>-gpu` and
    `<name>-cpu`, once it answers /v1/models."""
    config = tmp / "llamadesk.toml"
    config.write_text("".join(
        f'[[models]]\nname = "{name}-gpu"\npath = "{path}"\nctx = 1024\nstreams = 1\n\n'
        f'[[models]]\nname = "{name}-cpu"\npath = "{path}"\nctx = 1024\nstreams = 1\ngpu_layers = 0\n\n'
        for name, path in models.items()))
    port = _free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "XDG_DATA_HOME": str(tmp / "data")}
    command = [str(exe)] if exe else [sys.executable, "-m", "app"]
    proc = subprocess.Popen([*command, "--no-gui", "--config", str(config), "--port", str(port),
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


def cpu_choices_where_they_part(client, model: str, prompt: str, max_tokens: int,
                                at: int) -> tuple[int, list[tuple[str, float]]]:
    """Where the CPU's token holding character at of its answer starts, and the CPU's two likeliest tokens
    there (with their log-probabilities)."""
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
                                       max_tokens=max_tokens, logprobs=True, top_logprobs=2)
    start = 0
    for token in r.choices[0].logprobs.content:
        if start + len(token.token) > at:
            return start, [(c.token, round(c.logprob, 3)) for c in token.top_logprobs]
        start += len(token.token)
    return start, []


def compare(client, name: str, max_tokens: int, tie: float | None) -> list[dict]:
    """Each prompt's greedy answers from `<name>-gpu` and `<name>-cpu`, and whether they agree: equal, or (where
    tie is a number) parted at a near tie that the GPU took the other way."""
    entries = []
    for prompt in PROMPTS:
        texts = {}
        for where in ("gpu", "cpu"):
            r = client.chat.completions.create(model=f"{name}-{where}", temperature=0, max_tokens=max_tokens,
                                               messages=[{"role": "user", "content": prompt}])
            texts[where] = r.choices[0].message.content
        same_chars = len(os.path.commonprefix([texts["gpu"], texts["cpu"]]))
        entry = {"prompt": prompt, **texts, "equal": texts["gpu"] == texts["cpu"] and len(texts["cpu"]) > 0,
                 "same_chars": same_chars}
        entry["agree"] = entry["equal"]
        if not entry["equal"] and texts["cpu"]:
            start, top2 = cpu_choices_where_they_part(client, f"{name}-cpu", prompt, max_tokens, same_chars)
            entry["cpu_top2_where_they_part"] = top2
            entry["agree"] = tie is not None and parted_at_a_tie(texts["gpu"], texts["cpu"], start, top2, tie)
        entries.append(entry)
    return entries


def parted_at_a_tie(gpu: str, cpu: str, start: int, top2: list[tuple[str, float]], tie: float) -> bool:
    """Whether two greedy answers part at a near tie: from character start on, the CPU's answer goes on with its
    likeliest token and the GPU's with the CPU's second, whose log-probability is within tie nats of the first."""
    if len(top2) != 2:
        return False
    (first, first_logprob), (second, second_logprob) = top2
    return (first_logprob - second_logprob <= tie and gpu[:start] == cpu[:start] and cpu[start:].startswith(first)
            and gpu[start:].startswith(second))


def placements(models: dict[str, dict], name: str) -> dict:
    """Where /v1/models says the model's two copies run (a copy no longer loaded says nothing, and fails)."""
    gpu, cpu = models[f"{name}-gpu"], models[f"{name}-cpu"]
    none = {"offloaded": 0, "total": 0}
    layers = gpu.get("gpu_layers", none)
    return {"gpu": {"devices": gpu.get("devices", []), "gpu_layers": layers},
            "cpu": {"devices": cpu.get("devices", []), "gpu_layers": cpu.get("gpu_layers", none)},
            "on_gpu": layers["offloaded"] == layers["total"] > 0
            and gpu.get("devices", ["local"])[0] not in ("local", "CPU"),
            "cpu_on_cpu": cpu.get("gpu_layers", none)["offloaded"] == 0 and cpu.get("devices") == ["local"]}


def check(base: str, names: dict[str, float | None], max_tokens: int) -> dict:
    """Each model's placements and greedy answers (names: the model's name and its tie allowance, None for
    none), and whether they pass."""
    import openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    report = {}
    for name, tie in names.items():
        prompts = compare(client, name, max_tokens, tie)  # loads both copies: /v1/models says where a loaded one runs
        entry = {**placements(_models(base), name), "tie_nats": tie, "prompts": prompts}
        entry["passed"] = entry["on_gpu"] and entry["cpu_on_cpu"] and all(p["agree"] for p in prompts)
        report[name] = entry
    report["passed"] = all(entry["passed"] for entry in report.values())
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL, help=f"the GGUF to serve (default: {MODEL})")
    ap.add_argument("--exe", type=Path, help="a built llamadesk executable to check (default: this checkout)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--tie", type=float, default=0.25,
                    help="as quantized: how close (nats) the CPU's two likeliest tokens must be where the answers "
                         "part (default 0.25)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llamadesk-gpu-check-") as d:
        tmp = Path(d)
        model = args.model.resolve()
        proc, base = start({"exact": dequantized(model, tmp / "f32.gguf"), "quantized": model}, tmp,
                           args.exe and args.exe.resolve())
        try:
            report = check(base, {"exact": None, "quantized": args.tie}, args.max_tokens)
        finally:
            proc.terminate()
            proc.wait(60)
        log = (tmp / "server.log").read_text(errors="replace")
        report["log"] = [ln for ln in log.splitlines() if "layers on" in ln or "GPU:" in ln or "offloaded" in ln]
    print(json.dumps(report, indent=1))
    if report["quantized"]["gpu"]["devices"] in (["local"], []):
        print("no GPU device: this llama-cpp-python offers none (a CPU-only build, or no GPU driver)",
              file=sys.stderr)
        return 2
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
