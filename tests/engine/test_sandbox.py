"""The worker's sandbox: hostile code run inside it cannot reach the test process (which plays the
trusted controller), its files, its network, or outlive it; the things a worker needs still work.

Every attack runs from a real script in a real sandbox. Waits have generous deadlines (a loaded 2-core
machine) and nothing asserts a duration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from polymorph.engine import sandbox
from polymorph.engine.sandbox import LAYERS, Policy, SandboxError, default_policy, launch, layers_available

SANDBOX_FILE = Path(sandbox.__file__)
DEADLINE_S = 60.0  # only ever a bound on a wait that should end much sooner

# The hostile script. argv[1] is a JSON config; results go back as one JSON line on the inherited fd.
HOSTILE = r"""
import ctypes, errno, json, mmap, os, signal, socket, struct, sys, threading, time

cfg = json.loads(sys.argv[1])
chan = socket.socket(fileno=cfg["fd"])
mode = cfg["mode"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def attempt(fn):
    try:
        fn()
    except OSError as e:
        return f"blocked: {type(e).__name__} {errno.errorcode.get(e.errno, e.errno)}"
    return "SUCCEEDED"


def call(what, rc):
    if rc < 0:
        code = ctypes.get_errno()
        raise OSError(code, what)


def tcp():
    with socket.create_connection(("127.0.0.1", cfg["tcp_port"]), timeout=5) as s:
        s.sendall(b"hello from the sandbox")


def unix_path():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(cfg["unix_path"])


def unix_abstract():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + cfg["unix_abstract"])


def unix_dgram():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", cfg["unix_path"])


def vm_readv():
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    call("process_vm_readv", libc.syscall(310, cfg["host_pid"], iov, 1, remote, 1, 0))


def write_and_read_back(path):
    with open(path, "w") as f:
        f.write("ok")
    with open(path) as f:
        assert f.read() == "ok"


if mode == "attack":
    host = cfg["host_pid"]
    out = {}
    out["read_outside"] = attempt(lambda: open(cfg["secret"]).read())
    out["list_outside"] = attempt(lambda: os.listdir(os.path.dirname(cfg["secret"])))
    out["write_outside"] = attempt(lambda: open(cfg["outside_write"], "w").write("pwned"))
    out["write_read_path"] = attempt(lambda: open(os.path.join(cfg["readable_dir"], "x"), "w").write("x"))
    out["read_shadow"] = attempt(lambda: open("/etc/shadow").read())
    out["proc_mem"] = attempt(lambda: open(f"/proc/{host}/mem", "rb").read(1))
    out["proc_environ"] = attempt(lambda: open(f"/proc/{host}/environ", "rb").read())
    out["proc_cmdline"] = attempt(lambda: open(f"/proc/{host}/cmdline", "rb").read())
    out["tcp_connect"] = attempt(tcp)
    out["unix_path_connect"] = attempt(unix_path)
    out["unix_abstract_connect"] = attempt(unix_abstract)
    out["unix_dgram_sendto"] = attempt(unix_dgram)
    out["signal_host"] = attempt(lambda: os.kill(host, signal.SIGUSR1))
    out["signal_all"] = attempt(lambda: os.kill(-1, signal.SIGUSR1))
    out["ptrace_attach"] = attempt(lambda: call("ptrace", libc.ptrace(16, host, None, None)))
    out["process_vm_readv"] = attempt(vm_readv)
    out["unshare_user"] = attempt(lambda: call("unshare", libc.unshare(0x10000000)))
    out["mount_tmpfs"] = attempt(lambda: call("mount", libc.mount(b"t", b"/tmp", b"tmpfs", 0, None)))
    try:
        out["visible_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    except OSError as e:
        out["visible_pids"] = f"blocked: {type(e).__name__}"
    allowed = {}
    allowed["write_scratch"] = attempt(lambda: write_and_read_back(os.path.join(cfg["scratch"], "out.txt")))
    allowed["read_policy_file"] = attempt(lambda: open(cfg["readable_file"]).read())
    allowed["dev_null"] = attempt(lambda: open("/dev/null", "w").write("x"))
    allowed["shm"] = attempt(lambda: write_and_read_back("/dev/shm/worker-shm-test"))
    allowed["socketpair"] = attempt(lambda: socket.socketpair()[0].close())
    allowed["threads"] = attempt(lambda: threading.Thread(target=lambda: None).start())
    allowed["subprocess"] = attempt(lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0))
    if cfg["imports"]:
        try:
            import numpy
            import polymorph

            assert numpy.ones(3).sum() == 3.0 and polymorph.__version__
            allowed["import_numpy_polymorph"] = "SUCCEEDED"
        except Exception as e:
            allowed["import_numpy_polymorph"] = f"blocked: {type(e).__name__}: {e}"
    out["allowed"] = allowed
    out["cwd"] = os.getcwd()
    chan.sendall((json.dumps(out) + "\n").encode())

