"""Render the committed benchmark results as PNGs under docs/img/ and write docs/benchmarks.md.

Run:  .venv/bin/python benchmarks/plot.py   (needs the ``bench`` extra: ``pip install -e '.[bench]'``)

Reads only ``benchmarks/results/*.json`` (the source of truth) and never re-runs a benchmark. A figure whose
results file is missing, or whose run predates the fields it needs, is skipped or drawn from what the file
holds, with a line saying so: no number here is made up. Every caption states the machine, the command, the
date and the load average the JSON recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # after matplotlib.use: the backend must be chosen first

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"
DOC = ROOT / "docs" / "benchmarks.md"
DPI = 100
OURS, THEIRS, FLOOR = "#1f77b4", "#d62728", "#7f7f7f"
plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "figure.dpi": DPI, "savefig.dpi": DPI})

Section = tuple[str, list[str]]  # (title, markdown lines)
JOIN_LABELS = (
    "simulated ranks (threads, one TCPStore client each; log)",
    "seconds (log)",
    "Join protocol against one TCPStore (one run per size)",
)
HEADER_LABELS = (
    "gloo processes on this machine (log; 2 vCPUs, so worlds > 2 are oversubscribed)",
    "ms per call, minimum (log)",
    "Broadcast header exchange and its alternatives against world size",
)


# ---------------------------------------------------------------------------------------------- helpers
def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _committed(name: str) -> str | None:
    """The date of the last commit holding ``results/<name>.json`` (for runs whose JSON has no date)."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%cI", "--", f"benchmarks/results/{name}.json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def caption(name: str, data: dict[str, Any]) -> str:
    """Machine, command, date and load average, from whichever fields this results file has."""
    machine = data.get("machine")
    facts = data.get("machine_facts") or (machine if isinstance(machine, dict) else {})
    meta = data.get("meta") or {}
    command = facts.get("command") or meta.get("command") or data.get("command")
    if command is None and name == "watchdog":
        args = data.get("args", {})
        command = "python benchmarks/bench_watchdog.py" + (" --quick" if args.get("quick") else "")
    when = facts.get("when") or meta.get("when") or meta.get("date") or data.get("when")
    when_note = ""
    if when is None:
        when, when_note = _committed(name), " (commit date: the run recorded none)"
    if when is None:
        when, when_note = "date not recorded", ""
    cpus = facts.get("cpus") or meta.get("cpus") or (machine.get("cpus") if isinstance(machine, dict) else None)
    torch = facts.get("torch") or meta.get("torch") or (machine.get("torch") if isinstance(machine, dict) else None)
    load = _load_text(facts, meta, data)
    parts = [f"`{command}`" if command else "command not recorded", f"{when}{when_note}"]
    parts.append(f"{cpus} CPUs" if cpus else (str(machine) if machine else "machine not recorded"))
    if torch:
        parts.append(f"torch {torch}")
    if facts.get("gpu"):
        parts.append(str(facts["gpu"]))
    parts.append(load)
    return "; ".join(parts)


def _load_text(facts: dict[str, Any], meta: dict[str, Any], data: dict[str, Any]) -> str:
    if facts.get("load_average_at_end"):
        start = facts.get("load_average_at_start")
        return f"load average (1/5/15 min) {start} at the start, {facts['load_average_at_end']} at the end"
    if "load_average_1m_at_end" in meta:
        return f"1-minute load average {meta['load_average_1m_at_end']:.1f} at the end"
    if "load_average_1min" in meta:
        before, after = meta["load_average_1min"]
        return f"1-minute load average {before} before, {after} after"
    loads = [v.get("load_avg_1m") for v in data.get("latency", {}).values() if isinstance(v, dict)]
    loads = [x for x in loads if x is not None]
    if loads:
        return f"1-minute load average {min(loads):.1f}-{max(loads):.1f} during the latency trials"
    return "load average not recorded by this run"


def save(fig: Any, name: str, *, bottom: float = 0.0) -> str:
    """Write docs/img/<name>.png; ``bottom``: the figure fraction kept free for a legend below the axes."""
    IMG.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(IMG / f"{name}.png", dpi=DPI)
    plt.close(fig)
    return f"![{name}](img/{name}.png)"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def plain_log(ax: Any, axis: str = "x") -> None:
    """A log axis labelled with plain numbers (1, 10, 300) rather than powers of ten."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(matplotlib.ticker.NullFormatter())


def case_bars(ax: Any, cases: dict[str, Any], table: tuple[tuple[str, str, str], ...]) -> None:
    """``bars`` in ms for the rows of ``table`` (label, results key, colour) that ``cases`` holds."""
    rows = [(label, cases[key], color) for label, key, color in table if key in cases]
    mins, medians = [r[1]["min"] * 1e3 for r in rows], [r[1]["median"] * 1e3 for r in rows]
    bars(ax, [r[0] for r in rows], mins, medians, [r[2] for r in rows])


def world_axes(ax: Any, labels: tuple[str, str, str], legend_size: float) -> None:
    """x: a world size on a base-2 log axis labelled 64, 128, ...; y: a plain log axis; (x, y, title) labels."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    plain_log(ax, "y")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    ax.legend(fontsize=legend_size)


def size_label(nbytes: float, _: Any = None) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def bars(ax: Any, labels: list[str], mins: list[float], medians: list[float], colors: list[str]) -> None:
    """Horizontal bars at the minimum, a tick at the median."""
    ys = range(len(labels))
    ax.barh(ys, mins, color=colors, alpha=0.85, label="minimum")
    ax.scatter(medians, ys, marker="|", s=200, color="black", label="median", zorder=3)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()


# ---------------------------------------------------------------------------------------------- broadcast
MODEL_ROWS = (
    ("distinit broadcast_module", "distinit broadcast_module", OURS),
    (
        "distinit, model flattened (own rounds)",
        "distinit broadcast_module, model flattened (flatten_module_)",
        "#6baed6",
    ),
    ("torch per-parameter loop", "torch per-parameter loop", THEIRS),
    ("torch _broadcast_coalesced", "torch _broadcast_coalesced (250 MiB)", "#fc8d59"),
    ("one flat broadcast", "one pre-allocated flat broadcast", FLOOR),
)


