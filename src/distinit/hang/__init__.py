"""The live hang verdict: which rank the others wait for in a collective, while every rank is still alive.

After :func:`distinit.setup`, its liveness thread samples each rank's main-thread stack once a beat and compares
the ranks through the group's store. When some ranks have waited in the same ``torch.distributed`` call for
``hang_after`` seconds (default 10, or twice the median time between collectives once known), every rank logs
one verdict, the same words on every rank, naming the rank that is elsewhere (its own code, stopped, holding the
GIL, gone) or saying that the ranks called different collectives, or that none is missing. No change to the
user's code; ``setup(on_hang="abort")`` also stops every rank with :data:`HANG_EXIT_CODE`, the culprit first.
See docs/hangs.md.
"""

from distinit.hang._position import Position, Sampler, beat_of, still_of
from distinit.hang._verdict import DEFAULT_HANG_AFTER, HangVerdict, RankState, judge, threshold
from distinit.hang._watch import (
    HANG_AFTER_VARIABLE,
    HANG_EXIT_CODE,
    VERDICT_FILE_VARIABLE,
    HangSettings,
    HangWatch,
    OnHang,
    Peers,
    parse_record,
    states_of,
)

# Pickles and reprs name the public module, which stays put when the private ones move.
for _public in (HangSettings, HangVerdict, HangWatch, Peers, Position, RankState, Sampler):
    _public.__module__ = __name__
del _public

__all__ = [
    "DEFAULT_HANG_AFTER",
    "HANG_AFTER_VARIABLE",
    "HANG_EXIT_CODE",
    "VERDICT_FILE_VARIABLE",
    "HangSettings",
    "HangVerdict",
    "HangWatch",
    "OnHang",
    "Peers",
    "Position",
    "RankState",
    "Sampler",
    "beat_of",
    "judge",
    "parse_record",
    "states_of",
    "still_of",
    "threshold",
]