elif mode == "daemon":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: reparented, own session, holds the channel open
            chan.sendall(b"daemon up\n")
            while True:
                time.sleep(3600)
        os._exit(0)
    os.wait()
    while True:
        time.sleep(3600)

elif mode == "busy":
    # slot 0: a thread of pid 1; slot 1: a forked child process. Both spin without a syscall.
    fd = os.open(os.path.join(cfg["scratch"], "counters"), os.O_RDWR)
    shared = mmap.mmap(fd, 16)

    def spin(slot):
        n = 0
        while True:
            n += 1
            shared[slot * 8 : slot * 8 + 8] = struct.pack("<Q", n)

    if os.fork() == 0:
        spin(1)
    threading.Thread(target=spin, args=(0,), daemon=True).start()
    while True:
        time.sleep(3600)
"""

# A stand-in controller: loads the sandbox by path (no polymorph import), launches HOSTILE, prints the
# layers, then waits for the sandbox ("wait") or forever ("hold", to be SIGKILLed by the test).
DRIVER = r"""
import importlib.util, json, sys, time
cfg = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("polymorph_sandbox_driver", cfg["sandbox_file"])
sandbox = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sandbox
spec.loader.exec_module(sandbox)
policy = sandbox.Policy(tuple(cfg["read"]), tuple(cfg["write"]), tuple(cfg["devices"]))
box = sandbox.launch([sys.executable, cfg["script"], json.dumps(cfg["hostile"])], policy,
                     pass_fds=(cfg["hostile"]["fd"],))
caps = [l for l in open("/proc/self/status").read().splitlines() if l.startswith("CapEff")]
print(json.dumps({"layers": box.layers, "euid": __import__("os").geteuid(), "caps": caps}), flush=True)
if cfg["then"] == "wait":
    print(json.dumps({"rc": box.wait()}), flush=True)
else:
    while True:
        time.sleep(3600)
"""


class World:
    """The files and listeners of one test: a fake registry outside the policy, a readable kernel
    folder, the scratch folder, a TCP listener and unix sockets of the "controller"."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.scratch = root / "scratch"
        self.kernels = root / "kernels"
        self.scratch.mkdir()
        self.kernels.mkdir()
        self.secret = root / "registry.sqlite"
        self.secret.write_text("champions and reference outputs")
        self.outside_write = root / "pwned.txt"
        self.script = self.kernels / "hostile.py"
        self.script.write_text(HOSTILE)
        (self.kernels / "driver.py").write_text(DRIVER)
        (self.kernels / "kernel.py").write_text("# a candidate's source\n")
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.unix_path = str(root / "ctl.sock")
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        self.abstract_name = f"polymorph-sandbox-test-{os.getpid()}-{id(self)}"
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        for s in (self.tcp, self.unix, self.abstract):
            s.setblocking(False)

    def policy(self) -> Policy:
        return default_policy(self.scratch, extra_read=(self.kernels,))

    def hostile_cfg(self, mode: str, fd: int, imports: bool = False) -> dict[str, object]:
        return {
            "mode": mode,
            "fd": fd,
            "imports": imports,
            "host_pid": os.getpid(),
            "secret": str(self.secret),
            "outside_write": str(self.outside_write),
            "readable_dir": str(self.kernels),
            "readable_file": str(self.kernels / "kernel.py"),
            "scratch": str(self.scratch),
            "tcp_port": self.tcp.getsockname()[1],
            "unix_path": self.unix_path,
            "unix_abstract": self.abstract_name,
        }

    def connected(self) -> list[str]:
        """Which of the controller's listeners something connected to."""
        found = []
        for name, s in (("tcp", self.tcp), ("unix_path", self.unix), ("unix_abstract", self.abstract)):
            try:
                s.accept()[0].close()
                found.append(name)
            except BlockingIOError:
                pass
        return found

    def close(self) -> None:
        for s in (self.tcp, self.unix, self.abstract):
            s.close()


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path)
    yield w
    w.close()


