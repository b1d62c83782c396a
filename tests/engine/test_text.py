"""Incremental detokenization and stop strings."""
from __future__ import annotations

from engine.text import StopMatcher, Utf8Stream


def test_multibyte_character_split_across_tokens_is_never_emitted_half():
    data = "héllo 😀 ok".encode()
    for split in range(1, len(data)):
        u = Utf8Stream()
        out = [u.push(data[:split]), u.push(data[split:]), u.flush()]
        assert "".join(out) == "héllo 😀 ok"
        assert all("\ufffd" not in piece for piece in out)
    u = Utf8Stream()
    assert u.push("😀".encode()[:2]) == ""
    assert u.push("😀".encode()[2:]) == "😀"


def test_stop_string_found_across_chunks():
    m = StopMatcher(["</end>"])
    assert m.push("hello </") == ("hello ", False)  # held back: might start the stop string
    assert m.push("en") == ("", False)
    assert m.push("d> tail") == ("", True)


def test_partial_match_released_when_it_turns_out_not_to_be_a_stop():
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("ART") == ("START", False)
    assert m.push("x ST") == ("x ", False)
    assert m.flush() == "ST"


def test_earliest_of_several_stops_wins():
    m = StopMatcher(["b", "a"])
    assert m.push("xxab") == ("xx", True)
    assert StopMatcher([]).push("anything") == ("anything", False)
