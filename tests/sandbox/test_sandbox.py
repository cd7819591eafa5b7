"""The Sandbox contract, on real bubblewrap and local sandboxes."""

from __future__ import annotations

import asyncio
import os

import pytest

from raas.sandbox import Limits, SandboxError
from raas.sandbox.bwrap import BwrapSandbox


async def test_exec_reports_streams_and_exit_code(box):
    r = await box.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, b"out\n", b"err\n", False)
    assert (await box.exec(["printf", "%s|", "a b", "c"])).stdout == b"a b|c|"


async def test_exec_stdin_cwd_env(box):
    assert (await box.exec(["cat"], stdin=b"line1\nline2")).stdout == b"line1\nline2"
    await box.exec("mkdir -p sub/dir")
    r = await box.exec('pwd; echo "$GREETING"', cwd=f"{box.workspace}/sub", env={"GREETING": "it's \"quoted\""})
    assert r.stdout.decode().splitlines() == [f"{box.workspace}/sub", "it's \"quoted\""]
    with pytest.raises(ValueError):
        await box.exec("true", env={"BAD NAME": "x"})


async def test_default_cwd_is_the_workspace_and_files_are_shared(box):
    assert (await box.exec("pwd")).stdout.decode().strip() == box.workspace
    await box.write_file("dir/hello.txt", b"from host")
    assert (await box.exec("cat dir/hello.txt")).stdout == b"from host"
    await box.exec("echo from-sandbox > made.txt")
    assert await box.read_file("made.txt") == b"from-sandbox\n"
    assert await box.read_file(f"{box.workspace}/made.txt") == b"from-sandbox\n"
    assert box.host_path("made.txt").read_bytes() == b"from-sandbox\n"
    await box.exec("echo more >> dir/hello.txt")  # the sandbox may modify what the host wrote
    assert await box.read_file("dir/hello.txt") == b"from hostmore\n"


async def test_timeout_kills_the_whole_process_group(box, host):
    r = await box.exec("sleep 300 & sleep 301 & echo started; wait", timeout=1)
    assert r.timed_out and r.exit_code == 137 and r.stdout == b"started\n"
    await asyncio.sleep(0.2)
    assert not [c for c in host.descendants(os.getpid()).values() if "sleep 30" in c]


async def test_exec_output_is_bounded_head_and_tail(box):
    r = await box.exec("seq 1 200000", max_output=1000)
    assert len(r.stdout) == 1000 and r.stdout.startswith(b"1\n2\n3\n") and r.stdout.endswith(b"199999\n200000\n")
    assert r.stdout_dropped == len(b"".join(b"%d\n" % i for i in range(1, 200001))) - 1000


async def test_background_child_holding_stdout_does_not_block_exec(box):
    r = await box.exec("sleep 30 & echo done", timeout=10)
    assert r.stdout == b"done\n" and not r.timed_out


async def test_spawn_streams_and_pty(box):
    proc = await box.spawn(["cat"])
    proc.write(b"ping\n")
    assert await asyncio.wait_for(proc.read(), 10) == b"ping\n"
    await proc.close_stdin()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    tty = await box.spawn("tty; stty size", pty=True)
    out = b""
    while chunk := await asyncio.wait_for(tty.read(), 10):
        out += chunk
    assert b"/dev/pts/" in out and await tty.wait() == 0


async def test_kill_stops_a_spawned_process(box):
    proc = await box.spawn(["sleep", "300"])
    await proc.kill()
    assert proc.returncode == 137 and await proc.wait() == 137


async def test_file_paths_are_confined_to_the_workspace(box):
    for bad in ("/etc/passwd", "../x", "../../../../etc/passwd", "/tmp/x"):
        with pytest.raises(SandboxError, match="outside the workspace"):
            await box.read_file(bad)
        with pytest.raises(SandboxError, match="outside the workspace"):
            await box.write_file(bad, b"x")
    with pytest.raises(FileNotFoundError):
        await box.read_file("missing")
    with pytest.raises(IsADirectoryError):
        await box.read_file(".")


async def test_read_file_size_cap(box):
    await box.write_file("big", b"x" * 5000)
    with pytest.raises(SandboxError, match="more than"):
        await box.read_file("big", max_bytes=4999)
    assert len(await box.read_file("big", max_bytes=5000)) == 5000


async def test_planted_fifo_does_not_block_the_host(box):
    await box.exec("mkfifo trap")
    with pytest.raises(SandboxError, match="not a regular file"):
        await asyncio.wait_for(box.read_file("trap"), 5)
    with pytest.raises(SandboxError, match="not a regular file"):
        await asyncio.wait_for(box.write_file("trap", b"x"), 5)


async def test_closed_sandbox_refuses_and_cleans_up(tmp_path):
    box = BwrapSandbox(tmp_dir=str(tmp_path))
    with pytest.raises(SandboxError, match="not started"):
        await box.exec("true")
    await box.start()
    root = box.root
    await box.close()
    await box.close()  # idempotent
    assert not root.exists()
    with pytest.raises(SandboxError, match="closed"):
        await box.exec("true")
    with pytest.raises(SandboxError, match="already"):
        await box.start()


async def test_limits_file_size_memory_cpu(tmp_path):
    limits = Limits(file_size_bytes=1 << 20, memory_bytes=512 << 20, cpu_seconds=1, timeout=30)
    async with BwrapSandbox(limits=limits, tmp_dir=str(tmp_path)) as box:
        r = await box.exec("head -c 2000000 /dev/zero > big; echo rc=$?; stat -c %s big")
        assert b"rc=153" in r.stdout or b"File size limit" in r.stderr  # SIGXFSZ
        assert int(r.stdout.split()[-1]) == 1 << 20
        r = await box.exec(["python3", "-c", "b = bytearray(1 << 30)"])
        assert r.exit_code != 0 and b"MemoryError" in r.stderr
        r = await box.exec("while :; do :; done")
        assert r.exit_code == 128 + 9 or r.exit_code == 128 + 24  # SIGKILL/SIGXCPU at the CPU limit
        assert not r.timed_out


async def test_sandbox_user_has_no_capabilities(bwrap_box):
    status = (await bwrap_box.exec("cat /proc/self/status")).stdout.decode()
    caps = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Cap")}
    assert caps["CapEff"] == caps["CapPrm"] == "0000000000000000"
    assert "NoNewPrivs:\t1" in status
    assert (await bwrap_box.exec("id -u")).stdout == b"1000\n"
    r = await bwrap_box.exec("mount -t tmpfs none /tmp 2>&1; echo rc=$?")
    assert b"rc=0" not in r.stdout
