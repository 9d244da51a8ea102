"""The world's truth from host identities (``init._form``): rows, settling, conflicts. Pure, no network."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distinit._identity import HostIdentity, RankClaim, claim_of
from distinit.env import DistEnv
from distinit.errors import ConflictingEnvError, RendezvousError
from distinit.init import _form


def _env(rank: int, world: int, **values: object) -> DistEnv:
    fields: dict[str, object] = {"rank": rank, "local_rank": 0, "world_size": world, "launcher": "openmpi"}
    fields.update(values)
    fields.setdefault("sources", {"rank": ("OMPI_COMM_WORLD_RANK",)})
    return DistEnv.model_validate(fields)


def _host(name: str, *, node: str | None = None, boot: str = "b00t") -> HostIdentity:
    return HostIdentity(hostname=name, boot_id=boot, shm_device="0:1", netns=1, launcher_node=node)


def _claims(placement: list[str], **per_rank: list[object]) -> list[RankClaim]:
    """Claims for ranks placed on hosts ``placement[rank]``; local ranks by order on each host."""
    seen: dict[str, int] = {}
    claims = []
    for rank, host in enumerate(placement):
        local = seen.get(host, 0)
        seen[host] = local + 1
        values = {key: vals[rank] for key, vals in per_rank.items()}
        values.setdefault("local_rank", local)
        claims.append(RankClaim(rank=rank, identity=_host(host), **values))  # type: ignore[arg-type]
    return claims


def test_round_robin_placement_fills_node_rank_from_the_world() -> None:
    # mpirun --map-by node on two hosts: ranks 0,2 on a; 1,3 on b; the environment knows no node rank.
    claims = _claims(["a", "b", "a", "b"])
    settled = [_form.settle(_env(r, 4, local_rank=c.local_rank), claims) for r, c in enumerate(claims)]
    assert [e.node_rank for e in settled] == [0, 1, 0, 1]
    assert [e.local_rank for e in settled] == [0, 0, 1, 1]
    assert {e.local_world_size for e in settled} == {2} and {e.num_nodes for e in settled} == {2}
    assert settled[3].sources["node_rank"] == (_form.SOURCE,)
    assert settled[3].sources["rank"] == ("OMPI_COMM_WORLD_RANK",)  # what the environment knew is kept


def test_every_node_believes_it_is_node_zero_is_one_error_naming_hosts_and_ranks() -> None:
    # The Lightning story: NODE_RANK=0 on both hosts.
    claims = _claims(["a", "a", "b", "b"], node_rank=[0, 0, 0, 0])
    errors = []
    for rank in range(4):
        with pytest.raises(ConflictingEnvError) as info:
            _form.settle(_env(rank, 4, node_rank=0, local_rank=claims[rank].local_rank), claims)
        errors.append(str(info.value))
    assert len(set(errors)) == 1  # the same words on every rank
    assert "2 hosts claim node rank 0: a, b" in errors[0]
    assert "a = ranks 0,1" in errors[0] and "b = ranks 2,3" in errors[0]
    assert "NODE_RANK" in errors[0]


def test_wrong_node_rank_on_one_host_is_named() -> None:
    claims = _claims(["a", "a", "b", "b"], node_rank=[0, 0, 3, 3])
    with pytest.raises(ConflictingEnvError, match=r"host b \(ranks 2,3\) claims node rank 3 but the ranks run on 2"):
        _form.settle(_env(0, 4, node_rank=0), claims)


def test_local_world_size_that_disagrees_with_the_host_is_named() -> None:
    claims = _claims(["a", "a", "b", "b"], local_world_size=[4, 4, 2, 2])
    with pytest.raises(ConflictingEnvError, match=r"host a runs 2 ranks but ranks \[0, 1\] claim local_world_size"):
        _form.settle(_env(0, 4, local_world_size=4), claims)


def test_claimed_node_ranks_are_kept_even_out_of_torchrun_order() -> None:
    claims = _claims(["a", "a", "b", "b"], node_rank=[1, 1, 0, 0])
    settled = _form.settle(_env(0, 4, node_rank=1), claims)
    assert settled.node_rank == 1 and settled.num_nodes == 2
    assert settled.sources["num_nodes"] == (_form.SOURCE,)
    assert "node_rank" not in settled.sources


def test_two_launcher_nodes_on_one_machine_follow_the_launcher() -> None:
    # torchrun --nnodes 2 twice on one machine: same identity, GROUP_RANK 0 and 1.
    claims = _claims(["m"] * 4, node_rank=[0, 0, 1, 1], local_rank=[0, 1, 0, 1])
    settled = _form.settle(_env(2, 4, node_rank=1), claims)
    assert (settled.node_rank, settled.local_world_size, settled.num_nodes) == (1, 2, 2)
    assert any("several launcher nodes" in note for note in settled.notes)


def test_a_partly_claimed_world_gets_free_node_ranks() -> None:
    claims = _claims(["a", "b", "c"], node_rank=[None, 0, None])
    ranks = [_form.settle(_env(r, 3, node_rank=claims[r].node_rank), claims).node_rank for r in range(3)]
    assert ranks == [1, 0, 2]


def test_launcher_node_names_split_one_kernel() -> None:
    # Fake nodes (or containers) on one machine: same hostname and boot_id, different launcher node names.
    claims = [RankClaim(rank=r, identity=_host("m", node=f"node{r // 2 + 1}"), local_rank=r % 2) for r in range(4)]
    settled = _form.settle(_env(3, 4, local_rank=1), claims)
    assert (settled.node_rank, settled.num_nodes, settled.local_world_size) == (1, 2, 2)
    assert any("share one kernel" in note for note in settled.notes)


def test_rows_round_trip_and_a_long_node_name_travels_as_a_digest() -> None:
    env = _env(0, 1)
    claim = claim_of(env, {"SLURMD_NODENAME": "n" * 5000})
    assert claim.identity.launcher_node is not None and len(claim.identity.launcher_node) < 120
    row = _form._encode(claim)
    assert len(row) == _form.ROW
    assert _form._decode(row, 0, rank=0) == claim


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=_form.ROW, max_size=_form.ROW))
def test_garbage_rows_are_named_never_trusted(row: bytes) -> None:
    with pytest.raises(RendezvousError, match="rank 2 sent a malformed host identity row"):
        _form._decode(row, 2, rank=0)


def test_a_row_for_another_rank_is_refused() -> None:
    row = _form._encode(RankClaim(rank=1, identity=_host("a"), local_rank=0))
    with pytest.raises(RendezvousError, match="the row claims rank 1"):
        _form._decode(row, 0, rank=0)
