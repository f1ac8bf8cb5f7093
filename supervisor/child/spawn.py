"""Start a child with posix_spawn, not subprocess.Popen.

Why: Popen learns that exec succeeded by reading an error pipe until end-of-file. The
pipe's write end is close-on-exec, but a process that another trainer thread forks
during the spawn (a DataLoader worker, a checkpoint writer) does not exec: it holds a
copy for as long as it lives, and Popen waits for it (3-8 s in review, past
`startup_timeout` with long-lived workers). glibc's posix_spawn reports an exec failure
through memory the child shares with the parent until it execs (CLONE_VFORK), so there
is no descriptor for a fork to hold: the spawn takes as long as the exec, whatever
other threads do.

What Popen did besides is done here too: a new session, default SIGPIPE and SIGXFSZ,
an empty signal mask. Python 3.11's posix_spawn has no closefrom, so descriptors the
trainer left inheritable are closed by the child itself
(`child_runtime.protocol.boot.close_strays`).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Mapping, Sequence

_FIRST_FREE = 3  # 0, 1 and 2 are the child's stdin, stdout and stderr


def _above_std(fd: int, made: list[int]) -> int:
    """`fd`, or a close-on-exec copy numbered 3 or more when it is one of 0-2 (a trainer that closed
    its standard streams): the child's standard streams are set up without clobbering it."""
    if fd >= _FIRST_FREE:
        return fd
    copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _FIRST_FREE)
    made.append(copy)
    return copy


def spawn_child(
    argv: Sequence[str], env: Mapping[str, str], log_fd: int, pass_fds: Sequence[int]
) -> tuple[int, int, dict[int, int]]:
    """Spawn `argv` in a new session with stdin a new pipe, stdout and stderr on `log_fd`, and
    `pass_fds` inherited. Returns the pid, the pipe's write end (the caller's to close), and the
    number each passed descriptor has in the child (the boot config must say those)."""
    made: list[int] = []
    stdin_r, stdin_w = os.pipe()
    try:
        source_in, source_log = _above_std(stdin_r, made), _above_std(log_fd, made)
        # each passed descriptor onto a new number above every source: dup2 clears close-on-exec on
        # the copy (onto itself it would only from glibc 2.29), and no action overwrites a later
        # source
        base = max([source_in, source_log, *pass_fds]) + 1
        numbers = {fd: base + i for i, fd in enumerate(pass_fds)}
        actions = [
            # first: one may be 0-2
            *((os.POSIX_SPAWN_DUP2, fd, number) for fd, number in numbers.items()),
            (os.POSIX_SPAWN_DUP2, source_in, 0),
            (os.POSIX_SPAWN_DUP2, source_log, 1),
            (os.POSIX_SPAWN_DUP2, source_log, 2),
        ]
        pid = os.posix_spawn(
            argv[0],
            list(argv),
            dict(env),
            file_actions=actions,
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
    except BaseException:
        os.close(stdin_w)
        raise
    finally:
        os.close(stdin_r)
        for fd in made:
            os.close(fd)
    return pid, stdin_w, numbers
