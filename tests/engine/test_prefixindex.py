"""The token-prefix index answers as a brute-force scan over the same sequences does."""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from engine.core.prefixindex import PrefixIndex, common_length, key_of

tokens = st.lists(st.integers(0, 6), max_size=12)  # a small alphabet: many shared prefixes


def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(tokens, tokens)
def test_common_length_is_the_longest_common_prefix(a, b):
    assert common_length(a, b) == _lcp(a, b) == common_length(key_of(a), key_of(b))


@settings(max_examples=300)
@given(st.lists(tokens, max_size=20), tokens, st.lists(st.integers(0, 19), max_size=5))
def test_queries_match_a_scan(held, query, removed):
    index = PrefixIndex()
    keys = {key_of(t) for t in held}
    for k in keys:
        index.add(k)
    for i in removed:
        if i < len(held):
            index.remove(key_of(held[i]))
            keys.discard(key_of(held[i]))
    q = key_of(query)
    assert len(index) == len(keys)
    best = max((_lcp(k, q) for k in keys), default=0)
    found = index.longest(q)
    assert (found[1] if found else 0) == best
    if found:
        assert _lcp(found[0], q) == best and found[0] in keys
    covering = index.covering(q)
    assert (covering is not None) == any(k.startswith(q) for k in keys)
    assert sorted(index.prefixes_of(q)) == sorted(k for k in keys if q.startswith(k))


def test_large_token_ids_and_long_prompts():
    rng = random.Random(1)
    system = [rng.randrange(262_144) for _ in range(3000)]  # a Gemma-sized vocabulary, a long shared prefix
    index = PrefixIndex()
    convs = [system + [rng.randrange(262_144) for _ in range(rng.randrange(1, 400))] for _ in range(500)]
    for c in convs:
        index.add(key_of(c))
    probe = convs[137] + [5, 6, 7]
    assert index.longest(key_of(probe)) == (key_of(convs[137]), len(convs[137]))
    assert index.longest(key_of(system + [1]))[1] >= 3000
