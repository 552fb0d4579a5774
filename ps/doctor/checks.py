"""What ``ps-doctor`` measures and reports, one function per check (no output here).

Each check returns :class:`Finding` lines: what was found, and a warning where it would
hold a run back. The one that matters most is CURVE's speed: it depends on the
libsodium bundled in the pyzmq wheel, not on this project (``scripts/bench_wire.py
--sizes-mb 4``: 0.08-0.11 GB/s with pyzmq 26.4.0, 27.1.0 and 27.2.0, 0.65-1.03 GB/s with
27.3.0, on the same 2-core machine), and a cluster with keys moves every push and every
PARAMS reply through it: a slow one starves the whole run while its I/O threads burn the
CPU (a 16-core machine ran the MLP cluster at 17 rounds/s with 27.1.0, 91 with 27.3.0).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

import numpy as np

# Below this a keyed cluster's wire is what limits it (a round of the 10.6M-parameter
# model moves about 1 GB through CURVE): warn.
CURVE_WARN_GBPS = 0.3
CURVE_MESSAGE_BYTES = 4 << 20  # a full chunk (common.net.protocol.CHUNK_BYTES)
CURVE_QUICK_MESSAGES = 4  # what ps-cluster measures at start: 16 MiB, 20-200 ms


@dataclass
class Finding:
    """One line of the report: the check, what it found, and a warning if any."""

    check: str
    found: str
    warning: str = ""
    values: dict = field(default_factory=dict)


def versions() -> list[Finding]:
    """The versions that decide the speed: Python, torch, numpy, numba, pyzmq/libzmq."""
    import msgpack
    import numba
    import torch
    import zmq

    return [Finding("versions", f"Python {platform.python_version()}, torch "
                    f"{torch.__version__}, numpy {np.__version__}, numba {numba.__version__}, "
                    f"pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), msgpack "
                    f"{'.'.join(map(str, msgpack.version))}",
                    values={"python": platform.python_version(), "torch": torch.__version__,
                            "numpy": np.__version__, "numba": numba.__version__,
                            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()})]


def wire_throughput(curve: bool, messages: int, message_bytes: int = CURVE_MESSAGE_BYTES,
                    ) -> float:
    """GB/s of ``messages`` messages of ``message_bytes`` from a DEALER to a ROUTER on
    loopback TCP in this process, each encrypted and decrypted by CURVE with ``curve``
    (on two ZeroMQ I/O threads, as a keyed server's): what one connection of a cluster
    moves at most. The messages are copied into ZeroMQ (a zero-copy send starts pyzmq's
    garbage-collector thread, which would outlive this), and the context is terminated
    before this returns: a launcher forks afterwards."""
    import zmq

    ctx = zmq.Context(io_threads=2)
    try:
        server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        for sock in (server, client):
            sock.linger = 0
        if curve:
            public, secret = zmq.curve_keypair()
            server.curve_secretkey, server.curve_publickey = secret, public
            server.curve_server = True
            client.curve_publickey, client.curve_secretkey = zmq.curve_keypair()
            client.curve_serverkey = public
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        payload = np.ones(message_bytes // 4, dtype=np.float32)
        client.send(b"hello")  # the handshake, outside the clock
        server.recv_multipart()
        started = time.perf_counter()
        for _ in range(messages):
            client.send(payload.data)  # its buffer (numpy types one from Python 3.12)
        for _ in range(messages):
            server.recv_multipart(copy=False)
        seconds = time.perf_counter() - started
        return messages * message_bytes / seconds / 1e9
    finally:
        ctx.destroy(linger=0)


def curve_warning(gbps: float) -> str:
    """The warning for a CURVE throughput, or "" if it is fast enough."""
    if gbps >= CURVE_WARN_GBPS:
        return ""
    import zmq

    return (f"CURVE runs at {gbps:.2f} GB/s, under {CURVE_WARN_GBPS} GB/s: a cluster with "
            f"keys will be limited by its encryption. This pyzmq ({zmq.__version__}) "
            "bundles a slow libsodium; install pyzmq 27.3.0 or newer (its wheels encrypt "
            "at 0.65-1 GB/s per core), or run --insecure on a trusted network")


def wire(messages: int) -> list[Finding]:
    """CURVE's throughput against plain ZMTP's."""
    plain = wire_throughput(False, messages)
    curve = wire_throughput(True, messages)
    return [Finding("wire", f"loopback TCP, {CURVE_MESSAGE_BYTES >> 20} MiB messages: plain "
                    f"{plain:.2f} GB/s, CURVE {curve:.2f} GB/s ({curve / plain:.2f} of "
                    "plain)", curve_warning(curve),
                    {"plain_gbps": plain, "curve_gbps": curve})]


def kernels() -> list[Finding]:
    """The aggregation kernels: loaded (compiled, or from numba's cache), and their speed
    on a (20, 1M) matrix against the mean (the memory-bandwidth floor)."""
    import torch

    from common.learn.rules.kernels import networks

    rows = torch.from_numpy(np.random.default_rng(0).standard_normal(
        (20, 1 << 20), dtype=np.float32))
    started = time.perf_counter()
    networks.coordinate_median(rows.numpy()[:, :256])
    load_s = time.perf_counter() - started

    def best_ms(step) -> float:
        times = []
        for _ in range(3):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        return min(times) * 1e3

    median_ms = best_ms(lambda: networks.coordinate_median(rows.numpy()))
    mean_ms = best_ms(lambda: rows.mean(0))
    ratio = median_ms / mean_ms
    warning = ("" if ratio < 20 else f"the coordinate-wise median takes {ratio:.0f}x the "
               "mean (about 3x where the kernels run well): is numba's compiled code "
               "in use?")
    return [Finding("kernels", f"numba kernels loaded in {load_s:.2f} s; MarMed on 20 x "
                    f"1M values {median_ms:.1f} ms, {ratio:.1f}x the mean's {mean_ms:.1f} ms "
                    f"(on {torch.get_num_threads()} torch thread(s))", warning,
                    {"load_s": load_s, "marmed_ms": median_ms, "mean_ms": mean_ms})]


def threads() -> list[Finding]:
    """torch's threads here, and what each process of a run pins (--torch-threads)."""
    import torch

    from common.run.process import ProcessOptions

    pinned = ProcessOptions().torch_threads
    return [Finding("threads", f"{os.cpu_count()} cores; torch would use "
                    f"{torch.get_num_threads()} thread(s) here; each process of a run pins "
                    f"{pinned} (--torch-threads), so that many processes share the cores",
                    values={"cores": os.cpu_count(), "torch": torch.get_num_threads(),
                            "pinned": pinned})]


def cuda() -> list[Finding]:
    """The CUDA devices torch sees (CUDA_VISIBLE_DEVICES respected), with their memory."""
    import torch

    from worker.device import cuda_devices

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})"
    count = cuda_devices()
    if count == 0:
        why = ("torch was built without CUDA" if torch.version.cuda is None else
               f"torch (CUDA {torch.version.cuda}) sees no GPU")
        return [Finding("cuda", f"no CUDA device: {why}{shown}; --device auto computes on "
                        "the CPU", values={"devices": []})]
    names = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        names.append(f"cuda:{i} {props.name}, {props.total_memory / 2**30:.0f} GiB")
    return [Finding("cuda", f"{count} device(s){shown}, CUDA {torch.version.cuda}: "
                    + "; ".join(names), values={"devices": names})]


def placement(device: str, workers: int, processes: int | None) -> list[Finding]:
    """Where each worker process of ``ps-cluster --device DEVICE --workers N
    --worker-processes W`` computes (the k-th takes GPU k in turn,
    ``worker.device.spread_device``; W None: ps-cluster's default)."""
    from common.errors import ConfigError
    from ps.launcher.options import ClusterOptions
    from worker.device import select_device, spread_device

    blocks = ClusterOptions(worker_processes=processes).worker_blocks(workers)
    try:
        places = [(block, select_device(spread_device(device, k)))
                  for k, block in enumerate(blocks)]
    except ConfigError as exc:  # CUDA asked for and absent, or a bad --device
        return [Finding("placement", f"--device {device}: refused", str(exc))]
    text = "; ".join(f"worker-{b[0]} (workers {b[0]}-{b[-1]}): {d}" for b, d in places)
    return [Finding("placement", f"--device {device}, n={workers} in {len(blocks)} worker "
                    f"processes: {text}; the evaluator: "
                    f"{select_device(device)}; servers aggregate on the CPU",
                    values={f"worker-{b[0]}": str(d) for b, d in places})]
