"""Under CI (CI=true) a skipped test fails the run: CI installs every extra, so a skip means a reference
check silently did not run. Runs this suite's conftest.py on a throwaway test that skips."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("ci, code", [("true", 1), ("", 0)])
def test_a_skip_fails_the_run_only_under_ci(tmp_path, ci, code):
    shutil.copy(Path(__file__).parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_one.py").write_text("import pytest\n\n\ndef test_runs():\n    assert True\n\n\n"
                                          "def test_needs_an_extra():\n    pytest.skip('no such extra')\n")
    env = {**os.environ, "CI": ci}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == code, p.stdout + p.stderr
    assert "1 passed, 1 skipped" in p.stdout
    shown = "CI: skipped tests fail the run" in p.stdout and "test_needs_an_extra: Skipped: no such extra" in p.stdout
    assert shown == bool(ci), p.stdout
