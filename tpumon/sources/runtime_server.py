"""Who serves each runtime port, and whether its figures may be believed.

libtpu's metric service has no credentials: between jobs nobody listens on 8431, and any
local user who binds it first can serve made-up HBM figures (pages, a hidden leak). The
kernel knows who listens: /proc/net/tcp{,6} gives the listening socket's uid and inode,
and the inode names the process that holds it (``socket:[INODE]`` in /proc/PID/fd). A port
is trusted when its listener belongs to root, to the chips' holder (its pid or its uid),
or, while no holder is known (between jobs, a simulator), to a trusted user: those in
``reporter.allowed_uids``, or root and the agent's own user when that is empty, the rule
the reporter socket uses for steps (tpumon.diagnose.processes.chip_processes).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, Mapping, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket on a port: its owner's uid (the socket's creator, always
    known) and its inode (what /proc/PID/fd links name)."""

    uid: int
    inode: int


@dataclass(frozen=True, slots=True)
class RuntimeServer:
    """Who serves a runtime port and whether the agent believes it. ``pid`` is None when
    no visible process holds the socket (another user's, without the capabilities);
    ``uid`` is None when nobody listens."""

    pid: int | None
    uid: int | None
    trusted: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "uid": self.uid, "trusted": self.trusted,
                "reason": self.reason}


def _address(hex_address: str) -> IPAddress:
    """/proc/net/tcp's address: 32-bit words in host byte order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _reachable_on_loopback(address: IPAddress) -> bool:
    """A listener the agent's loopback dial may reach: a loopback or wildcard address."""
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    return address.is_loopback or address.is_unspecified


def is_loopback(host: str) -> bool:
    """Whether the runtime address is this VM's loopback, whose listeners the kernel's
    tables of this network namespace show."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listeners(ports: Collection[int]) -> dict[int, list[Listener]]:
    """Port -> the sockets listening on it on loopback or every address: asked of the
    kernel's sock_diag (the listening sockets alone, ~0.1 ms), else read from
    /proc/net/tcp{,6}, which lists every TCP socket (3.5 ms a table on the dev VM)."""
    try:
        return _diag_listeners(ports)
    except OSError:
        return _table_listeners(ports)


def _diag_listeners(ports: Collection[int]) -> dict[int, list[Listener]]:
    found: dict[int, list[Listener]] = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        for sport, address, uid, inode in _diag_dump(family):
            if sport in ports and _reachable_on_loopback(address):
                found.setdefault(sport, []).append(Listener(uid, inode))
    return found


_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBxI48s")  # inet_diag_req_v2: family, protocol, ext, states, id
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16s4s8sIIIII")  # inet_diag_msg
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR, NLMSG_DONE = 4, 20, 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
TCPF_LISTEN = 1 << 10


def _diag_dump(family: int) -> Iterator[tuple[int, IPAddress, int, int]]:
    """(port, address, uid, inode) of every TCP socket of ``family`` listening in this
    network namespace, from a NETLINK_SOCK_DIAG dump (OSError if the kernel refuses)."""
    request = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, TCPF_LISTEN, bytes(48))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                       NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(_NLMSG.pack(_NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY,
                            NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request)
        while True:
            data = nl.recv(1 << 16)
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, offset)[:2]
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR or length < _NLMSG.size:
                    raise OSError("sock_diag refused the dump")
                fields = _DIAG_MSG.unpack_from(data, offset + _NLMSG.size)
                raw = fields[6][:4] if family == socket.AF_INET else fields[6]
                yield (int.from_bytes(fields[4], "big"), ipaddress.ip_address(raw),
                       fields[13], fields[14])
                offset += (length + 3) & ~3


def _table_listeners(ports: Collection[int],
                     tables: Iterable[str] = TABLES) -> dict[int, list[Listener]]:
    """listeners() from /proc/net/tcp{,6}; a table that cannot be read adds nothing."""
    found: dict[int, list[Listener]] = {}
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, _, port_hex = fields[1].partition(":")
            port = int(port_hex, 16)
            if port in ports and _reachable_on_loopback(_address(address)):
                found.setdefault(port, []).append(Listener(int(fields[7]), int(fields[9])))
    return found


def socket_holders(inodes: Collection[int], proc: str = "/proc") -> dict[int, int]:
    """Socket inode -> the lowest pid holding it open, among the processes whose fds this
    process may list (all of them with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found: dict[int, int] = {}
    for entry in sorted(os.scandir(proc), key=lambda e: len(e.name)):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"{proc}/{entry.name}/fd")
            with fds:
                for fd in fds:
                    inode = wanted.get(os.readlink(fd.path))
                    if inode is not None:
                        found.setdefault(inode, int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
        if len(found) == len(wanted):
            break
    return found


def _listed(numbers: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(numbers)))


def uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


class RuntimeTrust:
    """Judges each runtime port's server at every poll: the kernel's listening sockets
    (sock_diag); the /proc walk for a pid only when a listening socket is new."""

    def __init__(self, holders: Callable[[], Mapping[str, int]],
                 allowed_uids: Callable[[], Collection[int]],
                 own_uid: int | None = None) -> None:
        self._holders = holders
        self._allowed_uids = allowed_uids
        self._own_uid = os.geteuid() if own_uid is None else own_uid
        self._pids: dict[int, int | None] = {}  # listening inode -> its pid, last seen

    def judge(self, ports: Collection[int]) -> dict[int, RuntimeServer]:
        """Port -> who serves it and whether to believe it."""
        by_port = listeners(ports)
        inodes = {lst.inode for found in by_port.values() for lst in found}
        unknown = inodes - self._pids.keys()
        if unknown:
            pids = socket_holders(unknown)
            self._pids.update({inode: pids.get(inode) for inode in unknown})
        self._pids = {inode: pid for inode, pid in self._pids.items() if inode in inodes}
        holders = set(self._holders().values())
        return {port: self._server(by_port.get(port, []), holders) for port in ports}

    def _server(self, found: list[Listener], holders: set[int]) -> RuntimeServer:
        """Every listener on the port must be trusted (the agent cannot tell which of two
        its dial reaches); the first untrusted one, else the first, is named."""
        if not found:
            return RuntimeServer(None, None, False, "nobody listens")
        servers = [RuntimeServer(pid, lst.uid, *self._verdict(lst.uid, pid, holders))
                   for lst, pid in ((lst, self._pids.get(lst.inode)) for lst in found)]
        return next((s for s in servers if not s.trusted), servers[0])

    def _verdict(self, uid: int, pid: int | None, holders: set[int]) -> tuple[bool, str]:
        """Whether a listener of ``uid`` (process ``pid``) is believed, and why."""
        if uid == 0:
            return True, "root"
        if pid is not None and pid in holders:
            return True, "the chips' holder"
        holder_uids = {u for u in map(uid_of, holders) if u is not None}
        if holder_uids:
            return (True, "the chips' holder's user") if uid in holder_uids else \
                (False, f"neither root nor the chips' holder: pid {_listed(holders)} of uid "
                        f"{_listed(holder_uids)}")
        if uid in {0, *(self._allowed_uids() or (self._own_uid,))}:
            return True, "a trusted user, no chip holder known"
        whom = "reporter.allowed_uids" if self._allowed_uids() else "the agent's user"
        return False, f"no chip holder known, and only root and {whom} are trusted then"
