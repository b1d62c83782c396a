"""The shipped catalog's invariants, fit badges and local presence."""
from __future__ import annotations

import dataclasses

from engine.catalog.entries import Entry, KINDS, default_catalog_path, fit_badge, load_catalog, local_state, memory_needed, \
    validate


def test_shipped_catalog_keeps_its_invariants():
    entries = load_catalog(default_catalog_path())  # raises on any broken invariant
    assert 30 <= len(entries) <= 45
    kinds = {e.kind for e in entries}
    assert kinds == set(KINDS)
    families = {e.family for e in entries if e.kind == "llm"}
    assert {"qwen3", "llama3", "gemma3", "gpt-oss", "smollm2", "mistral", "phi"} <= families
    assert any(e.thinking for e in entries if e.kind == "llm")
    gemma = next(e for e in entries if e.name == "gemma-3-4b-it-q4_k_m")
    assert gemma.towers and all(next(t for t in entries if t.name == n).kind == "mmproj" for n in gemma.towers)
    assert all(e.kv_bytes_per_token > 0 for e in entries if e.kind == "llm")


def test_validate_names_each_broken_invariant():
    good = Entry(name="a", kind="llm", file="a.gguf", url="https://x/a.gguf", sha256="0" * 64, size=1,
                 tool_format="hermes")
    bad = [good, dataclasses.replace(good, file="b.gguf"),  # duplicate name
           dataclasses.replace(good, name="c", file="c.gguf", sha256="XYZ", url="http://x", kind="movie"),
           dataclasses.replace(good, name="d", file="../d.gguf", towers=["nope"])]
    problems = " | ".join(validate(bad))
    for words in ("duplicate name a", "c: sha256", "c: url must be https", "c: unknown kind", "d: file must be",
                  "d: tower nope"):
        assert words in problems


def test_fit_badges_follow_memory():
    box = {"ram_bytes": 16 * 2**30, "vram_bytes": None}
    e = Entry(name="m", kind="llm", file="m.gguf", url="https://x", sha256="0" * 64, size=4 * 2**30, ctx=32768,
              kv_bytes_per_token=131072, tool_format="hermes")
    small = memory_needed(e, 4096, 4, "f16")
    assert small == 4 * 2**30 + 131072 * 4096 * 4 + 256 * 2**20
    assert fit_badge(small, box) == "fits"
    assert memory_needed(e, 4096, 4, "q8_0") < small
    assert fit_badge(memory_needed(e, 32768, 4, "f16"), box) == "too big"
    assert fit_badge(int(0.8 * 16 * 2**30), box) == "tight"


def test_local_state(tmp_path):
    e = Entry(name="m", kind="llm", file="m.gguf", url="https://x", sha256="a" * 64, size=3)
    assert local_state(e, tmp_path)["state"] == "absent"
    (tmp_path / "m.gguf.part").write_bytes(b"x")
    assert local_state(e, tmp_path) == {"state": "partial", "path": str(tmp_path / "m.gguf.part"), "bytes": 1}
    (tmp_path / "m.gguf").write_bytes(b"abc")
    assert local_state(e, tmp_path)["state"] == "present"
    (tmp_path / "m.gguf.sha256").write_text("a" * 64 + "  m.gguf\n")
    assert local_state(e, tmp_path)["state"] == "verified"
