"""Every rendezvous error message, composed in one place from facts (what / why / fix).

Raise sites pass facts; this module words them. A collective verdict (duplicate rank, world-size
mismatch) is turned into JSON, published on the store, and rebuilt identically on every rank by
:func:`verdict_from_json` (JSON only: we never unpickle bytes from a peer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from distinit.errors import (
    DuplicateRankError,
    MalformedEnvError,
    MasterUnreachableError,
    PortInUseError,
    RankLostError,
    RendezvousError,
    RendezvousTimeoutError,
    WorldSizeMismatchError,
)

#: Errors that may travel as a verdict on the store (whitelist for :func:`verdict_from_json`).
_VERDICT_CLASSES: dict[str, type[RendezvousError]] = {
    cls.__name__: cls for cls in (RendezvousError, DuplicateRankError, WorldSizeMismatchError, RankLostError)
}


def _ranks(ranks: Sequence[int], limit: int = 32) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:limit])
    more = f", ... ({len(ranks) - limit} more)" if len(ranks) > limit else ""
    return f"[{shown}{more}]"


def duplicate_rank(
    *, rank: int, master: str, generation: int, first: str, second: str, local_rank: int | None
) -> DuplicateRankError:
    """Two processes claimed ``rank``: ``first`` got there first, ``second`` is the latecomer."""
    return DuplicateRankError(
        f"rank {rank} was claimed twice at rendezvous {master} (generation {generation}): by {first} and by "
        f"{second}. Not retried: waiting cannot fix it.",
        rank=local_rank,
        why="both processes were given the same RANK; often RANK = NODE_RANK*nproc + LOCAL_RANK with NODE_RANK "
        "unset or equal on several hosts, or a stale process of a previous run is still alive.",
        fix="call distinit.env_from_scheduler(export=True) before init instead of computing RANK, export a "
        "distinct NODE_RANK per host, or stop the leftover process (pid above).",
        master=master,
        generation=generation,
        ranks=(rank,),
        claimants=(first, second),
    )


def world_size_mismatch(
    *, master: str, generation: int, first: tuple[int, int, str], second: tuple[int, int, str], local_rank: int
) -> WorldSizeMismatchError:
    """Ranks disagree on the world size; ``first``/``second`` are ``(rank, world_size, "host pid N")``."""
    (r1, w1, who1), (r2, w2, who2) = first, second
    return WorldSizeMismatchError(
        f"world size mismatch at rendezvous {master} (generation {generation}): rank {r2} says {w2} "
        f"({who2}), rank {r1} says {w1} ({who1}). Not retried: waiting cannot fix it.",
        rank=local_rank,
        why="the processes were started with different WORLD_SIZE values (a stale export, a job script "
        "computing it per host, or two jobs sharing MASTER_ADDR:MASTER_PORT).",
        fix="give every process the same WORLD_SIZE (let distinit.env_from_scheduler() derive it from the "
        "launcher), or use a distinct MASTER_PORT per job.",
        master=master,
        generation=generation,
        ranks=(r1, r2),
        claimants=(who1, who2),
    )


def rank_lost(
    *, rank: int, claimant: str, silent_for: float, last_seen: str, master: str, generation: int, local_rank: int
) -> RankLostError:
    """``rank`` (``claimant``: ``"host pid N"``) joined, then its heartbeat stopped ``silent_for`` s ago."""
    return RankLostError(
        f"rank {rank} ({claimant}) joined rendezvous {master} (generation {generation}) and then stopped: no "
        f"heartbeat for {silent_for:.1f} s (last seen {last_seen}). Not retried: the world cannot form without it.",
        rank=local_rank,
        why=f"the process of rank {rank} died after joining (killed, an exception, Ctrl-C) or is frozen "
        "(SIGSTOP, swapped out).",
        fix=f"read the log of rank {rank} ({claimant}) for why it ended, then start the job again (let the "
        "launcher do it: `srun --kill-on-bad-exit=1`, torchrun's --max-restarts).",
        master=master,
        generation=generation,
        ranks=(rank,),
        claimants=(claimant,),
    )


def frozen_self(
    *, rank: int, claimant: str, frozen_for: float, stale: float, master: str, generation: int
) -> RankLostError:
    """This rank (``claimant``) did not run for ``frozen_for`` s, longer than the ``stale`` s loss bound."""
    return RankLostError(
        f"rank {rank} ({claimant}, this process) was frozen for {frozen_for:.1f} s during rendezvous {master} "
        f"(generation {generation}), longer than the {stale:.0f} s loss bound: the other ranks declared it lost "
        "and the store host has gone. Not retried: the world cannot form without it.",
        rank=rank,
        why=f"the process of rank {rank} did not run (SIGSTOP, a thread holding the GIL, swapped out, a host "
        "under heavy load) while it waited for the others.",
        fix="start the job again; keep start-up work that holds the GIL (loading a checkpoint in a thread) until "
        "after setup() returns, or raise the loss bound with DISTINIT_LOSS_BOUND=<seconds>.",
        master=master,
        generation=generation,
        ranks=(rank,),
        claimants=(claimant,),
    )


def another_job(*, master: str, holder: str, holder_rank: int, world_size: int, rank: int) -> PortInUseError:
    """This rank met a world that formed before it came: another job's store on the same port."""
    port = master.rpartition(":")[2]
    return PortInUseError(
        f"rank {rank}: another job is using MASTER_PORT={port} ({master}): its world of {world_size} formed before "
        f"this process arrived, and its rank {holder_rank} is {holder}. Not retried.",
        rank=rank,
        why="two jobs use the same MASTER_ADDR:MASTER_PORT without a job id to tell them apart (a hard-coded "
        "port); the other job is not at fault.",
        fix="pick another port for this job (one MASTER_PORT per job), or give each job its own id "
        "(SLURM_JOB_ID, TORCHELASTIC_RUN_ID).",
        master=master,
        ranks=(holder_rank,),
        claimants=(holder,),
    )


