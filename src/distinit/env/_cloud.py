"""Cloud and Kubernetes platforms: SageMaker, Vertex AI, Azure ML, Kubeflow.

Platforms either run the script once per host (SageMaker, Vertex: the world is one process per
host, derived from their host lists), start an MPI or torch launcher themselves (their variables then
only name the platform and give rank 0's host), or — Kubeflow with ``nprocPerNode`` — hand the pod a
*pre-launch* environment whose ``RANK`` is a pod index that torchrun is expected to expand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from distinit._port import PORT_MAX, PORT_MIN
from distinit._text import decimal, quoted
from distinit.env._draft import Draft, Vars
from distinit.env._model import Launcher
from distinit.errors import ConflictingEnvError, MalformedEnvError

_AZURE_MARKERS = (
    "AZUREML_RUN_ID",
    "AZUREML_EXPERIMENT_ID",
    "AZ_BATCH_MASTER_NODE",
    "AZ_BATCHAI_MPI_MASTER_NODE",
)
_SAGEMAKER_MARKERS = ("SM_HOSTS", "SM_CURRENT_HOST", "SM_TRAINING_ENV")


@dataclass(frozen=True)
class Platform:
    """A platform's name and what it says about the hosts (``hosts`` in rank order of the nodes)."""

    launcher: Launcher
    hosts: tuple[str, ...] | None = None
    hosts_var: str | None = None
    current: int | None = None
    master_addr: str | None = None
    master_var: str | None = None
    master_port: int | None = None


def _json(v: Vars, name: str) -> object:
    text = v.text(name)
    try:
        return json.loads(text or "")
    except json.JSONDecodeError as exc:
        problem = f"{exc.msg} at position {exc.pos}"
    except ValueError:  # an integer of more than 4300 digits
        problem = "a number too long to read"
    except RecursionError:
        problem = "nested too deeply"
    raise MalformedEnvError(
        f"{name} is not valid JSON ({problem}).",
        variables=(name,),
        fix=f"do not override {name}; the platform sets it.",
    )


def _sagemaker(v: Vars) -> Platform | None:
    if not v.has("SM_HOSTS"):
        return Platform("sagemaker") if v.has(*_SAGEMAKER_MARKERS) else None
    hosts = _json(v, "SM_HOSTS")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise MalformedEnvError(
            f"SM_HOSTS={v.quoted('SM_HOSTS')} is not a non-empty JSON list of host names.",
            variables=("SM_HOSTS",),
            fix="do not override SM_HOSTS; SageMaker sets it.",
        )
    current_name = v.text("SM_CURRENT_HOST")
    current = None
    if current_name is not None:
        if current_name not in hosts:
            raise ConflictingEnvError(
                f"SM_CURRENT_HOST={v.quoted('SM_CURRENT_HOST')} is not in SM_HOSTS={v.quoted('SM_HOSTS')}.",
                variables=("SM_CURRENT_HOST", "SM_HOSTS"),
                fix="do not override SM_CURRENT_HOST or SM_HOSTS; SageMaker sets them.",
            )
        current = hosts.index(current_name)
    return Platform(
        "sagemaker",
        hosts=tuple(hosts),
        hosts_var="SM_HOSTS",
        current=current,
        master_addr=hosts[0],
        master_var="SM_HOSTS",
    )


def _vertex(v: Vars) -> Platform | None:
    if not v.has("CLUSTER_SPEC"):
        return None
    spec = _json(v, "CLUSTER_SPEC")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    task = spec.get("task") if isinstance(spec, dict) else None
    chief = cluster.get("workerpool0") if isinstance(cluster, dict) else None
    workers = cluster.get("workerpool1", []) if isinstance(cluster, dict) else None
    if not (isinstance(chief, list) and chief and isinstance(workers, list) and isinstance(task, dict)):
        raise MalformedEnvError(
            "CLUSTER_SPEC has no 'cluster.workerpool0' host list and 'task' entry.",
            variables=("CLUSTER_SPEC",),
            fix="do not override CLUSTER_SPEC; Vertex AI sets it for custom training jobs.",
        )
    hosts = [*chief, *workers]
    if not all(isinstance(entry, str) and entry.strip() for entry in hosts):
        raise MalformedEnvError(
            "CLUSTER_SPEC lists a replica that is not a 'host:port' string.",
            variables=("CLUSTER_SPEC",),
            fix="do not override CLUSTER_SPEC; Vertex AI sets it for custom training jobs.",
        )
    current = _vertex_replica(task, chief=len(chief), workers=len(workers))
    master_addr, master_port = _host_port(hosts[0])
    return Platform(
        "vertex",
        hosts=tuple(hosts),
        hosts_var="CLUSTER_SPEC",
        current=current,
        master_addr=master_addr,
        master_var="CLUSTER_SPEC",
        master_port=master_port,
    )


def _vertex_replica(task: dict[str, object], *, chief: int, workers: int) -> int:
    """This replica's index in the chief-then-workers host list; it must lie in its own pool."""
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in ("workerpool0", "workerpool1") or not isinstance(index, int) or isinstance(index, bool):
        raise MalformedEnvError(
            f"CLUSTER_SPEC task type {_shown(task_type)} with index {_shown(index)} is not a training replica "
            "(workerpool0 or workerpool1).",
            variables=("CLUSTER_SPEC",),
            why="reduction servers (workerpool2) and evaluators (workerpool3) are not part of the torch world.",
            fix="run the training code only in worker pools 0 and 1.",
        )
    size = chief if task_type == "workerpool0" else workers
    if not 0 <= index < size:
        shown = index if abs(index) < 10**20 else "a number of more than 20 digits"
        raise MalformedEnvError(
            f"CLUSTER_SPEC task index {shown} of {task_type} is outside its host list of {size} replicas.",
            variables=("CLUSTER_SPEC",),
            why="another replica would get the same rank.",
            fix="do not override CLUSTER_SPEC; Vertex AI sets it for custom training jobs.",
        )
    return index if task_type == "workerpool0" else chief + index


