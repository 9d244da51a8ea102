"""Issue 27: the pool of reusable shared-memory segments behind repeated ``via="shm"`` calls.

Real gloo groups of real processes on this host; the attacker is a real process of the same user. This file
is also the ranks' and the attacker's program (``python test_shm_pool.py SCENARIO``), so one file holds the
whole story. Markers in a per-test directory order the steps; nothing waits on a sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 60.0  # the ranks' timeout=: generous on a loaded 2-core machine
MEET = os.environ.get("VIA_MEET", "")  # via_worker.meet's directory too
_MFD_POOL = "/memfd:distinit-bc-pool-"


# ---------------------------------------------------------------------------------------------------- the ranks
def _state(seed: int, rows: int = 300) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(rows, 257, generator=g),
        "half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "codes": torch.randint(0, 60000, (5,), generator=g).to(torch.uint16),
        "step": torch.tensor(seed),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _pool_maps() -> list[str]:
    """This process's mappings of pooled segments: the device and inode of each (``/proc/self/maps``)."""
    with open("/proc/self/maps", encoding="ascii", errors="replace") as fh:
        return [" ".join(line.split()[3:5]) for line in fh if _MFD_POOL in line]


def _pool_fds() -> list[str]:
    """This process's descriptors of pooled segments."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(_MFD_POOL):
                found.append(fd)
    return found


def _forked_maps() -> list[str]:
    """The pooled mappings a child made by ``fork`` (as a DataLoader worker is) finds in itself."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, json.dumps(_pool_maps()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        found = json.loads(fh.read())
    os.waitpid(child, 0)
    return list(found)


def _identity(group: Any) -> list[int]:
    """The pooled segment this rank writes (leader: st_dev, st_ino) or reads from its leader (its cached key)."""
    from distinit.broadcast._transport import shm

    pool = shm._POOLS.get(group)
    if pool is None:
        return []
    if pool.mine is not None:
        st = os.fstat(pool.mine.fd)
        return [st.st_dev, st.st_ino, pool.mine.size]
    mapped = next(iter(pool.read.values()), None)  # one leader per reader here
    return [*mapped.key, mapped.size] if mapped is not None else []


def _reuse(rank: int) -> dict[str, Any]:
    """Repeated calls, new content each time; zero_copy views; growth; the cap; a subgroup destroyed."""
    import torch
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict, broadcast_tensor
    from distinit.broadcast._transport import shm
    from distinit.doctor._shm import check_shm

    world = dist.group.WORLD
    checks: dict[str, bool] = {}
    facts: dict[str, Any] = {}
    mine = _state(100 + rank)
    ids, equal = [], []
    for call in range(4):  # the same layout, other values every call: each reader sees each call's bytes
        broadcast_state_dict(_state(call) if rank == 0 else mine, via="shm", timeout=TIMEOUT)
        equal.append(rank == 0 or _same(mine, _state(call)))  # src passed its own
        ids.append(_identity(world))
    checks["every call's content on every rank"] = all(equal)
    checks["one segment for calls of the same layout"] = len({tuple(i) for i in ids}) == 1 and bool(ids[0])
    facts["pooled after repeats"] = shm.pool_bytes()
    leader = os.getpid() if rank == 0 else ids[0][0]  # a reader's key starts with its leader's pid
    seen = check_shm(local_world_size=3).evidence["pooled"]  # what `distinit doctor` reports
    checks["the doctor's shm check reports the pool"] = seen.get(str(leader)) == ids[0][-1]
    checks["a forked child inherits no pooled mapping"] = _forked_maps() == []

    views = broadcast_state_dict(_state(7) if rank == 0 else None, via="shm", zero_copy=True, timeout=TIMEOUT)
    broadcast_state_dict(_state(8) if rank == 0 else mine, via="shm", timeout=TIMEOUT)  # rewrites the pool
    checks["zero_copy views never rewritten"] = _same(views, _state(7)) and (rank == 0 or _same(mine, _state(8)))
    checks["zero_copy took a segment of its own"] = _identity(world) == ids[0]

    big = _state(9, rows=2000)  # grows: the pool replaces its segment; a smaller call then reuses the big one
    got = broadcast_state_dict(big if rank == 0 else None, via="shm", timeout=TIMEOUT)
    grown = _identity(world)
    small = broadcast_state_dict(_state(10) if rank == 0 else None, via="shm", timeout=TIMEOUT)
    checks["growth replaces the segment"] = _same(got, big) and grown != ids[0] and grown[-1] > ids[0][-1]
    checks["a smaller call reuses the grown segment"] = _same(small, _state(10)) and _identity(world) == grown
    checks["a reader maps only the current segment"] = rank == 0 or len(set(_pool_maps())) == 1

    sub = dist.new_group([0, 1, 2], backend="gloo")
    broadcast_state_dict(_state(11) if rank == 0 else mine, via="shm", group=sub, timeout=TIMEOUT)
    checks["a second group has a pool of its own"] = (rank == 0 or _same(mine, _state(11))) and _identity(
        sub
    ) != _identity(world)
    with_sub = shm.pool_bytes()
    dist.destroy_process_group(sub)
    del sub
    gc.collect()
    facts["pooled with the subgroup, after its destruction"] = [with_sub, shm.pool_bytes()]
    checks["destroying a group releases its pool"] = rank != 0 or shm.pool_bytes() < with_sub
    checks["one group's mappings left"] = len(set(_pool_maps())) == 1
    os.environ[shm.POOL_ENV] = str(1 << 20)  # a cap below the next payload: a sealed-once segment, same result
    ref = torch.arange(1 << 20, dtype=torch.int32) * 3
    out = broadcast_tensor(ref if rank == 0 else None, via="shm", timeout=TIMEOUT)
    checks["above the cap: correct, not pooled"] = torch.equal(out, ref) and shm.pool_bytes() <= 1 << 20
    facts["pooled under a 1 MiB cap"] = shm.pool_bytes()
    del os.environ[shm.POOL_ENV]

    return {"checks": checks, "facts": facts, "pid": os.getpid()}


