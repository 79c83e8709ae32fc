"""GPU detection and `--gpus` parsing against a fake `nvidia-smi` on PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.model.gpus import detect_gpus, gpu_spec, parse_gpu_spec, pin_env, query_gpus

SIX_B200 = "".join(f"{i}, NVIDIA B200, 183359 MiB\n" for i in range(6))


def fake_smi(bin_dir: Path, stdout: str = "", exit_code: int = 0, stderr: str = "") -> Path:
    """An executable nvidia-smi that prints `stdout` for the query and logs its argv."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "out.txt").write_text(stdout)
    (bin_dir / "err.txt").write_text(stderr)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{bin_dir}/argv.log"\n'
        f'cat "{bin_dir}/out.txt"\n'
        f'cat "{bin_dir}/err.txt" >&2\n'
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.fixture
def only_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """PATH = one directory of fakes (plus /bin for sh and cat); no NVML module."""

    def use(bin_dir: Path) -> None:
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")

    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails: no NVML
    return use


def test_detects_six_gpus_from_nvidia_smi(tmp_path: Path, only_path) -> None:
    # Given a host whose nvidia-smi lists six B200s
    only_path(fake_smi(tmp_path / "bin", SIX_B200))
    # When detected, Then six indexes, the names map to the table, and the query is the CSV one.
    assert detect_gpus() == [0, 1, 2, 3, 4, 5]
    gpus, source = query_gpus()
    assert source == "nvidia-smi"
    assert {g.kind for g in gpus} == {"b200"} and gpus[0].memory_mib == 183359
    argv = (tmp_path / "bin" / "argv.log").read_text()
    assert "--query-gpu=index,name,memory.total" in argv and "--format=csv,noheader" in argv


def test_spec_parsing_pins_listed_gpus(tmp_path: Path, only_path) -> None:
    only_path(fake_smi(tmp_path / "bin", SIX_B200))
    assert parse_gpu_spec("all") == [0, 1, 2, 3, 4, 5]
    assert parse_gpu_spec("ALL ") == [0, 1, 2, 3, 4, 5]
    assert parse_gpu_spec("0,1,4") == [0, 1, 4]
    assert parse_gpu_spec(" 4 , 0 ") == [4, 0]
    with pytest.raises(ConfigError, match=r"GPU 7 not present on this host \(present: 0, 1, 2, 3, 4, 5\)"):
        parse_gpu_spec("0,7")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_gpu_spec("1,1")
    with pytest.raises(ConfigError, match="'x' is not a GPU index"):
        parse_gpu_spec("0,x")
    with pytest.raises(ConfigError, match="'' is not a GPU index"):
        parse_gpu_spec("")


def test_all_without_gpus_is_a_clear_error(tmp_path: Path, only_path) -> None:
    # Given a host with no nvidia-smi at all
    only_path(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    assert detect_gpus() == []
    with pytest.raises(ConfigError) as err:
        parse_gpu_spec("all")
    msg = str(err.value)
    assert "no GPU found" in msg and "nvidia-smi not on PATH" in msg and "--workers N" in msg
    with pytest.raises(ConfigError, match=r"present: none"):
        parse_gpu_spec("0")


def test_driver_failure_is_reported(tmp_path: Path, only_path) -> None:
    # Given nvidia-smi that cannot reach the driver (what a broken container looks like)
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    only_path(fake_smi(tmp_path / "bin", stdout=msg + "\n", exit_code=9))
    assert detect_gpus() == []
    with pytest.raises(ConfigError, match="nvidia-smi exited 9: NVIDIA-SMI has failed"):
        parse_gpu_spec("all")


def test_explicit_available_list_and_table() -> None:
    assert parse_gpu_spec("all", available=[3, 1]) == [1, 3]
    assert pin_env(4) == {"CUDA_VISIBLE_DEVICES": "4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    b200 = gpu_spec("B200")
    assert (b200.hbm_gb, b200.hbm_tb_s) == (192, 8.0)
    assert gpu_spec("nvidia-h200").hbm_gb == 141 and gpu_spec("H100").hbm_tb_s == 3.35
    assert gpu_spec("rtx_pro_6000").hbm_gb == 96 and gpu_spec("rtx-pro-6000").hbm_tb_s == 1.8
