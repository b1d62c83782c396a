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
    (admitted, keep), = sched.admit()
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
    (_, keep), = sched.admit()
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
