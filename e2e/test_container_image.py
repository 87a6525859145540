"""The container image: built from the project's Dockerfile and checked by running it.

No container engine runs here, so `make image-local` builds it with buildah on a Debian base it makes
itself, then runs `greyrelease crd` in the image as its non-root user on a read-only root file system
and compares the output with the checked-in CRD (see image/build.sh). Needs root (buildah's storage,
debootstrap); the first run takes about two minutes, later ones seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="image/build.sh needs root")


def test_image_builds_and_runs_as_non_root_on_a_read_only_root() -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "image-local", "IMAGE=greyrelease:e2e"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    ok = re.search(r"ok: uid (\d+), read-only root, 'greyrelease crd' matches the CRDs", output)
    assert ok is not None, output[-4000:]
    assert ok.group(1) == "65532"
    assert re.search(r"greyrelease:e2e\s+\w+\s+\d", output), output[-2000:]  # the image and its size