def _attacked(rank: int) -> dict[str, Any]:
    """A pooled call; the attacker acts on the leader's segment; later calls still deliver src's bytes."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict
    from distinit.broadcast._transport import shm

    mine = _state(50 + rank)
    broadcast_state_dict(_state(1) if rank == 0 else mine, via="shm", timeout=TIMEOUT)
    pool = shm._POOLS[dist.group.WORLD]
    if rank == 0 and pool.mine is not None:
        (Path(MEET) / "segment.json").write_text(json.dumps({"pid": os.getpid(), "fd": pool.mine.fd}))
    if rank == 0:
        from via_worker import meet

        meet("pooled", "attacked", timeout=90)
    dist.barrier()
    results = []
    for seed in (2, 3):
        broadcast_state_dict(_state(seed) if rank == 0 else mine, via="shm", timeout=TIMEOUT)
        results.append(rank == 0 or _same(mine, _state(seed)))  # src passed its own
    return {"equal": all(results)}


def _hosts(rank: int) -> dict[str, Any]:
    """Two hosts (ranks 0, 1 here; 2, 3 in a fake host): src's host and the other leader each pool a segment."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict

    mine, equal, ids = _state(50 + rank), [], []
    for call in range(3):
        broadcast_state_dict(_state(call) if rank == 0 else mine, via="shm", timeout=TIMEOUT)
        equal.append(rank == 0 or _same(mine, _state(call)))
        ids.append(tuple(_identity(dist.group.WORLD)))
    return {"equal": all(equal), "pooled": bool(ids[0]) and len(set(ids)) == 1}


