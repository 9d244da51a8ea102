"""tests/unit holds fast, pure tests: no unit test starts a process, binds a socket or opens a TCPStore (issue 36).

Each file under tests/unit is read as text and parsed with :mod:`ast` (never imported), so a word inside a
string or a comment does not count. What counts: ``subprocess.<anything>``, ``Popen``, a call of ``popen``,
``multiprocessing`` (imported or named), ``socket.socket(...)`` (or ``socket`` imported from ``socket``), a call
of ``.bind(...)``, ``TCPStore(...)`` and ``run_distributed(...)``. Tests that need them belong under
tests/integration; a true exception goes into :data:`ALLOWED` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent
ROOT = UNIT.parents[1]
#: path (relative to the repository root) -> why that unit file may do what the guard refuses.
ALLOWED: dict[str, str] = {}
#: Modules whose mere import starts processes or is there to start them.
PROCESS_MODULES = ("subprocess", "multiprocessing")
#: Names whose call starts a process, binds a socket or opens a store.
CALLS = ("popen", "TCPStore", "run_distributed")


def _name_of(node: ast.expr) -> str | None:
    """The called name: ``f`` of ``f(...)`` and of ``a.b.f(...)``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _findings(node: ast.AST) -> list[str]:
    """What ``node`` itself does that a unit test must not (its children are walked by the caller)."""
    found = []
    if isinstance(node, ast.Import):
        found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in PROCESS_MODULES]
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if module.split(".")[0] in PROCESS_MODULES:
            found.append(f"from {module} import ...")
        found += [
            f"from {module} import {a.name}"
            for a in node.names
            if a.name in ("Popen", *CALLS) or (module == "socket" and a.name == "socket")
        ]
    elif isinstance(node, ast.Name) and node.id in ("multiprocessing", "Popen"):
        found.append(node.id)
    elif isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "subprocess":
            found.append(f"subprocess.{node.attr}")
        if node.attr in ("multiprocessing", "Popen"):
            found.append(f".{node.attr}")
    elif isinstance(node, ast.Call):
        func = node.func
        name = _name_of(func)
        called_on = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if (called_on, name) == ("socket", "socket"):
            found.append("socket.socket(...)")
        if isinstance(func, ast.Attribute) and func.attr == "bind":
            found.append(".bind(...)")
        if name in CALLS:
            found.append(f"{name}(...)")
    return found


def violations(path: Path) -> list[str]:
    """``path:line: what`` for each process, socket or store ``path``'s code (not its strings) starts or binds."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [
        f"{where}:{node.lineno}: {what}"
        for node in ast.walk(tree)
        for what in _findings(node)
        if hasattr(node, "lineno")
    ]


def _unit_files() -> list[Path]:
    return sorted(UNIT.rglob("*.py"))


def test_no_unit_test_starts_a_process_or_binds_a_socket() -> None:
    files = _unit_files()
    assert UNIT / "test_unit_is_pure.py" in files and UNIT / "env" / "cases.py" in files  # the walk sees them all
    assert not set(ALLOWED) - {str(p.relative_to(ROOT)) for p in files}, "ALLOWED names a file that is gone"
    bad = [v for path in files if str(path.relative_to(ROOT)) not in ALLOWED for v in violations(path)]
    assert not bad, (
        "a unit test must not start processes or bind sockets: move these tests to tests/integration "
        "(or allow the file in ALLOWED, with its reason):\n" + "\n".join(bad)
    )


def test_a_violation_is_seen_and_strings_and_comments_are_not(tmp_path: Path) -> None:
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import subprocess, socket, sys\n"
        "from multiprocessing import Process\n"
        "from torch.distributed import TCPStore\n"
        '"""subprocess.run, multiprocessing, socket.socket(), .bind(), TCPStore() in a docstring count not."""\n'
        "# subprocess.Popen(...) in a comment does not count either\n"
        "CODE = 'import multiprocessing; subprocess.run([])'\n"
        "def test_x(pytester):\n"
        "    subprocess.run([sys.executable])\n"
        "    socket.socket().bind(('127.0.0.1', 0))\n"
        "    TCPStore('127.0.0.1', 0)\n"
        "    pytester.popen(['true'])\n"
        "    run_distributed(2, print)\n"
    )
    found = [v.split(": ", 1)[1] for v in violations(planted)]
    assert sorted(found) == sorted(
        [
            "import subprocess",
            "from multiprocessing import ...",
            "from torch.distributed import TCPStore",
            "subprocess.run",
            "socket.socket(...)",
            ".bind(...)",
            "TCPStore(...)",
            "popen(...)",
            "run_distributed(...)",
        ]
    ), found
    assert all(v.startswith(f"{planted}:") for v in violations(planted))
    assert violations(planted)[0].split(":")[1].isdigit()
