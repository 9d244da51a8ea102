"""The store host (rank 0) died after this rank joined: say so in seconds instead of "missing ranks [0]" later.

Rank 0's store dies with it, so no heartbeat verdict can be published. A joined rank whose store
connection fails probes MASTER_ADDR:MASTER_PORT: refused for :data:`~distinit.init._pace.STALE` s
in a row means nothing serves the port any more (a frozen host or a lost network answers differently, and
a restarted rank 0 answers again); then it raises :class:`~distinit.errors.RankLostError` naming rank 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from distinit._net import probe
from distinit.errors import RankLostError
from distinit.init import _messages
from distinit.init._diagnose import Master
from distinit.init._pace import STALE

#: Pause between two probes while deciding.
PROBE_EVERY = 0.25


def host_gone(
    master: Master,
    *,
    claimant: str,
    generation: int,
    end: float,
    sleep: Callable[[float], None],
    stale: float = STALE,
) -> RankLostError | None:
    """Probe until ``stale`` s of refusals (the host is gone) or anything else (None); never past ``end``."""
    lost_at, lost_wall = time.monotonic(), time.time()
    if lost_at + stale > end:
        return None  # no room to decide before the deadline: the deadline's error says it
    while (silent := time.monotonic() - lost_at) < stale:
        seen = probe(master.addr, master.port, min(1.0, stale), handshake_timeout=1.0)
        if seen.kind != "refused":
            return None  # something answers (a restarted rank 0) or the network fails: the attempts handle it
        sleep(PROBE_EVERY)
    return _messages.rank_lost(
        rank=0,
        claimant=claimant,
        silent_for=silent,
        last_seen=datetime.fromtimestamp(lost_wall, tz=timezone.utc).strftime("%H:%M:%S UTC"),
        master=master.name,
        generation=generation,
        local_rank=master.rank,
    )
