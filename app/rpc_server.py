"""`llamadesk rpc-server`: llama.cpp's own rpc-server, for the machines that hold layers of a model another
llamadesk serves with --rpc. It has no authentication: whoever reaches its port can use it and read or write
the memory it holds, so it listens on 127.0.0.1 unless --host says otherwise (a LAN you trust)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import platformdirs

LLAMA_CPP_VERSION = "0.3.36"  # the vendored llama.cpp whose RPC protocol the wheel speaks (Makefile)
BINARY = "ggml-rpc-server"


def find_binary() -> Path | None:
    """The rpc-server to run: $LLAMADESK_RPC_SERVER, one shipped beside the bundle, or the cached build."""
    if os.environ.get("LLAMADESK_RPC_SERVER"):
        return Path(os.environ["LLAMADESK_RPC_SERVER"])
    name = BINARY + (".exe" if sys.platform == "win32" else "")
    bundled = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / name
    cached = Path(platformdirs.user_cache_dir("llamadesk")) / f"llama.cpp-{LLAMA_CPP_VERSION}" / "build" / "bin" / name
    return next((p for p in (bundled, cached) if p.is_file()), None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamadesk rpc-server",
                                description="Serve this machine's CPU to a llamadesk that runs a model with --rpc.")
    p.add_argument("--port", "-p", type=int, required=True, help="TCP port to listen on (llama.cpp's is 50052)")
    p.add_argument("--host", "-H", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1); another one exposes an unauthenticated server")
    p.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (0: llama.cpp's default)")
    return p


def command(binary: Path, args: argparse.Namespace) -> list[str]:
    """The rpc-server command line for the parsed flags."""
    cmd = [str(binary), "--host", args.host, "--port", str(args.port)]
    return cmd + (["--threads", str(args.threads)] if args.threads > 0 else [])


def main(argv: list[str]) -> int:
    """Run rpc-server in the foreground (in this process on POSIX) until it ends; 2 when it is not there."""
    args = build_parser().parse_args(argv)
    if not 0 < args.port < 65536 or args.threads < 0:
        print("llamadesk rpc-server: error: --port is 1..65535 and --threads at least 0", file=sys.stderr)
        return 2
    binary = find_binary()
    if binary is None or not binary.is_file():
        print(f"llamadesk rpc-server: error: llama.cpp's {BINARY} is not built. In a llamadesk source checkout run "
              f"`make rpc-server` (it builds it from the vendored llama.cpp {LLAMA_CPP_VERSION} into "
              f"{platformdirs.user_cache_dir('llamadesk')}), or set LLAMADESK_RPC_SERVER to the path of an "
              "rpc-server built from that same llama.cpp (the RPC protocol must match).", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"llamadesk rpc-server: listening on {args.host}: rpc-server has no authentication; use it on a "
              "LAN you trust only", file=sys.stderr)
    cmd = command(binary, args)
    if os.name == "posix":  # the rpc-server takes this process over: signals and its exit status are its own
        os.execv(cmd[0], cmd)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:  # Ctrl-C reached the child too; it has ended
        return 130
