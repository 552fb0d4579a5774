"""Many shards per server process, without sockets: shard sets and their spelling, where a
process's shards lie in a message, the server core hosting several shards (one PUSH, one
PARAMS, each shard its own state and metrics line), the proxy corrupting only the shards
it targets, the worker's one message per process, and the checkpoints a process of
several shards resumes from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from common.net.protocol import (
    CHUNK_BYTES,
    Hello,
    Params,
    ProtocolError,
    Push,
    Welcome,
    decode,
    encode,
)
from common.net.sharding import (
    ServerSlices,
    format_shard_set,
    parse_servers,
    parse_shard_set,
    server_blocks,
)
from common.net.transport import Incoming
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import JsonlWriter, read_jsonl
from ps.proxy.core import ProxyCore
from ps.proxy.corruption import ShardCorruptor
from server.checkpoint import (
    Checkpoint,
    Expected,
    GroupFiles,
    checkpoint_path,
    load_checkpoint,
    previous_path,
)
from server.core import ServerCore
from server.options import ServerOptions
from worker.core import ClientCore

# S=3 shards of d=10: [0, 4), [4, 7), [7, 10)
CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=3, rule="marmed", q=1,
                lr=0.5, rounds=4).validate()
INITIAL = np.linspace(-1.0, 1.0, 10, dtype=np.float32)
RANGES = [(0, 4), (4, 7), (7, 10)]


# -- shard sets ------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "shards"), [
    ("3", (3,)), (3, (3,)), ("0-4", (0, 1, 2, 3, 4)), ("1,3", (1, 3)),
    ("5,0-2", (0, 1, 2, 5)), (" 2 - 2 ".replace(" ", ""), (2,)),
])
def test_a_shard_set_is_an_index_a_range_or_a_list(spec, shards) -> None:
    assert parse_shard_set(spec) == shards
    assert parse_shard_set(format_shard_set(shards)) == shards


@pytest.mark.parametrize(("spec", "why"), [
    ("", "is not an index"), ("0-", "is not an index"), ("3-1", "is empty"),
    ("1,1", "twice"), ("0-2,2", "twice"), ("01", "is not an index"), ("٣", "is not an index"),
    ("0-3", "the run has S=3"),
])
def test_a_shard_set_that_is_not_one_is_refused(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_shard_set(spec, 3)


def test_the_canonical_spelling_merges_runs() -> None:
    assert format_shard_set([5, 0, 1, 2]) == "0-2,5"
    assert format_shard_set([1, 3]) == "1,3"


def test_blocks_are_contiguous_near_equal_and_cover_every_shard_once() -> None:
    assert server_blocks(20, 4) == [tuple(range(k, k + 5)) for k in (0, 5, 10, 15)]
    assert server_blocks(5, 3) == [(0, 1), (2, 3), (4,)]
    assert server_blocks(4, 4) == [(0,), (1,), (2,), (3,)]
    with pytest.raises(ConfigError, match=r"--server-processes 5 must be in 1\.\.S=4"):
        server_blocks(4, 5)


def test_a_servers_list_names_processes_by_blocks_or_by_their_shards() -> None:
    assert parse_servers("tcp://a:1,tcp://b:1", 5) == [((0, 1, 2), "tcp://a:1"),
                                                       ((3, 4), "tcp://b:1")]
    assert parse_servers("3-4@tcp://b:1; 0-2@tcp://a:1", 5) == [((0, 1, 2), "tcp://a:1"),
                                                                ((3, 4), "tcp://b:1")]
    with pytest.raises(ConfigError, match="hosts shards 0-2,4 but the run has shards 0-4"):
        parse_servers("0-2@tcp://a:1;4@tcp://b:1", 5)
    with pytest.raises(ConfigError, match=r"\(some twice\)"):
        parse_servers("0-2@tcp://a:1;2-4@tcp://b:1", 5)
    with pytest.raises(ConfigError, match="3 server endpoints given for S=2"):
        parse_servers("tcp://a:1,tcp://b:1,tcp://c:1", 2)


def test_slices_merge_contiguous_shards_into_one_span() -> None:
    together = ServerSlices.of(10, 3, (0, 1))
    assert together.spans == ((0, 7),) and together.length == 7
    assert together.offsets == (0, 4)
    apart = ServerSlices.of(10, 3, (0, 2))
    assert apart.spans == ((0, 4), (7, 10)) and apart.offsets == (0, 4)


# -- the wire: a message carrying several shards -----------------------------------


def test_a_payload_is_split_into_its_shards_across_chunk_boundaries() -> None:
    values = np.arange(CHUNK_BYTES // 4 + 300, dtype=np.float32)  # two chunks
    head, tail = values[:CHUNK_BYTES // 4 - 100], values[CHUNK_BYTES // 4 - 100:]
    msg = decode(encode(Push(round=0, worker=0, length=values.size), [head, tail]))
    assert len(msg.chunks) == 2  # each part sent as it is, without a copy
    cut = CHUNK_BYTES // 4 - 150  # the shards do not end where the chunks do
    first, middle, last = (np.empty(cut, np.float32), np.empty(250, np.float32),
                           np.empty(values.size - cut - 250, np.float32))
    msg.tensor_into(first, middle, last)
    np.testing.assert_array_equal(middle, values[cut:cut + 250])
    np.testing.assert_array_equal(np.concatenate([first, middle, last]), values)
    with pytest.raises(ProtocolError, match="destination needs"):
        msg.tensor_into(first, middle, np.empty(last.size - 1, np.float32))  # too long
    with pytest.raises(ProtocolError, match="destination needs"):
        msg.tensor_into(first, middle, np.empty(last.size + 1, np.float32))  # too short
    with pytest.raises(ValueError, match="announces 5 values, the tensor holds 6"):
        encode(Push(round=0, worker=0, length=5), [np.zeros(3, np.float32)] * 2)


# -- the server core hosting several shards ----------------------------------------


def _incoming(header, tensor=None, peer: bytes = b"w") -> Incoming:
    frames = encode(header, tensor)
    return Incoming(envelope=[peer], message=decode(frames), error=None,
                    frames=[peer, b"", *frames], size=sum(len(f) for f in frames))


def _grad(worker: int, round_: int) -> np.ndarray:
    return (np.arange(10, dtype=np.float32) - 3) * (worker + 1) + np.float32(round_)


def _drive(core: ServerCore, rounds: int) -> list:
    """Every worker pushes its slices of the hosted shards each round; the last round's
    replies."""
    replies = []
    slices = core.state.slices
    for w in range(CFG.num_workers):
        core.handle(_incoming(Hello(role="worker", worker=w, config_hash=CFG.config_hash,
                                    config=CFG.to_dict()), peer=b"w%d" % w), 0.0)
    for t in range(rounds):
        replies = []
        for w in range(CFG.num_workers):
            g = _grad(w, t)
            parts = [g[a:b] for a, b in slices.spans]
            push = Push(round=t, worker=w, length=slices.length, pull_next=t + 1 < CFG.rounds)
            replies += core.handle(_incoming(push, parts, peer=b"w%d" % w), 0.0)
    return replies


@pytest.mark.parametrize("spec", ["0-1", "0,2", "0-2"])
def test_a_process_of_several_shards_ends_as_each_shard_alone_would(tmp_path: Path,
                                                                    spec: str) -> None:
    shards = parse_shard_set(spec)
    metrics = {s: JsonlWriter(tmp_path / f"server-{s}.jsonl") for s in shards}
    group = ServerCore(CFG, ServerOptions(shard=spec), INITIAL, metrics)
    welcome = group.handle(_incoming(Hello(role="evaluator", worker=-1,
                                           config_hash=CFG.config_hash)), 0.0)[0].header
    assert isinstance(welcome, Welcome)
    assert welcome.shards == list(shards)
    assert welcome.length == sum(RANGES[s][1] - RANGES[s][0] for s in shards)
    replies = _drive(group, 3)
    alone = {s: ServerCore(CFG, ServerOptions(shard=str(s)), INITIAL) for s in shards}
    for core in alone.values():
        _drive(core, 3)
    # one PARAMS per worker, carrying every hosted shard's parameters, each as alone
    assert len(replies) == CFG.num_workers
    for reply in replies:
        assert reply.header == Params(round=3, shards=list(shards), length=welcome.length)
        np.testing.assert_array_equal(
            np.concatenate(reply.tensor),
            np.concatenate([alone[s].state.states[0].params for s in shards]))
    for s in shards:
        lines = read_jsonl(tmp_path / f"server-{s}.jsonl")
        assert [(x["shard"], x["round"], x["workers"]) for x in lines] == [
            (s, t, [0, 1, 2]) for t in range(3)]


def test_a_push_of_the_wrong_length_for_the_process_is_refused_and_stores_nothing() -> None:
    core = ServerCore(CFG, ServerOptions(shard="0-1"), INITIAL)
    core.handle(_incoming(Hello(role="worker", worker=0, config_hash=CFG.config_hash)), 0.0)
    reply = core.handle(_incoming(Push(round=0, worker=0, length=4), np.zeros(4, np.float32)),
                        0.0)[0].header
    assert reply.code == "wrong-length" and "7" in reply.message
    assert core.state.pushes == 0 and not any(st.received.any() for st in core.state.states)


def _run_rounds(core: ServerCore, cfg: RunConfig, rounds: int, values) -> None:
    """Workers n-1..0 push ``values(worker, round)``'s slices of the process's shards
    each round, except that the last worker misses round 1, which closes at its
    deadline (fake clock) with the others (the worker is back first in round 2)."""
    for w in range(cfg.num_workers):
        core.handle(_incoming(Hello(role="worker", worker=w, config_hash=cfg.config_hash,
                                    config=cfg.to_dict()), peer=b"w%d" % w), 0.0)
    slices = core.state.slices
    for t in range(rounds):
        for w in reversed(range(cfg.num_workers - (t == 1))):  # the absent one first
            g = values(w, t)
            push = Push(round=t, worker=w, length=slices.length)
            core.handle(_incoming(push, [g[a:b] for a, b in slices.spans], peer=b"w%d" % w),
                        10.0 * t)
        if t == 1:
            core.tick(10.0 * t + 5.0)
        assert core.state.round == t + 1


@pytest.mark.parametrize(("rule", "pre", "one_call"), [
    ("marmed", "", True), ("meamed", "", True), ("trimmed-mean", "", True),
    ("mean", "", False),  # coordinate-wise, but torch's sum rounds with the width
    ("krum", "", False), ("marmed", "nnm", False),  # a vector rule; a mixing step
])
def test_a_coordinate_wise_defence_aggregates_a_process_s_shards_in_one_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str, pre: str,
        one_call: bool) -> None:
    from common.learn.rules.defence import Defence

    cfg = RunConfig(dataset="synthetic", num_workers=6, num_shards=3, rule=rule, q=1,
                    pre=pre, lr=0.5, rounds=3).validate()
    options = {"round_timeout": "5.0", "quorum": 5}
    rng = np.random.default_rng(7)
    table = rng.standard_normal((cfg.rounds, cfg.num_workers, 10)).astype(np.float32)
    table[0, 2, 5] = np.nan  # shard 1's coordinates only (and one infinity in shard 2)
    table[2, 3, 8] = np.inf

    calls = []
    real = Defence.__call__

    def counted(self, G, context):
        calls.append(G.shape)
        return real(self, G, context)

    monkeypatch.setattr(Defence, "__call__", counted)
    metrics = {s: JsonlWriter(tmp_path / f"server-{s}.jsonl") for s in range(3)}
    group = ServerCore(cfg, ServerOptions(shard="0-2", **options), INITIAL, metrics)
    _run_rounds(group, cfg, cfg.rounds, lambda w, t: table[t, w])
    assert (group.state.grads is not None) is one_call
    assert calls == ([(6, 10), (5, 10), (6, 10)] if one_call else
                     [(6, 4), (6, 3), (6, 3), (5, 4), (5, 3), (5, 3), (6, 4), (6, 3), (6, 3)])
    for s in range(3):  # each shard as it would be alone, bit for bit
        alone = ServerCore(cfg, ServerOptions(shard=str(s), **options), INITIAL,
                           {s: JsonlWriter(tmp_path / f"alone-{s}.jsonl")})
        _run_rounds(alone, cfg, cfg.rounds, lambda w, t: table[t, w])
        np.testing.assert_array_equal(group.state.states[s].params.view(np.int32),
                                      alone.state.states[0].params.view(np.int32))
        mine, theirs = (read_jsonl(tmp_path / f"{who}-{s}.jsonl") for who in ("server",
                                                                             "alone"))
        keys = ("round", "nonfinite_values", "params_finite", "rule_info", "workers",
                "missing", "closed")
        assert [{k: x[k] for k in keys} for x in mine] == [
            {k: x[k] for k in keys} for x in theirs]
    assert [x["nonfinite_values"] for x in read_jsonl(tmp_path / "server-1.jsonl")] == [
        1, 0, 0]
    assert [x["missing"] for x in read_jsonl(tmp_path / "server-0.jsonl")] == [[], [5], []]


# -- the proxy in front of a process of several shards -----------------------------


def test_the_proxy_corrupts_only_the_shards_it_targets() -> None:
    attack = AttackConfig.build(proxy_attack="gambler", proxy_shards=(1,),
                                gambler_p=1.0).validate(CFG)
    welcome = Welcome(shards=[0, 1, 2], num_shards=3, d=10, length=10, round=0, rounds=4)
    proxy = ProxyCore(CFG, attack, welcome, targets=(1,))
    values = np.arange(10, dtype=np.float32) + 1
    out = proxy.from_worker(_incoming(Push(round=0, worker=2, length=10), values))
    [sent] = out
    forwarded = decode(sent.frames[2:]).tensor()
    np.testing.assert_array_equal(forwarded[:4], values[:4])  # shard 0: untouched
    np.testing.assert_array_equal(forwarded[7:], values[7:])  # shard 2: untouched
    alone, changed = ShardCorruptor(CFG, attack, 1, 4, 7).corrupt_push(0, 2, values[4:7])
    assert changed == 3
    np.testing.assert_array_equal(forwarded[4:7], alone)  # shard 1: as its proxy alone


def test_a_vector_attack_replaces_only_the_targeted_shards_of_the_victims() -> None:
    attack = AttackConfig.build(proxy_attack="signflip", proxy_victims=(1,),
                                proxy_shards=(0,)).validate(CFG)
    welcome = Welcome(shards=[0, 1], num_shards=3, d=10, length=7, round=0, rounds=4)
    proxy = ProxyCore(CFG, attack, welcome, targets=(0,))
    pushes = [np.arange(7, dtype=np.float32) * (w + 1) + 1 for w in range(3)]
    out = []
    for w, values in enumerate(pushes):
        out += proxy.from_worker(_incoming(Push(round=0, worker=w, length=7), values,
                                           peer=b"w%d" % w))
    forwarded = {bytes(o.frames[0]): decode(o.frames[2:]).tensor() for o in out}
    victim = forwarded[b"w1"]
    np.testing.assert_array_equal(victim[4:], pushes[1][4:])  # shard 1: untouched
    assert not np.array_equal(victim[:4], pushes[1][:4])  # shard 0: forged
    for w in (0, 2):
        np.testing.assert_array_equal(forwarded[b"w%d" % w], pushes[w])


# -- the worker: one message per server process ------------------------------------


def test_the_worker_sends_each_process_one_push_with_all_its_slices() -> None:
    core = ClientCore(CFG, "worker", 1, ["0,2@tcp://a:1;1@tcp://b:1"])
    core.hello(0.0)
    core.handle(0, decode(encode(Welcome(shards=[0, 2], num_shards=3, d=10, length=7,
                                         round=0, rounds=4))), 0.0)
    core.handle(1, decode(encode(Welcome(shards=[1], num_shards=3, d=10, length=3, round=0,
                                         rounds=4))), 0.0)
    g = np.arange(10, dtype=np.float32)
    sends = core.push(0, g, 0.0)
    assert [s.link for s in sends] == [0, 1]
    first = decode(sends[0].frames)
    assert first.header == Push(round=0, worker=1, length=7, pull_next=True)
    np.testing.assert_array_equal(first.tensor(), np.concatenate([g[0:4], g[7:10]]))
    x1 = np.arange(10, dtype=np.float32) * 10
    core.handle(0, decode(encode(Params(round=1, shards=[0, 2], length=7),
                                 [x1[0:4], x1[7:10]])), 0.0)
    core.handle(1, decode(encode(Params(round=1, shards=[1], length=3), x1[4:7])), 0.0)
    assert core.outcome.round == 1
    np.testing.assert_array_equal(core.outcome.params, x1)


def test_a_process_hosting_other_shards_than_expected_is_a_configuration_error() -> None:
    core = ClientCore(CFG, "worker", 1, ["tcp://a:1", "tcp://b:1"])  # blocks 0-1 and 2
    core.hello(0.0)
    core.handle(1, decode(encode(Welcome(shards=[2], num_shards=3, d=10, length=3, round=0,
                                         rounds=4))), 0.0)
    with pytest.raises(ConfigError, match="tcp://a:1 serves shards 0 of 3, expected 0-1"):
        core.handle(0, decode(encode(Welcome(shards=[0], num_shards=3, d=10, length=4,
                                             round=0, rounds=4))), 0.0)


# -- checkpoints of a process of several shards ------------------------------------


def _ckpt(shard: int, round_: int) -> Checkpoint:
    a, b = RANGES[shard]
    return Checkpoint(shard, round_, CFG.config_hash, np.full(b - a, round_, np.float32))


EXPECT = {s: Expected.of(CFG, s, size=b - a) for s, (a, b) in enumerate(RANGES)}


def test_a_process_cut_between_two_shard_files_resumes_at_the_round_both_have(
        tmp_path: Path) -> None:
    files = GroupFiles(tmp_path, (0, 1), {0: b"k" * 32, 1: b"k" * 32})
    assert files.load(EXPECT) is None  # nothing saved: round 0
    files.save([_ckpt(0, 1), _ckpt(1, 1)])
    assert [c.round for c in files.load(EXPECT)] == [1, 1]
    files.save([_ckpt(0, 2), _ckpt(1, 2)])
    files.save([_ckpt(0, 3)])  # killed before shard 1's file of round 3
    assert previous_path(tmp_path, 0).exists() and checkpoint_path(tmp_path, 1).exists()
    resumed = files.load(EXPECT)
    assert [(c.shard, c.round) for c in resumed] == [(0, 2), (1, 2)]
    np.testing.assert_array_equal(resumed[0].params, np.full(4, 2, np.float32))


def test_a_process_whose_first_write_was_cut_starts_from_round_0(tmp_path: Path) -> None:
    files = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    files.save([_ckpt(0, 2)])
    assert files.load(EXPECT) is None


def test_a_process_of_one_shard_keeps_no_previous_generation(tmp_path: Path) -> None:
    files = GroupFiles(tmp_path, (2,), {2: None})
    files.save([_ckpt(2, 2)])
    files.save([_ckpt(2, 3)])
    assert not previous_path(tmp_path, 2).exists()
    assert [c.round for c in files.load(EXPECT)] == [3]


# -- the launcher ------------------------------------------------------------------


def test_a_run_records_its_server_processes_so_a_resume_spreads_the_shards_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ps.launcher import options as launcher_options
    from ps.launcher.cluster import Cluster, ClusterSpec

    cfg = RunConfig(dataset="synthetic", num_workers=3, num_shards=6, rounds=2).validate()
    monkeypatch.setattr(launcher_options, "local_cores", lambda: 4)  # the default: min(S, 4)
    cluster = Cluster(ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg),
                                  out_dir=tmp_path))
    assert cluster.blocks == {0: (0, 1), 2: (2, 3), 4: (4,), 5: (5,)}
    argv = cluster.command_argv()
    assert argv[argv.index("--server-processes") + 1] == "4"
    assert cluster.server_argv(2, None)[cluster.server_argv(2, None).index("--shard") + 1] == "2-3"


@pytest.mark.parametrize("no_evaluator", [False, True])
def test_the_servers_of_a_run_with_an_evaluator_await_it(tmp_path: Path,
                                                         no_evaluator: bool) -> None:
    """A short run may end before the evaluator says HELLO: its servers linger for it."""
    from ps.launcher.cluster import Cluster, ClusterSpec
    from ps.launcher.options import ClusterOptions

    cfg = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rounds=2).validate()
    cluster = Cluster(ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg),
                                  out_dir=tmp_path,
                                  cluster=ClusterOptions(no_evaluator=no_evaluator)))
    assert ("--await-evaluator" in cluster.server_argv(0, None)) is not no_evaluator


def test_a_save_that_failed_part_way_never_becomes_the_previous_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    files = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    files.save([_ckpt(0, 1), _ckpt(1, 1)])
    real = os.replace

    def shard_1_cannot_be_replaced(src, dst):
        if Path(dst) == checkpoint_path(tmp_path, 1):
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", shard_1_cannot_be_replaced)
    with pytest.raises(OSError):
        files.save([_ckpt(0, 2), _ckpt(1, 2)])  # shard 0 at 2, shard 1 still at 1
    monkeypatch.setattr(os, "replace", real)
    assert not list(tmp_path.glob("*.tmp"))  # shard 1's file of round 2 removed
    files.save([_ckpt(0, 3)])  # killed after shard 0's file of round 3
    # shard 0's round-2 file (of a save that did not complete) was not kept: round 1 was
    assert [(c.shard, c.round) for c in files.load(EXPECT)] == [(0, 1), (1, 1)]


def test_a_save_that_cannot_write_a_file_replaces_none(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from server.checkpoint import writer

    files = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    files.save([_ckpt(0, 1), _ckpt(1, 1)])
    real = os.fchmod
    opened = []

    def disk_full_at_the_second_file(fd: int, mode: int) -> None:
        opened.append(fd)
        if len(opened) == 2:
            raise OSError(28, "No space left on device")
        real(fd, mode)

    monkeypatch.setattr(writer.os, "fchmod", disk_full_at_the_second_file)
    with pytest.raises(OSError, match="No space"):
        files.save([_ckpt(0, 2), _ckpt(1, 2)])
    monkeypatch.setattr(writer.os, "fchmod", real)
    # every file is written before any replaces its checkpoint: both still at round 1
    assert not list(tmp_path.glob("*.tmp"))
    assert load_checkpoint(checkpoint_path(tmp_path, 0), key=None, expect=EXPECT[0]).round == 1
    assert [(c.shard, c.round) for c in files.load(EXPECT)] == [(0, 1), (1, 1)]
    assert not previous_path(tmp_path, 0).exists()


def test_a_save_whose_link_failed_still_keeps_the_complete_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    files = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    files.save([_ckpt(0, 1), _ckpt(1, 1)])
    files.save([_ckpt(0, 2), _ckpt(1, 2)])  # complete at 2; round 1 the previous
    real = os.link

    def no_space_for_a_link(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", no_space_for_a_link)
    with pytest.raises(OSError, match="No space"):
        files.save([_ckpt(0, 3), _ckpt(1, 3)])  # nothing replaced
    monkeypatch.setattr(os, "link", real)
    files.save([_ckpt(0, 4)])  # killed after shard 0's file of round 4
    # shard 0's file of round 2 became its previous generation despite the failed save
    assert [(c.shard, c.round) for c in files.load(EXPECT)] == [(0, 2), (1, 2)]


def test_a_process_resumed_from_the_previous_generation_keeps_it_until_a_save_completes(
        tmp_path: Path) -> None:
    files = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    files.save([_ckpt(0, 1), _ckpt(1, 1)])
    files.save([_ckpt(0, 2)])  # killed: shard 0 at 2, shard 1 at 1
    resumed = GroupFiles(tmp_path, (0, 1), {0: None, 1: None})
    assert [c.round for c in resumed.load(EXPECT)] == [1, 1]
    resumed.save([_ckpt(0, 2)])  # killed again, in the same place
    assert [c.round for c in GroupFiles(tmp_path, (0, 1), {0: None, 1: None}).load(
        EXPECT)] == [1, 1]


def test_files_of_no_common_round_are_refused_not_restarted_from_0(tmp_path: Path) -> None:
    from server.checkpoint import CheckpointError, save_checkpoint

    save_checkpoint(checkpoint_path(tmp_path, 0), _ckpt(0, 3), key=None)
    save_checkpoint(checkpoint_path(tmp_path, 1), _ckpt(1, 1), key=None)
    with pytest.raises(CheckpointError, match="share no round"):
        GroupFiles(tmp_path, (0, 1), {0: None, 1: None}).load(EXPECT)


def test_a_fresh_start_forgets_another_runs_previous_generation(tmp_path: Path) -> None:
    from server.node import build_core

    stale = previous_path(tmp_path, 0)
    stale.write_bytes(b"another run's file")
    core, writer = build_core(CFG, ServerOptions(shard="0-1"), tmp_path, INITIAL)
    assert not stale.exists()
    writer.close(core.snapshot())
    resumed, again = build_core(CFG, ServerOptions(shard="0-1", resume=True), tmp_path,
                                INITIAL)
    assert resumed.state.round == 0
    again.close(resumed.snapshot())


class _FailingOnShard:
    """A defence that raises on one shard, as a rule's bug would."""

    def __init__(self, defence, fail: bool) -> None:
        self.defence, self.fail = defence, fail

    def __getattr__(self, name):
        return getattr(self.defence, name)

    def __setattr__(self, name, value):
        if name in ("defence", "fail"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.defence, name, value)

    def __call__(self, grads, context):
        if self.fail:
            raise RuntimeError("a bug in the rule")
        return self.defence(grads, context)


