"""Pid 1 of a sandbox: stdlib only, run as `python -I -S -B -c <this source> CFG LIFE STATUS`.

It is the init of the sandbox's PID namespace (bwrap `--as-pid-1`): when it exits, the kernel
kills every process left in the namespace (forks, daemons, re-parented grandchildren). It reads
its work from fd CFG (one marshal dict: argv, env, rlimits, memory cap, files by name; not json,
whose import costs more than the rest of this startup), writes the files into the working dir,
forks the program with its rlimits, and waits for one of: the program's exit, EOF on fd LIFE (the
scorer is gone or gave up: exit at once), or the namespace's anonymous resident memory, summed
every 20 ms, past the cap (kill all: "memory"). It writes one line to fd STATUS and exits:
`exec_failed <why>`, or `done|memory <exit code, or -signal> <cpu seconds> <peak bytes>`. It is
non-dumpable, so the program (same uid) cannot ptrace it; nor can it signal it (pid 1 of a
namespace gets no signal from inside it that it has no handler for).
"""

import ctypes
import marshal
import os
import resource
import select
import sys

PR_SET_DUMPABLE = 4
SIGKILL = 9  # not `signal.SIGKILL`: importing signal (enum) costs milliseconds here
WATCH_S = 0.02  # how often the namespace's resident memory is summed
RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "nofile": resource.RLIMIT_NOFILE,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
}


def read_all(fd):
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def write_files(files):
    for name, data in files.items():
        path = os.path.join(os.getcwd(), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)


def start(cfg, keep):
    """Fork the program with its rlimits; (pid, errno of a failed exec or None)."""
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            for fd in keep:
                os.close(fd)
            # the program, not pid 1, is what the kernel kills first for the cgroup's memory (its
            # /proc files are its own once it is dumpable again, as its exec would make it)
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            with open("/proc/self/oom_score_adj", "w") as adjust:
                adjust.write("1000")
            for name, limit in cfg["rlimits"].items():
                resource.setrlimit(RLIMITS[name], tuple(limit))
            os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
        except OSError as error:
            os.write(report_w, str(error).encode())
        os._exit(127)
    os.close(report_w)
    failure = read_all(report_r).decode(errors="replace")
    os.close(report_r)
    return pid, failure or None


def resident_bytes():
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != "1":
            try:
                with open(f"/proc/{entry}/statm", "rb") as statm:
                    fields = statm.read().split()
                # resident less shared: the anonymous pages, each process's own (a library
                # mapped by 64 processes counts once in the machine, not 64 times; the tmpfs
                # pages are bounded by their size)
                total += (int(fields[1]) - int(fields[2])) * page
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return total


def kill_all():
    try:
        os.kill(-1, SIGKILL)  # every process of the namespace but pid 1
    except ProcessLookupError:
        pass


def watch(pid, life, memory_cap):
    """Wait for the program; (wait status or None, killed for memory, peak resident bytes)."""
    pidfd = os.pidfd_open(pid)
    peak = 0
    while True:
        ready, _, _ = select.select([pidfd, life], [], [], WATCH_S)
        if life in ready and not os.read(life, 64):
            os._exit(3)  # the scorer is gone or gave up: the kernel kills the namespace
        if pidfd in ready:
            return os.waitpid(pid, 0)[1], False, peak
        peak = max(peak, resident_bytes())
        if peak > memory_cap:
            kill_all()
            return os.waitpid(pid, 0)[1], True, peak


def main():
    cfg_fd, life, status_fd = (int(arg) for arg in sys.argv[1:4])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    cfg = marshal.loads(read_all(cfg_fd))
    os.close(cfg_fd)
    write_files(cfg["files"])
    pid, failure = start(cfg, (life, status_fd))
    if failure is not None:
        os.waitpid(pid, 0)
        report = "exec_failed " + failure.replace("\n", " ")
    else:
        status, memory, peak = watch(pid, life, cfg["memory"])
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        peak = max(peak, usage.ru_maxrss * 1024)
        report = f"{'memory' if memory else 'done'} {code} {cpu:.6f} {peak}"
    os.write(status_fd, report.encode() + b"\n")


if __name__ == "__main__":
    main()
