"""The remote backends' policy (engine/remote.py) with a fake health probe: which replica takes an attempt,
when a failing one is out and when it is checked again. The relay itself is tested in tests/server/test_remote.py."""
from __future__ import annotations

import asyncio
import time

from engine import remote
from engine.config import ModelEntry
from engine.remote import RemoteModel, Remotes, backoff_s, base_url


def _model(*urls: str) -> RemoteModel:
    return RemoteModel.from_entry(ModelEntry(name="far", backend="remote", urls=list(urls)), created=0)


def test_base_url_takes_a_bare_host_as_its_v1_and_keeps_a_path():
    assert base_url("http://gpu-box:8000") == "http://gpu-box:8000/v1"
    assert base_url("HTTP://gpu-box:8000/v1/") == "http://gpu-box:8000/v1"
    assert base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai/v1"


def test_replicas_are_deduplicated_after_normalizing():
    m = RemoteModel.from_entry(ModelEntry(name="far", backend="remote", url="http://a:1",
                                          urls=["http://a:1/v1/", "http://b:1/v1"]), created=0)
    assert [r.url for r in m.replicas] == ["http://a:1/v1", "http://b:1/v1"]
    assert m.remote_model == "far" and m.timeout_s == remote.DEFAULT_TIMEOUT_S


def test_the_least_busy_replica_is_picked_and_a_tie_goes_to_the_least_recently_picked():
    m = _model("http://a/v1", "http://b/v1", "http://c/v1")
    a, b, c = m.replicas
    a.outstanding, b.outstanding, c.outstanding = 2, 1, 1
    first = m.pick(set())
    assert first in (b, c)
    assert m.pick(set()) is ({b, c} - {first}).pop()  # the tie alternates
    b.outstanding = 0
    assert m.pick(set()) is b
    assert m.pick({b}) in (a, c) and m.pick({a, b, c}) is None


def test_an_out_of_service_replica_is_skipped_unless_every_one_left_is_out():
    m = _model("http://a/v1", "http://b/v1")
    a, b = m.replicas
    now = time.monotonic()
    a.outstanding = 5
    b.fail("refused", now)
    assert not b.in_service and m.pick(set()) is a
    a.fail("refused", now + 1)
    assert m.pick(set()) is b  # both out: the one due back soonest is the last resort
    assert m.pick({b}) is a


def test_backoff_doubles_per_failed_check_and_requests_failing_together_count_once():
    assert [backoff_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0] and backoff_s(50) == remote.BACKOFF_MAX_S
    r = _model("http://a/v1").replicas[0]
    r.fail("refused", 100.0)
    r.fail("refused", 100.0)  # another request that was on its way
    assert (r.failures, r.next_check) == (1, 100.5)
    r.fail("still refused", 100.5, checked=True)
    assert (r.failures, r.next_check, r.last_error) == (2, 101.5, "still refused")
    r.recover(102.0)
    assert r.in_service and r.failures == 0 and r.next_check == 102.0 + remote.HEALTH_EVERY_S


def test_the_watch_checks_due_replicas_and_puts_a_recovered_one_back():
    m = _model("http://a/v1", "http://b/v1")
    a, b = m.replicas
    answers = {"http://a/v1": ["refused", None], "http://b/v1": [None]}
    checked = []

    async def probe(model: RemoteModel, r) -> str | None:
        checked.append(r.url)
        said = answers[r.url]
        return said.pop(0) if len(said) > 1 else said[0]

    async def main():
        watch = asyncio.ensure_future(Remotes([m]).watch(probe))
        deadline = time.monotonic() + 5
        while checked.count(a.url) < 2:
            assert time.monotonic() < deadline, checked
            await asyncio.sleep(0.01)
        watch.cancel()
    asyncio.run(main())
    # a: out after its first check, back after the second (half a second later); b: checked once, healthy
    assert a.in_service and a.failures == 0 and a.last_error == "refused"
    assert b.in_service and checked.count(b.url) == 1
