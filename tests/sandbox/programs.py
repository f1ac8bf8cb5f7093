"""The hostile programs of the escape battery: each is the source of one sandboxed run.

A program that tries many things reports each attempt's outcome as one JSON object on stdout,
so one sandbox run carries several attempts, each asserted on its own.
"""

from __future__ import annotations

# Everything a program may try without ending its own run; `CONFIG` (a JSON file given with the
# run) names the host's loopback port, the planted file, the fake key and a unique token.
ATTEMPTS = r"""
import ctypes, errno, json, os, socket

cfg = json.load(open("config.json"))
out = {}

def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except OSError as e:
        out[name] = ["error", errno.errorcode.get(e.errno, str(e.errno))]
    except Exception as e:
        out[name] = ["error", type(e).__name__]

def connect(host, port):
    with socket.create_connection((host, port), timeout=2) as s:
        return s.recv(16).decode()

attempt("loopback", lambda: connect("127.0.0.1", cfg["port"]))
attempt("resolve", lambda: socket.getaddrinfo("pypi.org", 443))
attempt("outside", lambda: connect("1.1.1.1", 53))
attempt("interfaces", lambda: [name for _, name in socket.if_nameindex()])
attempt("planted", lambda: open(cfg["planted"]).read())
attempt("home_listing", lambda: os.listdir(cfg["home"]))
out["env_has_key"] = any(cfg["key"] in v for v in os.environ.values())
out["env_names"] = sorted(os.environ)
attempt("pid1_environ", lambda: open("/proc/1/environ").read())
attempt("processes", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("uid", lambda: [os.getuid(), os.geteuid(), os.getgid()])
for name, path in [("root", "/x"), ("usr", "/usr/lib/x"), ("venv", cfg["venv"] + "/x"),
                   ("dev", "/dev/x")]:
    attempt("write_" + name, lambda path=path: open(path, "w").write("x"))
attempt("write_workdir", lambda: open(cfg["token"], "w").write("x"))
attempt("workdir", lambda: [os.getcwd(), os.environ.get("HOME")])

def one_big_file():
    with open("big", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
            f.flush()

def many_files(where):
    n = 0
    while True:
        with open(f"{where}/fill{n}", "wb") as f:
            f.write(b"x" * (1 << 19))
        n += 1

attempt("fsize", one_big_file)
os.remove("big")
attempt("fill_workdir", lambda: many_files("."))
attempt("fill_shm", lambda: many_files("/dev/shm"))

def open_many():
    held = []
    try:
        for _ in range(10_000):
            held.append(open("/dev/null"))
    finally:
        out["files_opened"] = len(held)
        for f in held:
            f.close()

attempt("open_10000", open_many)

libc = ctypes.CDLL(None, use_errno=True)
def ptrace_attach(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
attempt("ptrace_pid1", lambda: ptrace_attach(1))
attempt("ptrace_host", lambda: ptrace_attach(cfg["host_pid"]))
attempt("signal_pid1", lambda: os.kill(1, 9))
def nested_userns():
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare")
attempt("nested_userns", nested_userns)
print(json.dumps(out))
"""

# Forks until the process limit refuses, every child forking on forever; the parent then exits.
FORK_BOMB = r"""
import os, sys, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(n, e.errno, flush=True)
        os._exit(0)
    if pid == 0:
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    n += 1
"""

# A double-forked, setsid daemon (MARKER in its argv) left behind by a program that exits 0.
DAEMON = r"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", "MARKER"])
    os._exit(0)
os.wait()
print("left a daemon", flush=True)
"""

# Ignores SIGTERM, as does its child (MARKER in its argv), and sleeps forever.
STUBBORN = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
subprocess.Popen([sys.executable, "-c", code, "MARKER"])
print("sleeping", flush=True)
while True:
    time.sleep(1)
"""

MEMORY_BOMB = "x = bytearray(1 << 34)\n"

# Several processes whose resident memory passes the cap only together.
MEMORY_TOGETHER = r"""
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(96 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(1000)
time.sleep(1000)
"""

SPIN = "while True:\n    pass\n"

FLOOD = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"

NORMAL = r"""
import sys
data = open("data/in.txt").read()
print("stdin:", sys.stdin.read(), "file:", data)
print("to stderr", file=sys.stderr)
sys.exit(3)
"""