def rank_out_of_range(*, rank: int, world_size: int) -> WorldSizeMismatchError:
    """Pre-flight: ``rank`` does not fit in ``world_size``."""
    return WorldSizeMismatchError(
        f"rank {rank} is outside a world of size {world_size} (valid ranks are 0..{world_size - 1}). Not retried.",
        rank=rank,
        why="RANK and WORLD_SIZE come from different sources (e.g. a per-node rank against a global size).",
        fix="check RANK and WORLD_SIZE (`distinit env --explain` shows where each came from).",
        ranks=(rank,),
    )


def bad_interface(*, variable: str, value: str, available: Sequence[str], rank: int) -> RendezvousError:
    """Pre-flight: a ``*_SOCKET_IFNAME`` names an interface that does not exist on this host."""
    return RendezvousError(
        f"{variable}={value!r} names no network interface on this host (available: {', '.join(available)}). "
        "Not retried.",
        rank=rank,
        why="the variable was copied from another cluster or names an interface of another node type.",
        fix=f"set {variable} to one of the interfaces above (or unset it to let torch choose).",
    )


def hostname_too_long(*, rank: int, hostname: str, limit: int, fix: str) -> RendezvousError:
    """Pre-flight: torch's gloo cannot read a host name this long (its default device fails on every attempt)."""
    return RendezvousError(
        f"rank {rank}: this host's name is {len(hostname.encode())} bytes long ({hostname!r}) and GLOO_SOCKET_IFNAME "
        f"is unset: torch's gloo reads the host name into a buffer of {limit} bytes (HOST_NAME_MAX, its end "
        "included), so init_process_group would fail on every attempt with `DistBackendError: File name too "
        "long`. Not retried.",
        rank=rank,
        why=f"torch's ProcessGroupGloo.createDefaultDevice calls gethostname() with room for {limit - 1} "
        "characters; the kernel allows one more.",
        fix=fix,
    )


#: Why gloo advertises a loopback address (both the pre-flight finding and the connectFullMesh failure).
LOOPBACK_WHY = (
    "without GLOO_SOCKET_IFNAME gloo advertises the first address the hostname resolves to, and /etc/hosts maps "
    "the hostname to a loopback address (Debian and Ubuntu write `127.0.1.1 <hostname>`); GLOO_SOCKET_IFNAME=lo "
    "does the same. A peer on another host that connects to it reaches its own loopback."
)


