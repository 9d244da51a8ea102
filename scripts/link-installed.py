"""Hard-link an installed distribution into another venv, in place of pip unpacking its wheel again.

``make dist-check`` builds a clean venv for the built wheel; torch is ~700 MB unpacked and pip takes ~40 s
to install it again from its warm cache (2-vCPU machine), hard links take ~1 s. Only the distribution's own
files (its RECORD, console scripts left out) are linked, never its dependencies: pip then installs the wheel,
keeps the linked distribution only if it satisfies the requested version, and installs every dependency
from the metadata, so a dependency the wheel forgets to declare still fails the check.

Usage: ``python link-installed.py NAME TARGET_PYTHON`` (run by the interpreter that has NAME installed).
Exits 1, having linked nothing it could not finish, when NAME is not installed here or the two venvs run
different Python versions; the caller then installs it with pip.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path


def main(name: str, target_python: str) -> int:
    """Link NAME's installed files into the purelib directory of TARGET_PYTHON's venv."""
    query = "import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_path('purelib'))"
    answer = subprocess.run([target_python, "-c", query], capture_output=True, text=True, check=True, timeout=60)
    version, purelib = answer.stdout.splitlines()
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != ours:
        print(f"link-installed: {target_python} runs Python {version}, this one {ours}", file=sys.stderr)
        return 1
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        print(f"link-installed: {name} is not installed in {sys.prefix}", file=sys.stderr)
        return 1
    source = Path(str(dist.locate_file(""))).resolve()
    tops = sorted({Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")})
    try:
        for top in tops:
            src, dst = source / top, Path(purelib) / top
            if src.is_dir():
                shutil.copytree(src, dst, copy_function=os.link)
            elif src.exists():
                os.link(src, dst)
    except OSError as exc:  # another file system: leave it to pip
        for top in tops:
            target = Path(purelib) / top
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        print(f"link-installed: cannot hard-link {name} ({exc})", file=sys.stderr)
        return 1
    print(f"link-installed: {name} {dist.version} linked into {purelib} ({', '.join(tops)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
