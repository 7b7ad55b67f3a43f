"""The sandbox a worker runs in: the worker runs hostile candidate code, the controller is trusted.

    policy = default_policy(scratch, extra_read=(kernel_dir,))
    box = launch([sys.executable, "-m", "polymorph.engine.worker", "--fd", str(child.fileno())],
                 policy, pass_fds=(child.fileno(),), memory_bytes=32 << 30)
    box.layers     # {"user_ns": "on", ..., "seccomp": "off: libseccomp.so.2 not found"}
    box.freeze(); ...read outputs...; box.thaw()
    box.kill(); box.wait()

`launch` starts a fresh interpreter on this file (`python -I -S sandbox.py --config <json> -- argv`), the
trusted bootstrap. It needs only the stdlib and imports neither polymorph nor torch. It runs in three
processes' worth of steps:

1. the controller (`launch`) makes the worker's own cgroup (pids limit, memory limit, freezer) where one
   is writable, and starts the bootstrap in a new session;
2. the bootstrap (host pid `Sandboxed.pid`) sets PR_SET_PDEATHSIG (SIGKILL), joins the cgroup, unshares
   a user namespace (root inside maps to our uid outside, one uid and one gid) and then pid, net (only a
   loopback that is down), mount and ipc namespaces, and forks;
3. the child, pid 1 of the new pid namespace, sets PR_SET_PDEATHSIG again, makes every mount private,
   mounts a fresh /proc (it sees only its own processes) and a private tmpfs on /dev/shm, drops every
   capability (bounding set included), sets no_new_privs, enters a Landlock domain (read and execute
   only beneath `Policy.read`, write only beneath `Policy.write`, read-write and ioctl on
   `Policy.devices`; TCP bind and connect denied from ABI 4; signals and abstract unix sockets scoped
   to the domain from ABI 6), loads a seccomp filter (`_DENIED_SYSCALLS`), and execs argv, which keeps
   all of it.

If the controller dies, even by SIGKILL, the bootstrap gets SIGKILL, so pid 1 gets SIGKILL, and the
kernel kills everything left in the pid namespace: nothing the worker starts outlives it. The cgroup
holds the same tree a second way (kill and freeze go through it where it exists).

Each layer is tried on its own and falls back alone: another kernel, a caller that is not root and has
no unprivileged user namespaces, no libseccomp, no writable cgroup. `Sandboxed.layers` says which are
on, and each layer that is off is one warning line on stderr (once per reason per process).

Holes known and closed elsewhere:
- Landlock up to ABI 7 does not govern connect() to a pathname unix socket, so seccomp denies connect()
  and datagram unix sockets (whose sendto/sendmsg take an address). The worker's channel is the
  inherited socketpair, which must be SOCK_STREAM. Without seccomp this hole is open.
- PR_SET_PDEATHSIG fires when the *thread* that forked dies: call `launch` from a thread that lives as
  long as the worker should (the controller's main thread).
- the SIGSTOP fallback of `freeze` (no cgroup freezer) is visible to a parent process inside the tree
  (waitpid WUNTRACED); the cgroup freezer is not.
- without a pid namespace and without a cgroup, `kill` can only reach the process group: a daemon that
  called setsid escapes. `layers` says so.

This one file is the whole sandbox on purpose: the bootstrap runs it by path, before any package import.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

LAYERS = (
    "user_ns",
    "pid_ns",
    "net_ns",
    "mount_ns",
    "ipc_ns",
    "proc_remount",
    "private_shm",
    "pdeathsig",
    "cgroup",
    "cgroup_limits",
    "capabilities",
    "no_new_privs",
    "landlock",
    "landlock_net",
    "landlock_scope",
    "seccomp",
)
"""Every layer `Sandboxed.layers` and `layers_available` report, each as "on" or "off: <reason>"."""

DEFAULT_PIDS_MAX = 4096  # tasks (threads count) in the worker's cgroup: torch starts one per core and more


class SandboxError(RuntimeError):
    """The sandbox could not start the worker at all (not a missing layer: those fall back)."""


@dataclass(frozen=True)
class Policy:
    """What the sandboxed tree may touch. Everything else on the filesystem is denied by Landlock.

    read:    paths readable and executable, with everything beneath them.
    write:   paths writable (create, remove, rename, truncate), with everything beneath them; the
             first one is the worker's working directory.
    devices: device nodes (or folders of them) opened read-write, with ioctl allowed on them.
    Paths that do not exist are left out when the sandbox starts.
    """

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        return {"read": list(self.read), "write": list(self.write), "devices": list(self.devices)}


# --- Linux constants. Sources: include/uapi/linux/{sched,prctl,mount,landlock,capability}.h,
# --- arch/x86/entry/syscalls/syscall_64.tbl, libseccomp's include/seccomp.h.

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_NAMESPACES = (("pid_ns", _CLONE_NEWPID), ("net_ns", _CLONE_NEWNET), ("mount_ns", _CLONE_NEWNS))
_NAMESPACES += (("ipc_ns", _CLONE_NEWIPC),)

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAP_SETFCAP = 31

_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18

# The Landlock syscalls have one number on every architecture (444, 445, 446).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_PIDFD_OPEN = 434
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_BLOCK = 1 << 11
_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_FS_ON_FILES = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr; the size passed says which fields the kernel reads (8, 16, 24).
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    # struct landlock_path_beneath_attr, __attribute__((packed)): 12 bytes.
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _ScmpArgCmp(ctypes.Structure):
    # struct scmp_arg_cmp {unsigned int arg; enum scmp_compare op; scmp_datum_t datum_a, datum_b;}
    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE = 1
_SCMP_CMP_MASKED_EQ = 7  # (arg & datum_a) == datum_b


def _scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


_DENIED_SYSCALLS = (
    # another process's memory, or its file descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "kcmp",
    # namespaces and mounts: the sandbox is built of them
    "mount", "umount2", "unshare", "setns", "pivot_root", "chroot",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    # kernel attack surface a kernel worker never needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at",
    # a pathname unix socket is reached by connect(); Landlock up to ABI 7 does not govern it
    "connect",
)  # fmt: skip
_AF_UNIX = 1
_SOCK_TYPE_MASK = 0xF
_SOCK_DGRAM, _SOCK_RAW, _SOCK_RDM, _SOCK_PACKET = 2, 3, 4, 10
_CLONE_NEW_FLAGS = (_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS, _CLONE_NEWIPC)
_CLONE_NEW_FLAGS += (_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
    return libc


def _oserror(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def _prctl(libc: ctypes.CDLL, option: int, arg: int = 0) -> None:
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise _oserror(f"prctl({option})")


def _why(e: BaseException) -> str:
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return "off: " + " ".join(text.split())


# --------------------------------------------------------------------------------------------------
# The bootstrap (stage 2 and 3 of the module docstring). Runs in a fresh `python -I -S`.


def _landlock_abi(libc: ctypes.CDLL) -> int:
    abi = libc.syscall(
        _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION
    )
    if abi < 0:
        code = ctypes.get_errno()
        reason = "not built into this kernel" if code == errno.ENOSYS else "disabled at boot (lsm=)"
        raise OSError(code, f"Landlock {reason}")
    return abi


def _landlock_restrict(libc: ctypes.CDLL, policy: dict[str, list[str]], layers: dict[str, str]) -> None:
    """Enter a Landlock domain built from `policy`. The handled rights are those of the ABI the kernel
    reports, so on an older kernel the newer rights stay unhandled (allowed) rather than failing."""
    abi = _landlock_abi(libc)
    fs = _FS_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    fs |= _FS_IOCTL_DEV if abi >= 5 else 0
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise _oserror("landlock_create_ruleset")
    read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    write = fs & ~(_FS_MAKE_CHAR | _FS_MAKE_BLOCK | _FS_IOCTL_DEV)
    device = _FS_READ_FILE | _FS_WRITE_FILE | _FS_READ_DIR | _FS_TRUNCATE | _FS_IOCTL_DEV
    try:
        for access, paths in ((read, policy["read"]), (write, policy["write"]), (device, policy["devices"])):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path this host lacks
                try:
                    allowed = access & fs
                    if not stat.S_ISDIR(os.fstat(fd).st_mode):
                        allowed &= _FS_ON_FILES  # rights on a directory's contents are EINVAL on a file
                    rule = _PathBeneathAttr(allowed, fd)
                    if libc.syscall(
                        _SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
                    ):
                        raise _oserror(f"landlock_add_rule({path})")
                finally:
                    os.close(fd)
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise _oserror("landlock_restrict_self")
    finally:
        os.close(ruleset)
    layers["landlock"] = "on"
    layers["landlock_net"] = "on" if net else f"off: Landlock ABI {abi} < 4 cannot deny TCP"
    layers["landlock_scope"] = "on" if scoped else f"off: Landlock ABI {abi} < 6 cannot scope signals"


def _seccomp_lib() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        raise OSError(errno.ENOENT, "libseccomp.so.2 not found") from None


def _seccomp_load(lib: ctypes.CDLL) -> None:
    """Load the deny-list filter through libseccomp: EPERM for `_DENIED_SYSCALLS`, socket() of any
    family but AF_UNIX and of any unix type that takes an address per message, clone() with a
    namespace flag; ENOSYS for clone3 (its flags are behind a pointer; glibc then falls back to
    clone). Calls of another architecture (int 0x80, x32) kill the process: libseccomp's default."""
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_rule_add_array.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ScmpArgCmp),
    )
    lib.seccomp_load.argtypes = (ctypes.c_void_p,)
    lib.seccomp_release.argtypes = (ctypes.c_void_p,)
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    eperm = _scmp_act_errno(errno.EPERM)

    def rule(action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # this libseccomp or architecture does not know the call, so it cannot be made
        array = (_ScmpArgCmp * max(1, len(cmps)))(*(_ScmpArgCmp(*c) for c in cmps))
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")

    try:
        for name in _DENIED_SYSCALLS:
            rule(eperm, name)
        rule(eperm, "socket", (0, _SCMP_CMP_NE, _AF_UNIX, 0))
        for kind in (_SOCK_DGRAM, _SOCK_RAW, _SOCK_RDM, _SOCK_PACKET):
            rule(eperm, "socket", (1, _SCMP_CMP_MASKED_EQ, _SOCK_TYPE_MASK, kind))
        for flag in _CLONE_NEW_FLAGS:
            rule(eperm, "clone", (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        rule(_scmp_act_errno(errno.ENOSYS), "clone3")
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


def _drop_capabilities(libc: ctypes.CDLL) -> str:
    """Drop every capability, the bounding set too, so that exec as (namespace) root gains none."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: checked below
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    libc.capset(header, data)
    caps = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Cap"):
            key, value = line.split(":")
            caps[key] = int(value, 16)
    held = [k for k in ("CapInh", "CapPrm", "CapEff", "CapAmb") if caps.get(k)]
    if os.geteuid() == 0 and caps.get("CapBnd"):
        held.append("CapBnd")  # root would get the bounding set back at exec
    return "on" if not held else f"off: still held after dropping: {', '.join(held)}"


def _has_capability(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def _write_id_maps(uid: int, gid: int) -> None:
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1\n")
    Path("/proc/self/setgroups").write_text("deny\n")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1\n")


def _report(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _confine_child(libc: ctypes.CDLL, cfg: dict[str, Any], layers: dict[str, str], lifeline: int) -> None:
    """Stage 3, in the forked child (pid 1 of the new pid namespace): everything up to the exec."""
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
    import select

    if select.select([lifeline], [], [], 0)[0]:
        os._exit(1)  # the bootstrap died before PR_SET_PDEATHSIG: nobody would kill us
    os.close(lifeline)
    layers["pdeathsig"] = "on"
    policy = cfg["policy"]
    policy = {k: list(v) for k, v in policy.items()}
    disabled = set(cfg["disable"])
    mount_ns = layers.get("mount_ns") == "on"
    if not mount_ns:
        layers["proc_remount"] = layers["private_shm"] = "off: no mount namespace"
    else:
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise _oserror("mount --make-rprivate /")
        if layers.get("pid_ns") != "on":
            layers["proc_remount"] = "off: no pid namespace"
        elif "proc_remount" in disabled:
            layers["proc_remount"] = "off: disabled by the caller"
        elif libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
            layers["proc_remount"] = _why(_oserror("mount proc on /proc"))
        else:
            layers["proc_remount"] = "on"
        under_shm = [p for p in policy["read"] + policy["write"] if p.startswith("/dev/shm/")]
        if under_shm:
            layers["private_shm"] = f"off: the policy names {under_shm[0]}, which a private /dev/shm hides"
        elif "private_shm" in disabled or not os.path.isdir("/dev/shm"):
            layers["private_shm"] = (
                "off: disabled by the caller" if os.path.isdir("/dev/shm") else "off: no /dev/shm"
            )
        elif libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777") != 0:
            layers["private_shm"] = _why(_oserror("mount tmpfs on /dev/shm"))
        else:
            layers["private_shm"] = "on"
    if layers["proc_remount"] != "on":
        # The host's /proc shows every process: grant only our own entry and a few host-wide files.
        policy["read"] = [p for p in policy["read"] if p != "/proc"]
        policy["read"] += [f"/proc/{os.getpid()}", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat"]
    if layers["private_shm"] != "on":
        policy["write"] = [p for p in policy["write"] if p != "/dev/shm"]  # no channel between workers
    cwd = cfg["cwd"]
    if cwd:
        os.chdir(cwd)
    layers["capabilities"] = (
        "off: disabled by the caller" if "capabilities" in disabled else _drop_capabilities(libc)
    )
    try:
        _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)
        layers["no_new_privs"] = "on"
    except OSError as e:
        layers["no_new_privs"] = _why(e)
    seccomp: ctypes.CDLL | OSError
    try:
        seccomp = _seccomp_lib()  # before Landlock, which may deny reading the library
    except OSError as e:
        seccomp = e

    def load_seccomp() -> None:
        if isinstance(seccomp, OSError):
            raise seccomp
        _seccomp_load(seccomp)

    for name, apply in (
        ("landlock", lambda: _landlock_restrict(libc, policy, layers)),
        ("seccomp", load_seccomp),
    ):
        if name in disabled:
            layers[name] = "off: disabled by the caller"
        elif layers["no_new_privs"] != "on":
            layers[name] = "off: needs no_new_privs"
        else:
            try:
                apply()
                layers.setdefault(name, "on")
            except OSError as e:
                layers[name] = _why(e)
    for name in ("landlock_net", "landlock_scope"):
        layers.setdefault(name, "off: no Landlock")


def _bootstrap(config: str, argv: list[str]) -> None:
    """Stage 2: the outer process. Never returns."""
    cfg = json.loads(config)
    status = cfg["status_fd"]
    os.set_inheritable(status, False)
    libc = _libc()
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:
        os._exit(1)  # the controller died before PR_SET_PDEATHSIG took effect
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    layers: dict[str, str] = {}
    disabled = set(cfg["disable"])
    try:
        for procs in cfg["cgroup_procs"]:
            Path(procs).write_text(f"{os.getpid()}\n")
        layers["cgroup"] = "on" if cfg["cgroup_procs"] else "off: not made"
    except OSError as e:
        layers["cgroup"] = _why(e)
    uid, gid = os.geteuid(), os.getegid()
    if "user_ns" in disabled:
        layers["user_ns"] = "off: disabled by the caller"
    elif uid == 0 and not _has_capability(_CAP_SETFCAP):
        # Since Linux 5.12 mapping the parent's uid 0 needs CAP_SETFCAP; unmapped, nothing could
        # create a file. Such a caller (root without capabilities) goes without a user namespace.
        layers["user_ns"] = "off: root without CAP_SETFCAP cannot map uid 0 into a user namespace"
    elif libc.unshare(_CLONE_NEWUSER) != 0:
        layers["user_ns"] = _why(_oserror("unshare(CLONE_NEWUSER)"))
    else:
        try:
            _write_id_maps(uid, gid)
            layers["user_ns"] = "on"
        except OSError as e:
            _report(status, {"error": f"writing the user namespace's id maps failed: {e}"})
            os._exit(1)
    for name, flag in _NAMESPACES:
        if name in disabled:
            layers[name] = "off: disabled by the caller"
        elif libc.unshare(flag) != 0:
            layers[name] = _why(_oserror(f"unshare({name})"))
        else:
            layers[name] = "on"
    lifeline_r, lifeline_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(lifeline_w)
            _confine_child(libc, cfg, layers, lifeline_r)
            _report(status, {"layers": layers})
            if cfg["probe"]:
                os._exit(0)
            os.execvp(argv[0], argv)
        except BaseException as e:
            _report(status, {"error": f"{type(e).__name__}: {e}"})
        os._exit(127)
    os.close(lifeline_r)
    for fd in cfg["pass_fds"]:
        os.close(fd)  # the controller sees EOF on its channel when the worker dies, not when we do
    layers["pdeathsig"] = "on"
    _report(status, {"child": child, "layers": layers})
    os.close(status)
    while True:
        try:
            _, code = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(code) & 0xFF)


# --------------------------------------------------------------------------------------------------
# The controller's side.


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fstype, super options) of each mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and len(rfields) >= 3:
            out.append((fields[3], fields[4].replace("\\040", " "), rfields[0], rfields[2]))
    return out


def _own_cgroups() -> dict[str, str]:
    """controller name (v1) or "" (v2) -> this process's cgroup path."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _cgroup_parents() -> tuple[int, dict[str, Path]]:
    """(version, {controller: the folder a new cgroup for the worker goes in}). v1 needs pids and
    freezer (memory where it exists); else v2. Raises OSError with the reason when neither is there."""
    mounts, own = _mountinfo(), _own_cgroups()
    v1: dict[str, Path] = {}
    for root, point, fstype, options in mounts:
        if fstype != "cgroup":
            continue
        for name in ("pids", "freezer", "memory"):
            if name in options.split(",") and name in own:
                rel = os.path.relpath(own[name], root) if own[name].startswith(root) else None
                if rel is not None:
                    v1[name] = Path(point) / rel if rel != "." else Path(point)
    if "pids" in v1 and "freezer" in v1:
        return 1, v1
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own and own[""].startswith(root):
            rel = os.path.relpath(own[""], root)
            return 2, {"": Path(point) / rel if rel != "." else Path(point)}
    raise OSError(errno.ENOENT, "no cgroup v1 pids+freezer hierarchy and no cgroup v2 mount")


class _Cgroup:
    """The worker's own cgroup: v1 (one folder per controller) or v2 (one folder). Only v1 is checked
    on a real host so far; the v2 path (cgroup.freeze, cgroup.kill, pids.max and memory.max where the
    parent delegates them) is written against the kernel's cgroup-v2 documentation."""

    _counter = 0

    def __init__(self, version: int, dirs: dict[str, Path]) -> None:
        self.version, self.dirs = version, dirs

    @classmethod
    def create(cls, memory_bytes: int | None, pids_max: int) -> tuple[_Cgroup, str]:
        """Make it and set its limits; returns it and the `cgroup_limits` layer value."""
        version, parents = _cgroup_parents()
        for parent in parents.values():
            _sweep_stale(parent)
        cls._counter += 1
        name = f"polymorph-sandbox-{os.getpid()}-{cls._counter}-{time.monotonic_ns() % 10**9}"
        made = _Cgroup(version, {})
        try:
            for controller, parent in parents.items():
                if controller == "memory" and memory_bytes is None:
                    continue
                (parent / name).mkdir()
                made.dirs[controller] = parent / name
            limits = made._set_limits(memory_bytes, pids_max)
        except OSError:
            made.remove()
            raise
        return made, limits

    def _set_limits(self, memory_bytes: int | None, pids_max: int) -> str:
        if self.version == 1:
            (self.dirs["pids"] / "pids.max").write_text(str(pids_max))
            if memory_bytes is not None:
                if "memory" not in self.dirs:
                    return "off: no cgroup v1 memory controller for the memory limit"
                (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            return "on"
        cg = self.dirs[""]
        missing = []
        for filename, value in (("pids.max", pids_max), ("memory.max", memory_bytes)):
            if value is None:
                continue
            if (cg / filename).exists():
                (cg / filename).write_text(str(value))
            else:
                missing.append(filename.split(".")[0])
        if missing:
            return f"off: cgroup v2 {cg.parent} does not delegate the {'/'.join(missing)} controller"
        return "on"

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files():
            try:
                found |= {int(x) for x in Path(path).read_text().split()}
            except OSError:
                pass
        return found

    def _freeze_file(self) -> tuple[Path, str, str]:
        if self.version == 1:
            return self.dirs["freezer"] / "freezer.state", "FROZEN", "THAWED"
        return self.dirs[""] / "cgroup.freeze", "1", "0"

    def frozen(self) -> bool:
        if self.version == 1:
            return (self.dirs["freezer"] / "freezer.state").read_text().strip() == "FROZEN"
        return "frozen 1" in (self.dirs[""] / "cgroup.events").read_text()

    def freeze(self, deadline: float) -> None:
        path, on, _ = self._freeze_file()
        path.write_text(on)
        while not self.frozen():  # the freezer is asynchronous: wait until every task is stopped
            if time.monotonic() > deadline:
                raise SandboxError(f"the cgroup freezer did not freeze {path.parent} in time")
            time.sleep(0.001)

    def thaw(self) -> None:
        path, _, off = self._freeze_file()
        path.write_text(off)

    def kill_all(self) -> None:
        if self.version == 2 and (self.dirs[""] / "cgroup.kill").exists():
            (self.dirs[""] / "cgroup.kill").write_text("1")
            return
        try:
            self.freeze(time.monotonic() + 5.0)  # so nothing forks between reading procs and killing
        except (OSError, SandboxError):
            pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.thaw()  # a frozen task dies of SIGKILL only once thawed

    def remove_when_empty(self, deadline: float | None) -> bool:
        """Wait until every task has left (exited), then remove the folders. False when the deadline
        passed first (a stale empty folder is swept by a later `create`)."""
        while self.pids():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        while not self.remove():  # v1 may say EBUSY for a moment after the last task exits
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def remove(self) -> bool:
        ok = True
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok


def _sweep_stale(parent: Path) -> None:
    """Remove worker cgroups left by controllers that died (SIGKILL leaves the empty folder)."""
    try:
        entries = list(parent.glob("polymorph-sandbox-*"))
    except OSError:
        return
    for d in entries:
        try:
            owner = int(d.name.split("-")[2])
            os.kill(owner, 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            try:
                d.rmdir()
            except OSError:
                pass
        except PermissionError:
            continue


_warned: set[tuple[str, str]] = set()


def _warn_off(layers: dict[str, str]) -> None:
    import logging

    log = logging.getLogger(__name__)
    for name, value in layers.items():
        if value != "on" and (name, value) not in _warned:
            _warned.add((name, value))
            log.warning("sandbox layer %s is %s", name, value)


def _minimal_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
    return {k: os.environ[k] for k in keep if k in os.environ}


class Sandboxed:
    """A running sandboxed tree, Popen-like, held by the trusted controller.

    pid:    host pid of the bootstrap, the outermost process started.
    layers: layer name -> "on" or "off: <reason>" (`LAYERS`).
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        layers: dict[str, str],
        child: int | None,
        cgroup: _Cgroup | None,
    ) -> None:
        self._proc, self.layers, self._child, self._cgroup = proc, layers, child, cgroup
        self.pid = proc.pid
        self.returncode: int | None = None
        self._pidfd: int | None = None
        self._pidns: str | None = None
        self._stopped: set[int] = set()
        if child is not None:
            # The bootstrap has not reaped pid 1 unless it already exited, so the pid is still ours.
            try:
                self._pidfd = os.pidfd_open(child)
            except OSError:
                pass
            if layers.get("pid_ns") == "on":
                try:
                    self._pidns = os.readlink(f"/proc/{child}/ns/pid")
                except OSError:
                    pass

    @property
    def child_pid(self) -> int | None:
        """Host pid of the sandboxed program itself (pid 1 of its namespace), below the bootstrap."""
        return self._child

    @property
    def stdout(self) -> Any:
        return self._proc.stdout

    @property
    def stderr(self) -> Any:
        return self._proc.stderr

    def _child_gone(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return True
        import select

        return bool(select.select([self._pidfd], [], [], timeout)[0])

    def _finish(self, rc: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._child_gone(timeout):
            return None
        if self._cgroup is not None:
            # pid 1 is gone, so the kernel is killing the rest; wait for them, not for the folder
            if not self._cgroup.remove_when_empty(deadline) and self._cgroup.pids():
                return None
            self._cgroup = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.returncode = rc
        return rc

    def poll(self) -> int | None:
        """The exit code once the whole tree is gone (negative: killed by that signal), else None."""
        if self.returncode is not None:
            return self.returncode
        rc = self._proc.poll()
        return None if rc is None else self._finish(rc, 0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait until the bootstrap is reaped and every process of the tree is gone; returns the exit
        code. Raises subprocess.TimeoutExpired after `timeout` seconds."""
        import subprocess

        if self.returncode is not None:
            return self.returncode
        start = time.monotonic()
        rc = self._proc.wait(timeout)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        done = self._finish(rc, left)
        if done is None:
            raise subprocess.TimeoutExpired(self._proc.args, timeout or 0.0)
        return done

    def kill(self) -> None:
        """SIGKILL every process of the tree: the cgroup's, pid 1 of the pid namespace (the kernel
        then kills the rest of it), the bootstrap, and without either the process group."""
        if self.returncode is not None:
            return
        if self._cgroup is not None:
            try:
                self._cgroup.kill_all()
            except OSError:
                pass
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc.poll() is None:
            if self._cgroup is None and self.layers.get("pid_ns") != "on":
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._proc.kill()

    def _tree(self) -> set[int]:
        """Host pids of the tree without a cgroup: every process in our pid namespace, else the
        descendants of pid 1 (an orphaned daemon is missed there)."""
        found: set[int] = set()
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                if self._pidns is not None:
                    if os.readlink(f"/proc/{pid}/ns/pid") == self._pidns:
                        found.add(pid)
                else:
                    text = Path(f"/proc/{pid}/stat").read_text()
                    parents[pid] = int(text[text.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError):
                continue
        if self._pidns is None and self._child is not None:
            found = {self._child}
            grew = True
            while grew:
                more = {p for p, pp in parents.items() if pp in found} - found
                found |= more
                grew = bool(more)
        return found

    def freeze(self, timeout: float = 10.0) -> None:
        """Stop every process and thread of the tree and return once they are all stopped."""
        deadline = time.monotonic() + timeout
        if self._cgroup is not None:
            self._cgroup.freeze(deadline)
            return
        while True:
            new = self._tree() - self._stopped
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            self._stopped |= new
        for pid in self._stopped:
            while not _all_threads_stopped(pid):
                if time.monotonic() > deadline:
                    raise SandboxError(f"process {pid} of the sandbox did not stop in time")
                time.sleep(0.001)

    def thaw(self) -> None:
        """Resume what `freeze` stopped."""
        if self._cgroup is not None:
            self._cgroup.thaw()
            return
        for pid in self._stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._stopped = set()

    def __enter__(self) -> Sandboxed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.wait()


def _all_threads_stopped(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if text[text.rindex(")") + 2] not in "tTZX":
            return False
    return True


def _start(
    argv: list[str],
    policy: Policy,
    *,
    pass_fds: tuple[int, ...],
    env: dict[str, str] | None,
    stdin: Any,
    stdout: Any,
    stderr: Any,
    cwd: str | None,
    cgroup: _Cgroup | None,
    disable: tuple[str, ...],
    probe: bool,
    timeout: float,
) -> tuple[subprocess.Popen[bytes], dict[str, str], int | None]:
    import select
    import subprocess

    unknown = set(disable) - set(LAYERS)
    if unknown:
        raise ValueError(f"unknown sandbox layers {sorted(unknown)}; the layers are {', '.join(LAYERS)}")
    status_r, status_w = os.pipe()
    cfg = {
        "policy": policy.to_json(),
        "parent": os.getpid(),
        "status_fd": status_w,
        "pass_fds": list(pass_fds),
        "cgroup_procs": cgroup.procs_files() if cgroup is not None else [],
        "disable": list(disable),
        "cwd": cwd,
        "probe": probe,
    }
    cmd = [sys.executable, "-I", "-S", os.path.abspath(__file__), "--config", json.dumps(cfg), "--", *argv]
    try:
        proc = subprocess.Popen(
            cmd,
            pass_fds=(status_w, *pass_fds),
            env=_minimal_env() if env is None else env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # the tree is one process group: a fallback for kill, and no ^C
        )
    finally:
        os.close(status_w)
    layers: dict[str, str] = {}
    child = None
    errors = []
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([status_r], [], [], left)[0]:
                proc.kill()
                proc.wait()
                raise SandboxError(f"the sandbox bootstrap did not report within {timeout:.0f} s")
            chunk = os.read(status_r, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(status_r)
    for line in buf.decode().splitlines():
        message = json.loads(line)
        layers.update(message.get("layers", {}))
        child = message.get("child", child)
        if "error" in message:
            errors.append(message["error"])
    if errors or "landlock" not in layers:
        proc.kill()
        proc.wait()
        why = "; ".join(errors) or f"the bootstrap exited ({proc.returncode}) before the exec"
        raise SandboxError(f"the sandbox could not start {argv[0]!r}: {why}")
    return proc, layers, child


def launch(
    argv: list[str],
    policy: Policy,
    *,
    pass_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    stdin: Any = -3,  # subprocess.DEVNULL
    stdout: Any = None,
    stderr: Any = None,
    cwd: str | None = None,
    memory_bytes: int | None = None,
    pids_max: int = DEFAULT_PIDS_MAX,
    disable: tuple[str, ...] = (),
    timeout: float = 60.0,
) -> Sandboxed:
    """Start `argv` (its argv[0] looked up on PATH) inside the sandbox and return once it has been
    exec'd under every layer that could be had.

    pass_fds: the worker's channel(s) to the controller, inherited; a SOCK_STREAM socketpair end.
    env:      the worker's whole environment; None gives a minimal one (PATH, LANG, ...) so that none of
              the controller's secrets travel. Point TMPDIR and compile caches into `policy.write`.
    cwd:      the worker's working directory; default `policy.write[0]`.
    memory_bytes, pids_max: limits of the worker's cgroup, where one can be made.
    disable:  layers to leave off (tests of the fallbacks; an operator's escape hatch).
    Raises SandboxError when the worker cannot be started at all (the exec failed, the bootstrap
    died); a layer that cannot be had is reported in `layers` and warned about, not raised.
    """
    cgroup, limits = None, "off: no cgroup"
    if "cgroup" in disable:
        cg_layer = "off: disabled by the caller"
    else:
        try:
            cgroup, limits = _Cgroup.create(memory_bytes, pids_max)
            cg_layer = "on"
        except OSError as e:
            cg_layer = _why(e)
    if cwd is None and policy.write:
        cwd = policy.write[0]
    try:
        proc, layers, child = _start(
            argv,
            policy,
            pass_fds=pass_fds,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            cgroup=cgroup,
            disable=disable,
            probe=False,
            timeout=timeout,
        )
    except BaseException:
        if cgroup is not None:
            cgroup.kill_all()
            cgroup.remove_when_empty(time.monotonic() + 10.0)
        raise
    if cgroup is not None and layers.get("cgroup") != "on":
        cgroup.remove()  # the bootstrap could not join it
        cgroup = None
    if cgroup is None:
        layers["cgroup"] = cg_layer if cg_layer != "on" else layers.get("cgroup", "off: not joined")
        limits = "off: no cgroup"
    layers["cgroup_limits"] = limits
    layers = {name: layers.get(name, "off: not reported") for name in LAYERS}
    _warn_off(layers)
    return Sandboxed(proc, layers, child, cgroup)


_available: dict[str, str] | None = None


def layers_available() -> dict[str, str]:
    """What this host supports, layer by layer ("on" or "off: <reason>"), for `engine status` and the
    README. It runs the bootstrap once up to the exec in a throwaway process (tens of milliseconds,
    nothing left behind; the result is kept for the life of this process), and only checks that a
    cgroup could be made, without making one."""
    global _available
    if _available is None:
        import subprocess

        proc, layers, _ = _start(
            ["true"],
            Policy(read=(), write=()),
            pass_fds=(),
            env=_minimal_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=None,
            cgroup=None,
            disable=(),
            probe=True,
            timeout=30.0,
        )
        proc.wait()
        try:
            version, parents = _cgroup_parents()
            unwritable = [str(p) for p in parents.values() if not os.access(p, os.W_OK)]
            if unwritable:
                layers["cgroup"] = layers["cgroup_limits"] = f"off: cannot write {unwritable[0]}"
            else:
                layers["cgroup"] = "on"
                layers["cgroup_limits"] = "on" if version == 1 else "on (cgroup v2: if delegated)"
        except OSError as e:
            layers["cgroup"] = layers["cgroup_limits"] = _why(e)
        _available = {name: layers.get(name, "off: not reported") for name in LAYERS}
    return dict(_available)


def harden_self() -> None:
    """Make the trusted controller non-dumpable: no ptrace and no /proc/<pid>/mem, environ, fd of it
    by processes of the same uid (its children reset this at exec)."""
    _prctl(_libc(), _PR_SET_DUMPABLE, 0)


def default_policy(
    scratch: str | Path,
    extra_read: tuple[str | Path, ...] = (),
    extra_write: tuple[str | Path, ...] = (),
) -> Policy:
    """What a worker needs to import polymorph, numpy, torch (and triton), and nothing of the user's
    files: the interpreter and its prefixes with site-packages, the polymorph source folders, the
    system's libraries and tools, the few /etc files the loader and libc read, /proc (remounted),
    the CPU topology in /sys; `scratch` and /dev/shm (private to the worker) writable; /dev/null
    and /dev/zero read-write; and the GPU device nodes this host has.

    GPU hosts (unchecked here: this machine has no GPU): /dev/nvidia*, /dev/nvidia-caps, /dev/kfd and
    /dev/dri go in `devices`, opened read-write with ioctl allowed (LANDLOCK_ACCESS_FS_IOCTL_DEV from
    ABI 5, which would otherwise deny the driver's ioctls), and the sysfs folders the CUDA and ROCm
    user-space drivers read (/sys/bus/pci, /sys/devices, /sys/class/kfd, /sys/class/drm,
    /sys/module/nvidia, /sys/module/amdgpu) go in `read`. The driver's own files (/usr/lib, /opt/rocm,
    /usr/local/cuda) are under `read` already. Point TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
    TMPDIR into `scratch` or `extra_write`.
    """
    import importlib.util
    import site

    read: list[str] = []
    for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        read.append(p)
    read.append(os.path.dirname(os.path.realpath(sys.executable)))
    read += site.getsitepackages()
    for name in ("polymorph", "polymorph.backends", "polymorph.hwprofiles", "polymorph.kernels"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            read += list(spec.submodule_search_locations)
    read += ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"]
    read += [f"/etc/{f}" for f in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd")]
    read += [f"/etc/{f}" for f in ("group", "nsswitch.conf", "os-release", "alternatives", "mime.types")]
    read += ["/proc", "/sys/devices/system/cpu", "/sys/devices/system/node", "/dev/urandom", "/dev/random"]
    devices = ["/dev/null", "/dev/zero", "/dev/full"]
    gpu = [*sorted(str(p) for p in Path("/dev").glob("nvidia*")), "/dev/kfd", "/dev/dri"]
    gpu = [p for p in gpu if os.path.exists(p)]
    if gpu:
        devices += gpu
        read += ["/sys/bus/pci", "/sys/devices", "/sys/class/kfd", "/sys/class/drm"]
        read += ["/sys/module/nvidia", "/sys/module/amdgpu", "/dev/char"]
    read += [str(p) for p in extra_read]
    write = [str(scratch), "/dev/shm", *(str(p) for p in extra_write)]
    if gpu:
        # Seen on an H200 host (2026-12-01): CUDA's initialisation fails (cudaGetDeviceCount: error 304)
        # unless the process may write somewhere under /proc; read and write of the rest of the tree
        # were bisected down to that. The pid namespace hides every process but the sandbox's own, and
        # the capabilities are dropped, so this reaches nothing outside.
        write.append("/proc")
    unique = lambda xs: tuple(dict.fromkeys(os.path.abspath(x) for x in xs))  # noqa: E731
    return Policy(read=unique(read), write=unique(write), devices=unique(devices))


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "--config" or sys.argv[3] != "--":
        sys.exit("usage: sandbox.py --config <json> -- argv...  (started by polymorph.engine.sandbox.launch)")
    _bootstrap(sys.argv[2], sys.argv[4:])
