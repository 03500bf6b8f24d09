"""Who serves a runtime port (tpumon.sources.runtime_server), read from the kernel's
tables against real listening sockets of this process: works unprivileged."""

from __future__ import annotations

import os
import socket

import pytest

from tpumon.sources.chips import ChipInventory
from tpumon.sources.health import SourceUnavailable
from tpumon.sources.runtime_server import RuntimeTrust, _table_listeners, is_loopback, \
    listeners, socket_holders
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from fake_runtime import chips_metrics


@pytest.mark.parametrize("family,address", [(socket.AF_INET, "127.0.0.1"),
                                            (socket.AF_INET6, "::1"),
                                            (socket.AF_INET, "0.0.0.0")])
def test_a_listening_socket_is_found_with_its_uid_inode_and_pid(family, address):
    with socket.socket(family) as s:
        s.bind((address, 0))
        s.listen()
        port = s.getsockname()[1]
        [found] = listeners({port})[port]
        assert found.uid == os.geteuid()
        assert found.inode == os.fstat(s.fileno()).st_ino
        assert socket_holders({found.inode}) == {found.inode: os.getpid()}
        assert _table_listeners({port}) == listeners({port})  # sock_diag's fallback


def test_a_socket_that_only_connects_or_listens_elsewhere_is_not_a_listener():
    with socket.socket() as lst, socket.socket() as out:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        out.connect(lst.getsockname())
        assert listeners({out.getsockname()[1]}) == {}
    assert is_loopback("localhost") and is_loopback("[::1]") and is_loopback("127.0.0.2")
    assert not is_loopback("10.0.0.1") and not is_loopback("tpu-host")


def test_the_holders_own_server_is_trusted_and_named(runtime_servers):
    """This process holds the chips and serves the port: trusted, with its pid and uid."""
    server = runtime_servers(chips_metrics({0: 1 << 30}))
    trust = RuntimeTrust(lambda: {"0": os.getpid()}, lambda: ())
    source = TpuRuntimeSource("127.0.0.1", [server.port], 2.0, ChipInventory(None, 0), trust=trust)
    try:
        assert source.poll().chips["0"].hbm_used_bytes == 1 << 30
        served = source.servers[server.port]
        assert (served.pid, served.uid, served.trusted) == (os.getpid(), os.geteuid(), True)
    finally:
        source.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root's servers are always trusted; as root "
                    "test_hostile.py's squatter runs as a second user")
def test_a_server_of_an_untrusted_user_is_not_believed(runtime_servers):
    """Another holder's uid (the agent's notion of the holder: pid 1, root's init), and this
    process's uid not trusted: its figures are refused, and it is named."""
    server = runtime_servers(chips_metrics({0: 1 << 30}))
    trust = RuntimeTrust(lambda: {"0": 1}, lambda: ())
    source = TpuRuntimeSource("127.0.0.1", [server.port], 2.0, ChipInventory(None, 0), trust=trust)
    try:
        with pytest.raises(SourceUnavailable, match=f"pid {os.getpid()} \\(uid "
                           f"{os.geteuid()}\\): its figures are ignored"):
            source.poll()
        assert not source.servers[server.port].trusted
        assert source.ports_up == {server.port: False}
    finally:
        source.close()