def test_a_round_steps_every_hosted_shard_or_none(caplog) -> None:
    cc = RunConfig(dataset="synthetic", num_workers=3, num_shards=3, q=1, lr=0.5, rounds=4,
                   rule="centered-clipping", cc_tau=0.5).validate()
    core = ServerCore(cc, ServerOptions(shard="0-1"), INITIAL)
    _drive_cfg(core, cc, 1)
    before = [(st.round, st.params.copy(), {k: v.copy() for k, v in st.defence.state.items()})
              for st in core.state.states]
    second = core.state.states[1]
    second.defence = _FailingOnShard(second.defence, fail=True)
    _drive_cfg(core, cc, 1, start=1)  # round 1's pushes: the step raises on shard 1
    assert core.counters["internal"] >= 1
    for st, (round_, params, state) in zip(core.state.states, before, strict=True):
        assert st.round == round_ == 1 and np.array_equal(st.params, params)
        assert all(np.array_equal(st.defence.state[k], v) for k, v in state.items())
    second.defence.fail = False
    core.tick(0.0)  # the round closes on both now, as if the failure never was
    alone = ServerCore(cc, ServerOptions(shard="0-1"), INITIAL)
    _drive_cfg(alone, cc, 2)
    for st, other in zip(core.state.states, alone.state.states, strict=True):
        assert st.round == 2 and np.array_equal(st.params, other.params)