def _auto(rank: int) -> dict[str, Any]:
    """via="auto" with copying receivers: 64 MiB three times, then another size once; the route of each call."""
    import logging

    import torch

    from distinit.broadcast import broadcast_tensor

    routes: list[str] = []

    class Routes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            facts = getattr(record, "distinit", None)
            if isinstance(facts, dict) and facts.get("event") == "broadcast.route":
                routes.append(str(facts["route"]))

    logger = logging.getLogger("distinit.broadcast")
    logger.addHandler(Routes(logging.DEBUG))
    logger.setLevel(logging.DEBUG)
    equal = []
    for call, nbytes in enumerate((64 << 20, 64 << 20, 64 << 20, 80 << 20)):
        ref = torch.arange(nbytes // 4, dtype=torch.int32) + call
        got = broadcast_tensor(ref if rank == 0 else torch.empty_like(ref), via="auto", timeout=TIMEOUT)
        equal.append(torch.equal(got, ref))
    return {"equal": all(equal), "routes": routes}


def _killed(rank: int) -> dict[str, Any]:
    """A pooled call, then wait to be SIGKILLed by the test (bounded)."""
    from distinit.broadcast import broadcast_state_dict

    mine = _state(50 + rank)
    broadcast_state_dict(_state(1) if rank == 0 else mine, via="shm", timeout=TIMEOUT)
    (Path(MEET) / f"pooled-{rank}").write_text(json.dumps({"pid": os.getpid(), "maps": _pool_maps()}))
    from via_worker import meet

    meet(f"waiting-{rank}", "never", timeout=90)
    return {}


def _rank_main(scenario: str) -> None:
    import atexit
    import datetime

    exit_file = Path(MEET) / f"exit-{os.environ['RANK']}.json" if MEET else None
    if exit_file is not None:  # registered before torch makes any weakref.finalize: runs after their exit pass
        atexit.register(lambda: exit_file.write_text(json.dumps({"maps": _pool_maps(), "fds": _pool_fds()})))
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()
    result = {"reuse": _reuse, "attacked": _attacked, "killed": _killed, "hosts": _hosts, "auto": _auto}[scenario](rank)
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    if scenario == "attacked":  # leave the world's pool to the exit pass (checked through exit_file)
        dist.barrier()
        return
    dist.destroy_process_group()
    gc.collect()
    if exit_file is not None:
        (Path(MEET) / f"destroyed-{rank}.json").write_text(json.dumps({"maps": _pool_maps(), "fds": _pool_fds()}))


# ------------------------------------------------------------------------------------------------- the attacker
def _try(outcomes: dict[str, str], name: str, action: Any) -> None:
    try:
        action()
        outcomes[name] = "ok"
    except OSError as exc:
        outcomes[name] = errno.errorcode.get(exc.errno or 0, str(exc))


def _attacker_main(meet: Path) -> None:
    """Open the leader's pooled segment every way a process of the same user can and try to change it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

    def checked(result: int) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), "")

    deadline = time.monotonic() + 90
    while not (meet / "pooled").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the leader never pooled")
        time.sleep(0.01)
    seg = json.loads((meet / "segment.json").read_text())
    link = f"/proc/{seg['pid']}/fd/{seg['fd']}"
    outcomes: dict[str, str] = {}
    ro = os.open(link, os.O_RDONLY)
    size = os.fstat(ro).st_size
    _try(outcomes, "fchmod 0600", lambda: os.fchmod(ro, 0o600))  # the owner may: then reopen it writable
    rw = os.open(link, os.O_RDWR)
    _try(outcomes, "pwrite", lambda: os.pwrite(rw, b"\xff" * 4096, 0))
    _try(outcomes, "mmap shared writable", lambda: mmap.mmap(rw, size, mmap.MAP_SHARED).close())
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, rw, 0)
    _try(outcomes, "mprotect a read-only map writable", lambda: checked(libc.mprotect(addr, size, 3)))
    _try(outcomes, "ftruncate", lambda: os.ftruncate(rw, 0))
    _try(outcomes, "fallocate punch hole", lambda: checked(libc.fallocate(rw, 3, 0, size)))  # PUNCH|KEEP_SIZE
    _try(outcomes, "fallocate grow", lambda: checked(libc.fallocate(rw, 0, 0, size + 4096)))
    _try(outcomes, "add a seal", lambda: fcntl_seal(rw))
    private = mmap.mmap(rw, size, mmap.MAP_PRIVATE)  # allowed: copy-on-write, the write stays here
    private[:4096] = b"\xff" * 4096
    (meet / "attacker.json").write_text(json.dumps({"outcomes": outcomes}))
    (meet / "attacked").write_text("")


def fcntl_seal(fd: int) -> None:
    import fcntl

    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)


# --------------------------------------------------------------------------------- the window before the seal
def _window_main() -> None:
    """A process of one user makes pooled segments; another of the same user races to open them writable."""
    from distinit.broadcast._transport import shm

    if os.geteuid() == 0:  # root passes every /proc check: test as an ordinary user (nobody)
        os.setgid(65534)
        os.setuid(65534)
    libc = ctypes.CDLL(None)
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: setuid left this process non-dumpable; a user's process is
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # the attacker: tries the leader's descriptor while the leader is hidden, then after
        os.close(ready_w)
        os.close(go_r)
        leader, fd = json.loads(os.read(ready_r, 200))
        seen: dict[str, str] = {}
        for mode, name in ((os.O_RDONLY, "read-only"), (os.O_RDWR, "writable")):
            _try(seen, f"hidden: open {name}", lambda m=mode: os.close(os.open(f"/proc/{leader}/fd/{fd}", m)))
        _try(seen, "hidden: list /proc/<leader>/fd", lambda: os.listdir(f"/proc/{leader}/fd"))
        os.write(go_w, b"1")
        os.read(ready_r, 1)
        _try(seen, "after: open read-only", lambda: os.close(os.open(f"/proc/{leader}/fd/{fd}", os.O_RDONLY)))
        _try(seen, "after: open writable", lambda: os.close(os.open(f"/proc/{leader}/fd/{fd}", os.O_RDWR)))
        os.write(1, ("SEEN " + json.dumps(seen) + "\n").encode())
        os._exit(0)
    os.close(ready_r)
    os.close(go_w)
    with shm._hidden():
        fd = os.memfd_create("distinit-bc-pool-window", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(ready_w, json.dumps([os.getpid(), fd]).encode())
        os.read(go_r, 1)
    os.fchmod(fd, 0o400)
    os.write(ready_w, b"1")
    _, status = os.waitpid(child, 0)
    seg = shm.Pooled.create(1 << 20, "distinit-bc-pool-window")  # the real thing works as that user too
    seg.close()
    sys.exit(os.waitstatus_to_exitcode(status))


# -------------------------------------------------------------------------------------------------- the tests
def _job(tmp_path: Path, scenario: str, world: int, hosts: Any = None) -> Any:
    from via_launch import Job

    meet = tmp_path / "meet"
    meet.mkdir(exist_ok=True)
    # fresh: _rank_main registers its exit check before torch's first weakref.finalize (so it runs after their exit
    # pass); in a process forked with torch already imported (tests/_zygote.py) it would run before it.
    return Job(tmp_path, scenario, hosts or [(range(world), None)], env={"VIA_MEET": str(meet)},
               command=[sys.executable, __file__, scenario], fresh=True)  # fmt: skip


@pytest.mark.timeout(180)
def test_repeated_calls_reuse_one_segment_and_release_it(tmp_path: Path) -> None:
    """Reuse, growth, the cap, zero_copy views never rewritten, release at destroy_process_group and at exit."""
    results = _job(tmp_path, "reuse", 3).results(timeout=150)
    for rank, result in enumerate(results):
        assert result.get("checks") and all(result["checks"].values()), (rank, result)
    assert results[0]["facts"]["pooled after repeats"] > 0
    meet = tmp_path / "meet"
    for rank in range(3):  # after the world's destruction no pooled descriptor or mapping is left in any rank
        assert json.loads((meet / f"destroyed-{rank}.json").read_text()) == {"maps": [], "fds": []}


@pytest.mark.timeout(150)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (fake host)")
def test_each_hosts_leader_pools_its_own_segment_across_hosts(tmp_path: Path) -> None:
    """Ranks 2, 3 in a fake host (a private /dev/shm): src sends to rank 2 by the network, each host pools."""
    results = _job(tmp_path, "hosts", 4, hosts=[((0, 1), None), ((2, 3), "64m")]).results(timeout=120)
    assert all(r.get("equal") is True and r.get("pooled") is True for r in results), results


@pytest.mark.timeout(150)
def test_auto_takes_the_pool_from_the_second_call_of_a_layout(tmp_path: Path) -> None:
    """The first 64 MiB call and a one-off size go by the network; repeats by the pool, on every rank alike."""
    results = _job(tmp_path, "auto", 2).results(timeout=120)
    for result in results:
        assert result.get("equal") is True and result["routes"] == ["network", "shm", "shm", "network"], result


def test_auto_takes_the_pool_only_where_every_leader_admits_the_payload() -> None:
    """decide() is pure: a repeated 64 MiB payload above one host leader's pool cap stays on the network."""
    from distinit.broadcast._transport.choose import decide

    def rows(cap_of_rank_2: int) -> list[list[int]]:  # ranks 0, 1 on host a; 2, 3 on host b; plenty of /dev/shm
        return [[1, 1, 1 << 40, 5, 5, 1 << 30]] * 2 + [[2, 2, 1 << 40, 5, 5, cap_of_rank_2]] * 2

    total = 64 << 20
    assert decide("auto", rows(1 << 30), src=0, total=total, zero_copy=False, repeat=True).kind == "shm"
    assert decide("auto", rows(1 << 20), src=0, total=total, zero_copy=False, repeat=True).kind == "network"
    assert decide("auto", rows(1 << 30), src=0, total=total, zero_copy=False, repeat=False).kind == "network"
    assert decide("auto", rows(-1), src=0, total=total, zero_copy=False, repeat=True).kind == "network"  # malformed


@pytest.mark.timeout(180)
def test_a_same_user_attacker_cannot_change_a_pooled_segment(tmp_path: Path) -> None:
    meet = tmp_path / "meet"
    meet.mkdir()
    job = _job(tmp_path, "attacked", 2)
    attacker = subprocess.Popen([sys.executable, __file__, "attacker", str(meet)])
    try:
        results = job.results(timeout=150)
        assert (meet / "attacked").exists(), job.logs()  # else the ranks stopped before the attack
        assert attacker.wait(timeout=60) == 0
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait(timeout=10)
    outcomes = json.loads((meet / "attacker.json").read_text())["outcomes"]
    assert outcomes.pop("fchmod 0600") == "ok", outcomes  # the owner may chmod: the seals are what hold
    assert all(result in ("EPERM", "EACCES", "EBUSY") for result in outcomes.values()), outcomes
    assert all(r.get("equal") is True for r in results), results
    for rank in range(2):  # released at exit (weakref.finalize's exit pass) though no group was destroyed
        assert json.loads((meet / f"exit-{rank}.json").read_text()) == {"maps": [], "fds": []}, rank


@pytest.mark.timeout(120)
def test_nobody_else_of_the_user_can_open_the_segment_before_its_seal(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, __file__, "window"], timeout=90, check=False, capture_output=True,
                          text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("SEEN ")]
    seen = json.loads(line[5:])
    assert seen.pop("after: open read-only") == "ok", seen  # the attacker can see it once the seal is on
    assert seen == {"hidden: open read-only": "EACCES", "hidden: open writable": "EACCES",
                    "hidden: list /proc/<leader>/fd": "EACCES", "after: open writable": "EACCES"}  # fmt: skip


