"""Run a command in a user namespace of its own (uids and gids 0-65535 mapped to themselves) whose
`user.max_user_namespaces` is set to LIMIT: 0 is a machine with user namespaces off as bwrap meets
it, without touching the host's setting (the sysctl is per user namespace).

    python -m tests.sandbox.userns_limit LIMIT PROGRAM ARGS...   (as root; exits as PROGRAM does)
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000


def _child(limit: str, argv: list[str], made_w: int, go_r: int) -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
        os.write(2, f"unshare(CLONE_NEWUSER): errno {ctypes.get_errno()}\n".encode())
        os._exit(90)
    os.write(made_w, b"1")
    os.read(go_r, 1)  # the parent has written the maps
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    with open("/proc/sys/user/max_user_namespaces", "w") as setting:
        setting.write(limit)
    os.execv(argv[0], argv)


def main() -> None:
    limit, argv = sys.argv[1], sys.argv[2:]
    go_r, go_w = os.pipe()
    made_r, made_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(limit, argv, made_w, go_r)
        finally:
            os._exit(91)
    os.close(made_w)
    if os.read(made_r, 1) == b"1":
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as mapping:
                mapping.write("0 0 65536\n")
        os.write(go_w, b"1")
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
