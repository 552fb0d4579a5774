"""Chaos: an honest keyed cluster trains while insiders holding the keys of its Byzantine
workers (and the evaluator's) attack one server and one proxy; what does each node pay?

    python3 scripts/chaos.py                    # 100,000 frames of each class per target
    python3 scripts/chaos.py --frames 2000      # a quick look
    git worktree add --detach /tmp/chaos-before c9cfc53   # the code before the insider
    python3 scripts/chaos.py --before-tree /tmp/chaos-before   # changes: its CPU too
    git worktree remove /tmp/chaos-before

The run: n workers (``--workers``), of which only the first ``--honest`` h run; workers
h..n-1 are Byzantine and never run as honest processes: their keys are the attackers'.
The servers close a round at its deadline (``--round-timeout``) with a quorum of the h
honest workers (q = n - h), so the run goes on without the absent and barred workers;
afterwards the reference engine replays the participation the servers recorded and must
end bit-identical. The proxy in front of shard 0 runs a value-level attack (gambler: an
attack that holds whole rounds cannot run with a deadline).

The attackers' keys (bars hit only them):

* ``worker-h``: every flood class that speaks as a worker, and the straggler, which says
  HELLO (accepted) six times per deadline and never pushes: every round of the attack
  waits for its deadline (the most a present but slow worker costs), which also paces
  the run so that it outlasts the attack and leaves the attack the CPU;
* ``worker-h+1``: ``oversize``, a message larger than any legal one, again and again
  (delivered ``too-large``: the key is barred at that node);
* ``worker-h+2``: ``giant``, messages of 2 GB in 4 MiB frames (one 4 MiB buffer referenced
  512 times, zero-copy), each on a new connection after one STATUS (the node attributes
  a connection to its key by a delivered message);
* ``worker-h+3``: ``giant-silent``, the same with the 2 GB message as the first one;
* ``evaluator``: the read-only classes (HELLO as a monitor, forged envelopes) at
  server-1; at proxy-0, which admits the workers' keys only, they use ``worker-h``.

Phases (the targets are server-1 and proxy-0):

1. ``giant`` alone at server-1 for ``--giant-seconds`` (its RSS peak is its own), then
   ``giant-silent`` alone as long; both go on reconnecting until the attack ends; then
   the key holders' phases (``ps/chaos/keyholders.py``), each alone as long:
   ``unread`` (a key's connections that PULL and never read, at server-1), ``bare``
   (``--bare-connections`` that never start a handshake, at server-1),
   ``proxy-envelopes`` (proxy-0's key at server-0, HELLO as every worker behind made-up
   envelopes), each with the CPU, peak RSS, log bytes and counters it cost;
2. the floods: at each target its classes one after another (on one connection per key:
   a node admits a key's handshakes a few at a time), each asking STATUS before and
   after (the node answers a connection in order, so the second reply comes after every
   reply of the class, and the counters' difference is the class's); a class waits at
   most ``--window-wait`` for replies the node may drop (refusals beyond 100/s per key
   go unanswered). Meanwhile ``oversize`` at both targets,
   ``--idle-connections`` idle TCP connections per target (a node closes them: libzmq
   after its handshake timeout, the in-flight guard's idle cut), ``--strangers`` without
   a key;
3. after the run: the CPU a standalone server spends on the most expensive headers it
   still accepts or answers, from one key (``--cpu-messages``), with this code and, with
   ``--before-tree``, the code of that checkout.

It prints a table per class and a JSON summary: crashes (must be 0), bit_identical (must
be true), per class the messages answered, left without reply (its own count) and
dropped (the node's ``unanswered`` counter; a proxy exposes no counters), the bars, peak
RSS (VmRSS every 20 ms, per phase) over the baseline, connections a key got after its
first offence (handshakes its sockets' monitors saw succeed), log bytes (with rotated
files) per 100,000 hostile frames, CPU-ms per 1,000 worst accepted headers.

The package, by job: ``classes`` (the hostile classes and their frames), ``floods`` (a
class at a target, its lane, the offenders, the straggler), ``attack`` (phase 2's floods,
idle connections and strangers), ``keyholders`` (phase 1b), ``measure`` (RSS sampling,
logs, metrics, the table), ``cpu`` (phase 3), ``cluster`` (the attacked cluster's run and
its summary), ``faults`` (``scripts/chaos_faults.py``: faults on a schedule) and ``cli``
(both commands). ``scripts/chaos.py`` and ``scripts/chaos_faults.py`` call ``cli``; nothing
else imports this package.
"""
