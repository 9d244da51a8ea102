"""GPU per task: the device each rank binds (a pure decision) and the refusal of two ranks on one GPU (by UUID)."""

from __future__ import annotations

import pytest

from distinit._identity import HostIdentity, RankClaim, claim_of, shared_gpus
from distinit.env import DistEnv
from distinit.errors import ConflictingEnvError
from distinit.init import _form
from distinit.init._device import DevicePlan, plan_device

# (backend, visible, CUDA_VISIBLE_DEVICES, LOCAL_RANK, LOCAL_WORLD_SIZE) -> plan (None: refused)
PLANS = [
    pytest.param(None, 0, None, 0, 4, DevicePlan("gloo"), id="cpu-host-gloo"),
    pytest.param("gloo", 8, None, 3, 4, DevicePlan("gloo"), id="gloo-named-on-gpu-host"),
    pytest.param("mpi", 1, "0", 0, 1, DevicePlan("mpi"), id="other-backend-named"),
    pytest.param(None, 4, None, 3, 4, DevicePlan("nccl", 3), id="torchrun-every-gpu-visible"),
    pytest.param(None, 8, None, 1, 2, DevicePlan("nccl", 1), id="fewer-ranks-than-gpus"),
    pytest.param(None, 2, "0,1", 1, None, DevicePlan("nccl", 1), id="lws-unknown-fits"),
    pytest.param(None, 1, "0", 0, 4, DevicePlan("nccl", 0), id="srun-gpus-per-task-rank0"),
    pytest.param(None, 1, "3", 3, 4, DevicePlan("nccl", 0), id="srun-gpus-per-task-rank3"),
    pytest.param("nccl", 1, "GPU-5e1c", 2, 4, DevicePlan("nccl", 0), id="uuid-visible-nccl-named"),
    pytest.param(None, 2, "2,3", 1, 4, DevicePlan("nccl", 1), id="two-per-task-rank1"),
    pytest.param(None, 4, "4,5,6,7", 6, 8, DevicePlan("nccl", 2), id="per-socket-groups"),
    pytest.param(None, 2, None, 3, 4, None, id="crowded-host-refused"),
    pytest.param(None, 1, None, 1, None, None, id="crowded-lws-unknown-refused"),
    pytest.param("nccl", 1, "", 1, 2, None, id="empty-cvd-is-unset-refused"),
    pytest.param("nccl", 0, None, 1, 2, DevicePlan("nccl", 1), id="nccl-named-no-cuda-torch-says-so"),
]


@pytest.mark.parametrize(("backend", "visible", "cvd", "local_rank", "lws", "want"), PLANS)
def test_device_plan(
    backend: str | None, visible: int, cvd: str | None, local_rank: int, lws: int | None, want: DevicePlan | None
) -> None:
    def plan() -> DevicePlan:
        return plan_device(
            backend, visible=visible, cuda_visible_devices=cvd, local_rank=local_rank, local_world_size=lws
        )

    if want is not None:
        assert plan() == want
        return
    with pytest.raises(ConflictingEnvError) as caught:
        plan()
    assert caught.value.variables == ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
    assert f"--nproc-per-node={visible}" in caught.value.fix and "--gpus-per-task=1" in caught.value.fix


def test_srun_gpus_per_task_binds_distinct_gpus() -> None:
    """Four ranks of one host, one device each through per-rank CUDA_VISIBLE_DEVICES: each binds its own."""
    plans = [
        plan_device(None, visible=1, cuda_visible_devices=str(r), local_rank=r, local_world_size=4) for r in range(4)
    ]
    assert {p.device for p in plans} == {0} and {p.backend for p in plans} == {"nccl"}


HOST = HostIdentity(hostname="gpu-a", boot_id="b00t", shm_device="0:1", netns=1)
OTHER = HostIdentity(hostname="gpu-b", boot_id="b11t", shm_device="0:1", netns=1)


def _claims(*rows: tuple[HostIdentity, str | None]) -> list[RankClaim]:
    return [RankClaim(rank=r, identity=host, gpu=gpu) for r, (host, gpu) in enumerate(rows)]


SHARED = [
    pytest.param(_claims((HOST, "GPU-a"), (HOST, "GPU-b")), [], id="distinct-gpus"),
    pytest.param(_claims((HOST, None), (HOST, None)), [], id="gloo-no-gpu"),
    pytest.param(_claims((HOST, "GPU-a"), (HOST, "GPU-a")), [(0, 1)], id="two-ranks-one-gpu"),
    pytest.param(_claims((HOST, "GPU-a"), (OTHER, "GPU-b"), (HOST, "GPU-c"), (HOST, "GPU-a")), [(0, 3)], id="4-ranks"),
    pytest.param(
        _claims((HOST, "GPU-a"), (HOST, "GPU-a"), (OTHER, "GPU-z"), (OTHER, "GPU-z")), [(0, 1), (2, 3)], id="both"
    ),
]


@pytest.mark.parametrize(("claims", "want"), SHARED)
def test_shared_gpus(claims: list[RankClaim], want: list[tuple[int, ...]]) -> None:
    assert [c.ranks for c in shared_gpus(claims)] == want


def test_settle_refuses_a_shared_gpu_on_every_rank_naming_both_ranks() -> None:
    claims = _claims((HOST, "GPU-5e1c"), (HOST, "GPU-5e1c"))
    texts = set()
    for rank in range(2):
        env = DistEnv.model_validate({"rank": rank, "world_size": 2, "local_rank": rank, "launcher": "slurm"})
        with pytest.raises(ConflictingEnvError) as caught:
            _form.settle(env, claims)
        texts.add(str(caught.value))
    (text,) = texts  # the same verdict on both ranks
    assert "ranks 0, 1 (host gpu-a) all bound GPU GPU-5e1c" in text and "--gpus-per-task=1" in text


def test_gpu_uuid_travels_in_the_identity_row() -> None:
    env = DistEnv.model_validate({"rank": 0, "world_size": 1, "local_rank": 0, "launcher": "slurm"})
    claim = claim_of(env, {}, HOST, gpu="GPU-" + "f" * 36)
    assert _form._decode(_form._encode(claim), 0, rank=0).gpu == claim.gpu