def loopback_fix(
    *,
    host: str,
    route: str | None,
    interfaces: Sequence[tuple[str, str]],
    instead: str = "map the hostname to that interface's address in /etc/hosts instead of 127.0.1.1",
) -> str:
    """The fix for the loopback trap: the interface to name (``route``: the one that reaches MASTER_ADDR).

    ``instead``: the other way out, in words (the default: the trap's own, /etc/hosts).
    """
    shown = ", ".join(f"{name} {address}" for name, address in interfaces[:6]) or "no interface with an address"
    example = route or (interfaces[0][0] if interfaces else "<interface>")
    return (
        f"`export GLOO_SOCKET_IFNAME={example}` on every host, naming the interface that carries traffic between "
        f"the hosts ({host} has: {shown}); or {instead}. Fake hosts that share one machine's network may set "
        "GLOO_SOCKET_IFNAME=lo."
    )


def loopback_advertised(
    *, rank: int, hostname: str, resolved: Sequence[str], address: str, evidence: str, fix: str
) -> RendezvousError:
    """Pre-flight: gloo would advertise the loopback ``address`` while the world spans hosts (``evidence``)."""
    resolves = f"resolves to {', '.join(resolved)}" if resolved else "resolves to no address that binds"
    return RendezvousError(
        f"rank {rank}: gloo would advertise the loopback address {address} to the other ranks: hostname "
        f"{hostname!r} {resolves} and GLOO_SOCKET_IFNAME is unset, but the world spans several hosts "
        f"({evidence}). Ranks on other hosts would fail with `Gloo connectFullMesh failed ... Connection "
        f"refused, remote=[{address}]` or wait for a connection that never comes. Not retried.",
        rank=rank,
        why=LOOPBACK_WHY,
        fix=fix,
    )


def loopback_mesh(
    *, rank: int, host: str, remote: str, evidence: str, fix: str, master: str, generation: int
) -> RendezvousError:
    """Gloo's connectFullMesh failed connecting to a loopback ``remote`` in a world that spans hosts."""
    return RendezvousError(
        f"rank {rank} ({host}): gloo's connectFullMesh (rendezvous {master}, generation {generation}) could not "
        f"connect to a peer at {remote}, a loopback "
        f"address, in a world that spans several hosts ({evidence}): a rank advertised its loopback address, so "
        "its peers on other hosts connect to themselves. Not retried: every attempt would fail the same way.",
        rank=rank,
        why=LOOPBACK_WHY,
        fix=fix,
        master=master,
        generation=generation,
    )


def backend_unavailable(*, backend: str, rank: int) -> RendezvousError:
    """Pre-flight: torch cannot provide ``backend`` here."""
    return RendezvousError(
        f"backend {backend!r} is not available in this torch build on this host. Not retried.",
        rank=rank,
        why="NCCL needs a CUDA build of torch and a visible GPU; MPI needs torch built with MPI.",
        fix="pass backend='gloo' (CPU), or install a torch build with the backend and run where it exists.",
    )


def unsupported(*, step: str, master: str, cause: str, rank: int) -> RendezvousError:
    """A deterministic failure (:func:`distinit.init._policy.nature`): ``step`` cannot work with this torch or setting.

    ``cause``: the foreign error as ``Type: first line``. Raised at once: every retry would fail the same way.
    """
    return RendezvousError(
        f"rank {rank} cannot {step} (rendezvous {master}): {cause}. Not retried: every attempt would fail the same "
        "way.",
        rank=rank,
        why="this torch build does not support what the call needs (a store feature, a keyword, a backend "
        "option), or a setting is invalid for it; see docs/compat.md for the torch versions distinit supports.",
        fix="install a torch listed in docs/compat.md or correct the setting named above; if the "
        "message asks for an environment variable (e.g. USE_LIBUV=0), export it for every rank.",
        master=master,
    )


def incompatible_group(*, want: str, have: str, rank: int) -> RendezvousError:
    """A process group already exists and differs from the one requested."""
    return RendezvousError(
        f"a process group is already initialised ({have}) but {want} was requested.",
        rank=rank,
        why="init_process_group or setup() ran earlier in this process with other settings.",
        fix="call distinit.teardown() (destroy_process_group) first, or request the same backend, rank and world size.",
    )