def broadcast_models(data: dict[str, Any]) -> Section:
    worlds = list(data["results"])
    fig, axes = plt.subplots(len(worlds), 2, figsize=(8, 1.9 * len(worlds) + 0.6), squeeze=False)
    for i, world in enumerate(worlds):
        for j, model in enumerate(("A", "B")):
            ax = axes[i][j]
            case_bars(ax, data["results"][world][model], MODEL_ROWS)
            plain_log(ax)
            ax.set_title(f"{world}, model {model} ({'168 tensors, 340 MB' if model == 'A' else '2000 x 4 KB'})")
            ax.set_xlabel("ms per call (log)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("broadcast_module vs torch's ways to broadcast a model (gloo, lower is better)", fontsize=9)
    image = save(fig, "broadcast_models", bottom=0.07)
    lines = [image, "", "| world | model | method | min | median | min / best torch |", "|---|---|---|---:|---:|---:|"]
    for world in worlds:
        for model in ("A", "B"):
            cases = data["results"][world][model]
            best = min(cases["torch per-parameter loop"]["min"], cases["torch _broadcast_coalesced (250 MiB)"]["min"])
            for label, key, _ in MODEL_ROWS:
                if key in cases:
                    c = cases[key]
                    lines.append(
                        f"| {world} | {model} | {label} | {ms(c['min'])} | {ms(c['median'])} | {c['min'] / best:.2f}x |"
                    )
    return "Broadcasting a model", lines


def broadcast_targets(data: dict[str, Any]) -> list[str]:
    """The model B and small-call targets (docs/broadcast.md), judged on the minimum, from the same rounds."""
    lines = ["| world | target | measured | verdict |", "|---|---|---:|---|"]
    for world, modes in data["results"].items():
        b = {k: v["min"] for k, v in modes["B"].items()}
        best = min(b["torch per-parameter loop"], b["torch _broadcast_coalesced (250 MiB)"])
        checks = [
            ("model B: broadcast_module <= 0.8x best torch", b["distinit broadcast_module"] / best, 0.8),
            (
                "model B flattened (flatten_module_) <= 0.5x best torch",
                b["distinit broadcast_module, model flattened (flatten_module_)"] / best,
                0.5,
            ),
        ]
        small = {k: v["min"] for k, v in modes["small"].items()}
        floor = small.get("tensor 1 KB: floor, the header all-to-all alone")
        if int(world.split()[-1]) < 4:  # world 2 keeps its target against a raw broadcast
            raw = small["tensor 1 KB: torch broadcast into a pre-allocated buffer"]
            ratio = small["tensor 1 KB: distinit broadcast_tensor (receivers pass a buffer)"] / raw
            checks.append(("1 KB broadcast_tensor (receivers pass a buffer) <= 2x a raw broadcast", ratio, 2.0))
        elif floor:
            for who in ("receivers pass a buffer", "receivers pass None"):
                ratio = small[f"tensor 1 KB: distinit broadcast_tensor ({who})"] / floor
                checks.append((f"1 KB broadcast_tensor ({who}) <= 1.5x the header all-to-all floor", ratio, 1.5))
        for label, ratio, limit in checks:
            lines.append(f"| {world} | {label} | {ratio:.2f}x | {'met' if ratio <= limit else 'missed'} |")
    return lines


def broadcast_sizes(data: dict[str, Any]) -> Section:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    notes: list[str] = []
    styles = {"world 2": "-", "world 4": "--"}
    for world, modes in data["results"].items():
        if "sweep" in modes:
            points = {int(size): cases for size, cases in modes["sweep"].items()}
            raw_key, ours_key = (
                "torch broadcast into a pre-allocated buffer",
                "distinit broadcast_tensor (receivers pass a buffer)",
            )
        else:
            small = modes["small"]
            points = {
                1024: {k.split(": ", 1)[1]: v for k, v in small.items() if k.startswith("tensor 1 KB: ")},
                64 << 20: {k.split(": ", 1)[1]: v for k, v in small.items() if k.startswith("tensor 64 MB: ")},
            }
            raw_key, ours_key = (
                "torch broadcast into a pre-allocated buffer",
                "distinit broadcast_tensor (receivers pass a buffer)",
            )
            notes.append(f"{world}: this run has no payload sweep, only the 1 KB and 64 MB points")
        sizes = sorted(points)
        for key, color, label in ((raw_key, THEIRS, "torch broadcast"), (ours_key, OURS, "distinit broadcast_tensor")):
            rate = [size / points[size][key]["min"] / 1e9 for size in sizes]
            ax.plot(sizes, rate, styles.get(world, ":"), marker="o", color=color, label=f"{label}, {world} (min)")
    roof = data.get("ceilings")
    if roof:
        ax.axhline(roof["memcpy_GBps"], color=FLOOR, lw=1, ls="-.", label="memcpy, one core (same run)")
        ax.axhline(roof["tcp_loopback_GBps"], color="#2ca02c", lw=1, ls="-.", label="one TCP stream over loopback")
    else:
        notes.append(
            "no memcpy / TCP-loopback reference lines: this run predates them (the next `make bench` records them)"
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(size_label))
    plain_log(ax, "y")
    ax.set_xlabel("payload (log)")
    ax.set_ylabel("effective GB/s = bytes / time (log)")
    ax.set_title("broadcast_tensor vs raw broadcast by payload size, receivers pass a buffer (gloo)")
    ax.legend(fontsize=6.5, loc="upper left")
    lines = [save(fig, "broadcast_sizes")]
    lines += [f"\n_Note: {n}._" for n in notes]
    return "Broadcast throughput by payload size", lines


SMALL_ROWS = (
    ("header all-to-all alone (floor)", "tensor 1 KB: floor, the header all-to-all alone", FLOOR),
    ("torch broadcast, 1 KB", "tensor 1 KB: torch broadcast into a pre-allocated buffer", THEIRS),
    ("distinit broadcast_tensor, 1 KB", "tensor 1 KB: distinit broadcast_tensor (receivers pass a buffer)", OURS),
    ("torch broadcast_object_list, ~1 KB config", "object: torch broadcast_object_list", THEIRS),
    ("distinit broadcast_object, ~1 KB config", "object: distinit broadcast_object", OURS),
)


def broadcast_small(data: dict[str, Any]) -> Section:
    worlds = list(data["results"])
    fig, axes = plt.subplots(1, len(worlds), figsize=(8, 2.6), squeeze=False)
    for ax, world in zip(axes[0], worlds, strict=True):
        small = data["results"][world]["small"]
        case_bars(ax, small, SMALL_ROWS)
        floor = small.get("tensor 1 KB: floor, the header all-to-all alone")
        if floor:
            ax.axvline(1.5 * floor["min"] * 1e3, color=FLOOR, ls=":", lw=1, label="1.5x the floor (target)")
        ax.set_title(world)
        ax.set_xlabel("ms per call")
        if ax is not axes[0][0]:
            ax.set_yticklabels([])
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle("Small calls (gloo): checked broadcasts against the header-exchange floor of the same run", fontsize=9)
    lines = [save(fig, "broadcast_small", bottom=0.1), "", "| world | call | min | median |", "|---|---|---:|---:|"]
    for world in worlds:
        small = data["results"][world]["small"]
        lines += [
            f"| {world} | {label} | {ms(small[key]['min'])} | {ms(small[key]['median'])} |"
            for label, key, _ in SMALL_ROWS
            if key in small
        ]
    return "Small broadcasts", lines


REPEAT_KEYS = ('via="network"', 'via="shm", repeated (the segment pool)',
               'via="shm", pool off (a fresh sealed segment every call)')  # fmt: skip
REPEAT_ROWS = tuple(zip(REPEAT_KEYS, REPEAT_KEYS, (THEIRS, OURS, FLOOR), strict=True))


def broadcast_shm_repeat(data: dict[str, Any]) -> Section:
    """Issue 27: repeated 256 MiB shm calls of one layout against the network (>= 2x at world 4, >= 1x at 2)."""
    worlds = list(data["results"])
    fig, axes = plt.subplots(1, len(worlds), figsize=(8, 1.9), squeeze=False)
    lines = ["| world | shm repeated / network (min) | median | target | |", "|---|---:|---:|---:|---|"]
    for ax, world in zip(axes[0], worlds, strict=True):
        rows = data["results"][world]["repeat"]
        case_bars(ax, rows, REPEAT_ROWS)
        ax.set_title(world)
        ax.set_xlabel("ms per 256 MiB state dict")
        if ax is not axes[0][0]:
            ax.set_yticklabels([])
        net, pooled = rows[REPEAT_ROWS[0][1]], rows[REPEAT_ROWS[1][1]]
        target = 2.0 if int(world.split()[-1]) >= 4 else 1.0
        ratio = net["min"] / pooled["min"]
        lines.append(f"| {world} | {ratio:.2f}x | {net['median'] / pooled['median']:.2f}x | >= {target:g}x | "
                     f"{'met' if ratio >= target else 'MISSED'} |")  # fmt: skip
    fig.suptitle("Repeated via='shm' calls of one layout vs the network (gloo, lower is better)", fontsize=9)
    return "Repeated shared-memory broadcasts (issue 27)", [save(fig, "broadcast_shm_repeat"), "", *lines]


ALONE_LABEL = "world 1"


def broadcast_alone(data: dict[str, Any]) -> Section:
    """Issue 27: a world of one rank, each distinit entry point beside the raw torch call it replaces."""
    rows = data["results"][ALONE_LABEL]["alone"]
    pairs = [(theirs, ours) for theirs, ours in zip(list(rows)[::2], list(rows)[1::2], strict=True)]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(pairs) + 1.2))
    ys = list(range(len(pairs)))
    for offset, pick, color, label in ((-0.2, 0, THEIRS, "torch"), (0.2, 1, OURS, "distinit")):
        ax.barh([y + offset for y in ys], [rows[p[pick]]["min"] * 1e6 for p in pairs], 0.4, color=color, label=label)
    ax.set_yticks(ys, [theirs.split(": ")[0] for theirs, _ in pairs])
    ax.invert_yaxis()
    plain_log(ax)
    ax.set_xlabel("µs per call, minimum over rounds (log)")
    ax.set_title("A world of one rank (gloo): distinit's calls vs the raw torch call each replaces")
    ax.legend(fontsize=7)
    lines = [save(fig, "broadcast_alone"), "", "| case | torch (min) | distinit (min) | distinit / torch | "
             "torch (median) | distinit (median) |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for theirs, ours in pairs:
        t, o = rows[theirs], rows[ours]
        case = f"{theirs.split(': ')[0]}: {ours.split(': ', 1)[1]} vs {theirs.split(': ', 1)[1]}"
        lines.append(f"| {case} | {t['min'] * 1e6:.1f} µs | {o['min'] * 1e6:.1f} µs | {o['min'] / t['min']:.2f}x | "
                     f"{t['median'] * 1e6:.1f} µs | {o['median'] * 1e6:.1f} µs |")  # fmt: skip
    counted = data["results"][ALONE_LABEL].get("collectives")
    lines.append("")
    lines.append(
        f"_Collectives per call (torch's profiler): {counted}._"
        if counted is not None
        else "_This run did not record how many collectives each call ran; "
        "`tests/integration/broadcast/test_world_one.py` asserts none (torch's profiler)._"
    )
    return "A world of one rank (issue 27)", lines


# ---------------------------------------------------------------------------------------------- init
def init_verdicts(data: dict[str, Any]) -> Section:
    rows: list[tuple[str, float, float, bool, str, str]] = []
    for kind in ("duplicate", "mismatch"):
        for row in data.get(kind, []):
            d, t = row["distinit"], row["torch"]
            rows.append(
                (
                    f"{kind}, world {row['world_size']}",
                    d["last_raise_s"],
                    t["last_raise_s"],
                    "killed" in t["errors"],
                    ", ".join(d["errors"]),
                    ", ".join(t["errors"]),
                )
            )
    f = data.get("foreign")
    if f:
        rows.append(
            (
                "foreign listener on MASTER_PORT",
                f["distinit"]["t_s"],
                f["torch"]["t_s"],
                f["torch"]["error"] == "killed",
                str(f["distinit"]["error"]),
                str(f["torch"]["error"]),
            )
        )
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    ys = list(range(len(rows)))
    ax.barh([y - 0.2 for y in ys], [r[1] for r in rows], height=0.4, color=OURS, label="distinit: named verdict")
    ax.barh(
        [y + 0.2 for y in ys],
        [r[2] for r in rows],
        height=0.4,
        color=THEIRS,
        label="torch: timeout (hatched: still hanging when killed)",
    )
    for y, r in zip(ys, rows, strict=True):
        if r[3]:
            ax.barh(y + 0.2, r[2], height=0.4, color="none", edgecolor="white", hatch="//")
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds until the last process raised (log; one run each)")
    ax.set_title("Time to a verdict: distinit's named error vs torch's timeout (gloo, loopback)")
    ax.legend(fontsize=7, loc="lower right")
    lines = [save(fig, "init_verdicts"), "", "| case | distinit | torch |", "|---|---|---|"]
    for r in rows:
        theirs = f"> {r[2]:.0f} s (killed)" if r[3] else f"{r[2]:.2f} s: {r[5]}"
        lines.append(f"| {r[0]} | {r[1] * 1e3:.0f} ms: {r[4]} | {theirs} |")
    return "Init: time to a named verdict", lines


def init_happy(data: dict[str, Any]) -> Section:
    names = {
        "torch": ("torch init_process_group", THEIRS),
        "distinit_noverify": ("distinit, no check", "#6baed6"),
        "distinit": ("distinit (default: with check)", OURS),
    }
    fig, ax = plt.subplots(figsize=(7, 2.8))
    labels, lines = [], ["| world | method | min | median | samples |", "|---|---|---:|---:|---:|"]
    for row in data.get("happy", []):
        for name, (label, color) in names.items():
            samples = row["samples_s"][name]
            y = len(labels)
            labels.append(f"world {row['world_size']}: {label}")
            ax.scatter([s * 1e3 for s in samples], [y] * len(samples), color=color, alpha=0.5, s=14)
            ax.scatter([min(samples) * 1e3], [y], marker="|", s=250, color="black")
            ax.scatter([sorted(samples)[len(samples) // 2] * 1e3], [y], marker="D", s=22, color="black")
            lines.append(
                f"| {row['world_size']} | {label} | {min(samples) * 1e3:.0f} ms | "
                f"{row['median_s'][name] * 1e3:.0f} ms | {len(samples)} |"
            )
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    plain_log(ax)
    ax.set_xlabel("ms from a common start to the last rank returning (log)")
    ax.set_title("Happy path, gloo: each dot a run, | the minimum, ◆ the median")
    return "Init: happy-path overhead", [save(fig, "init_happy"), "", *lines]


def init_join(init: dict[str, Any], scale: dict[str, Any] | None) -> Section:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    series = [("bench_init.py", init.get("join_scale", []), "o")]
    if scale:
        series.append(("bench_scale.py", scale.get("join", []), "s"))
    wide = load("scale_16cpu")  # the same join where the simulated ranks have CPUs of their own
    if wide:
        series.append((f"bench_scale.py, {wide['machine_facts']['cpus']} CPUs", wide.get("join", []), "^"))
    lines = ["| source | ranks | connect | join | errors |", "|---|---:|---:|---:|---:|"]
    for source, rows, marker in series:
        if not rows:
            continue
        ranks = [r["ranks"] for r in rows]
        ax.plot(ranks, [r["connect_s"] for r in rows], marker=marker, color=FLOOR, label=f"connect ({source})")
        ax.plot(ranks, [r["join_s"] for r in rows], marker=marker, color=OURS, label=f"join ({source})")
        lines += [
            f"| {source} | {r['ranks']} | {r['connect_s']:.2f} s | {r['join_s']:.2f} s | {r['errors']} |" for r in rows
        ]
    world_axes(ax, JOIN_LABELS, 7)
    if scale:
        # A join-only run keeps the other parts' facts and records its own as join_machine_facts.
        joined = {**scale, "machine_facts": scale.get("join_machine_facts") or scale.get("machine_facts")}
        lines.append(f"\n_The bench_scale.py rows: {caption('scale', joined)}._")
    if wide:
        lines.append(f"\n_The {wide['machine_facts']['cpus']}-CPU rows: {caption('scale_16cpu', wide)}._")
    return "Init: join protocol against world size", [save(fig, "init_join"), "", *lines]


# ---------------------------------------------------------------------------------------------- watchdog
def watchdog_cost(data: dict[str, Any]) -> Section:
    cost = data["cost"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    notes = []
    for impl, color in (("distinit", OURS), ("torch", THEIRS)):
        for kind, style in (("", "-"), ("spaced_", "--")):
            e = cost[impl]["explicit"]
            q = e.get(f"{kind}quantiles_us")
            label = f"{impl}, {'spaced 1 ms' if kind else 'back to back'}"
            if q:
                ax.plot([float(k) for k in q], list(q.values()), style, marker=".", color=color, label=label)
            else:
                ax.plot([50, 99], [e[f"{kind}p50_us"], e[f"{kind}p99_us"]], style, marker="o", color=color, label=label)
                notes.append(impl)
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel("µs per arm + disarm (log)")
    ax.set_title("Cost of one `with expires(...)` region, explicit scope (one client, live server)")
    ax.legend(fontsize=7)
    lines = [
        save(fig, "watchdog_cost"),
        "",
        "| implementation | p50 | p99 | spaced 1 ms p50 | calls that raised |",
        "|---|---:|---:|---:|---:|",
    ]
    for impl in ("distinit", "torch"):
        e = cost[impl]["explicit"]
        lines.append(
            f"| {impl} | {e['p50_us']:.2f} µs | {e['p99_us']:.1f} µs | {e['spaced_p50_us']:.1f} µs | "
            f"{e['errors']} of {e['calls']} |"
        )
    if notes:
        lines.append(
            "\n_Note: this run recorded only the p50 and p99 (drawn as two points); the next `make bench` "
            "records the percentiles 1 ... 99.9._"
        )
    return "Watchdog: arm + disarm cost", lines


def watchdog_latency(data: dict[str, Any]) -> Section:
    lat = data["latency"]
    names = {
        "sleep_grace0": "distinit, sleeping worker",
        "gil_grace0": "distinit, worker holding the GIL",
        "ignore_term_grace05": "distinit, ignores SIGTERM, grace 0.5 s",
        "torch_0.1": "torch, max_interval 0.1 s",
        "torch_10": "torch, default max_interval 10 s",
    }
    fig, ax = plt.subplots(figsize=(7, 3.0))
    rows = [(label, lat[key]) for key, label in names.items() if key in lat]
    lines = ["| case | trials | min | p50 | p99 | max |", "|---|---:|---:|---:|---:|---:|"]
    for y, (label, r) in enumerate(rows):
        color = THEIRS if label.startswith("torch") else OURS
        if r.get("lat_ms"):
            ax.scatter(r["lat_ms"], [y] * len(r["lat_ms"]), color=color, alpha=0.4, s=12)
        else:
            ax.scatter([r["min_ms"], r["max_ms"]], [y, y], color=color, marker="x", s=30)
        ax.scatter([r["p50_ms"]], [y], marker="D", color="black", s=20)
        lines.append(
            f"| {label} | {r['trials']} | {r['min_ms']:.0f} ms | {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | "
            f"{r['max_ms']:.0f} ms |"
        )
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    plain_log(ax)
    ax.set_xlabel("ms from the deadline to the process being dead (log)")
    ax.set_title("Deadline -> stack dumped -> dead: dots are trials (x: only min and max recorded), ◆ median")
    if any(not r.get("lat_ms") for _, r in rows):
        lines.append(
            "\n_Note: rows marked x recorded only min / p50 / p99 / max in this run; the next `make bench` "
            "records every trial._"
        )
    return "Watchdog: deadline to death", [save(fig, "watchdog_latency"), "", *lines]


def watchdog_load(data: dict[str, Any]) -> Section:
    load, args = data["load"], data["args"]
    fig, ax = plt.subplots(figsize=(7, 2.2))
    labels = ["calls that raised", "arms / messages lost"]
    for i, (impl, color) in enumerate((("distinit", OURS), ("torch", THEIRS))):
        values = [load[impl]["errors"], load[impl]["lost"]]
        ys = [y + (0.2 if i else -0.2) for y in range(2)]
        ax.barh(ys, values, height=0.4, color=color, label=impl)
        for y, v in zip(ys, values, strict=True):
            ax.text(max(v, 1) * 1.1, y, f"{v:,}", va="center", fontsize=7)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(0, 2e7)
    ax.set_yticks(range(2), labels)
    ax.invert_yaxis()
    ax.set_title(
        f"{args['clients']} clients x {args['arms']:,} arms against one server ({load['distinit']['calls']:,} calls)"
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    lines = [
        "| | distinit | torch |",
        "|---|---:|---:|",
        f"| calls that raised | {load['distinit']['errors']:,} | {load['torch']['errors']:,} |",
        f"| lost | {load['distinit']['lost']:,} | {load['torch']['lost']:,} |",
        f"| worst single call | {load['distinit']['worst_call_s'] * 1e3:.1f} ms | "
        f"{load['torch']['worst_call_s'] * 1e3:.0f} ms |",
    ]
    return "Watchdog: under load", [save(fig, "watchdog_load"), "", *lines]


# ---------------------------------------------------------------------------------------------- testing
def testing(data: dict[str, Any]) -> Section:
    res = data["results"]
    rows = [
        ("MultiProcessTestCase, first test", res["torch"], "trivial", 0, THEIRS),
        ("MultiProcessTestCase, later tests", res["torch"], "trivial", 1, THEIRS),
        ("distinit, first test", res["distinit"], "trivial", 0, OURS),
        ("distinit, later tests", res["distinit"], "trivial", 1, OURS),
        ("distinit reuse=True, first test", res["distinit"], "reuse", 0, "#6baed6"),
        ("distinit reuse=True, later tests", res["distinit"], "reuse", 1, "#6baed6"),
    ]
    fig, ax = plt.subplots(figsize=(7, 2.6))
    lines = ["| framework, test | min | median | tests |", "|---|---:|---:|---:|"]
    mins, medians, note = [], [], False
    for _, r, kind, later, _ in rows:
        samples = r.get(f"{kind}_durations_s")
        if samples:
            picked = samples[1:] if later else samples[:1]
            mins.append(min(picked))
            medians.append(sorted(picked)[len(picked) // 2])
        else:  # runs before the per-test list was recorded: the first test, and the median of the rest
            value = r[f"{kind}_median_s"] if later else r[f"{kind}_first_s"]
            mins.append(value)
            medians.append(value)
            note = note or bool(later)
    bars(ax, [r[0] for r in rows], mins, medians, [r[4] for r in rows])
    plain_log(ax)
    ax.set_xlabel("seconds per trivial 2-rank test, setup + call + teardown (log)")
    ax.set_title("Per-test cost in a fresh pytest session (bar: minimum, |: median)")
    for row, lo, mid in zip(rows, mins, medians, strict=True):
        lines.append(f"| {row[0]} | {lo:.3f} s | {mid:.3f} s | {'1' if not row[3] else 'the rest'} |")
    if note:
        lines.append(
            "\n_Note: this run recorded the median of the later tests only (min = median here); the next "
            "`make bench` records every test's time._"
        )
    return "Testing: per-test cost", [save(fig, "testing_cost"), "", *lines]


# ---------------------------------------------------------------------------------------------- doctor
def doctor(data: dict[str, Any]) -> Section:
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
    lines: list[str] = []
    local = data.get("local", {}).get("per_check_s", {})
    if local:
        names = list(local)
        axes[0].barh(range(len(names)), [local[n] * 1e3 for n in names], color=OURS)
        axes[0].set_yticks(range(len(names)), names)
        axes[0].invert_yaxis()
        axes[0].set_xlabel("ms per rank (median)")
        axes[0].set_title(f"local checks: {data['local']['total_s'] * 1e3:.1f} ms in all")
        lines += [f"- local checks, per rank, median: {data['local']['total_s'] * 1e3:.1f} ms in all"]
    reach = data.get("reach", [])
    if reach:
        hosts = [r["hosts"] for r in reach]
        axes[1].plot(hosts, [r["elapsed_s"] for r in reach], marker="o", color=OURS, label="reach, all hosts at once")
        axes[1].set_xscale("log", base=2)
        axes[1].xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes[1].set_xlabel("simulated hosts (loopback addresses; log)")
        axes[1].set_ylabel("seconds")
        axes[1].set_title("reach tier against world size")
        lines += ["", "| simulated hosts | pairs probed | failures | seconds |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['hosts']} | {r['pairs']} | {r['failures']} | {r['elapsed_s']:.2f} |" for r in reach]
    w4 = data.get("world4")
    if w4:
        for mode, color in (("bare", THEIRS), ("doctor", OURS)):
            axes[1].axhline(w4[mode], color=color, ls=":", lw=1, label=f"world 4, whole run: {mode}")
        axes[1].legend(fontsize=6.5)
        lines.insert(
            1,
            f"- world 4, start to the last rank done (median): bare init + barrier {w4['bare']:.2f} s, "
            f"doctor {w4['doctor']:.2f} s",
        )
    return "Doctor: time per check tier", [save(fig, "doctor_tiers"), "", *lines]


def torchrun(data: dict[str, Any]) -> Section:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.0))
    happy = data["happy"]
    sizes = list(happy)
    xs = list(range(len(sizes)))
    for offset, backend, color in ((-0.2, "c10d", THEIRS), (0.2, "distinit", OURS)):
        axes[0].bar(
            [x + offset for x in xs], [happy[n][backend]["median_s"] for n in sizes], 0.4, color=color, label=backend
        )
    axes[0].set_xticks(xs, [f"{n} agents" for n in sizes])
    axes[0].set_ylabel("seconds, agents start -> last worker starts")
    axes[0].set_title("happy path (median)")
    axes[0].legend(fontsize=7)
    rows = data["verdicts"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    limit = float(data["limit_s"])
    ys = list(range(len(scenarios)))
    for offset, backend, color in ((0.2, "c10d", THEIRS), (-0.2, "distinit", OURS)):
        by = {r["scenario"]: r for r in rows if r["backend"] == backend}
        values = [by[s]["seconds"] if by[s]["seconds"] is not None else limit for s in scenarios]
        axes[1].barh([y + offset for y in ys], values, 0.4, color=color, label=backend)
    axes[1].set_yticks(ys, scenarios)
    axes[1].invert_yaxis()
    axes[1].set_xlabel(f"seconds to the agent's exit (>= {limit:g}: no verdict)")
    axes[1].set_title("time to a verdict")
    axes[1].legend(fontsize=7)
    lines = [save(fig, "torchrun"), "", "| scenario | c10d | distinit |", "|---|---|---|"]
    for scenario in scenarios:
        cells = []
        for backend in ("c10d", "distinit"):
            r = next(r for r in rows if r["scenario"] == scenario and r["backend"] == backend)
            seconds = f"{r['seconds']:.1f} s" if r["seconds"] is not None else f"none in {limit:g} s"
            cells.append(f"{seconds}, {'named' if r['named'] else 'unnamed'}")
        lines.append(f"| {scenario} | {cells[0]} | {cells[1]} |")
    lines += ["", "| agents | c10d median | distinit median | over c10d | budget: + max(10 %, 0.3 s) |",
              "|---:|---:|---:|---:|---|"]  # fmt: skip
    for n in sizes:
        theirs, ours = happy[n]["c10d"]["median_s"], happy[n]["distinit"]["median_s"]
        budget = max(0.1 * theirs, 0.3)
        lines.append(f"| {n} | {theirs:.2f} s | {ours:.2f} s | {ours - theirs:+.2f} s | +{budget:.2f} s: "
                     f"{'met' if ours - theirs <= budget else 'MISSED'} |")  # fmt: skip
    return "torchrun: --rdzv-backend=distinit vs c10d", lines


# ---------------------------------------------------------------------------------------------- import
def import_cost(data: dict[str, Any]) -> Section:
    rows = {name: row for name, row in data["rows"].items() if name != "import torch"}
    names = list(rows)
    own = [rows[n]["step_s"] * 1e3 - rows[n]["gc_full_s"] * 1e3 for n in names]
    pause = [rows[n]["gc_full_s"] * 1e3 for n in names]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.0))
    ax.barh(range(len(names)), own, color=OURS, label="the step itself")
    ax.barh(range(len(names)), pause, left=own, color=FLOOR, label="full GC left due by import torch")
    for (step, target), style in zip(data["targets_s"].items(), (":", "--"), strict=True):
        ax.axvline(target * 1e3, color=THEIRS, ls=style, lw=1, label=f"target: {step} <= {target * 1e3:.0f} ms")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms over import torch ({data['rows']['import torch']['torch_s']:.2f} s), median per step")
    ax.legend(fontsize=6.5, loc="lower right")
    lines = [
        save(fig, "import_cost"),
        "",
        "Fresh interpreters, median of each; _as seen_ runs right after `import torch`, _own work_ after a",
        "`gc.collect()` that pays the full collection `import torch` leaves due. Judged on the wall-clock median;",
        "the CPU-time median leaves out the time the process waited for a core on this loaded machine.",
        "",
    ]
    for v in data["verdicts"]:
        cpu = f", CPU {v['cpu_s'] * 1e3:.1f} ms" if "cpu_s" in v else ""
        said = "**met**" if v["met"] else f"**missed**: {v['reason']}"
        lines.append(f"- {v['target']}, {v['figure']}: {v['measured_s'] * 1e3:.1f} ms{cpu}: {said}")
    for name, row in rows.items():
        if name.startswith("control"):
            lines.append(
                f"- {name.split(' | ')[0]} (not distinit) right after `import torch`: {row['step_s'] * 1e3:.1f} ms, "
                f"{row['gc_full_s'] * 1e3:.0f} ms of it the same full collection: whatever allocates first pays it"
            )
    return "Import: cost over import torch", lines


# ---------------------------------------------------------------------------------------------- hang
def hang(data: dict[str, Any]) -> Section:
    """The hang verdict: the step time with it on and off (interleaved worlds), and the judge's work per beat."""
    over, scale = data.get("overhead"), data.get("scale")
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    lines: list[str] = []
    if over is not None:
        ax = axes[0]
        rounds = range(len(over["per_step_s"]["off"]))
        width = 0.38
        ax.bar([r - width / 2 for r in rounds], [x * 1e3 for x in over["per_step_s"]["off"]], width, color=FLOOR,
               label="off (setup(hang_verdict=False))")  # fmt: skip
        ax.bar([r + width / 2 for r in rounds], [x * 1e3 for x in over["per_step_s"]["on"]], width, color=OURS,
               label="on (the default)")  # fmt: skip
        ax.set_xticks(list(rounds), [f"round {r + 1}" for r in rounds])
        ax.set_ylabel("ms per step (rank 0)")
        ax.set_title(f"World 4, gloo, {over['step_ms']:.0f} ms CPU + all_reduce per step")
        ax.legend(fontsize=6.5, loc="lower right")
        lines.append(
            f"- Overhead: median {over['median_on_s'] * 1e3:.3f} ms per step on, {over['median_off_s'] * 1e3:.3f} ms "
            f"off: ratio {over['ratio_on_off']:.4f} (target <= {over['target_ratio']})"
        )
    if scale is not None:
        ax = axes[1]
        ns = sorted(scale["ranks"], key=int)
        for key, label, color in (
            ("multi_get_ms", "read every position", FLOOR),
            ("first_look_ms", "first look (the usual beat)", OURS),
            ("judge_a_hang_ms", "parse + judge a hang", THEIRS),
        ):
            ax.plot([int(n) for n in ns], [scale["ranks"][n].get(key, float("nan")) for n in ns], "o-", color=color,
                    label=label)  # fmt: skip
        plain_log(ax)
        ax.set_yscale("log")
        ax.set_xlabel("simulated ranks (log)")
        ax.set_ylabel("ms per beat on rank 0 (log)")
        ax.set_title("The judge's work per beat")
        ax.legend(fontsize=6.5)
        for n in ns:
            row = scale["ranks"][n]
            lines.append(
                f"- {n} ranks: read {row['multi_get_ms']} ms, first look {row.get('first_look_ms', '-')} ms, "
                f"judge a hang {row['judge_a_hang_ms']} ms, {row['bytes_read_per_beat']} bytes per beat"
            )
    return "Hang verdict: cost", [save(fig, "hang"), "", *lines, ""]


# ---------------------------------------------------------------------------------------------- cuda
CUDA_PANELS = (
    ("nccl world 1", "model B: ", "NCCL, world 1: model B (2000 x 4 KB on the GPU)"),
    ("gloo world 2", "gloo 64 MB CUDA: ", "gloo, world 2: 64 MB CUDA"),
)


def cuda(data: dict[str, Any]) -> Section:
    """The GPU run (bench_cuda.py): two panels of bars and every row as a table."""
    results = data["results"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
    for ax, (world, prefix, title) in zip(axes, CUDA_PANELS, strict=True):
        rows = {k.removeprefix(prefix): v for k, v in results[world].items() if k.startswith(prefix)}
        colors = [OURS if "distinit" in k else FLOOR if "flat" in k else THEIRS for k in rows]
        mins, medians = [v["min"] * 1e3 for v in rows.values()], [v["median"] * 1e3 for v in rows.values()]
        bars(ax, list(rows), mins, medians, colors)
        if max(mins) > 10 * min(mins):  # a log axis only where the bars span decades
            plain_log(ax)
        ax.set_xlabel("ms per call" + (" (log)" if ax.get_xscale() == "log" else ""))
        ax.set_title(title)
    fig.suptitle("distinit vs torch on a GPU (lower is better)", fontsize=9)
    lines = [save(fig, "cuda"), "", "| case | min | median |", "|---|---:|---:|"]
    for world, rows in results.items():
        lines += [f"| {world}: {k} | {ms(v['min'])} | {ms(v['median'])} |" for k, v in rows.items()]
    lines += ["", "| init, NCCL world 1 | torch | distinit |", "|---|---:|---:|"]
    for i, run in enumerate(data.get("init", []), 1):
        if isinstance(run.get("torch"), float) and isinstance(run.get("distinit"), float):
            lines.append(f"| run {i} | {ms(run['torch'])} | {ms(run['distinit'])} |")
    lines += ["", *(f"_{note}_" for note in data.get("notes", []))]
    return "CUDA: NCCL and CUDA tensors over gloo", lines


# ---------------------------------------------------------------------------------------------- scale
def scale_header(data: dict[str, Any]) -> Section:
    rows = data.get("header", [])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    cases = list(rows[0]["cases"]) if rows else []
    colors = [THEIRS, OURS, "#ff7f0e", "#2ca02c", FLOOR]
    for case, color in zip(cases, colors, strict=False):
        worlds = [r["world"] for r in rows]
        ax.plot(worlds, [r["cases"][case]["min"] * 1e3 for r in rows], marker="o", color=color, label=case)
    world_axes(ax, HEADER_LABELS, 6.5)
    lines = ["| world | bytes each rank sends | " + " | ".join(cases) + " |", "|---:|---:|" + "---:|" * len(cases)]
    for r in rows:
        cells = [f"{r['cases'][c]['min'] * 1e3:.2f} / {r['cases'][c]['median'] * 1e3:.2f} ms" for c in cases]
        lines.append(f"| {r['world']} | {r['bytes_sent_per_rank']:,} | " + " | ".join(cells) + " |")
    return "Scale: broadcast header exchange", [save(fig, "scale_header"), "", "Cells: minimum / median.", "", *lines]


# ---------------------------------------------------------------------------------------------- issue 27 targets
TARGETS_27 = RESULTS / "targets_27.json"
SUITE_JSON = "benchmarks/results/suite.json"
NOT_RECORDED = "reason: not recorded"
Row = dict[str, str]  # target, measured, source, verdict, reason


def _row(target: str, measured: str, source: str, verdict: str, reason: str = "") -> Row:
    return {"target": target, "measured": measured, "source": source, "verdict": verdict, "reason": reason}


def _absent(name: str, why: str) -> Row:
    """The row standing for the targets a missing or unreadable ``results/<name>.json`` would have given."""
    source = f"results/{name}.json"
    return _row(f"the targets read from {source}", why, source, "not measured", NOT_RECORDED)


def _verdict(met: bool, reason: str | None) -> tuple[str, str]:
    """(verdict, reason): a missed target keeps the reason its results file records, or says it recorded none."""
    return ("met", "") if met else ("MISSED", reason or NOT_RECORDED)


def _import_rows(d: dict[str, Any]) -> list[Row]:
    """Judged on what a user waits for (``as seen``: right after ``import torch``), own work beside it."""
    rows = []
    for target in ("import distinit", "from distinit import setup"):
        seen = {v["figure"]: v for v in d["verdicts"] if v["target"].startswith(target + " <=")}
        a, own = seen["as seen"], seen.get("own work")
        measured = f"{a['measured_s'] * 1e3:.1f} ms as seen (median of {d['repeats']} fresh interpreters)"
        measured += f"; {own['measured_s'] * 1e3:.1f} ms own work (after a `gc.collect()`)" if own else ""
        rows.append(_row(f"`{target}` <= {a['target_s'] * 1e3:.0f} ms over `import torch`", measured,
                         "results/import.json", *_verdict(a["met"], a.get("reason"))))  # fmt: skip
    return rows


def _help_rows(d: dict[str, Any]) -> list[Row]:
    h = d["help"]
    rows = []
    for command in ("distinit --help", "distinit doctor --help", "distinit env --help"):
        median = h["median_s"][command]
        measured = f"{median * 1e3:.0f} ms (median of {h['repeats']}; slowest {h['max_s'][command] * 1e3:.0f} ms)"
        rows.append(_row(f"`{command}` <= {h['target_s']:g} s", measured, "results/doctor.json",
                         *_verdict(median <= h["target_s"], h.get("reason"))))  # fmt: skip
    return rows


def _happy_rows(d: dict[str, Any], limit_s: float = 0.010) -> list[Row]:
    """setup() over torch's init_process_group + barrier, medians of the same interleaved rounds."""
    by_world = {row["world_size"]: row for row in d["happy"]}
    rows = []
    for world in (2, 4):
        target = f"`setup()` happy path <= +{limit_s * 1e3:.0f} ms over torch, world {world}"
        row = by_world.get(world)
        if row is None:
            rows.append(_row(target, "not measured", "results/init.json", "not measured", NOT_RECORDED))
            continue
        ours, theirs = row["median_s"]["distinit"], row["median_s"]["torch"]
        n = len(row["samples_s"]["distinit"])
        measured = f"{ours * 1e3:.1f} ms vs torch {theirs * 1e3:.1f} ms (medians of {n} rounds): "
        measured += f"{(ours - theirs) * 1e3:+.1f} ms"
        rows.append(_row(target, measured, "results/init.json", *_verdict(ours - theirs <= limit_s, row.get("reason"))))
    return rows


def _alone_row(d: dict[str, Any]) -> Row:
    world = d["results"][ALONE_LABEL]
    cases = world["alone"]
    parts = []
    for size in ("1 KB", "64 MB"):
        ours, theirs = cases[f"tensor {size}: distinit broadcast_tensor"], cases[f"tensor {size}: torch broadcast"]
        parts.append(
            f"{size} {ours['min'] * 1e6:.1f} µs vs raw {theirs['min'] * 1e6:.1f} µs "
            f"({ours['min'] / theirs['min']:.2f}x)"
        )
    counted = world.get("collectives")
    target = "`broadcast_tensor` at world 1 does no exchange"
    if counted is None:
        measured = "; ".join(parts) + "; collective count: not recorded"
        reason = ("the count is not recorded by `bench_broadcast.py --parts alone` "
                  "(`tests/integration/broadcast/test_world_one.py` asserts 0 with torch's profiler)")  # fmt: skip
        return _row(target, measured, "results/broadcast_alone.json", "met on time; count not recorded", reason)
    count = sum(counted.values()) if isinstance(counted, dict) else int(counted)
    measured = "; ".join(parts) + f"; {count} collectives"
    return _row(target, measured, "results/broadcast_alone.json", *_verdict(count == 0, world.get("reason")))


def _nccl_row(cuda: dict[str, Any] | None) -> Row:
    target = "small NCCL headers use a pinned, reused host buffer"
    measured = "not run on a GPU since the change: no GPU was lent to this session"
    if cuda:
        nccl = cuda["results"]["nccl world 1"]
        ours, raw = nccl["tensor 1 KB: distinit broadcast_tensor"], nccl["tensor 1 KB: torch dist.broadcast"]
        when = (cuda.get("machine_facts") or {}).get("when", "date not recorded")
        measured += (f"; the last GPU run ({when}, before the change): 1 KB broadcast_tensor "
                     f"{ours['min'] * 1e3:.3f} ms vs raw {raw['min'] * 1e3:.3f} ms")  # fmt: skip
    return _row(
        target, measured, "results/cuda.json", "not measured", "no GPU lent (`scripts/gpu-check.sh`, `bench_cuda.py`)"
    )


def _shm_rows(d: dict[str, Any], source: str) -> list[Row]:
    rows = []
    for world, target in ((4, 2.0), (2, 1.0)):
        label = f'repeated `via="shm"` >= {target:g}x the network, world {world} (256 MiB)'
        cases = d["results"].get(f"world {world}", {}).get("repeat")
        if cases is None:
            rows.append(_row(label, "not measured", source, "not measured", NOT_RECORDED))
            continue
        net, pooled = cases[REPEAT_KEYS[0]], cases[REPEAT_KEYS[1]]
        ratio = net["min"] / pooled["min"]
        measured = (f"{ratio:.2f}x on the minimum ({pooled['min'] * 1e3:.0f} ms vs {net['min'] * 1e3:.0f} ms), "
                    f"{net['median'] / pooled['median']:.2f}x on the median")  # fmt: skip
        rows.append(_row(label, measured, source, *_verdict(ratio >= target, cases.get("reason"))))
    return rows


def _auto_row(d: dict[str, Any], source: str) -> Row:
    """No benchmark records what via="auto" chose; the threshold rows say where repeated shm beats the network."""
    facts = []
    for world, modes in d["results"].items():
        cases = modes.get("repeat", {})
        sizes = [k.split(": ")[0].removeprefix("threshold ") for k in cases if k.endswith(": network")]
        ratios = [cases[f"threshold {s}: network"]["min"] / cases[f"threshold {s}: shm repeated"]["min"] for s in sizes]
        facts.append(f"{world}: " + ", ".join(f"{s} {r:.2f}x" for s, r in zip(sizes, ratios, strict=True)))
    measured = "auto's choice: not recorded by any benchmark; network / repeated shm (min; above 1: shm faster): "
    measured += "; ".join(facts)
    reason = ("not recorded by a benchmark (`tests/integration/broadcast/test_shm_pool.py` checks that auto takes "
              "the pool from the second call of a layout of >= 64 MiB)")  # fmt: skip
    return _row('`via="auto"` picks shm when that holds', measured, source, "not measured", reason)


def _suite_row(suite: dict[str, Any] | None, limit_s: float = 720.0) -> Row:  # issue 34: <= 12 min
    target = f"`make test` <= {limit_s / 60:.0f} min on a clean 2-vCPU machine"
    if suite is None:
        how = f"no results/suite.json: `python scripts/suite_times.py LOG --out {SUITE_JSON}`"
        return _row(target, "not measured yet", "results/suite.json", "not measured yet", how)
    counts = ", ".join(f"{n} {k}" for k, n in suite.get("counts", {}).items())
    pytest_s, wall = suite.get("pytest_s"), suite.get("wall_s")
    slowest = "; ".join(f"{r['test'].rsplit('::', 1)[-1]} {r['seconds']:.0f} s" for r in suite.get("slowest", [])[:3])
    facts = f"slowest recorded: {slowest}" if slowest else ""
    if pytest_s is None:
        return _row(target, "the log holds no pytest summary line", "results/suite.json", "not measured", NOT_RECORDED)
    measured = f"pytest {pytest_s / 60:.1f} min ({counts})"
    if wall is not None:
        measured = f"{wall / 60:.1f} min wall clock (the log's stamps); " + measured
        verdict, reason = _verdict(wall <= limit_s, suite.get("reason"))
    elif pytest_s > limit_s:
        verdict, reason = "MISSED", NOT_RECORDED
        measured += "; the whole make test is longer (no wall-clock stamps in the log)"
    else:
        verdict, reason = (
            "pytest met; make test not recorded",
            "the log has no wall-clock stamps: the venv, system packages, lint and wheel check are not timed",
        )
    return _row(
        target, measured, "results/suite.json", verdict, "; ".join(x for x in (reason, facts) if x and verdict != "met")
    )


def _stress_row(flakes: dict[str, Any] | None) -> Row:  # issue 34: every test passes beside 2 burners per core
    target = "every integration test passes beside 2 CPU burners per core (`scripts/flakes.py`)"
    if flakes is None:
        how = "no results/flakes.json: `make flakes`"
        return _row(target, "not measured yet", "results/flakes.json", "not measured yet", how)
    runs = flakes.get("runs", [])
    totals: dict[str, int] = {}
    for run in runs:
        for outcome, n in run.get("counts", {}).items():
            totals[outcome] = totals.get(outcome, 0) + n
    seconds = sum(float(run.get("seconds", 0)) for run in runs)
    measured = f"{len(runs)} round(s), {seconds / 60:.0f} min: " + ", ".join(f"{n} {k}" for k, n in totals.items())
    flaky = [f"{f['test'].rsplit('::', 1)[-1]} ({f['failed']} of {f['of']})" for f in flakes.get("flaky", [])]
    verdict, reason = _verdict(not flaky and bool(runs), "failed: " + "; ".join(flaky) if flaky else None)
    return _row(target, measured, "results/flakes.json", verdict, reason)


def _shm_source() -> tuple[str, dict[str, Any] | None]:
    """The newer of broadcast.json (a default run includes the repeat part) and broadcast_shm_repeat.json."""
    found = []
    for name in ("broadcast_shm_repeat", "broadcast"):
        data = load(name)
        if data and any("repeat" in modes for modes in data.get("results", {}).values()):
            found.append(((data.get("meta") or {}).get("when", ""), name, data))
    if not found:
        return "results/broadcast_shm_repeat.json", None
    _, name, data = max(found, key=lambda item: item[0])
    return f"results/{name}.json", data


def targets_27() -> list[Row]:
    """One row per issue-27 target, each from the results file named in its row; missing files say so."""
    rows: list[Row] = []
    plans: list[tuple[str, Callable[[dict[str, Any]], list[Row]]]] = [
        ("import", _import_rows), ("doctor", _help_rows), ("init", _happy_rows),
        ("broadcast_alone", lambda d: [_alone_row(d)]),
    ]  # fmt: skip
    for name, make in plans:
        data = load(name)
        try:
            rows += make(data) if data else [_absent(name, "no such file")]
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # a results file of another shape
            rows.append(_absent(name, f"unreadable ({type(exc).__name__}: {exc})"))
    rows.append(_nccl_row(load("cuda")))
    source, shm = _shm_source()
    if shm is None:
        rows.append(_row("repeated shm broadcasts", "not measured", source, "not measured", NOT_RECORDED))
    else:
        rows += _shm_rows(shm, source)
        rows.append(_auto_row(shm, source))
    rows.append(_suite_row(load("suite")))
    rows.append(_stress_row(load("flakes")))
    return rows


def targets_section() -> list[str]:
    """The "Issue 27 targets" table; writes the same rows to results/targets_27.json (a derived file)."""
    rows = targets_27()
    TARGETS_27.write_text(json.dumps({
        "meta": {
            "derived": "written by benchmarks/plot.py from the results files named in each row's source; "
                       "not a measurement: re-run plot.py after any benchmark",
            "command": "python benchmarks/plot.py",
            "issue": 27,
        },
        "rows": rows,
    }, indent=2) + "\n")  # fmt: skip
    lines = [
        "## Issue 27 targets",
        "",
        "_One row per target, each read from the results file in its row (that file's section below gives its",
        "run, date and load); the same rows are in",
        "[`benchmarks/results/targets_27.json`](../benchmarks/results/targets_27.json)._",
        "",
        "| target | measured | from | verdict | reason (as recorded) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['target']} | {r['measured']} | `{r['source']}` | **{r['verdict']}** | {r['reason']} |" for r in rows
    ]
    return [*lines, ""]


# ---------------------------------------------------------------------------------------------- summary
def _summary_broadcast(b: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    rows: list[tuple[str, float, float]] = []
    if b and "world 4" in b["results"]:
        r = b["results"]["world 4"]
        for model, what in (("A", "model A, 340 MB"), ("B", "model B, 2000 tensors")):
            c = r[model]
            best = min(c["torch per-parameter loop"]["min"], c["torch _broadcast_coalesced (250 MiB)"]["min"])
            rows.append((f"broadcast {what} (world 4)", best, c["distinit broadcast_module"]["min"]))
        small = r["small"]
        rows.append(
            (
                "1 KB broadcast, checked (world 4)",
                small["tensor 1 KB: torch broadcast into a pre-allocated buffer"]["min"],
                small["tensor 1 KB: distinit broadcast_tensor (receivers pass a buffer)"]["min"],
            )
        )
    return rows


def _summary_rows() -> list[tuple[str, float, float]]:
    """(comparison, torch's figure, distinit's figure) from each results file present; same run, same units."""
    rows = _summary_broadcast(load("broadcast"))
    i = load("init")
    if i:
        happy = i["happy"][-1]
        rows.append(
            (
                f"init, happy path (world {happy['world_size']}, median)",
                happy["median_s"]["torch"],
                happy["median_s"]["distinit"],
            )
        )
        dup = i["duplicate"][-1]
        rows.append(
            (
                f"init, duplicate rank -> error (world {dup['world_size']})",
                dup["torch"]["last_raise_s"],
                dup["distinit"]["last_raise_s"],
            )
        )
    w = load("watchdog")
    if w:
        rows.append(
            (
                "watchdog arm + disarm (p50)",
                w["cost"]["torch"]["explicit"]["p50_us"],
                w["cost"]["distinit"]["explicit"]["p50_us"],
            )
        )
        rows.append(
            (
                "watchdog deadline -> dead (p50)",
                w["latency"]["torch_0.1"]["p50_ms"],
                w["latency"]["sleep_grace0"]["p50_ms"],
            )
        )
    t = load("testing")
    if t:
        rows.append(
            (
                "2-rank test after the first (median)",
                t["results"]["torch"]["trivial_median_s"],
                t["results"]["distinit"]["trivial_median_s"],
            )
        )
    return rows


def summary() -> str | None:
    rows = _summary_rows()
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(rows) + 1.0))
    ratios = [theirs / ours for _, theirs, ours in rows]
    # bars grow from 1 (parity) towards the ratio, so "slower" bars point left
    ax.barh(
        range(len(rows)),
        [abs(x - 1) for x in ratios],
        left=[min(x, 1) for x in ratios],
        color=[OURS if x >= 1 else THEIRS for x in ratios],
    )
    for y, x in enumerate(ratios):
        text = f"{x:.0f}x" if x >= 10 else f"{x:.2g}x"
        ax.text(x * (1.1 if x >= 1 else 0.9), y, text, va="center", ha="left" if x >= 1 else "right")
    ax.axvline(1, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    plain_log(ax)
    ax.set_xlim(min(ratios) / 3, max(ratios) * 4)
    ax.set_xlabel("torch's time / distinit's time, same run (log): right of 1 = distinit faster")
    ax.set_title("distinit vs the torch way, ratios from one run each")
    return save(fig, "summary")


# ---------------------------------------------------------------------------------------------- document
INTRO = """# Benchmarks

Every figure below is drawn by `python benchmarks/plot.py` from the committed results in
[`benchmarks/results/`](../benchmarks/results/) (the JSON files are the source of truth; the Markdown tables
beside them have every row). `make bench` re-runs every benchmark, then this script. Each caption names the
command, the date, the machine and the load average the run recorded: the machine these were taken on has
**2 vCPUs shared with other jobs**, so read ratios from the same run, not absolute times. Times are the
minimum over repeated, interleaved rounds (background load only ever adds time) with the median beside it;
single-shot measurements (verdicts, one join per size) say so.

How each capability behaves from 1k to 100k ranks, measured where this machine allows and computed
otherwise: [scale.md](scale.md).

This page is generated: edit `benchmarks/plot.py`, not this file.
"""


def figure(title: str, name: str, data: dict[str, Any], render: Callable[[], Section]) -> list[str]:
    try:
        section_title, body = render()
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a results file of another shape
        print(f"plot: {title}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
        return [f"## {title}", "", f"_Skipped: `results/{name}.json` lacks a field this figure needs ({exc})._", ""]
    return [f"## {section_title}", "", f"_{caption(name, data)}._", "", *body, ""]


def sections() -> list[str]:
    out: list[str] = []
    plans: list[tuple[str, str, Callable[[dict[str, Any]], list[tuple[str, Callable[[], Section]]]]]] = [
        (
            "broadcast",
            "Broadcast",
            lambda d: [
                ("models", lambda: broadcast_models(d)),
                ("targets", lambda: ("Broadcast targets (judged on the minimum, same rounds)", broadcast_targets(d))),
                ("sizes", lambda: broadcast_sizes(d)),
                ("small", lambda: broadcast_small(d)),
            ],
        ),
        ("broadcast_shm_repeat", "Broadcast", lambda d: [("shm repeated", lambda: broadcast_shm_repeat(d))]),
        ("broadcast_alone", "Broadcast", lambda d: [("world 1", lambda: broadcast_alone(d))]),
        (
            "init",
            "Init",
            lambda d: [
                ("verdicts", lambda: init_verdicts(d)),
                ("happy", lambda: init_happy(d)),
                ("join", lambda: init_join(d, load("scale"))),
            ],
        ),
        (
            "watchdog",
            "Watchdog",
            lambda d: [
                ("cost", lambda: watchdog_cost(d)),
                ("latency", lambda: watchdog_latency(d)),
                ("load", lambda: watchdog_load(d)),
            ],
        ),
        ("testing", "Testing", lambda d: [("cost", lambda: testing(d))]),
        ("doctor", "Doctor", lambda d: [("tiers", lambda: doctor(d))]),
        ("import", "Import", lambda d: [("cost", lambda: import_cost(d))]),
        ("torchrun", "torchrun", lambda d: [("rendezvous", lambda: torchrun(d))]),
        ("hang", "Hang verdict", lambda d: [("cost", lambda: hang(d))]),
        ("scale", "Scale", lambda d: [("header", lambda: scale_header(d))]),
        ("cuda", "CUDA", lambda d: [("gpu", lambda: cuda(d))]),
    ]
    for name, title, plan in plans:
        data = load(name)
        if data is None:
            line = f"{title}: no `benchmarks/results/{name}.json` yet (run `python benchmarks/bench_{name}.py`)"
            print(f"plot: {line}; skipped", file=sys.stderr)
            out += [f"## {title}", "", f"_{line}; its figures are skipped._", ""]
            continue
        for part, render in plan(data):
            out += figure(f"{title} ({part})", name, data, render)
    return out


def main() -> int:
    body = sections()
    try:
        top = summary()
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a results file of another shape
        print(f"plot: summary figure skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
        top = None
    lead = [top, "", "_The summary: every bar is a ratio from one run; the sections below give each figure's run._", ""]
    DOC.write_text(INTRO + "\n" + "\n".join([*(lead if top else []), *targets_section(), *body]).rstrip() + "\n")
    print(f"plot: wrote {DOC.relative_to(ROOT)} and {len(list(IMG.glob('*.png')))} images in {IMG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
