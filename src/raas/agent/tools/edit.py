"""The ``edit`` tool: view and edit workspace files without going through a shell.

Commands: ``view`` (numbered lines, optional ``view_range``), ``create`` (write a whole file),
``str_replace`` (``old_str`` must occur exactly once: zero or several matches are an error
that says which, so the model adds context instead of editing the wrong place), ``insert``
(``new_str`` after line ``insert_line``; 0 = at the top) and ``undo`` (restore the file as it
was before the last edit made through this tool; repeatable).

All reads and writes go through the sandbox's ``read_file`` / ``write_file``, so paths are
confined to the workspace (relative paths are relative to it) and symlinks planted by the
sandboxed code resolve inside the sandbox. Files are UTF-8 text up to ``max_file_bytes``.
"""

from __future__ import annotations

from typing import Any

from raas.agent.tools.base import ToolResult
from raas.sandbox.base import Sandbox, SandboxError

_SNIPPET = 4  # lines of context shown around an edit


class _EditError(Exception):
    pass


class EditTool:
    name = "edit"
    description = (
        "View and edit text files in the workspace. Commands: view (file with line numbers; optional "
        "view_range [start, end], end -1 = to the end), create (write file_text as the whole file), "
        "str_replace (replace old_str, which must appear exactly once, with new_str), insert (insert "
        "new_str after line insert_line; 0 = at the top), undo (revert the last edit of the file)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo"]},
            "path": {"type": "string", "description": "file path, relative to the workspace or absolute inside it"},
            "file_text": {"type": "string", "description": "create: the file's content"},
            "old_str": {"type": "string", "description": "str_replace: exact text to replace (must be unique)"},
            "new_str": {"type": "string", "description": "str_replace: replacement; insert: text to insert"},
            "insert_line": {"type": "integer", "description": "insert: the line after which to insert (0 = top)"},
            "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: [start, end] (1-based)"},
        },
        "required": ["command", "path"],
    }

    def __init__(self, sandbox: Sandbox, *, max_file_bytes: int = 1 << 20, max_output_chars: int = 20_000, history: int = 10):
        self.sandbox = sandbox
        self.max_file_bytes = max_file_bytes
        self.max_output_chars = max_output_chars
        self.history = history
        self._history: dict[str, list[str | None]] = {}  # path -> earlier contents (None: did not exist)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        command, path = arguments.get("command"), arguments.get("path")
        handler = getattr(self, f"_{command}", None) if command in ("view", "create", "str_replace", "insert", "undo") else None
        if handler is None:
            return ToolResult("Error: command must be one of view, create, str_replace, insert, undo", ok=False)
        if not isinstance(path, str) or not path:
            return ToolResult("Error: edit needs a string argument 'path'", ok=False)
        try:
            return ToolResult(await handler(self._key(path), arguments))
        except _EditError as e:
            return ToolResult(f"Error: {e}", ok=False)
        except SandboxError as e:
            return ToolResult(f"Error: {e}", ok=False)
        except OSError as e:
            return ToolResult(f"Error: {path}: {_describe(e)}", ok=False)

    # -- commands --------------------------------------------------------------------------------
    async def _view(self, path: str, args: dict[str, Any]) -> str:
        lines, _ = _split(await self._read(path))
        if not lines:
            return f"{path} is empty"
        start, end = 1, len(lines)
        rng = args.get("view_range")
        if rng is not None:
            if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) for x in rng)):
                raise _EditError("view_range must be [start, end] (integers; end -1 = to the end)")
            start, end = rng[0], (len(lines) if rng[1] == -1 else rng[1])
            if not 1 <= start <= end <= len(lines):
                raise _EditError(f"view_range {rng} is outside the file's lines 1-{len(lines)}")
        text = _numbered(lines[start - 1 : end], start)
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n[... cut; view a smaller view_range of the {len(lines)} lines]"
        return text

    async def _create(self, path: str, args: dict[str, Any]) -> str:
        text = _need_str(args, "file_text")
        before = await self._read_or_none(path)
        await self._write(path, text, before)
        return f"{'Overwrote' if before is not None else 'Created'} {path} ({len(text.splitlines())} lines)"

    async def _str_replace(self, path: str, args: dict[str, Any]) -> str:
        old, new = _need_str(args, "old_str"), args.get("new_str", "")
        if not isinstance(new, str):
            raise _EditError("new_str must be a string")
        if not old:
            raise _EditError("old_str must not be empty")
        text = await self._read(path)
        count = text.count(old)
        if count == 0:
            raise _EditError(f"old_str not found in {path}; it must match the file exactly (whitespace included)")
        if count > 1:
            lines = [text.count("\n", 0, i) + 1 for i in _find_all(text, old)]
            raise _EditError(f"old_str matches {count} times in {path} (lines {', '.join(map(str, lines))}); "
                             "include more surrounding text to make it unique")
        at = text.index(old)
        edited = text.replace(old, new, 1)
        await self._write(path, edited, text)
        first = text.count("\n", 0, at) + 1
        return f"Edited {path}:\n" + _snippet(edited, first, first + new.count("\n"))

    async def _insert(self, path: str, args: dict[str, Any]) -> str:
        new, after = _need_str(args, "new_str"), args.get("insert_line")
        text = await self._read(path)
        lines, newline_at_end = _split(text)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= len(lines):
            raise _EditError(f"insert_line must be an integer from 0 to {len(lines)}")
        lines[after:after] = new.removesuffix("\n").split("\n")
        edited = "\n".join(lines) + "\n" * newline_at_end
        await self._write(path, edited, text)
        return f"Inserted into {path}:\n" + _snippet(edited, after + 1, after + new.count("\n") + 1)

    async def _undo(self, path: str, args: dict[str, Any]) -> str:
        stack = self._history.get(path)
        if not stack:
            raise _EditError(f"no edit of {path} to undo")
        before = stack.pop()
        if before is None:  # the edit created the file
            result = await self.sandbox.exec(["rm", "-f", "--", path], timeout=30)
            if not result.ok:
                raise _EditError(f"could not remove {path}: {result.text.strip()}")
            return f"Undid the creation of {path} (removed it)"
        await self.sandbox.write_file(path, before.encode())
        return f"Restored {path} to its state before the last edit ({len(before.splitlines())} lines)"

    # -- helpers ---------------------------------------------------------------------------------
    def _key(self, path: str) -> str:
        """The workspace-relative name of ``path``: one name per file, so that 'a.py' and
        '/workspace/a.py' share an undo history. Raises SandboxError outside the workspace."""
        host, root = self.sandbox.host_path(path), self.sandbox.host_path(".")
        if host == root or root not in host.parents:
            raise SandboxError(f"{path!r} is outside the workspace ({self.sandbox.workspace}) or not a file path")
        return str(host.relative_to(root))

    async def _read(self, path: str) -> str:
        data = await self.sandbox.read_file(path, max_bytes=self.max_file_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise _EditError(f"{path} is not UTF-8 text") from None

    async def _read_or_none(self, path: str) -> str | None:
        try:
            return await self._read(path)
        except FileNotFoundError:
            return None

    async def _write(self, path: str, text: str, before: str | None) -> None:
        data = text.encode()
        if len(data) > self.max_file_bytes:
            raise _EditError(f"the result would be {len(data)} bytes, over the {self.max_file_bytes} allowed")
        await self.sandbox.write_file(path, data)
        stack = self._history.setdefault(path, [])
        stack.append(before)
        del stack[: -self.history]

def _split(text: str) -> tuple[list[str], bool]:
    """Lines as an editor counts them (a final newline ends the last line, it does not start
    an empty one) and whether there was that final newline."""
    if not text:
        return [], False
    return text.removesuffix("\n").split("\n"), text.endswith("\n")


def _snippet(text: str, first: int, last: int) -> str:
    lines, _ = _split(text)
    lo, hi = max(1, first - _SNIPPET), min(len(lines), last + _SNIPPET)
    return _numbered(lines[lo - 1 : hi], lo)


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, first))


def _need_str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise _EditError(f"this command needs a string argument {key!r}")
    return value


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _describe(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "is a directory (list it with bash: ls)"
    return e.strerror or str(e)