def cannot_resolve(*, master: str, host: str, seconds: float, detail: str, rank: int) -> MasterUnreachableError:
    """DNS failed for the whole grace period."""
    return MasterUnreachableError(
        f"rank {rank} cannot resolve MASTER_ADDR={host!r} (rendezvous {master}): {detail}; still failing "
        f"after {seconds:.0f} s.",
        rank=rank,
        why="a typo in MASTER_ADDR, a short hostname not in this node's DNS search path, or a service record "
        "(e.g. a Kubernetes headless service) that is not published yet.",
        fix="use the master's IP address or fully qualified name; check `getent hosts <MASTER_ADDR>` on this node.",
        master=master,
    )


def not_this_host(*, master: str, addr: str, resolved: Sequence[str], host: str, rank: int) -> MasterUnreachableError:
    """Rank 0: MASTER_ADDR resolves to addresses none of which is this host (nor routes here)."""
    return MasterUnreachableError(
        f"rank {rank} is to host the rendezvous store at {master}, but MASTER_ADDR={addr!r} "
        f"({', '.join(resolved[:4])}) is not an address of this host ({host}): the other ranks would look for "
        "the store on another machine. Not retried.",
        rank=rank,
        why="MASTER_ADDR names another node (a copied value, the first node of another job or allocation), or "
        "RANK 0 was given to a process on the wrong node.",
        fix=f"set MASTER_ADDR to the host of rank 0 ({host} here) for every process, e.g. under Slurm "
        '`export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)`, or let '
        "distinit.env_from_scheduler() derive it.",
        master=master,
    )


def hostlist_addr(*, addr: str, rank: int) -> MalformedEnvError:
    """MASTER_ADDR holds a Slurm hostlist expression (``dnode[1-2]``) or a list of hosts."""
    return MalformedEnvError(
        f"rank {rank}: MASTER_ADDR={addr!r} is a list of hosts (a Slurm hostlist expression), not one host: "
        "no rank could ever resolve it. Not retried.",
        variables=("MASTER_ADDR",),
        why="MASTER_ADDR was set from $SLURM_JOB_NODELIST (or SLURM_NODELIST), which names every node of the job.",
        fix='take the first host of the list: `export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" '
        "| head -n1)`, or let distinit.env_from_scheduler() derive it under srun.",
    )


def unroutable(*, master: str, seconds: float, detail: str, rank: int) -> MasterUnreachableError:
    """No route to the master for the whole grace period."""
    return MasterUnreachableError(
        f"rank {rank} has no route to MASTER_ADDR at {master}: {detail}; still failing after {seconds:.0f} s.",
        rank=rank,
        why="MASTER_ADDR is on a network this host cannot reach (wrong subnet, a link down, or an address of "
        "another cluster).",
        fix="set MASTER_ADDR to an address of rank 0's host that this node can reach (`ip route get <addr>`).",
        master=master,
    )


def black_hole(*, master: str, seconds: float, rank: int) -> MasterUnreachableError:
    """Connects to the master timed out until the deadline: packets vanish."""
    return MasterUnreachableError(
        f"rank {rank} could not connect to {master} for {seconds:.0f} s: connection attempts time out, so "
        "packets to it vanish without an answer.",
        rank=rank,
        why="a firewall drops the traffic, MASTER_ADDR is an address nobody answers on, or the master host is down.",
        fix="check MASTER_ADDR and that MASTER_PORT is open between the nodes (`nc -zv <addr> <port>`).",
        master=master,
    )


def port_in_use(*, master: str, port: int, seconds: float, holder: str | None, rank: int) -> PortInUseError:
    """Rank 0 could not bind ``port`` for the whole grace period."""
    who = f"it is held by {holder}" if holder else "the holding process is not visible from here"
    return PortInUseError(
        f"rank {rank} cannot host the rendezvous store: MASTER_PORT={port} is already in use on this host "
        f"(Address already in use) and stayed busy for {seconds:.0f} s; {who}.",
        rank=rank,
        why=f"a previous run is still exiting, another job on this node uses the same port, or a hard-coded "
        f"MASTER_PORT={port} collides with another job's.",
        fix="use another MASTER_PORT (one per job), or stop the holder shown above.",
        master=master,
    )