def _shown(value: object) -> str:
    """A JSON scalar as written; a container by its type only (its repr could be huge or nested deeply)."""
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return json.dumps(value)[:40]
    return f"<a JSON {type(value).__name__}>"


def _host_port(entry: str) -> tuple[str, int | None]:
    """``'host:port'`` → (host, port), ``'host'`` → (host, None); a missing host or a bad port is an error."""
    host, sep, port_text = entry.strip().rpartition(":")
    if not sep:
        return entry.strip(), None
    port = decimal(port_text)
    if not host or port is None or not PORT_MIN <= port <= PORT_MAX:
        raise MalformedEnvError(
            f"CLUSTER_SPEC's first replica {quoted(entry)} is not 'host:port' with a TCP port ({PORT_MIN}-{PORT_MAX}).",
            variables=("CLUSTER_SPEC",),
            fix="do not override CLUSTER_SPEC; Vertex AI sets it for custom training jobs.",
        )
    return host, port


def _azure(v: Vars) -> Platform | None:
    if not v.has(*_AZURE_MARKERS):
        return None
    multi = v.text("AZ_BATCH_MASTER_NODE")
    if multi is not None:
        host = multi.rsplit(":", 1)[0].strip()
        if not host:
            raise MalformedEnvError(
                f"AZ_BATCH_MASTER_NODE={v.quoted('AZ_BATCH_MASTER_NODE')} has no host name.",
                variables=("AZ_BATCH_MASTER_NODE",),
                why="Azure ML writes it as 'host:port' for the node of rank 0.",
                fix="do not override AZ_BATCH_MASTER_NODE, or export MASTER_ADDR.",
            )
        return Platform("azureml", master_addr=host, master_var="AZ_BATCH_MASTER_NODE")
    single = v.text("AZ_BATCHAI_MPI_MASTER_NODE")
    if single is not None:
        return Platform("azureml", master_addr=single, master_var="AZ_BATCHAI_MPI_MASTER_NODE")
    return Platform("azureml")


def read(v: Vars) -> Platform | None:
    """The cloud platform this process runs on, if its variables say so."""
    return _sagemaker(v) or _vertex(v) or _azure(v)


def apply(found: Platform, draft: Draft, *, per_host: bool) -> None:
    """Name the platform as launcher and add rank 0's host and the node rank from its host list.

    ``per_host`` is True when the platform itself is the launcher (one process per host), False when
    an MPI or torch launcher it started gives the ranks.
    """
    draft.launcher = found.launcher
    if found.master_addr is not None and found.master_var is not None:
        draft.put("master_addr", found.master_addr, found.master_var)
    if found.master_port is not None:
        draft.put("master_port", found.master_port, "CLUSTER_SPEC")
    if found.hosts is not None and found.current is not None and found.hosts_var is not None:
        if per_host or draft.node_rank is None or not draft.trusted_node_rank:
            draft.put(
                "node_rank",
                found.current,
                found.hosts_var,
                "SM_CURRENT_HOST" if found.hosts_var == "SM_HOSTS" else found.hosts_var,
            )
            draft.trusted_node_rank = True
        draft.put("num_nodes", len(found.hosts), found.hosts_var)


def per_host_world(found: Platform) -> Draft | None:
    """The one-process-per-host world of a platform that runs the script on each host."""
    if found.hosts is None or found.current is None or found.hosts_var is None:
        return None
    draft = Draft(launcher=found.launcher, rank=found.current, world_size=len(found.hosts))
    sources = (found.hosts_var, "SM_CURRENT_HOST") if found.hosts_var == "SM_HOSTS" else (found.hosts_var,)
    draft.sources.update(rank=sources, world_size=(found.hosts_var,))
    draft.put("local_rank", 0, "rule: one process per host")
    draft.put("local_world_size", 1, "rule: one process per host")
    apply(found, draft, per_host=True)
    draft.note(f"{found.launcher} runs the script once per host: one process per host is assumed.")
    return draft


def prelaunch(v: Vars) -> tuple[str, str] | None:
    """``(variable, explanation)`` when the pod holds a pre-launch environment that torchrun must expand."""
    for name, platform_name in (("PET_NPROC_PER_NODE", "Kubeflow PyTorchJob"), ("NPROC_PER_NODE", "PAI-DLC")):
        value = v.text(name)
        if value is None or (name == "NPROC_PER_NODE" and not v.has("RANK", "WORLD_SIZE")):
            continue
        count = decimal(value)
        if count is not None and count <= 1:
            continue
        return name, (
            f"{name}={v.quoted(name)} without TORCHELASTIC_RUN_ID: this is {platform_name}'s pre-launch environment, "
            f"where RANK={v.quoted('RANK')} is the pod (node) index and WORLD_SIZE={v.quoted('WORLD_SIZE')} counts the "
            "processes torchrun is expected to start."
        )
    return None
