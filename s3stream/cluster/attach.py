"""The attach command: how a taker makes a dead node's WAL reachable before it reads it.

On one machine a dead node's WAL is a file the taker can open where the dead node's ``open_node``
recorded it. In production it lives on a volume of the dead node's machine (an EBS volume, a shared
disk) that must first be attached or mounted where the taker runs. ``s3.wal.failover.attach.cmd`` is
an operator-supplied shell command that does this:

- ``{node_id}`` and ``{wal_path}`` in it are replaced by the dead node's id and its recorded WAL path
  (the path shell-quoted);
- it runs under ``sh -c`` in its own process group, with at most :data:`ATTACH_TIMEOUT_S` seconds;
- exit status 0 is success: the last non-empty line of its stdout, if any, is the path to open
  instead of the recorded one; any other status, or the timeout (the whole group is killed), fails
  the takeover attempt with :class:`~s3stream.errors.UnavailableError` (it is tried again).

An empty command attaches nothing: the recorded path is opened as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal

from s3stream.errors import InvalidArgumentError, UnavailableError
from s3stream.logfmt import log_event

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 120.0
"""Longest an attach command may run (attaching a cloud volume takes tens of seconds)."""
STDERR_TAIL_BYTES = 2000
"""How much of a failed command's stderr its error quotes."""


def attach_command(template: str, *, node_id: int, wal_path: str) -> str:
    """The shell command of ``template`` for one dead node (placeholders replaced, the path quoted)."""
    return template.replace("{node_id}", str(int(node_id))).replace("{wal_path}", shlex.quote(wal_path))


def chosen_path(stdout: bytes, recorded_path: str) -> str:
    """The path to open: the last non-empty line of the command's stdout, else ``recorded_path``."""
    lines = [line.strip() for line in stdout.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else recorded_path


async def attach_wal(
    template: str, *, node_id: int, wal_path: str, timeout_s: float = ATTACH_TIMEOUT_S
) -> str:
    """Run the attach command for the dead node ``node_id`` (nothing if ``template`` is empty) and
    return the path of its WAL to open. UnavailableError when the command fails or times out;
    InvalidArgumentError when there is no path at all (no command and none recorded)."""
    if not template.strip():
        if not wal_path:
            raise InvalidArgumentError(
                f"node {node_id} recorded no WAL path and s3.wal.failover.attach.cmd is empty: "
                "nothing to open"
            )
        return wal_path
    command = attach_command(template, node_id=node_id, wal_path=wal_path)
    log_event(log, logging.INFO, "takeover.attach", node=node_id, command=command)
    proc = await asyncio.create_subprocess_shell(
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        raise UnavailableError(
            f"attach command for node {node_id} did not finish within {timeout_s:g} s: {command!r}"
        ) from None
    except BaseException:
        _kill_group(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            await asyncio.shield(proc.wait())
        raise
    if proc.returncode != 0:
        tail = stderr[-STDERR_TAIL_BYTES:].decode("utf-8", "replace").strip()
        raise UnavailableError(
            f"attach command for node {node_id} exited with status {proc.returncode}: {command!r}"
            + (f"; stderr: {tail}" if tail else "")
        )
    path = chosen_path(stdout, wal_path)
    if not path:
        raise InvalidArgumentError(
            f"attach command for node {node_id} printed no path and the node recorded none: {command!r}"
        )
    log_event(log, logging.INFO, "takeover.attached", node=node_id, path=path)
    return path


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
