"""The factory and each kind's command line; real Apptainer/Docker runs only where installed."""

from __future__ import annotations

import os
import warnings

import pytest

from raas.sandbox import KINDS, Limits, make_sandbox
from raas.sandbox import apptainer as apptainer_mod
from raas.sandbox import docker as docker_mod
from raas.sandbox.apptainer import ApptainerSandbox
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.docker import DockerSandbox
from raas.sandbox.local import LocalSandbox

APPTAINER_IMAGE = os.environ.get("RAAS_TEST_APPTAINER_IMAGE", "docker://debian:bookworm-slim")
DOCKER_IMAGE = os.environ.get("RAAS_TEST_DOCKER_IMAGE", "debian:bookworm-slim")


def _layout(box):
    box._make_layout()  # the host directories a started sandbox would have
    return box


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_factory_kinds_and_errors():
    assert isinstance(make_sandbox(), BwrapSandbox)  # bwrap is installed where the tests run
    assert isinstance(make_sandbox("local"), LocalSandbox)
    assert isinstance(make_sandbox("docker", image="img"), DockerSandbox)
    assert isinstance(make_sandbox("apptainer", image="img.sif"), ApptainerSandbox)
    assert make_sandbox("bwrap", network=True).network is True
    assert set(KINDS) == {"bwrap", "apptainer", "docker", "local"}
    with pytest.raises(ValueError, match="'firecracker'"):
        make_sandbox("firecracker")


def test_auto_falls_back_to_local_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr("raas.sandbox.bwrap.available", lambda: False)
    with caplog.at_level("WARNING"):
        box = make_sandbox("auto")
    assert isinstance(box, LocalSandbox) and box.isolated is False
    assert "does NOT isolate" in caplog.text


def test_bwrap_command_line(tmp_path):
    box = _layout(BwrapSandbox(tmp_dir=str(tmp_path)))
    argv = box.bwrap_argv()
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--unshare-user"):
        assert flag in argv
    assert "--share-net" not in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--proc") == ["/proc"] and _pairs(argv, "--dev") == ["/dev"] and _pairs(argv, "--tmpfs") == ["/tmp"]
    assert [str(box.root / "workspace"), "/workspace"] == argv[argv.index(str(box.root / "workspace")) :][:2]
    assert _pairs(argv, "--ro-bind").count("/usr") == 1
    assert "/etc/passwd" not in _pairs(argv, "--ro-bind")  # a generated one is bound instead
    if os.geteuid() == 0:  # the agent must drop to the unprivileged uid before anything else runs
        assert argv[argv.index("setpriv") + 1 : argv.index("setpriv") + 3] == ["--reuid=1000", "--regid=1000"]
    else:
        assert "--disable-userns" in argv and _pairs(argv, "--uid") == ["1000"]
    assert "ulimit -t 600" in argv[-3] and "-u 256" in argv[-3]
    assert "--share-net" in _layout(BwrapSandbox(network=True, tmp_dir=str(tmp_path))).bwrap_argv()


def test_apptainer_command_line(tmp_path):
    box = _layout(ApptainerSandbox("/images/env.sif", limits=Limits(max_processes=32), tmp_dir=str(tmp_path)))
    argv = box.apptainer_argv({"A": "1"})
    i = argv.index("exec")
    assert argv[i - 1].endswith(("apptainer", "singularity")) and argv[:2] == ["prlimit", "--cpu=600:600"]
    assert "--nproc=32:32" in argv[: argv.index("--")]
    assert {"--containall", "--writable-tmpfs"} <= set(argv)
    assert argv[argv.index("--net") + 1 : argv.index("--net") + 3] == ["--network", "none"]
    binds = _pairs(argv, "--bind")
    assert f"{box.root / 'workspace'}:/workspace" in binds and f"{box.root / 'run/raas/ctl'}:/run/raas/ctl:ro" in binds
    assert _pairs(argv, "--env") == ["A=1"] and _pairs(argv, "--pwd") == ["/workspace"]
    assert argv[argv.index("/images/env.sif") + 1 :][:2] == ["/bin/sh", "-c"]
    net = _layout(ApptainerSandbox("x.sif", network=True, tmp_dir=str(tmp_path))).apptainer_argv({})
    assert "--net" not in net and "--network" not in net


def test_docker_command_line(tmp_path):
    limits = Limits(max_processes=50, memory_bytes=1 << 30, cpu_seconds=10, file_size_bytes=None, tmp_bytes=1 << 20)
    box = _layout(DockerSandbox("python:3.11-slim", limits=limits, user="1234:99", tmp_dir=str(tmp_path)))
    argv = box.docker_argv({"A": "1"})
    assert argv[:3] == ["docker", "run", "--rm"] and {"-i", "--init"} <= set(argv)
    assert _pairs(argv, "--network") == ["none"] and _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--security-opt") == ["no-new-privileges"] and _pairs(argv, "--user") == ["1234:99"]
    assert _pairs(argv, "--pids-limit") == ["50"] and _pairs(argv, "--memory") == [str(1 << 30)]
    assert _pairs(argv, "--ulimit") == ["cpu=10:10", "nofile=4096:4096"]
    assert _pairs(argv, "--tmpfs") == [f"/tmp:rw,nosuid,nodev,mode=1777,size={1 << 20}"]
    assert f"{box.root / 'run/raas/ctl'}:/run/raas/ctl:ro" in _pairs(argv, "-v") and _pairs(argv, "-e") == ["A=1"]
    assert argv[argv.index("--entrypoint") + 1 : argv.index("--entrypoint") + 4] == ["/bin/sh", "python:3.11-slim", "-c"]
    assert box.owner == (1234, 99)
    with pytest.raises(ValueError, match="numeric"):
        DockerSandbox("img", user="nobody")


def _require(available: bool, what: str) -> None:
    if not available:
        reason = f"{what}: real tests skipped (command construction is still tested above)"
        warnings.warn(reason, stacklevel=2)
        pytest.skip(reason)


async def test_apptainer_real(tmp_path):
    _require(apptainer_mod.available(), "apptainer/singularity is not on PATH")
    async with ApptainerSandbox(APPTAINER_IMAGE, tmp_dir=str(tmp_path)) as box:
        r = await box.exec("echo hi > f; cat f; cat /proc/net/dev | wc -l")
        assert r.stdout.split() == [b"hi", b"3"] and await box.read_file("f") == b"hi\n"  # 3: loopback only
        assert (await box.exec("sleep 30", timeout=1)).timed_out


async def test_docker_real(tmp_path):
    _require(docker_mod.available(), "no docker daemon answers `docker info`")
    async with DockerSandbox(DOCKER_IMAGE, tmp_dir=str(tmp_path)) as box:
        r = await box.exec("echo hi > f; cat f; id -u")
        assert r.stdout == b"hi\n65534\n" and await box.read_file("f") == b"hi\n"
        assert (await box.exec("sleep 30", timeout=1)).timed_out