def foreign_listener(*, master: str, seconds: float, holder: str | None, rank: int) -> PortInUseError:
    """Something accepts TCP on MASTER_PORT but does not speak the TCPStore protocol."""
    who = f" ({holder})" if holder else ""
    return PortInUseError(
        f"rank {rank}: something is listening on {master}{who} but it is not a torch TCPStore: it did not "
        f"answer the store handshake for {seconds:.0f} s. torch alone would hang here without bound.",
        rank=rank,
        why=(
            "another program (or another job's service) owns MASTER_PORT on the master host; less often, a "
            "network that loses most packets lets the connection open but never delivers the store's answer."
        ),
        fix="use another MASTER_PORT, or stop the program listening on it (check for packet loss if none is).",
        master=master,
    )


#: Seconds without a new arrival after which missing top ranks suggest an oversized WORLD_SIZE.
QUIET = 10.0


def oversized(
    *, world_size: int, missing: Sequence[int], launched: tuple[int, str] | None, quiet_for: float
) -> str | None:
    """Why the missing ranks may never come, from facts every rank shares (None: no sign of it).

    ``launched`` is the launcher's own count (``(n, "VAR=n")``): below ``world_size``, WORLD_SIZE is too
    large; equal, every process was started, so the missing ones exited or crashed before joining. Without
    a count, missing top ranks get both possibilities once nothing new arrived for :data:`QUIET` s
    (``quiet_for``; pass ``math.inf`` for the final verdict, so that every rank words it alike).
    """
    if not missing or len(missing) >= world_size:
        return None
    present = world_size - len(missing)
    if launched is not None and launched[0] < world_size:
        return (
            f"WORLD_SIZE={world_size} is larger than what the launcher started ({launched[1]}): ranks "
            f"{_ranks(missing)} were never launched"
        )
    if launched is not None:
        return (
            f"the launcher started all {world_size} processes ({launched[1]}): ranks {_ranks(missing)} exited or "
            "crashed before joining, or use another MASTER_ADDR/MASTER_PORT"
        )
    top = list(missing) == list(range(present, world_size))
    if top and quiet_for >= QUIET:
        return (
            f"ranks 0..{present - 1} joined and ranks {_ranks(missing)} never came: they exited or crashed before "
            f"joining, or WORLD_SIZE={world_size} may be larger than the number of processes launched (the "
            "launcher does not say how many it started)"
        )
    return None


#: Why the attempts failed when no rank was missing at the end, by the last attempt's failure kind.
_TIMEOUT_WHY = {
    "init": (
        "every rank joined but init_process_group failed (a rank died during init, or the backend cannot "
        "connect the hosts: a firewall, a wrong *_SOCKET_IFNAME, a loopback address advertised).",
        "find the rank whose log shows the first failure; between hosts, set GLOO_SOCKET_IFNAME/"
        "NCCL_SOCKET_IFNAME to the interface that reaches the other hosts.",
    ),
    "store": (
        "the connection to the store kept failing: the process hosting it (rank 0, or the torchrun agent) "
        "restarted or went away, or the network between the hosts drops connections.",
        "check that rank 0 (the store host) stayed alive in its log, and the network between the hosts.",
    ),
    "other": (
        "the attempts below failed without naming a missing rank.",
        "check that every process uses the same MASTER_ADDR:MASTER_PORT; raise deadline= if starts are slow.",
    ),
    "refused": (
        "nothing listened on MASTER_ADDR:MASTER_PORT: rank 0 never hosted the store (not started, crashed, "
        "or running on another host than MASTER_ADDR).",
        "check rank 0's log, and that MASTER_ADDR is the host of rank 0 and every process uses the same MASTER_PORT.",
    ),
}