@pytest.mark.timeout(120)
def test_a_killed_job_leaves_no_pooled_segment(tmp_path: Path) -> None:
    from via_launch import segments

    before = segments()
    job = _job(tmp_path, "killed", 2)
    meet = tmp_path / "meet"
    try:
        deadline = time.monotonic() + 90
        while not all((meet / f"waiting-{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, job.logs()
            time.sleep(0.05)
        pids = [int((meet / f"waiting-{r}").read_text()) for r in range(2)]
        held = [json.loads((meet / f"pooled-{r}").read_text())["maps"] for r in range(2)]
        assert all(held), held  # both ranks held the pooled segment mapped when killed
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for proc in job.procs:
            proc.wait(timeout=30)
    finally:
        job.stop()
    tags = [f"{_MFD_POOL}p{pid}s" for pid in pids]
    assert segments() == before
    assert not [p for p in _holders() if any(tag in p for tag in tags)]  # no process holds it: the memory is gone


def _holders() -> list[str]:
    """Every pooled segment any process we can see holds open or mapped."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            found += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            found += Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines()
    return [f for f in found if _MFD_POOL in f]


if __name__ == "__main__":
    if sys.argv[1] == "attacker":
        _attacker_main(Path(sys.argv[2]))
    elif sys.argv[1] == "window":
        _window_main()
    else:
        _rank_main(sys.argv[1])
