"""How long the hang judge takes each rank to be silent (pure: the beats and positions it read, and when)."""

from __future__ import annotations

import math

from distinit.init._liveness import NOPOS, silence

NOW = 1000.0


def test_silent_since_the_beat_last_changed() -> None:
    silent, process = silence([1, 2], beats={1: (b"7|1.0", NOW - 12), 2: (b"9|1.0", NOW - 0.5)},
                              positions={1: (7, NOW - 12), 2: (9, NOW - 0.5)}, left=set(), now=NOW)  # fmt: skip
    assert silent == {1: 12.0, 2: 0.5}
    assert process == {}


def test_a_position_newer_than_the_beat_read_before_it_is_a_rank_alive_just_now() -> None:
    """The judge reads every beat, then every position: a rank that beat and published in between (here after
    15 s holding the GIL) shows its old beat and its new position. It is not silent (it was taken to be, and
    the verdict flipped from naming it to "none is missing" on the one rank that read it then)."""
    silent, process = silence([2], beats={2: (b"40|1.0", NOW - 15)}, positions={2: (41, NOW)}, left=(), now=NOW)
    assert silent == {2: 0.0}
    assert process == {}


def test_the_same_beat_in_both_reads_is_still_silent() -> None:
    silent, _ = silence([2], beats={2: (b"40|1.0", NOW - 15)}, positions={2: (40, NOW - 15)}, left=(), now=NOW)
    assert silent == {2: 15.0}


def test_a_rank_that_left_is_silent_for_ever() -> None:
    silent, process = silence([3], beats={}, positions={3: (5, NOW - 1)}, left={3}, now=NOW)
    assert silent == {3: math.inf}
    assert process == {3: "left"}


def test_beating_without_a_fresh_position_is_nopos() -> None:
    behind = 50 - NOPOS
    silent, process = silence([1], beats={1: (b"50|1.0", NOW)}, positions={1: (behind, NOW - 9)}, left=(), now=NOW)
    assert process == {1: "nopos"}
    assert 1 not in silent
    silent, process = silence([1], beats={1: (b"50|1.0", NOW)}, positions={1: (behind + 1, NOW)}, left=(), now=NOW)
    assert process == {} and silent == {1: 0.0}


def test_without_a_beat_the_position_says_how_long() -> None:
    silent, _ = silence([1, 2], beats={}, positions={1: (3, NOW - 4)}, left=(), now=NOW)
    assert silent == {1: 4.0, 2: 0.0}