def rendezvous_timeout(
    *,
    rank: int,
    world_size: int,
    master: str,
    deadline: float,
    missing: Sequence[int],
    attempts: Sequence[str],
    generation: int | None,
    blocked: str | None = None,
    last_kind: str | None = None,
    hint: str | None = None,
) -> RendezvousTimeoutError:
    """The deadline passed without a formed group.

    ``blocked`` names the call that was still running at the deadline when the rendezvous thread had to
    be abandoned (a store or network operation that never returned). ``last_kind`` is the failure kind of
    the last attempt (it words the cause when no rank was missing); ``hint`` an :func:`oversized` finding.
    """
    if blocked is not None:
        head = f"{blocked}: a store or network call never returned"
        why = (
            "a store or network call got no answer: the process hosting the store (rank 0, or the torchrun "
            "agent) is frozen, stopped or swapped out, or packets between the hosts are being lost."
        )
        fix = (
            f"check that the process serving {master} is alive and responsive and that the network between "
            "the hosts is healthy; then start the job again (this process may hold a half-open connection)."
        )
    elif missing and hint is not None:
        head = f"missing ranks {_ranks(missing)} of world size {world_size}"
        why = f"{hint}."
        fix = (
            "read the missing ranks' logs for a crash; set WORLD_SIZE to the number of processes launched (or let "
            "distinit.env_from_scheduler() derive it from the launcher), or launch the missing ranks."
        )
    elif missing:
        head = f"missing ranks {_ranks(missing)} of world size {world_size}"
        why = "those processes never started, crashed, or use another MASTER_ADDR/MASTER_PORT or job id."
        fix = (
            "check the logs of the missing ranks and that every process has the same MASTER_ADDR:MASTER_PORT; "
            "raise deadline= if they are only slow to start."
        )
    else:
        head = f"no world of size {world_size} formed"
        why, fix = _TIMEOUT_WHY.get(last_kind or "", _TIMEOUT_WHY["other"])
    seen = "; ".join(attempts[-6:])
    return RendezvousTimeoutError(
        f"rank {rank}: rendezvous at {master} did not complete within the {deadline:.0f} s deadline "
        f"({len(attempts)} attempt{'' if len(attempts) == 1 else 's'}): {head}. Attempts: {seen}",
        rank=rank,
        why=why,
        fix=fix,
        master=master,
        generation=generation,
        ranks=tuple(missing),
        attempts=tuple(attempts),
    )


def verdict_to_json(exc: RendezvousError, *, writer: int | None = None, token: str | None = None) -> str:
    """Serialise a collective verdict for the store (facts only, JSON).

    With ``writer`` and ``token``, it carries the writing rank and the group's generation token, which
    :func:`verdict_origin` checks on read.
    """
    payload: dict[str, Any] = {
        "error": type(exc).__name__,
        "what": exc.what,
        "why": exc.why,
        "fix": exc.fix,
        "master": exc.master,
        "generation": exc.generation,
        "ranks": list(exc.ranks),
        "claimants": list(exc.claimants),
    }
    if writer is not None and token is not None:
        payload.update(writer=writer, token=token)
    return json.dumps(payload)


#: The longest verdict a rank writes is a few KiB (its text, the ranks and claimants it names): anything longer
#: is not one, and is refused before it is parsed.
MAX_VERDICT_CHARS = 1 << 20


def verdict_origin(text: str, *, token: str, world_size: int) -> bool:
    """Whether ``text`` is a verdict written by a rank of this group.

    That is JSON carrying this generation's ``token`` and a ``writer`` rank below ``world_size``. Never
    raises: garbage is simply not a verdict.
    """
    if len(text) > MAX_VERDICT_CHARS:
        return False
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: a value nested deeper than the parser recurses
        return False
    if not isinstance(data, dict):
        return False
    writer = data.get("writer")
    return (
        data.get("token") == token
        and isinstance(writer, int)
        and not isinstance(writer, bool)
        and 0 <= writer < world_size
        and isinstance(data.get("what"), str)
    )


def verdict_from_json(text: str, *, rank: int) -> RendezvousError:
    """Rebuild a verdict read from the store; unknown payloads become a plain :class:`RendezvousError`."""
    try:
        if len(text) > MAX_VERDICT_CHARS:
            raise ValueError(f"{len(text)} characters")
        data = json.loads(text)
        cls = _VERDICT_CLASSES.get(str(data["error"]), RendezvousError)
        return cls(
            str(data["what"]),
            rank=rank,
            why=str(data.get("why", "")),
            fix=str(data.get("fix", "")),
            master=data.get("master"),
            generation=data.get("generation"),
            ranks=tuple(int(r) for r in data.get("ranks", ())),
            claimants=tuple(str(c) for c in data.get("claimants", ())),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return RendezvousError(
            f"rendezvous aborted by a peer with an unreadable verdict: {text[:200]!r}",
            rank=rank,
            why="a peer runs another distinit version or another program wrote the abort key.",
            fix="run the same distinit version on every rank.",
        )
