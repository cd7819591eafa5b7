"""The edit tool on files of a real bubblewrap sandbox."""

from __future__ import annotations

import pytest

from raas.agent.tools.base import Tool, schema
from raas.agent.tools.edit import EditTool


@pytest.fixture
def edit(sandbox):
    return EditTool(sandbox)


async def ok(tool: EditTool, **args) -> str:
    result = await tool(args)
    assert result.ok, result.text
    return result.text


async def err(tool: EditTool, **args) -> str:
    result = await tool(args)
    assert not result.ok and result.text.startswith("Error:"), result.text
    return result.text


def test_schema(sandbox):
    tool = EditTool(sandbox)
    assert isinstance(tool, Tool)
    params = schema(tool)["function"]["parameters"]
    assert params["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo"]
    assert set(params["required"]) <= set(params["properties"])


async def test_create_view_and_ranges(edit, sandbox):
    text = await ok(edit, command="create", path="pkg/mod.py", file_text="a = 1\nb = 2\nc = 3\n")
    assert text == "Created pkg/mod.py (3 lines)"
    assert await sandbox.read_file("pkg/mod.py") == b"a = 1\nb = 2\nc = 3\n"
    assert (await sandbox.exec("cat pkg/mod.py")).stdout == b"a = 1\nb = 2\nc = 3\n"  # visible inside
    assert await ok(edit, command="view", path="/workspace/pkg/mod.py") == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3"
    assert await ok(edit, command="view", path="pkg/mod.py", view_range=[2, -1]) == "     2\tb = 2\n     3\tc = 3"
    assert await ok(edit, command="view", path="pkg/mod.py", view_range=[2, 2]) == "     2\tb = 2"
    assert "outside the file's lines 1-3" in await err(edit, command="view", path="pkg/mod.py", view_range=[2, 9])
    assert "view_range must be" in await err(edit, command="view", path="pkg/mod.py", view_range="2-3")
    assert "no such file" in await err(edit, command="view", path="nope.py")
    assert "is a directory" in await err(edit, command="view", path="pkg")


async def test_str_replace_needs_a_unique_match(edit, sandbox):
    await ok(edit, command="create", path="f.py", file_text="x = 1\ny = 2\nx = 1\n")
    assert "old_str not found in f.py" in await err(edit, command="str_replace", path="f.py", old_str="z = 0", new_str="")
    assert "old_str matches 2 times in f.py (lines 1, 3)" in await err(
        edit, command="str_replace", path="f.py", old_str="x = 1", new_str="x = 9"
    )
    assert await sandbox.read_file("f.py") == b"x = 1\ny = 2\nx = 1\n"  # failed edits change nothing
    text = await ok(edit, command="str_replace", path="f.py", old_str="y = 2\nx = 1", new_str="y = 5\nx = 7")
    assert text == "Edited f.py:\n     1\tx = 1\n     2\ty = 5\n     3\tx = 7"
    assert await sandbox.read_file("f.py") == b"x = 1\ny = 5\nx = 7\n"
    assert "must not be empty" in await err(edit, command="str_replace", path="f.py", old_str="", new_str="q")


async def test_insert(edit, sandbox):
    await ok(edit, command="create", path="f.txt", file_text="one\ntwo\n")
    await ok(edit, command="insert", path="f.txt", insert_line=0, new_str="zero")
    await ok(edit, command="insert", path="f.txt", insert_line=3, new_str="three\nfour")
    assert await sandbox.read_file("f.txt") == b"zero\none\ntwo\nthree\nfour\n"
    assert "from 0 to 5" in await err(edit, command="insert", path="f.txt", insert_line=9, new_str="x")


async def test_undo_steps_back_through_edits(edit, sandbox):
    await sandbox.write_file("u.txt", b"v1\n")
    await ok(edit, command="str_replace", path="u.txt", old_str="v1", new_str="v2")
    await ok(edit, command="create", path="/workspace/u.txt", file_text="v3\n")  # same file, other spelling
    await ok(edit, command="undo", path="u.txt")
    assert await sandbox.read_file("u.txt") == b"v2\n"
    await ok(edit, command="undo", path="u.txt")
    assert await sandbox.read_file("u.txt") == b"v1\n"
    assert "no edit of u.txt to undo" in await err(edit, command="undo", path="u.txt")
    await ok(edit, command="create", path="new.txt", file_text="fresh")
    assert "removed it" in await ok(edit, command="undo", path="new.txt")
    assert (await sandbox.exec("test -e new.txt")).exit_code == 1


async def test_paths_are_confined(edit, sandbox, tmp_path):
    host_file = tmp_path / "host.txt"
    host_file.write_text("host data")
    for path in ("/etc/passwd", "../../etc/passwd", str(host_file), "/run/raas/scratch/x"):
        assert "outside the workspace" in await err(edit, command="view", path=path)
    await sandbox.exec(f"ln -s {host_file} link; ln -s /etc/passwd pw")
    assert "host data" not in (await edit({"command": "view", "path": "link"})).text
    assert "root:" not in (await edit({"command": "view", "path": "pw"})).text
    await edit({"command": "create", "path": "link", "file_text": "pwned"})
    assert host_file.read_text() == "host data"


async def test_rejects_binary_and_oversized_files(sandbox):
    tool = EditTool(sandbox, max_file_bytes=100)
    await sandbox.write_file("bin", b"\xff\xfe\x00")
    assert "not UTF-8" in await err(tool, command="view", path="bin")
    await sandbox.write_file("big", b"x" * 200)
    assert "more than the 100" in await err(tool, command="view", path="big")
    assert "over the 100 allowed" in await err(tool, command="create", path="c", file_text="y" * 101)


async def test_bad_arguments(edit):
    assert "command must be one of" in await err(edit, command="delete", path="x")
    assert "needs a string argument 'path'" in await err(edit, command="view")
    assert "needs a string argument 'file_text'" in await err(edit, command="create", path="x")