def start(world: World, mode: str, **kw: object) -> tuple[sandbox.Sandboxed, socket.socket]:
    parent, child = socket.socketpair()
    try:
        cfg = world.hostile_cfg(mode, child.fileno(), imports=bool(kw.pop("imports", False)))
        argv = [sys.executable, str(world.script), json.dumps(cfg)]
        box = launch(argv, world.policy(), pass_fds=(child.fileno(),), **kw)  # type: ignore[arg-type]
    finally:
        child.close()
    parent.settimeout(DEADLINE_S)
    return box, parent


def read_line(chan: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = chan.recv(65536)
        if not chunk:
            raise AssertionError(f"the sandboxed script closed its channel after {buf!r}")
        buf += chunk
    return buf


def assert_eof(chan: socket.socket) -> None:
    """Every holder of the channel's other end is dead (the sandbox's daemon included)."""
    assert chan.recv(1) == b"", "something in the sandbox still holds the channel"


FILE_NET_SIGNAL = [
    *("read_outside", "list_outside", "write_outside", "write_read_path", "proc_environ", "proc_cmdline"),
    *("tcp_connect", "unix_path_connect", "unix_abstract_connect", "signal_host"),
]
ATTACKS = [*FILE_NET_SIGNAL, "read_shadow", "proc_mem", "unix_dgram_sendto", "ptrace_attach"]
ATTACKS += ["process_vm_readv", "unshare_user", "mount_tmpfs"]
# kill(-1, sig) returns 0 even when every single send was refused (the kernel ignores EPERM there), so
# "signal_all" is judged by what the test process received (`hits`), never by its return code.


def check_layers(layers: dict[str, str]) -> None:
    assert list(layers) == list(LAYERS)
    for name, value in layers.items():
        assert value == "on" or value.startswith("on (") or re.fullmatch(r"off: \S.*", value), (name, value)
        assert "\n" not in value


def undelegated(layers: dict[str, str]) -> bool:
    """A cgroup v2 host that does not delegate the pids/memory controllers (the GPU machine's)."""
    return "does not delegate" in layers.get("cgroup_limits", "")


def run_attacks(world: World, **kw: object) -> tuple[dict[str, object], dict[str, str], int]:
    hits: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    try:
        box, chan = start(world, "attack", **kw)
        with chan:
            results = json.loads(read_line(chan))
        rc = box.wait(DEADLINE_S)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert not hits, "the sandbox signalled the test process"
    return results, box.layers, rc


def test_attacks_fail_and_a_worker_still_works(world: World) -> None:
    results, layers, rc = run_attacks(world, imports=True, memory_bytes=4 << 30)
    assert rc == 0
    for attack in ATTACKS:
        assert str(results[attack]).startswith("blocked"), (attack, results[attack])
    assert results["visible_pids"] == [1]  # pid 1 of its own namespace, and nothing of the host
    allowed = results["allowed"]
    assert isinstance(allowed, dict)
    assert all(v == "SUCCEEDED" for v in allowed.values()), allowed
    assert results["cwd"] == str(world.scratch)
    assert (world.scratch / "out.txt").read_text() == "ok"
    assert not world.outside_write.exists()
    assert world.connected() == []
    check_layers(layers)
    # This host (kernel 6.18, Landlock ABI 7, root, libseccomp, cgroup v1) has every layer.
    off = {k: v for k, v in layers.items() if v != "on"}
    if undelegated(layers):
        off.pop("cgroup_limits")
    assert off == {}


def test_seccomp_is_what_denies_ptrace_and_sockets(world: World) -> None:
    results, layers, _ = run_attacks(world)
    assert layers["seccomp"] == "on"
    for attack in ("ptrace_attach", "process_vm_readv", "unshare_user", "mount_tmpfs", "tcp_connect"):
        assert results[attack] == "blocked: PermissionError EPERM", (attack, results[attack])


def test_landlock_alone_still_denies_files_and_signals(world: World) -> None:
    # Without seccomp and the namespaces' help, Landlock is what stands between the worker and the
    # host: files outside the policy, TCP (ABI 4) and signals out of its domain (ABI 6).
    results, layers, _ = run_attacks(world, disable=("seccomp", "net_ns", "pid_ns"))
    assert layers["seccomp"].startswith("off") and layers["landlock"] == "on"
    assert layers["proc_remount"] == "off: no pid namespace"
    for attack in ("read_outside", "list_outside", "write_outside", "proc_environ", "proc_cmdline"):
        assert str(results[attack]).startswith("blocked: PermissionError"), (attack, results[attack])
    assert str(results["tcp_connect"]).startswith("blocked: PermissionError"), results["tcp_connect"]
    assert results["signal_host"] == "blocked: PermissionError EPERM"
    assert str(results["unix_abstract_connect"]).startswith("blocked: PermissionError")
    # The known hole that seccomp closes: Landlock up to ABI 7 does not govern pathname unix sockets.
    assert world.connected() in ([], ["unix_path"])


@pytest.mark.parametrize("disable", [(), ("cgroup",), ("pid_ns",)], ids=["all", "no-cgroup", "no-pid-ns"])
def test_a_daemon_does_not_outlive_kill(world: World, disable: tuple[str, ...]) -> None:
    box, chan = start(world, "daemon", disable=disable)
    with chan:
        assert read_line(chan) == b"daemon up\n"
        box.kill()
        assert box.wait(DEADLINE_S) == -signal.SIGKILL
        assert_eof(chan)
    assert box.poll() == -signal.SIGKILL


def test_sigkill_of_the_controller_kills_the_tree(world: World) -> None:
    parent, child = socket.socketpair()
    p = world.policy()
    cfg = {
        "sandbox_file": str(SANDBOX_FILE),
        "read": p.read,
        "write": p.write,
        "devices": p.devices,
        "script": str(world.script),
        "hostile": world.hostile_cfg("daemon", child.fileno()),
        "then": "hold",
    }
    driver = subprocess.Popen(
        [sys.executable, str(world.kernels / "driver.py"), json.dumps(cfg)],
        pass_fds=(child.fileno(),),
        stdout=subprocess.PIPE,
    )
    child.close()
    parent.settimeout(DEADLINE_S)
    with parent:
        assert driver.stdout is not None
        layers = json.loads(driver.stdout.readline())["layers"]
        assert layers["pdeathsig"] == "on"
        assert read_line(parent) == b"daemon up\n"
        driver.kill()
        driver.wait()
        assert_eof(parent)
    driver.stdout.close()


def counters(world: World) -> tuple[int, int]:
    with open(world.scratch / "counters", "rb") as f:
        return struct.unpack("<QQ", f.read(16))


def wait_until(what: str, cond) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("disable", [(), ("cgroup",)], ids=["cgroup-freezer", "sigstop"])
def test_freeze_stops_every_thread_and_process(world: World, disable: tuple[str, ...]) -> None:
    (world.scratch / "counters").write_bytes(bytes(16))
    box, chan = start(world, "busy", disable=disable)
    with chan:
        try:
            wait_until("both counters run", lambda: min(counters(world)) > 0)
            box.freeze()
            frozen = counters(world)
            time.sleep(0.2)  # a chance to move, were anything still running
            assert counters(world) == frozen
            box.thaw()
            wait_until("both counters run again", lambda: all(a > b for a, b in zip(counters(world), frozen)))
        finally:
            box.kill()
            box.wait(DEADLINE_S)


def test_layers_available_reports_every_layer() -> None:
    layers = layers_available()
    check_layers(layers)
    assert layers["landlock"] == "on" and layers["user_ns"] == "on"


def test_a_failed_exec_raises_and_leaves_no_cgroup(world: World) -> None:
    with pytest.raises(SandboxError, match="no-such-program"):
        launch(["no-such-program-polymorph"], world.policy())
    _, parents = sandbox._cgroup_parents()
    leftovers = [d for parent in parents.values() for d in parent.glob(f"polymorph-sandbox-{os.getpid()}-*")]
    assert leftovers == []


def test_unknown_layer_names_are_an_error(world: World) -> None:
    with pytest.raises(ValueError, match="unknown sandbox layers"):
        launch(["true"], world.policy(), disable=("seccom",))


def test_harden_self_makes_the_controller_non_dumpable() -> None:
    code = (
        "import ctypes, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sb', {str(SANDBOX_FILE)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['sb'] = m; spec.loader.exec_module(m)\n"
        "m.harden_self()\n"
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"  # PR_GET_DUMPABLE
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


UNPRIVILEGED = {
    "nobody": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
    "root-without-capabilities": ["setpriv", "--inh-caps=-all", "--bounding-set=-all"],
}


@pytest.mark.skipif(not os.path.exists("/usr/bin/setpriv"), reason="util-linux setpriv is not installed")
@pytest.mark.parametrize("how", list(UNPRIVILEGED))
def test_unprivileged_controller(how: str) -> None:
    """The controller itself unprivileged: the sandbox falls back to an unprivileged user namespace,
    reports what it cannot have, and the file, network and signal attacks still fail."""
    prefix = UNPRIVILEGED[how]
    python = sys.executable
    if how == "nobody":
        # The driver and the hostile script need only the stdlib, so any interpreter nobody can run
        # whole will do. `-c pass` is not proof: an interpreter that cannot read its own prefix
        # starts on frozen modules and whatever stdlib it finds elsewhere.
        code = (
            "import sys, json, subprocess; assert json.__file__.startswith(sys.prefix); "
            f"open({str(SANDBOX_FILE)!r}); subprocess.run([sys.executable, '-c', 'pass'], check=True)"
        )
        for python in (sys.executable, "/usr/bin/python3"):
            if subprocess.run([*prefix, python, "-c", code], capture_output=True).returncode == 0:
                break
        else:
            pytest.skip("uid 65534 can run no whole Python here; the root-without-capabilities case runs")
    # Not under pytest's 0700 tmp folder: nobody must reach it, so only the sandbox stands in the way
    # (the secret is world-readable, the folder world-writable).
    root = Path(tempfile.mkdtemp(prefix="polymorph-sandbox-test-"))
    os.chmod(root, 0o777)
    w = World(root)
    try:
        for path in (w.scratch, w.kernels, w.unix_path):
            os.chmod(path, 0o777)
        os.chmod(w.secret, 0o644)
        parent, child = socket.socketpair()
        p = w.policy()
        cfg = {
            "sandbox_file": str(SANDBOX_FILE),
            "read": p.read,
            "write": p.write,
            "devices": p.devices,
            "script": str(w.script),
            "hostile": w.hostile_cfg("attack", child.fileno()),
            "then": "wait",
        }
        hits: list[int] = []
        old = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
        try:
            out = subprocess.run(
                [*prefix, python, str(w.kernels / "driver.py"), json.dumps(cfg)],
                pass_fds=(child.fileno(),),
                capture_output=True,
                text=True,
                timeout=DEADLINE_S,
            )
        finally:
            signal.signal(signal.SIGUSR1, old)
            child.close()
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        report, layers = lines[0], lines[0]["layers"]
        assert report["caps"] == ["CapEff:\t0000000000000000"], report
        assert lines[1]["rc"] == 0
        parent.settimeout(DEADLINE_S)
        with parent:
            results = json.loads(read_line(parent))
        check_layers(layers)
        for name, value in layers.items():  # each layer off is one warning line of the driver
            assert (f"sandbox layer {name} is {value}" in out.stderr) == (value != "on"), (name, out.stderr)
        assert "Traceback" not in out.stderr
        if layers["user_ns"] != "on":  # without a user namespace an unprivileged caller has no other
            for name in ("pid_ns", "net_ns", "mount_ns", "ipc_ns", "proc_remount", "private_shm"):
                assert layers[name].startswith("off"), (name, layers[name])
        if how == "nobody":  # the unprivileged user namespace carries the namespaces
            assert layers["cgroup"].startswith("off")  # nobody cannot make a cgroup here
            for name in ("user_ns", "pid_ns", "net_ns", "mount_ns", "ipc_ns", "proc_remount", "landlock"):
                assert layers[name] == "on", (name, layers[name])
        else:
            assert layers["user_ns"].startswith("off: root without CAP_SETFCAP")
        for attack in FILE_NET_SIGNAL:
            assert str(results[attack]).startswith("blocked"), (how, attack, results[attack])
        assert not hits
        assert w.connected() == []
        assert not w.outside_write.exists()
    finally:
        w.close()
        shutil.rmtree(root, ignore_errors=True)
