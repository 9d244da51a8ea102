"""``distinit.integrations`` imports stay lazy and never touch ``mpi4py``, checked in a fresh interpreter (a child
process) with a fake ``mpi4py`` that records any import (Lightning's own MPIEnvironment imports it, and can hang).

The plugin against the real Lightning classes, without processes, is in ``tests/unit/integrations/test_lightning.py``,
whose launcher environment (``block``) and ``clean_environ`` fixture this file reuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from tests.unit.integrations.conftest import clean_environ  # noqa: F401  (the fixture, used by name)
from tests.unit.integrations.test_lightning import block

pytestmark = pytest.mark.usefixtures("clean_environ")


@pytest.mark.timeout(60)
def test_imports_stay_lazy_and_never_touch_mpi4py(tmp_path: Path) -> None:
    # A fake mpi4py that records any import: Lightning's own MPIEnvironment imports it (and can hang, #20049).
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    script = textwrap.dedent(
        f"""
        import sys
        import distinit, distinit.integrations
        assert not {{"lightning", "pytorch_lightning", "torch"}} & set(sys.modules), sorted(sys.modules)
        from distinit.integrations.lightning import DistinitEnvironment
        from lightning.pytorch import Trainer
        env = DistinitEnvironment({block(3)!r})
        assert DistinitEnvironment.detect() is False
        built = Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", plugins=[env], logger=False)
        assert built.global_rank == 3
        """
    )
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "imported").exists(), "mpi4py was imported"