def test_a_round_aggregated_in_one_call_that_raises_stays_open_on_every_shard() -> None:
    core = ServerCore(CFG, ServerOptions(shard="0-1"), INITIAL)
    assert core.state.grads is not None  # MarMed: one call for both shards
    _drive_cfg(core, CFG, 1)
    before = [st.params.copy() for st in core.state.states]
    first = core.state.states[0]
    first.defence = _FailingOnShard(first.defence, fail=True)
    _drive_cfg(core, CFG, 1, start=1)  # round 1's pushes: the one call raises
    assert core.counters["internal"] >= 1
    assert [st.round for st in core.state.states] == [1, 1]
    assert all(np.array_equal(st.params, b) for st, b in zip(core.state.states, before,
                                                             strict=True))
    first.defence.fail = False
    core.tick(0.0)
    alone = ServerCore(CFG, ServerOptions(shard="0-1"), INITIAL)
    _drive_cfg(alone, CFG, 2)
    for st, other in zip(core.state.states, alone.state.states, strict=True):
        assert st.round == 2 and np.array_equal(st.params, other.params)


def _drive_cfg(core: ServerCore, cfg: RunConfig, rounds: int, start: int = 0) -> None:
    slices = core.state.slices
    for w in range(cfg.num_workers):
        core.handle(_incoming(Hello(role="worker", worker=w, config_hash=cfg.config_hash,
                                    config=cfg.to_dict()), peer=b"w%d" % w), 0.0)
    for t in range(start, start + rounds):
        for w in range(cfg.num_workers):
            g = _grad(w, t)
            push = Push(round=t, worker=w, length=slices.length)
            core.handle(_incoming(push, [g[a:b] for a, b in slices.spans],
                                  peer=b"w%d" % w), 0.0)
