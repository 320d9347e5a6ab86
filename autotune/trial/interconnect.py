"""What a trial's ranks can tell about how they met and talked: recorded with every result of several ranks.

On a CPU (gloo): the backend, the rendezvous (torchrun's c10d across nodes, autotune's own env:// on one machine)
and the network interface gloo used: GLOO_SOCKET_IFNAME where it is set, else the one holding the address this
host's name resolves to, which is how gloo picks its device when the variable is unset (ProcessGroupGloo's
createDefaultDevice). On CUDA (NCCL): NCCL's version as torch reports it (torch.cuda.nccl.version()) and every NCCL_*
variable the ranks ran with (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_NET_GDR_LEVEL...: what decides which fabric the
all-reduce takes). NCCL's own choice of transport is only in its debug log (NCCL_DEBUG=INFO), which a user can ask
for and find in the trial's log; it is not parsed here.

A rank's host is SLURM's name for its node (SLURMD_NODENAME, set in every job step) or else the host name: the
emulated nodes of the tests share one host and differ only there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["rank_host", "facts", "gloo_interface"]

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def rank_host(env: Mapping[str, str] | None = None) -> str:
    """This rank's node: SLURM's name for it, else the host name."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def facts(
    device_type: str,
    env: Mapping[str, str] | None = None,
    nccl_version: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """The interconnect facts of this rank (rank 0's speak for the trial: every rank ran with one environment).

    nccl_version: how NCCL's version is read (torch.cuda.nccl.version by default; a test passes a fake)."""
    env = os.environ if env is None else env
    found: dict[str, Any] = {
        "backend": "nccl" if device_type == "cuda" else "gloo",
        # torchrun sets TORCHELASTIC_RUN_ID in every worker it starts; autotune's own launcher does not.
        "rendezvous": "c10d (torchrun)" if env.get("TORCHELASTIC_RUN_ID") else "env (autotune's launcher)",
        "master": f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}",
    }
    if device_type == "cuda":
        found["nccl_version"] = _nccl_version(nccl_version)
        found["nccl_env"] = {key: value for key, value in sorted(env.items()) if key.startswith("NCCL_")}
    else:
        found.update(gloo_interface(env))
    return found


def _nccl_version(read: Callable[[], Any] | None) -> str | None:
    """NCCL's version as 'major.minor.patch' (torch gives a tuple; old builds an int such as 2708), None without it."""
    if read is None:
        import torch

        read = torch.cuda.nccl.version
    try:
        version = read()
    except Exception:  # a CUDA build without NCCL, or a driver that refuses: the trial itself says more
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    if isinstance(version, int):  # NCCL_VERSION_CODE: major*1000 + minor*100 + patch (or *10000 from 2.9 on)
        major, rest = divmod(version, 10000 if version >= 20900 else 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return str(version)


def gloo_interface(env: Mapping[str, str]) -> dict[str, Any]:
    """The interface gloo used and why: {"gloo_interface", "gloo_address", "gloo_interface_from"}."""
    named = env.get("GLOO_SOCKET_IFNAME")
    addresses = _interface_addresses()
    if named:
        first = named.split(",")[0]
        return {
            "gloo_interface": named,
            "gloo_address": addresses.get(first),
            "gloo_interface_from": "GLOO_SOCKET_IFNAME",
        }
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"  # gloo falls back to the loopback device when the host name does not resolve
    interface = next((name for name, held in addresses.items() if held == address), None)
    if interface is None and address.startswith("127."):
        interface = next((name for name, held in addresses.items() if held.startswith("127.")), "lo")
    return {"gloo_interface": interface, "gloo_address": address, "gloo_interface_from": "the host name's address"}


def _interface_addresses() -> dict[str, str]:
    """Each network interface's IPv4 address (Linux ioctl; interfaces without one are left out)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found
