"""The shape of the package, measured: what issue 24 asks to keep small, in one rerunnable script.

Static (read from ``src/distinit``): modules per package, lines, functions over 60 lines, module pairs
whose imports point both ways, and imports that reach into another package's ``_private`` module. Issue 36's
counts too: ``# ---`` banners in ``init/`` (a module's parts belong in its docstring), launcher variables
(``SLURM_*``, ``OMPI_*``, ``PMI_*``, ``MV2_*``, ``TORCHELASTIC_*``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``
as string literals) named outside ``env/`` by a module whose docstring gives no reason (:data:`REASON`), names
each face binds outside its ``__all__`` (submodules and dunders aside) and which of them the allow-list
``FACE_EXTRAS`` of ``tests/unit/test_layering.py`` does not name with a reason (the same walk and list that test
enforces), and test functions (read from ``tests/`` beside ``src``) with no ``assert``, no ``pytest.raises`` and
no call to a helper that checks (one of the same file that does, read through, or an imported ``check*``/``assert*``),
and the join's store keys (``claim/``, ``beat/``, ``order/``, ``joined``, ``state``, ``init_verdict``, ...) spelled
in a module of ``init/`` other than the one that owns the layout (``_join``; the scan and its owners live in
``tests/unit/init/test_store_keys.py``, which enforces the same rule).

Dynamic (a real 2-rank gloo world on loopback, one process per rank): ``distinit.setup()`` on the happy
path runs under ``sys.setprofile``/``threading.setprofile``; every Python call whose callee lives in
``distinit`` and whose caller lives in another ``distinit`` module is a cross-module call. The trace covers
``setup()`` from entry to return (not ``teardown``), threads that ``setup()`` starts included (the
calling thread's share is reported too: a polling thread's count grows with how long it runs).

Usage: ``python scripts/measure_shape.py [--src DIR] [--json]`` (``--src`` measures another checkout's
``src``, e.g. a clean clone of an older commit, so before/after figures come from the same script).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# One rank: trace setup() and print the counts as one JSON line. Run as `python -c RANK_CODE`.
RANK_CODE = r"""
import json, sys, threading
from collections import Counter
import torch.distributed  # imported before tracing: its cost is not the package's shape
import distinit
from distinit.init import setup, teardown

main = threading.get_ident()
calls = {"main": Counter(), "threads": Counter()}
entered = set()

def profile(frame, event, arg):
    if event != "call":
        return
    callee = frame.f_globals.get("__name__", "")
    if not callee.startswith("distinit"):
        return
    entered.add(callee)
    back = frame.f_back
    caller = back.f_globals.get("__name__", "") if back is not None else ""
    if caller.startswith("distinit") and caller != callee:
        key = "main" if threading.get_ident() == main else "threads"
        calls[key][caller + " -> " + callee] += 1

threading.setprofile(profile)
sys.setprofile(profile)
ctx = setup(backend="gloo", deadline=60)
sys.setprofile(None)
threading.setprofile(None)
teardown()
print(json.dumps({
    "rank": ctx.env.rank,
    "entered": sorted(entered),
    "main": dict(calls["main"]),
    "threads": dict(calls["threads"]),
}))
"""


def _package(module: str) -> str:
    """``distinit.init._join`` -> ``init``; top-level modules (``distinit._identity``) are their own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(src: Path, path: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(module: str, tree: ast.AST, is_package: bool) -> set[str]:
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("distinit")}


LAUNCHER_VARIABLE = re.compile(r"(SLURM_|OMPI_|PMI_|MV2_|TORCHELASTIC_)[A-Z0-9_]*|LOCAL_WORLD_SIZE|GROUP_WORLD_SIZE")
#: The sentence by which a module's docstring says why it names launcher variables outside ``env/`` (which
#: alone resolves the world from them): "Reads launcher variables itself: <why>." or "Writes ...: <why>.".
REASON = re.compile(r"\b(Reads|Writes) launcher variables itself: \S")


