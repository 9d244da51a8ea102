"""``distinit._identity.group_ranks``: hosts from identities, torchrun's derived layout, every conflict named."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from distinit._identity import HostIdentity, RankClaim, group_ranks, local_identity, open_mpi_node

BOOT = "cf776ca3-0000-0000-0000-000000000000"


def host(name: str, *, boot: str | None = None, netns: int = 1) -> HostIdentity:
    return HostIdentity(hostname=name, boot_id=boot or f"boot-{name}", shm_device="0:27", netns=netns)


def claim(rank: int, where: HostIdentity, **claimed: int | None) -> RankClaim:
    return RankClaim(rank=rank, identity=where, **claimed)


def test_one_host_of_four_ranks_is_node_zero_with_local_ranks_in_order() -> None:
    a = host("a")
    layout = group_ranks([claim(r, a, node_rank=0, local_rank=r, local_world_size=4, num_nodes=1) for r in range(4)])
    assert not layout.conflicts
    assert layout.num_nodes == 1
    assert layout.hosts[0].ranks == (0, 1, 2, 3) and layout.hosts[0].node_rank == 0


def test_hosts_are_ordered_by_lowest_global_rank_as_torchrun_does() -> None:
    a, b = host("a"), host("b")
    # ranks interleaved across hosts, and given in a scrambled order
    claims = [claim(3, a), claim(0, b), claim(1, a), claim(2, b)]
    layout = group_ranks(claims)
    assert [h.label for h in layout.hosts] == ["b", "a"]
    assert layout.hosts[0].ranks == (0, 2) and layout.hosts[1].ranks == (1, 3)
    assert layout.host_of(3).node_rank == 1


def test_every_node_believing_it_is_node_zero_names_both_hosts() -> None:
    a, b = host("node-a"), host("node-b")
    claims = [claim(r, a if r < 2 else b, node_rank=0, local_rank=r % 2, local_world_size=2) for r in range(4)]
    layout = group_ranks(claims)
    (shared,) = [c for c in layout.conflicts if c.kind == "node_rank_shared"]
    assert shared.hosts == ("node-a", "node-b")
    assert shared.ranks == (0, 1, 2, 3)
    assert "2 hosts claim node rank 0: node-a, node-b" in shared.message


def test_local_ranks_that_are_not_zero_to_n_minus_one_are_named() -> None:
    a = host("a")
    layout = group_ranks([claim(0, a, local_rank=0), claim(1, a, local_rank=0)])
    (bad,) = layout.conflicts
    assert bad.kind == "local_ranks" and bad.hosts == ("a",) and "[0, 0]" in bad.message


def test_local_world_size_and_num_nodes_disagreements() -> None:
    a, b = host("a"), host("b")
    layout = group_ranks([claim(0, a, local_world_size=2, num_nodes=1), claim(1, b, local_world_size=1, num_nodes=2)])
    kinds = {c.kind: c for c in layout.conflicts}
    assert kinds["local_world_size"].ranks == (0,)
    assert kinds["num_nodes"].ranks == (0,) and "2 hosts" in kinds["num_nodes"].message


def test_one_machine_split_across_node_ranks_follows_the_launcher() -> None:
    # Two torchrun agents on one machine (--nnodes 2 to try a multi-node job): two nodes, with a note.
    a = host("a")
    layout = group_ranks([claim(r, a, node_rank=r // 2, local_rank=r % 2) for r in range(4)])
    assert layout.conflicts == ()
    assert [h.ranks for h in layout.hosts] == [(0, 1), (2, 3)]
    assert any("several launcher nodes" in note for note in layout.notes)


def test_one_machine_split_with_wrong_local_ranks_is_still_a_conflict() -> None:
    a = host("a")
    layout = group_ranks([claim(0, a, node_rank=0, local_rank=0), claim(1, a, node_rank=1, local_rank=1)])
    assert [c.kind for c in layout.conflicts] == ["local_ranks"]


def test_a_rank_claimed_twice_is_reported_and_the_first_claim_kept() -> None:
    a, b = host("a"), host("b")
    layout = group_ranks([claim(0, a), claim(0, b), claim(1, b)])
    assert layout.conflicts[0].kind == "duplicate_rank" and layout.conflicts[0].hosts == ("a", "b")
    assert layout.host_of(0).label == "a"


def test_shared_kernel_with_distinct_hostnames_is_a_note_not_a_conflict() -> None:
    a, b = host("fake-a", boot=BOOT, netns=1), host("fake-b", boot=BOOT, netns=2)
    layout = group_ranks([claim(0, a, node_rank=0), claim(1, b, node_rank=1)])
    assert not layout.conflicts
    assert len(layout.notes) == 1 and "fake-a, fake-b share one kernel" in layout.notes[0]


def test_distinct_hosts_with_one_hostname_get_distinct_labels() -> None:
    a, b = host("same", netns=1), host("same", netns=2)
    layout = group_ranks([claim(0, a), claim(1, b)])
    assert [h.label for h in layout.hosts] == ["same", "same#2"]


def test_local_identity_reads_this_machine() -> None:
    me = local_identity({"SLURMD_NODENAME": "n07"})
    assert me.hostname and me.launcher_node == "n07"
    assert me.boot_id is None or len(me.boot_id) >= 32
    assert local_identity({}) == local_identity({})


def test_launcher_node_names_of_hydra_and_open_mpi() -> None:
    """Recorded variables of hydra's fake hosts and Open MPI's orteds (see tests/integration/launchers/captures)."""
    assert local_identity({"MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "fakehost-b"}).launcher_node == "fakehost-b"
    ompi = {
        "OMPI_MCA_orte_local_daemon_uri": "1578631168.2;tcp://192.0.2.2:60229;tcp6://[fd00::2]:55697",
        "OMPI_MCA_orte_node_regex": "vm,fakehost-a,fakehost-b@0(3)",
    }
    assert open_mpi_node(ompi) == "fakehost-b"
    assert local_identity({**ompi, "SLURMD_NODENAME": "dnode2"}).launcher_node == "dnode2"  # innermost first
    compressed = {**ompi, "OMPI_MCA_orte_node_regex": "node[2:1-4]@0(5)"}
    assert open_mpi_node(compressed) == "orted2"
    assert open_mpi_node({**ompi, "OMPI_MCA_orte_node_regex": "vm@0(1)"}) == "orted2"  # vpid beyond the list
    assert open_mpi_node({}) is None and open_mpi_node({"OMPI_MCA_orte_local_daemon_uri": "garbage"}) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=24), st.randoms(use_true_random=False))
def test_consistent_claims_never_conflict_and_layout_is_torchruns(assignment: list[int], rnd: object) -> None:
    """Any assignment of ranks to hosts, claimed exactly as derived, has no conflict; derived values are sound."""
    hosts = [host(f"h{i}") for i in range(6)]
    by_host: dict[int, list[int]] = {}
    for rank, h in enumerate(assignment):
        by_host.setdefault(h, []).append(rank)
    order = sorted(by_host, key=lambda h: by_host[h][0])
    claims = [
        claim(
            rank,
            hosts[h],
            node_rank=order.index(h),
            local_rank=by_host[h].index(rank),
            local_world_size=len(by_host[h]),
            num_nodes=len(by_host),
        )
        for rank, h in enumerate(assignment)
    ]
    rnd.shuffle(claims)  # type: ignore[attr-defined]
    layout = group_ranks(claims)
    assert not layout.conflicts
    assert [h.node_rank for h in layout.hosts] == list(range(len(by_host)))
    assert sorted(r for h in layout.hosts for r in h.ranks) == list(range(len(assignment)))
    # and flipping one node rank onto another host's is always caught
    if len(by_host) > 1:
        moved = [c if c.rank != 0 else RankClaim.model_validate({**c.model_dump(), "node_rank": 1}) for c in claims]
        assert {c.kind for c in group_ranks(moved).conflicts} & {"node_rank_shared", "node_rank_split"}
