"""Check an installed distinit (the built wheel in a clean venv), run from outside the checkout.

`make dist-check` runs it: every public name resolves, the typing marker and the entry points are
installed, and the `distinit` command works. A file or entry point missing from the wheel fails here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path


def _check_imports() -> Path:
    import distinit

    package = Path(distinit.__file__).resolve().parent
    prefix = Path(sys.prefix).resolve()
    if prefix not in package.parents:
        sys.exit(f"distinit imported from {package}, not from this venv ({prefix}): run from outside the checkout")
    for name in distinit.__all__:
        getattr(distinit, name)
    for module in (
        "distinit.env",
        "distinit.init",
        "distinit.broadcast",
        "distinit.watchdog",
        "distinit.testing",
        "distinit.integrations",
        "distinit.rendezvous",
        "distinit.cli",
    ):
        importlib.import_module(module)
    if not (package / "py.typed").is_file():
        sys.exit("py.typed is missing from the installed package")
    return package


def _check_entry_points() -> None:
    plugins = {ep.value for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "distinit"}
    if plugins != {"distinit.testing.plugin"}:
        sys.exit(f"pytest11 entry point 'distinit' is {plugins or 'missing'}")
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    if scripts.get("distinit") != "distinit.cli:main":
        sys.exit(f"console script 'distinit' is {scripts.get('distinit')!r}")
    # torchrun --rdzv-backend=distinit: importing torch's rendezvous package registers the entry points.
    handlers = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torchrun.handlers")}
    if handlers.get("distinit") != "distinit.rendezvous:handler":
        sys.exit(f"torchrun.handlers entry point 'distinit' is {handlers.get('distinit')!r}")
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    if "distinit" not in rendezvous_handler_registry._registry:
        sys.exit("torch's rendezvous registry did not register 'distinit' (see torch's warning above)")


def _run(*args: str) -> str:
    command = [str(Path(sys.executable).with_name("distinit")), *args]
    env = {key: value for key, value in os.environ.items() if key not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def main() -> None:
    """Run every check; exit non-zero with the reason at the first failure."""
    package = _check_imports()
    _check_entry_points()
    world = json.loads(_run("env", "--no-strict", "--json"))
    if world["world_size"] != 1:
        sys.exit(f"distinit env resolved {world}, expected one process")
    checked = _run("env", "--no-strict", "--check")
    if "check: ok" not in checked:
        sys.exit(f"distinit env --check did not pass:\n{checked}")
    report = json.loads(_run("doctor", "--no-strict", "--json"))
    if not report["ok"] or report["world_size"] != 1:
        sys.exit(f"distinit doctor on one process did not pass: {report}")
    print(f"check-installed: ok ({package})")


if __name__ == "__main__":
    main()
