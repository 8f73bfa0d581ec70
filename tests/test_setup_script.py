"""``scripts/setup.sh``'s torch claim holds: without an NVIDIA GPU torch comes from PyTorch's CPU index (an extra
index: PyPI's Linux wheel is the CUDA build), with one from PyPI alone (issue 31 item 7). The script runs in a copy
of the repo layout with a stub ``.venv/bin/python`` that records its pip commands, and stub system tools on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _setup_calls(tmp_path: Path, *, gpu: bool, env: dict[str, str] | None = None) -> list[str]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    _stub(repo / ".venv" / "bin" / "python", f'echo "$*" >> {log}')
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bwrap", "setpriv"):  # the sandbox's tools present: no apt-get
        _stub(bin_ / tool, "exit 0")
    _stub(bin_ / "ldconfig", "echo 'libseccomp.so.2 (libc6,x86-64) => /lib/libseccomp.so.2'")
    _stub(bin_ / "apt-get", f"echo apt-get >> {log}")
    _stub(bin_ / "nvidia-smi", "echo 'GPU 0: NVIDIA H200'" if gpu else "exit 9")  # no driver: nvidia-smi fails
    full_env = {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), **(env or {})}
    subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=full_env, check=True, capture_output=True)
    return log.read_text().splitlines()


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="setup.sh hashes pyproject.toml with sha256sum")
def test_on_a_cpu_machine_torch_comes_from_the_cpu_index(tmp_path):
    calls = _setup_calls(tmp_path, gpu=False)
    torch = next(c for c in calls if "torch==" in c)
    assert torch == f"-m pip install -q --extra-index-url {CPU_INDEX} torch==2.13.0"  # before: PyPI's CUDA build
    assert calls.index(torch) < next(i for i, c in enumerate(calls) if "-e" in c.split())  # before slime itself
    assert "apt-get" not in calls


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="setup.sh hashes pyproject.toml with sha256sum")
def test_on_a_gpu_machine_or_with_the_index_given_torch_comes_from_there(tmp_path):
    assert "-m pip install -q torch==2.13.0" in _setup_calls(tmp_path / "gpu", gpu=True)
    calls = _setup_calls(tmp_path / "own", gpu=False, env={"SLIME_TORCH_INDEX": "https://mirror/whl"})
    assert "-m pip install -q --extra-index-url https://mirror/whl torch==2.13.0" in calls
