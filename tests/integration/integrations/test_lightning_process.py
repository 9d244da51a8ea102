"""``distinit.integrations`` imports stay lazy (checked in a fresh interpreter) and never touch ``mpi4py`` (checked in a
child process with a fake ``mpi4py`` that records any import: Lightning's own MPIEnvironment imports it, and can hang).

The plugin against the real Lightning classes, without processes, is in ``tests/unit/integrations/test_lightning.py``,
whose launcher environment (``block``) and ``clean_environ`` fixture this file reuses.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests._zygote import popen

pytest.importorskip("lightning")

from tests.unit.integrations.conftest import clean_environ  # noqa: F401  (the fixture, used by name)
from tests.unit.integrations.test_lightning import block

pytestmark = pytest.mark.usefixtures("clean_environ")


@pytest.mark.timeout(60)
def test_imports_stay_lazy_and_never_touch_mpi4py(tmp_path: Path) -> None:
    # Two children, so that only the claim that needs a fresh interpreter pays for one: importing distinit imports
    # neither torch nor Lightning (a fresh interpreter, no torch: about 0.5 CPU-s); building a Trainer with the plugin
    # never imports mpi4py (forked from tests/_zygote.py's server, torch already imported). As one fresh interpreter
    # the test cost about 6 CPU-s, and beside the stress round's burners it once ran past its 50-s bound (issue 34).
    lazy = "import sys, distinit, distinit.integrations\n" + (
        'assert not {"lightning", "pytorch_lightning", "torch"} & set(sys.modules), sorted(sys.modules)\n'
    )
    end = time.monotonic() + 50  # one budget for both children, inside the test's 60 s
    done = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    # A fake mpi4py that records any import: Lightning's own MPIEnvironment imports it (and can hang, #20049).
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    script = textwrap.dedent(
        f"""
        import sys
        assert not {{"mpi4py", "lightning"}} & set(sys.modules), sorted(sys.modules)  # the fork server imported neither
        sys.path.insert(0, {str(tmp_path)!r})
        from distinit.integrations.lightning import DistinitEnvironment
        from lightning.pytorch import Trainer
        env = DistinitEnvironment({block(3)!r})
        assert DistinitEnvironment.detect() is False
        built = Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", plugins=[env], logger=False)
        assert built.global_rank == 3
        """
    )
    child = popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = child.communicate(timeout=max(1.0, end - time.monotonic()))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert child.returncode == 0, err[-3000:]
    assert not (tmp_path / "imported").exists(), "mpi4py was imported"