def _banners(src: Path) -> list[str]:
    """``# ---`` banner lines in ``init/``: parts pasted into a module instead of named in its docstring."""
    return [
        f"{path.name}:{number}"
        for path in sorted((src / "distinit" / "init").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.lstrip().startswith("# ---")
    ]


def _named_at_fault(tree: ast.AST) -> set[int]:
    """``id``s of the string literals inside a ``variables=`` argument: an error naming the variable to fix."""
    return {
        id(node)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        for keyword in call.keywords
        if keyword.arg == "variables"
        for node in ast.walk(keyword.value)
    }


def _launcher_variables(src: Path) -> dict[str, list[str]]:
    """Launcher variable names spelled as string literals outside ``env/`` (``env/`` alone should read them).

    ``counted``: in modules whose docstring gives no reason (:data:`REASON`); ``explained``: in modules whose
    docstring does. A name inside an error's ``variables=`` (the variable the user should fix) is no read.
    """
    found: dict[str, list[str]] = {"counted": [], "explained": []}
    for path in sorted((src / "distinit").rglob("*.py")):
        if "env" in path.relative_to(src / "distinit").parts[:1]:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        explained = REASON.search(ast.get_docstring(tree) or "") is not None
        at_fault = _named_at_fault(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and LAUNCHER_VARIABLE.fullmatch(node.value)
                and id(node) not in at_fault
            ):
                kind = "explained" if explained else "counted"
                found[kind].append(f"{path.relative_to(src).as_posix()}:{node.lineno} {node.value}")
    return found


def _layering() -> Any:
    """``tests/unit/test_layering.py``, loaded by path: the face walk and its allow-list live there, once."""
    spec = importlib.util.spec_from_file_location(
        "distinit_layering_rules", ROOT / "tests" / "unit" / "test_layering.py"
    )
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load tests/unit/test_layering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _store_keys_outside_owner(src: Path) -> list[str]:
    """``module:line name``: a join key spelled outside its owner (``tests/unit/init/test_store_keys.py``'s scan)."""
    spec = importlib.util.spec_from_file_location(
        "distinit_store_key_rules", ROOT / "tests" / "unit" / "init" / "test_store_keys.py"
    )
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load tests/unit/init/test_store_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: list[str] = module.outside_owner(src / "distinit" / "init")
    return found


def _face_extras(src: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per face: the names it binds outside ``__all__``, and those of them the allow-list does not name."""
    rules = _layering()
    bound = {face: rules.face_extras(path) for face, path in rules.face_paths(src / "distinit").items()}
    bound = {face: names for face, names in bound.items() if names}
    allowed = rules.FACE_EXTRAS
    unlisted = {face: [n for n in names if n not in allowed.get(face, {})] for face, names in bound.items()}
    return bound, {face: names for face, names in unlisted.items() if names}


def _checks(function: ast.AST, local: dict[str, ast.AST], seen: frozenset[str] = frozenset()) -> bool:
    """Does a test function check anything: an ``assert``, ``pytest.raises``, or a call that checks?

    A call checks when it calls a helper of the same file that checks (``_assert_gone``, ``_check``: read
    through, so a helper named ``_check`` that asserts nothing does not count), or an imported helper named
    ``check*``/``assert*`` (from a conftest or a shared module).
    """
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "raises":
                return True
            if name in local:
                if name not in seen and _checks(local[name], local, seen | {name}):
                    return True
            elif name.startswith(("check", "assert")):
                return True
    return False


def _tests_without_check(tests: Path) -> list[str]:
    """Test functions under ``tests`` that check nothing (see :func:`_checks`)."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        functions = [
            n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        local: dict[str, ast.AST] = {n.name: n for n in functions if not n.name.startswith("test")}
        for node in functions:
            if node.name.startswith("test") and not _checks(node, local):
                found.append(f"{path.relative_to(tests).as_posix()}::{node.name}")
    return found


def static(src: Path) -> dict[str, Any]:
    """Counts read from the source tree ``src`` (the folder holding ``distinit``)."""
    files = sorted((src / "distinit").rglob("*.py"))
    names = {_module_name(src, path) for path in files}
    per_package: Counter[str] = Counter()
    lines = 0
    long_functions: list[str] = []
    imports: dict[str, set[str]] = {}
    private_reach: list[str] = []
    for path in files:
        module = _module_name(src, path)
        text = path.read_text()
        lines += text.count("\n")
        per_package[_package(module) or "(top)"] += 1
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{module}.{node.name} ({length} lines)")
        targets = {name for name in _imported(module, tree, path.name == "__init__.py") if name in names}
        imports[module] = targets
        for target in sorted(targets):
            owner, here = _package(target), _package(module)
            private = any(part.startswith("_") for part in target.split(".")[2:])
            if owner and owner != here and private:
                private_reach.append(f"{module} -> {target}")
    extras, unlisted = _face_extras(src)
    # A module importing its own package (``from distinit.init import _x``) is Python's mechanics, not a cycle.
    both_ways = sorted(
        f"{a} <-> {b}"
        for a in imports
        for b in imports[a]
        if a < b and a in imports.get(b, set()) and not b.startswith(a + ".")
    )
    return {
        "files": len(files),
        "lines": lines,
        "modules_per_package": dict(sorted(per_package.items())),
        "functions_over_60_lines": long_functions,
        "import_pairs_both_ways": both_ways,
        "private_cross_package_imports": private_reach,
        "init_banners": _banners(src),
        "launcher_variables_outside_env": (named := _launcher_variables(src))["counted"],
        "launcher_variables_explained": named["explained"],
        "face_names_outside_all": extras,
        "face_names_not_allowed": unlisted,
        "tests_without_check": _tests_without_check(src.parent / "tests"),
        "store_keys_outside_owner": _store_keys_outside_owner(src),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dynamic(src: Path, timeout: float = 120.0) -> dict[str, Any]:
    """Trace a happy-path ``setup()`` on a 2-rank loopback world; rank 0's and rank 1's counts."""
    port = _free_port()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rank in range(2):
            env = {
                **os.environ,
                "PYTHONPATH": str(src),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            out = open(Path(tmp) / f"rank{rank}.out", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-c", RANK_CODE], env=env, stdout=out), out))
        results = []
        try:
            for proc, out in procs:
                proc.wait(timeout=timeout)
                out.close()
                if proc.returncode != 0:
                    raise RuntimeError(f"a traced rank exited {proc.returncode}")
            for rank in range(2):
                results.append(json.loads((Path(tmp) / f"rank{rank}.out").read_text().strip().splitlines()[-1]))
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    summary = {}
    for result in results:
        main = Counter(result["main"])
        every = main + Counter(result["threads"])
        within_init = sum(n for edge, n in every.items() if all(_package(m) == "init" for m in edge.split(" -> ")))
        pairs = {tuple(edge.split(" -> ")) for edge in every}
        summary[f"rank{result['rank']}"] = {
            "init_modules_entered": sum(1 for m in result["entered"] if _package(m) == "init"),
            "modules_entered": len(result["entered"]),
            "cross_module_calls_init": within_init,
            "cross_module_calls_package": sum(every.values()),
            "cross_module_calls_main_thread": sum(main.values()),
            "call_pairs_both_ways": sorted(f"{a} <-> {b}" for a, b in pairs if a < b and (b, a) in pairs),
            "top_edges": every.most_common(12),
        }
    return summary


def main() -> int:
    """Print the static and dynamic measures (human lines, or one JSON document with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the folder holding distinit (default: ours)")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--static-only", action="store_true", help="skip the traced 2-rank world")
    args = parser.parse_args()
    report: dict[str, Any] = {"static": static(args.src.resolve())}
    if not args.static_only:
        report["dynamic"] = dynamic(args.src.resolve())
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    s = report["static"]
    print(f"files {s['files']}, lines {s['lines']}, modules per package {s['modules_per_package']}")
    print(f"functions over 60 lines: {len(s['functions_over_60_lines'])} {s['functions_over_60_lines']}")
    print(f"import pairs both ways: {len(s['import_pairs_both_ways'])} {s['import_pairs_both_ways']}")
    print(f"private cross-package imports: {len(s['private_cross_package_imports'])}")
    for line in s["private_cross_package_imports"]:
        print(f"  {line}")
    print(f"banners in init: {len(s['init_banners'])} {s['init_banners']}")
    unexplained, explained = s["launcher_variables_outside_env"], s["launcher_variables_explained"]
    modules = sorted({line.partition(":")[0] for line in explained})
    print(f"launcher variables named outside env/ without a reason: {len(unexplained)} {unexplained[:20]}")
    print(f"  with a reason in the module docstring: {len(explained)} in {len(modules)} modules {modules}")
    hidden, unlisted = s["face_names_outside_all"], s["face_names_not_allowed"]
    print(
        f"face names outside __all__: {sum(map(len, hidden.values()))} {dict((k, len(v)) for k, v in hidden.items())}"
    )
    print(f"  of which not in the allow-list (FACE_EXTRAS): {sum(map(len, unlisted.values()))} {unlisted}")
    print(f"tests without a check: {len(s['tests_without_check'])}")
    for line in s["tests_without_check"]:
        print(f"  {line}")
    keys = s["store_keys_outside_owner"]
    print(f"join store keys spelled outside their owner (_join): {len(keys)} {keys}")
    for rank, d in report.get("dynamic", {}).items():
        print(
            f"{rank}: setup() entered {d['init_modules_entered']} init modules ({d['modules_entered']} in all); "
            f"cross-module calls: {d['cross_module_calls_init']} within init, {d['cross_module_calls_package']} "
            f"in the package (all threads; {d['cross_module_calls_main_thread']} on the calling thread)"
        )
        print(f"  call pairs both ways: {len(d['call_pairs_both_ways'])} {d['call_pairs_both_ways']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
