"""The lifecycle policy: keep_alive durations as Ollama reads them, which idle models go for a load to fit."""
from __future__ import annotations

import pytest

from engine.errors import InvalidRequest
from engine.models.gguf import Footprint, NotGGUF, footprint, read_metadata
from engine.models.tenancy import Tenancy, parse_keep_alive, victims


@pytest.mark.parametrize("value, seconds", [
    (0, 0.0), (30, 30.0), (2.5, 2.5), ("0", 0.0), ("45s", 45.0), ("5m", 300.0), ("1h30m", 5400.0),
    ("300ms", 0.3), ("-1", None), (-1, None), ("-5m", None), ("1.5h", 5400.0)])
def test_keep_alive_reads_as_ollama_does(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", "m", "5x", True, [1], {"s": 1}, float("nan")])
def test_bad_keep_alive_names_the_field(value):
    with pytest.raises(InvalidRequest) as e:
        parse_keep_alive(value)
    assert e.value.param == "keep_alive"


def _t(name: str, gib: float, last: float) -> Tenancy:
    return Tenancy(name, Footprint(int(gib * 2**30), 0, 0), on_demand=True, ttl_s=None, last_used=last)


def test_victims_are_the_least_recently_used_idle_models_that_make_room():
    a, b, c = _t("a", 2, last=1), _t("b", 2, last=3), _t("c", 2, last=2)
    G = 2**30
    assert victims([a, b, c], set(), need=1 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) == []
    assert victims([a, b, c], set(), need=3 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) == [a]
    assert victims([a, b, c], {"a"}, need=3 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) == [c]
    assert victims([a, b, c], set(), need=5 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) == [a, c]
    assert victims([a, b, c], {"a", "b", "c"}, need=3 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) is None
    # a load in flight holds its reservation; the count limit evicts too
    assert victims([a, b, c], set(), need=1 * G, budget=8 * G, reserved=2 * G, max_loaded=0, loading=1) == [a]
    assert victims([a, b, c], set(), need=1 * G, budget=80 * G, reserved=0, max_loaded=2, loading=0) == [a, c]
    a.leases = 1  # a request is being routed to it: not evictable
    assert victims([a, b, c], set(), need=3 * G, budget=8 * G, reserved=0, max_loaded=0, loading=0) == [c]


def test_a_ttl_runs_from_the_last_use_and_a_keep_alive_overrides_it():
    t = Tenancy("m", Footprint(1, 0, 0), on_demand=True, ttl_s=10.0, last_used=100.0)
    assert not t.expired(109.0, busy=False) and t.expired(110.0, busy=False) and not t.expired(200.0, busy=True)
    t.keep(None)
    assert not t.expired(10_000.0, busy=False)
    t.keep(0.0)
    assert t.expired(100.0, busy=False)


def test_the_footprint_comes_from_the_header(assets):
    meta = read_metadata(assets["smollm2"])
    assert meta["llama.block_count"] == 30 and meta["tokenizer.ggml.tokens.length"] == 49152
    fp = footprint(assets["smollm2"], ctx=2048, streams=4, kv_dtype="f16", chunk=512)
    # 30 layers x 8192 cells x 3 KV heads x (64 + 64) dims x 2 bytes
    assert fp.kv == 30 * 8192 * 3 * 128 * 2 and fp.weights == assets["smollm2"].stat().st_size
    assert footprint(assets["smollm2"], 2048, 4, "q8_0", 512).kv < fp.kv
    minilm = footprint(assets["minilm"], 512, 1, "f16", 512)
    assert minilm.embedding and minilm.kv == 0 and not fp.embedding


def test_a_truncated_header_is_refused(assets, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(assets["smollm2"].read_bytes()[:5000])
    with pytest.raises(NotGGUF):
        read_metadata(cut)
    (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
    with pytest.raises(NotGGUF):
        read_metadata(tmp_path / "x.gguf")
