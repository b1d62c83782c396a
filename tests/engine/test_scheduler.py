"""The scheduling policy, driven by a fake runner (no llama.cpp)."""
from __future__ import annotations

from engine.core.request import Request as Stream, RequestState as StreamState
from engine.core.scheduler import Scheduler


class FakeRunner:
    """Plays the runner's part: 'decodes' a step and samples a fixed next token per stream."""

    def __init__(self, sched: Scheduler, max_new: int):
        self.sched = sched
        self.max_new = max_new
        self.steps: list = []

    def tick(self) -> bool:
        self.sched.admit()
        self.attach()
        step = self.sched.schedule()
        if step.n_tokens == 0:
            return False
        self.steps.append(step)
        self.sched.advance(step)
        sampled = list(step.decode) + [s for s, _ in step.prefill if self.sched.prompt_done(s)]
        for s in sampled:
            if s.state is StreamState.PREFILL:
                self.sched.start_decoding(s)
            s.generated.append(1000 + len(s.generated))
            if len(s.generated) >= self.max_new:
                self.sched.finish(s)
        return True

    def attach(self) -> None:
        """What the real runner does between admission and planning (SharingRunner: attach prefixes)."""


def stream(name: str, n: int, base: int = 0) -> Stream:
    return Stream(id=name, prompt=list(range(base, base + n)))


def test_decoding_streams_share_one_step_and_prefill_respects_the_chunk():
    sched = Scheduler(n_seq=4, chunk=100)
    runner = FakeRunner(sched, max_new=50)
    for i in range(4):
        sched.add(stream(f"s{i}", 10, base=i * 1000))
    runner.tick()
    assert runner.steps[0].n_tokens == 40  # four 10-token prompts fit in one chunk
    runner.tick()
    assert len(runner.steps[1].decode) == 4 and not runner.steps[1].prefill


def test_a_long_prompt_is_sliced_and_never_stalls_decoding_streams():
    sched = Scheduler(n_seq=2, chunk=64)
    runner = FakeRunner(sched, max_new=100)
    sched.add(stream("short", 5))
    runner.tick()
    runner.tick()
    sched.add(stream("long", 300, base=5000))
    slices = []
    for _ in range(5):
        runner.tick()
        step = runner.steps[-1]
        assert [s.id for s in step.decode][:1] == ["short"]  # the running stream advances every tick
        slices += [n for s, n in step.prefill]
    assert slices == [64, 64, 64, 64, 44]
    assert all(step.n_tokens <= 64 + 2 for step in runner.steps)


def test_queue_is_fifo_and_sequences_are_recycled():
    sched = Scheduler(n_seq=2, chunk=512)
    runner = FakeRunner(sched, max_new=3)
    for i in range(5):
        sched.add(stream(f"s{i}", 4, base=100 * i))
    order = []
    while runner.tick():
        for s in sched.running:
            if s.id not in order:
                order.append(s.id)
    assert order == ["s0", "s1", "s2", "s3", "s4"]
    assert sorted(sched.free_seqs) == [0, 1]


def test_prefix_reuse_picks_the_longest_common_prefix():
    sched = Scheduler(n_seq=3, chunk=512)
    runner = FakeRunner(sched, max_new=2)
    a, b = stream("a", 20), stream("b", 20, base=500)
    sched.add(a)
    sched.add(b)
    while runner.tick():
        pass
    # b's sequence holds tokens 500..519 plus its first generated token
    follow = Stream(id="c", prompt=list(range(500, 515)) + [7, 8, 9])
    sched.add(follow)
    (admitted, keep, _), = sched.admit()
    assert admitted.seq == b.seq and keep == 15
    assert admitted.num_cached_tokens == 15 and sched.seq_tokens[b.seq] == list(range(500, 515))


def test_identical_prompt_recomputes_only_the_last_token():
    sched = Scheduler(n_seq=1, chunk=512)
    runner = FakeRunner(sched, max_new=2)
    sched.add(stream("a", 10))
    while runner.tick():
        pass
    again = stream("again", 10)
    sched.add(again)
    (_, keep, _), = sched.admit()
    assert keep == 9
    step = sched.schedule()
    assert step.prefill == [(again, 1)]


def test_cancel_while_queued_or_running():
    sched = Scheduler(n_seq=1, chunk=512)
    runner = FakeRunner(sched, max_new=100)
    first, second = stream("first", 4), stream("second", 4, base=50)
    sched.add(first)
    sched.add(second)
    runner.tick()
    sched.finish(second)  # still queued
    assert second.state is StreamState.DONE and not sched.waiting
    sched.finish(first)
    assert not sched.waiting and not sched.running and sched.free_seqs == [0]


class SharingRunner(FakeRunner):
    """A fake runner over a unified pool: attaches the longest prefix another sequence holds, as the real one."""

    def attach(self) -> None:
        for s in list(self.sched.running):
            src = self.sched.attach_source(s)
            if src is not None:
                self.sched.attached(s, src[1])


def test_a_burst_sharing_a_prefix_computes_it_once():
    sched = Scheduler(n_seq=2, chunk=64, share=True)
    runner = SharingRunner(sched, max_new=3)
    shared = list(range(200))
    a, b = stream("a", 0), stream("b", 0)
    a.prompt, b.prompt = shared + [900, 901], shared + [950, 951, 952]
    sched.add(a)
    sched.add(b)
    runner.tick()
    assert [s.id for s, _ in runner.steps[0].prefill] == ["a"]  # b waits: a is computing what they share
    while runner.tick():
        pass
    prefilled = {s.id: sum(n for r, n in (p for st in runner.steps for p in st.prefill) if r is s) for s in (a, b)}
    assert prefilled == {"a": 202, "b": 3}  # b attached the 200 shared tokens and computed its own 3
    assert b.reused_tokens == 200 and b.state is StreamState.DONE


def test_only_earlier_requests_are_waited_for_and_a_cancelled_source_releases_the_wait():
    sched = Scheduler(n_seq=2, chunk=32, share=True)
    runner = SharingRunner(sched, max_new=2)
    shared = list(range(100))
    a, b = stream("a", 0), stream("b", 0)
    a.prompt, b.prompt = shared + [1], shared + [2]
    sched.add(a)
    sched.add(b)
    runner.tick()
    assert not sched.waits_for_prefix(a) and sched.waits_for_prefix(b)  # never the other way round
    sched.finish(a)  # cancelled mid-prefill: b computes the prefix itself
    assert not sched.waits_for_prefix(b)
    assert sched.attach_source(b) == (a.seq, 32)  # what a had computed stays attachable
    while runner.tick():
        pass
    assert b.state is StreamState.DONE and b.reused_tokens == 32


def test_attach_needs_a_longer_prefix_than_the_request_has_and_sharing_on():
    off = Scheduler(n_seq=2, chunk=64)
    r = stream("r", 40)
    off.seq_tokens[1] = list(range(40))
    off.add(r)
    off.admit()
    assert off.attach_source(r) is None and not off.waits_for_prefix(r)
    on = Scheduler(n_seq=3, chunk=64, share=True)
    on.seq_tokens[1] = list(range(10))  # too short to be worth it (MIN_SHARE)
    on.seq_tokens[2] = list(range(39)) + [7]
    r = stream("r", 40)
    on.add(r)
    on.admit()  # takes sequence 2 (the longest prefix: 39 tokens kept)
    assert r.seq == 2 and r.num_cached_tokens == 39 and on.attach_source(r) is None
