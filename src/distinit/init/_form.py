"""Forming the group once every rank joined: ``init_process_group``, the check collective, and the undo.

Its parts:

* :class:`GroupFormer` -- one attempt's group: init, the check collective, and the complete undo;
* :func:`exchange` and :func:`settle` -- the world's own truth: every rank's host identity (its claim, built
  by :func:`distinit._identity.claim_of`), exchanged by the check collective, and the world it describes;
* :func:`classify_init_failure` and :class:`InitWatch` -- a verdict reached during ``init_process_group``
  (gloo's loopback trap), the same on every rank, at once.

torch's backend bootstrap waits on peers' keys with the *group* timeout, not the store's, so the group is
created with the attempt's bound and the collective timeout is set right after (a private torch API,
feature-detected). A failed init is undone completely, including torch's leaked group counter
(pytorch/pytorch#46561), so that the next attempt in this process can meet fresh peers.

**The world's own truth.** The environment can only guess a node rank (Open MPI and MPICH name no node; a
user's ``NODE_RANK`` may be wrong on one machine); the ranks together know it. Right after
``init_process_group`` every rank contributes one fixed-size row (its host identity and what its
environment claims) to one ``all_gather``: that collective replaces the old check ``all_reduce``, so success
still means the fabric works, and it costs one small collective. :func:`settle` then derives node rank, local
rank, local world size and node count from the identities (:func:`distinit._identity.group_ranks`, torchrun's
assignment), fills what the environment left unknown, and raises :class:`ConflictingEnvError` when the
environment disagrees with the world. Every rank sees the same rows, so every rank raises the same error.
Rows are JSON validated by pydantic (never pickle) with a fixed size, so a hostile or broken peer can send
garbage but cannot make this rank allocate more than ``ROW`` bytes per rank.

**The init verdict.** The join's ``state`` key already says ``ok`` when init runs, so a verdict found in
init has a key of its own, the join's ``init_verdict`` (:meth:`JoinProtocol.init_verdict_key`; first writer
wins). The rank that recognises its own gloo failure as the loopback trap publishes it; a rank whose init failed
otherwise reads it before giving up on the generation, so no rank starts a new generation for it (the ranks
would drift apart, each waiting for the others in another generation until the deadline). A rank still blocked in init
(gloo's listener side waits about five times its timeout for a peer that can never connect) learns it from
:class:`InitWatch`, a thread with its own store connection, and its caller raises it at once. The store host
stays up until the others have read it, at most :data:`distinit._board.LINGER` s (the key is a
:class:`distinit._board.Board`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch.distributed import TCPStore

from distinit._board import Board
from distinit._duration import to_timedelta
from distinit._identity import (
    Conflict,
    HostIdentity,
    HostSlot,
    NodeLayout,
    RankClaim,
    claim_of,
    group_ranks,
    shared_gpus,
)
from distinit._net import interfaces
from distinit._torch import pg_timeout_setter, reset_group_counter
from distinit.env import DistEnv
from distinit.errors import ConflictingEnvError, RendezvousError, SchedulerEnvError
from distinit.init import _loopback, _messages
from distinit.init._join import JoinProtocol
from distinit.init._policy import AttemptFailed, Bounds, quote
from distinit.init._store import Master

logger = logging.getLogger("distinit.init")


def init_group(
    backend: str,
    *,
    store: dist.Store,
    rank: int,
    world_size: int,
    bound: timedelta,
    init_timeout: timedelta | None,
    device_id: int | torch.device | None,
) -> None:
    """``init_process_group`` with its bootstrap bounded by ``bound``.

    Without torch's private ``_set_pg_timeout`` (see ``distinit._torch``) the group is created with
    ``init_timeout`` instead (torch's behaviour: the collective timeout also bounds the bootstrap).
    """
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=bound if pg_timeout_setter() is not None else init_timeout,
        device_id=device_id,
    )


def set_collective_timeout(timeout: timedelta) -> None:
    """Give the formed default group its collective timeout (no-op without the private API)."""
    setter = pg_timeout_setter()
    if setter is not None:
        setter(timeout)


def destroy_group(rank: int) -> bool:
    """Destroy the default group if one exists, then reset torch's leaked counter; True if it was reset."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, AssertionError, ValueError) as exc:
            logger.debug("rank %d: destroy_process_group after a failed init: %s", rank, exc)
    return reset_group_counter()


class GroupFormer:
    """Form the default group on a joined generation, verify it, and undo a failed one completely."""

    def __init__(
        self,
        *,
        backend: str,
        env: DistEnv,
        environ: Mapping[str, str],
        bounds: Bounds,
        device_id: int | torch.device | None,
        verify: bool,
        watch: InitWatch,
    ) -> None:
        """``watch``: looks for a peer's init verdict while init runs (the caller polls ``watch.verdict``)."""
        self.backend, self.env, self.environ = backend, env, environ
        self.bounds, self.device_id, self.verify, self.watch = bounds, device_id, verify, watch
        #: The world as the ranks' host identities verified it (set by a verified ``form``).
        self.world: DistEnv | None = None
        #: How often torch's leaked group counter was reset (reported as ``group_counter_reset``).
        self.counter_resets = 0

    def form(self, join: JoinProtocol, generation: int, *, end: float) -> None:
        """Form the group on ``generation``'s keys within ``end`` (monotonic); :meth:`check` it next.

        Raises:
            RendezvousError: ``init_process_group`` rejected its arguments (never retried).
            AttemptFailed: (kind ``init``) it failed; the generation was bumped so every rank starts anew.
        """
        store = join.store
        bound = to_timedelta(max(end - time.monotonic(), 1.0))
        store.set_timeout(bound)  # the store keeps this bound through the check (NCCL's lazy communicator)
        try:
            with self._undone_on_failure(join, generation), self.watch.during(join.init_verdict_key(generation)):
                init_group(
                    self.backend,
                    store=dist.PrefixStore(join.prefix(generation), store),
                    rank=self.env.rank,
                    world_size=self.env.world_size,
                    bound=bound,
                    init_timeout=self.bounds.init_timeout(),
                    device_id=self.device_id,
                )
        except BaseException:
            store.set_timeout(self.bounds.collective_timeout(self.backend))
            raise

    def check(self, join: JoinProtocol, generation: int, *, end: float) -> None:
        """The check collective (if ``verify``) on the formed group, then its collective timeout.

        Raises:
            ConflictingEnvError: the ranks' host identities disagree with the environment (a verdict).
            AttemptFailed: (kind ``init``) the collective failed; the generation was bumped.
        """
        collective = self.bounds.collective_timeout(self.backend)
        try:
            with self._undone_on_failure(join, generation):
                if self.verify:
                    self.world = self._verified(end)
                set_collective_timeout(collective)
        finally:
            join.store.set_timeout(collective)

    @contextlib.contextmanager
    def _undone_on_failure(self, join: JoinProtocol, generation: int) -> Iterator[None]:
        """Undo a failed init or check completely, and say what the failure means for the attempts."""
        try:
            yield
        except (SchedulerEnvError, RendezvousError):
            self.undo()  # the world disagrees with the environment: a verdict, the same on every rank
            raise
        except (ValueError, TypeError, NotImplementedError) as exc:  # NotImplementedError is a RuntimeError
            self.undo()
            raise RendezvousError(
                f"rank {self.env.rank}: init_process_group rejected its arguments: {quote(exc)}",
                rank=self.env.rank,
                why="an argument (backend, device_id, pg_timeout) does not fit this torch build or host.",
                fix="check the arguments passed to init_with_retry()/setup().",
                master=join.master,
                generation=generation,
            ) from exc
        except (RuntimeError, OSError) as exc:
            self.undo()
            verdict = classify_init_failure(exc, join=join, generation=generation, env=self.env, hosting=join.hosting)
            if verdict is not None:  # not transient (gloo's loopback trap): one verdict everywhere, no new generation
                raise verdict from exc
            # If the store is gone too, the next attempt reconnects and reads the generation anew.
            with contextlib.suppress(RuntimeError):
                join.abandon(generation)
            raise AttemptFailed(
                "init",
                f"init_process_group failed in generation {generation} after every rank joined: {quote(exc)}",
            ) from exc

    def _verified(self, end: float) -> DistEnv:
        """Exchange host identities (the check collective) and settle the world they describe."""
        gpu = None
        if self.backend == "nccl" and self.device_id is not None:
            index = self.device_id if isinstance(self.device_id, int) else self.device_id.index
            gpu = device_uuid(torch.cuda.current_device() if index is None else index)
        claims = exchange(
            claim_of(self.env, self.environ, gpu=gpu),
            backend=self.backend,
            device_id=self.device_id,
            world_size=self.env.world_size,
            end=end,
        )
        return settle(self.env, claims)

    def undo(self) -> None:
        """Destroy the group this call formed (if any) and reset torch's leaked counter."""
        if destroy_group(self.env.rank):
            self.counter_resets += 1


def device_uuid(index: int) -> str:
    """The UUID of CUDA device ``index`` (the physical GPU, whatever ``CUDA_VISIBLE_DEVICES`` renumbers)."""
    return str(torch.cuda.get_device_properties(index).uuid)


#: Bytes each rank contributes: a magic, a 4-byte length, the JSON claim, zero padding.
ROW = 1024
MAGIC = b"distinit/world/1"
#: What ``DistEnv.sources`` says of a value derived from the ranks' host identities.
SOURCE = "world: host identity"


def _encode(claim: RankClaim) -> bytes:
    raw = claim.model_dump_json(exclude_none=True).encode()
    if len(MAGIC) + 4 + len(raw) > ROW:  # pragma: no cover - MAX_NAME and HOST_NAME_MAX keep a claim small
        raise ValueError(f"rank {claim.rank}'s host identity is {len(raw)} bytes, over the {ROW}-byte row")
    return (MAGIC + len(raw).to_bytes(4, "little") + raw).ljust(ROW, b"\0")


def _decode(row: bytes, index: int, *, rank: int) -> RankClaim:
    """Rank ``index``'s claim from its row; a malformed row is named, never trusted."""
    size = int.from_bytes(row[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    try:
        if not row.startswith(MAGIC) or size > ROW - start:
            raise ValueError("not a distinit identity row")
        claim = RankClaim.model_validate_json(row[start : start + size])
        if claim.rank != index:
            raise ValueError(f"the row claims rank {claim.rank}")
    except (ValueError, ValidationError) as exc:
        raise RendezvousError(
            f"rank {rank}: rank {index} sent a malformed host identity row ({str(exc).splitlines()[0]})",
            rank=rank,
            why="the peer runs another distinit version, or something other than distinit joined the group.",
            fix="run the same distinit version on every rank.",
        ) from None
    return claim


def exchange(
    claim: RankClaim, *, backend: str, device_id: int | torch.device | None, world_size: int, end: float
) -> list[RankClaim]:
    """Every rank's claim, in rank order: one ``all_gather`` of ``ROW`` bytes within ``end`` (monotonic).

    Raises:
        RuntimeError: the collective did not complete in time (the fabric does not work).
        RendezvousError: a peer's row is malformed.
    """
    device: torch.device | None = None
    if isinstance(device_id, torch.device):
        device = device_id
    elif isinstance(device_id, int):
        device = torch.device("cuda", device_id)
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.frombuffer(bytearray(_encode(claim)), dtype=torch.uint8).to(device)
    rows = torch.empty(world_size * ROW, dtype=torch.uint8, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
    work = gather(rows, mine, async_op=True)
    if work is None or not work.wait(timeout=to_timedelta(max(end - time.monotonic(), 1.0))):
        raise RuntimeError("the identity all_gather did not complete")
    host = rows.cpu().contiguous()
    data = ctypes.string_at(host.data_ptr(), host.numel())  # not .numpy(): torch does not require numpy
    return [_decode(data[i * ROW : (i + 1) * ROW], i, rank=claim.rank) for i in range(world_size)]


def _out_of_range(layout: NodeLayout, claimed: Mapping[HostIdentity, int]) -> list[str]:
    """Node ranks claimed beyond the hosts there are (``NODE_RANK=3`` in a world of two hosts)."""
    return [
        f"host {h.label} (ranks {_span(h.ranks)}) claims node rank {claimed[h.identity]} but the ranks run on "
        f"{layout.num_nodes} hosts"
        for h in layout.hosts
        if claimed.get(h.identity, 0) >= layout.num_nodes
    ]


def _conflict_error(layout: NodeLayout, extra: Sequence[str], world_size: int) -> ConflictingEnvError:
    lines = "; ".join([*(conflict.message for conflict in layout.conflicts), *extra])
    hosts = ", ".join(f"{h.label} = ranks {_span(h.ranks)}" for h in layout.hosts)
    return ConflictingEnvError(
        f"the environment disagrees with where the {world_size} ranks really run: {lines}",
        variables=("NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        why=f"the ranks' host identities (hostname, boot_id, launcher node) say: {hosts}. Node ranks derived "
        "from a wrong NODE_RANK give two ranks the same global rank in frameworks that compute "
        "NODE_RANK * devices + LOCAL_RANK (Lightning), and put two processes on one GPU.",
        fix="unset NODE_RANK/GROUP_RANK/LOCAL_RANK/LOCAL_WORLD_SIZE where the launcher sets its own, or export "
        "the values of the hosts above (setup() derives what is left unknown).",
    )


def _shared_gpu_error(shared: Sequence[Conflict]) -> ConflictingEnvError:
    return ConflictingEnvError(
        f"two ranks bound one GPU: {'; '.join(conflict.message for conflict in shared)}",
        variables=("CUDA_VISIBLE_DEVICES", "LOCAL_RANK"),
        why="each rank binds cuda:LOCAL_RANK, or cuda:LOCAL_RANK % visible where it sees fewer GPUs than its host "
        "runs ranks (per-rank CUDA_VISIBLE_DEVICES, srun --gpus-per-task): these ranks' visible devices overlap, "
        "so they landed on one physical GPU",
        fix="give each rank a GPU of its own (srun --gpus-per-task=1 without an exported CUDA_VISIBLE_DEVICES, or "
        "unset CUDA_VISIBLE_DEVICES so every rank sees every GPU of its host), or launch fewer ranks per host",
    )


def _span(ranks: Sequence[int]) -> str:
    """``0-7`` for a run of three or more consecutive ranks, else ``0,2,4``."""
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def settle(env: DistEnv, claims: Sequence[RankClaim]) -> DistEnv:
    """``env`` with what the world knows filled in, or the conflict named (identically on every rank).

    Raises:
        ConflictingEnvError: a node rank, local rank, local world size or node count of the environment
            disagrees with the hosts the ranks run on, or two ranks bound one GPU (by UUID).
    """
    shared = shared_gpus(claims)
    if shared:
        raise _shared_gpu_error(shared)
    layout = group_ranks(claims)
    claimed = {h.identity: n for h in layout.hosts if (n := _claimed(h, claims)) is not None}
    extra = _out_of_range(layout, claimed)
    if layout.conflicts or extra:
        raise _conflict_error(layout, extra, env.world_size)
    host = layout.host_of(env.rank)
    node_ranks = _node_ranks(layout, claimed)
    derived = {
        "node_rank": node_ranks[host.label],
        "local_rank": host.ranks.index(env.rank),
        "local_world_size": len(host.ranks),
        "num_nodes": layout.num_nodes,
    }
    fields = env.model_dump()
    sources = dict(env.sources)
    for field, value in derived.items():
        if fields[field] is None:
            fields[field] = value
            sources[field] = (SOURCE,)
    fields["sources"] = sources
    fields["notes"] = (*env.notes, *layout.notes)
    return DistEnv.model_validate(fields)


def _claimed(host: HostSlot, claims: Sequence[RankClaim]) -> int | None:
    """The node rank the ranks of ``host`` claim (one, or the layout would hold a conflict), if any."""
    return next((c.node_rank for c in claims if c.rank in host.ranks and c.node_rank is not None), None)


def _node_ranks(layout: NodeLayout, claimed: Mapping[HostIdentity, int]) -> dict[str, int]:
    """Each host's node rank: the one its ranks claim, else the lowest free one in torchrun's order."""
    taken = set(claimed.values())
    free = (n for n in range(layout.num_nodes + len(taken)) if n not in taken)
    return {h.label: claimed[h.identity] if h.identity in claimed else next(free) for h in layout.hosts}


#: How often a blocked rank's watch looks for the verdict, and its store connection's bound.
WATCH_EVERY = 0.25
WATCH_TIMEOUT = 5.0

_Failure = (RuntimeError, OSError, ValueError)  # torch's DistError (torch 2.2+) is a RuntimeError


def classify_init_failure(
    exc: BaseException, *, join: JoinProtocol, generation: int, env: DistEnv, hosting: bool
) -> RendezvousError | None:
    """The verdict for this rank's failed init: its own loopback failure (published), a peer's, or None.

    None means an ordinary failure: the caller abandons the generation and retries.
    """
    board = Board(join.store, join.init_verdict_key(generation), rank=env.rank, world_size=env.world_size)
    own = _own_verdict(exc, env=env, master=join.master, generation=generation)
    try:
        found = board.publish(_messages.verdict_to_json(own)) if own is not None else board.read()
    except _Failure as failure:  # the store went away: our own finding still stands
        logger.debug("rank %d: init verdict key unreachable: %s", env.rank, failure)
        return own
    if found is None:
        return None
    _acknowledge(board, hosting=hosting)
    return _messages.verdict_from_json(found, rank=env.rank)


def _own_verdict(exc: BaseException, *, env: DistEnv, master: str, generation: int) -> RendezvousError | None:
    """This rank's gloo error as the loopback trap, if it names a loopback peer in a world that spans hosts."""
    remote = _loopback.loopback_remote(str(exc))
    if remote is None:
        return None
    evidence = _loopback.world_spans_hosts(env)
    if evidence is None:  # one host: a loopback peer that refused is a peer that died
        return None
    host = socket.gethostname()
    return _messages.loopback_mesh(
        rank=env.rank,
        host=host,
        remote=remote,
        evidence=evidence,
        fix=_messages.loopback_fix(
            host=host,
            route=_loopback.route_interface(env.master_addr, env.master_port),
            interfaces=interfaces(),
        ),
        master=master,
        generation=generation,
    )


def _acknowledge(board: Board, *, hosting: bool) -> None:
    """This rank read the verdict; the store host then waits for the others to read it too."""
    with contextlib.suppress(*_Failure):  # the verdict is known; a store gone meanwhile only ends the wait
        board.acknowledge()
        if hosting:
            board.linger()


class InitWatch:
    """While init runs, look for a peer's init verdict from a thread (see the module docstring).

    Enabled only where it can matter: gloo, this host advertising a loopback address, and a world that
    spans hosts; elsewhere :meth:`during` does nothing and no connection is opened.
    """

    def __init__(self, master: Master, *, env: DistEnv, hosting: bool, enabled: bool) -> None:
        """``enabled``: :func:`~distinit.init._loopback.loopback_trap` found the trap possible here."""
        self.master, self.env, self.hosting, self.enabled = master, env, hosting, enabled
        #: The verdict a peer published while this rank was in init, or None (read by the caller's thread).
        self.verdict: RendezvousError | None = None

    @contextlib.contextmanager
    def during(self, key: str) -> Iterator[None]:
        """Watch the init verdict at ``key`` (:meth:`JoinProtocol.init_verdict_key`) for the duration of the block."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(key, stop), name=f"distinit-init-watch-rank{self.env.rank}", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()

    def _run(self, key: str, stop: threading.Event) -> None:
        try:
            store = TCPStore(
                self.master.addr,
                self.master.port,
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=WATCH_TIMEOUT),
            )
            board = Board(store, key, rank=self.env.rank, world_size=self.env.world_size)
            while not stop.wait(WATCH_EVERY):
                found = board.read()
                if found is not None:
                    _acknowledge(board, hosting=self.hosting)
                    self.verdict = _messages.verdict_from_json(found, rank=self.env.rank)
                    return
        except _Failure as exc:  # the store went away: the attempt itself sees that too
            logger.debug("rank %d: init watch stopped: %s", self.env.rank, exc)
