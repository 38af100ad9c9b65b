"""Plays a named scenario through vLLM's own KV-event publisher (vllm/distributed/kv_events.py
of the pinned wheel, unmodified) with vLLM's own block hashing (hash_block_tokens over the
default sha256, NONE_HASH from init_none_hash) and, for CPU offloading, the offloading
connector's own event translation (OffloadingEventsTracker, kv_connector/v1/offloading/
events.py, with its default of self-describing events off), for the conformance test
integration/tests/suite/engine_vllm.rs. Stores, removals and resets are built as vLLM's block pool
builds them (BlockStored of the newly cached blocks with the last cached block as parent,
BlockRemoved per reallocated block, AllBlocksCleared on reset_prefix_cache).

    vllm_driver.py --engines .cache/engines/vllm --events PORT --replay PORT
                   --scenario NAME --go FILE --expect FILE

Prints READY once the publisher is bound (PUB and replay ROUTER on 127.0.0.1), waits for the go
file, publishes the scenario's batches, writes the knowledge a correct consumer holds afterwards
to the expect file, and stays up (replay available) until killed:

    {"block_size": 16, "tiers": {"GPU": [prefix, ...], "CPU": [...]}, "not_gpu": [prefix, ...]}

Each prefix is the token ids from the start of a chain through one block: that block's identity
(the test hashes it with kvroute's chain hash). `not_gpu` lists blocks that must not be on the
GPU tier and need not be anywhere (unknown medium). The expectation is written independently
of the events: from the scenario's story, not from what was published.
"""

import argparse
import dataclasses
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_stubs as S  # noqa: E402

BS = 16


def load(root):
    """vLLM's publisher and block hashing, with stand-ins for what publishing does not use."""
    S.package(root, "vllm")
    S.stub("vllm.logger", init_logger=S.init_logger)
    envs = S.stub(
        "vllm.envs",
        VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
        != "0",
    )
    envs.__getattr__ = lambda attr: None
    # The configuration machinery (pydantic, torch): KVEventsConfig stays a plain dataclass.
    S.package(root, "vllm.config", VllmConfig=S.Anything)
    S.stub("vllm.config.utils", config=dataclasses.dataclass)
    S.package(root, "vllm.utils")
    # Only used to bind tcp://*:0 (a node IP); the test gives ports.
    S.stub(
        "vllm.utils.network_utils",
        get_ip=lambda: "127.0.0.1",
        get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
        is_valid_ipv6_address=lambda ip: False,
        split_zmq_path=lambda p: tuple(p.rsplit(":", 1)[0].split("://")) + (p.rsplit(":", 1)[1],),
    )
    S.package(root, "vllm.distributed")
    S.package(root, "vllm.v1")
    S.package(root, "vllm.v1.core")
    # Multimodal, KV-cache specs, requests, tensors: only in code paths block hashing skips.
    S.stub("vllm.multimodal")
    S.stub("vllm.multimodal.utils")
    S.stub("vllm.v1.kv_cache_interface")
    S.stub("vllm.v1.kv_cache_spec_registry")
    S.stub("vllm.v1.request")
    S.stub("vllm.v1.utils")
    import vllm.distributed.kv_events as kve
    import vllm.v1.core.kv_cache_utils as kcu
    from vllm.utils.hashing import sha256

    kcu.init_none_hash(sha256)
    return kve, kcu, sha256


def load_offloading(root):
    """The offloading connector's event translation (kv_connector/v1/offloading/events.py) and
    its keys (v1/kv_offload/base.py); tensors, hints, offloading config and metrics stand in."""
    for name in ["torch", "numpy", "vllm.v1.kv_hints", "vllm.v1.kv_offload.config"]:
        S.stub(name)
    S.stub("vllm.v1.metrics")
    S.stub("vllm.v1.metrics.cache_hit_source")
    S.package(root, "vllm.v1.kv_offload")
    for name in [
        "vllm.distributed.kv_transfer",
        "vllm.distributed.kv_transfer.kv_connector",
        "vllm.distributed.kv_transfer.kv_connector.v1",
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading",
    ]:
        S.package(root, name)
    import vllm.distributed.kv_transfer.kv_connector.v1.offloading.events as oev
    import vllm.v1.kv_offload.base as base

    # The default: KV events on, self-describing offload events off.
    config = base.OffloadingKVEventsConfig(
        enable_kv_cache_events=True, self_describing_kv_events=False
    )
    return oev.OffloadingEventsTracker(config), base


class Engine:
    """What vLLM's block pool sends for the story a scenario tells: chains of full blocks
    hashed as vLLM hashes them, stored once, removed tail first."""

    def __init__(self, kve, kcu, hash_fn, tracker, base):
        self.kve, self.kcu, self.hash_fn = kve, kcu, hash_fn
        self.tracker, self.base = tracker, base

    def hashes(self, tokens, extra=None):
        """vLLM's raw hash of every full block of `tokens` (extra keys per block)."""
        out, parent = [], None
        for i in range(len(tokens) // BS):
            block = tokens[i * BS : (i + 1) * BS]
            keys = extra[i] if extra else None
            parent = self.kcu.hash_block_tokens(self.hash_fn, parent, block, keys)
            out.append(parent)
        return out

    def ext(self, h):
        return self.kcu.maybe_convert_block_hash(h)

    def stored(self, tokens, start_block, n_blocks, medium="GPU", group=0, kind=None, **kw):
        """A BlockStored of blocks start_block..start_block+n_blocks of chain `tokens`."""
        hs = self.hashes(tokens, kw.pop("extra", None))
        parent = self.ext(hs[start_block - 1]) if start_block > 0 else None
        return self.kve.BlockStored(
            block_hashes=[self.ext(h) for h in hs[start_block : start_block + n_blocks]],
            parent_block_hash=parent,
            token_ids=tokens[start_block * BS : (start_block + n_blocks) * BS],
            block_size=BS,
            lora_id=None,
            medium=medium,
            lora_name=None,
            group_idx=group,
            kv_cache_spec_kind=kind,
            **kw,
        )

    def offloaded(self, tokens, blocks, group=0):
        """What the offloading connector publishes when the CPU tier stores `blocks` of chain
        `tokens` (its OffloadingEventsTracker, self-describing events off: the default), one
        offload key per block (offloaded block size = GPU block size)."""
        hs = self.hashes(tokens)
        keys = [self.base.make_offload_key(hs[b], group) for b in blocks]
        event = self.base.OffloadingEvent(keys=keys, medium=self.base.Medium.CPU, removed=False)
        return list(self.tracker.take_events([event]))

    def removed(self, tokens, blocks, medium="GPU", group=0):
        hs = self.hashes(tokens)
        return self.kve.BlockRemoved(
            block_hashes=[self.ext(hs[b]) for b in blocks], medium=medium, group_idx=group
        )

    def batch(self, events):
        return self.kve.KVEventBatch(ts=time.time(), events=events)


def chain(seed, n_blocks, share=None, shared_blocks=0):
    """Deterministic token ids: `shared_blocks` blocks of `share`, then blocks of `seed`."""
    head = list(share[: shared_blocks * BS]) if share else []
    tail = [(seed * 7919 + i * 31) % 50000 + 1 for i in range(n_blocks * BS - len(head))]
    return head + tail


# Each scenario: (publish(eng, pub, ctx), expect) -> expected {"GPU": [...], ...}.


def sc_chains(eng, pub, ctx):
    a = chain(1, 4)
    b = chain(2, 5, share=a, shared_blocks=2)
    pub.publish(eng.batch([eng.stored(a, 0, 4)]))
    # b reuses a's first two blocks: vLLM stores only the new ones, parent = a's block 1.
    pub.publish(eng.batch([eng.stored(b, 2, 3)]))
    # a finishes and its tail is reallocated: tail first.
    pub.publish(eng.batch([eng.removed(a, [3]), eng.removed(a, [2])]))
    return {"GPU": S.prefixes(a, BS)[:2] + S.prefixes(b, BS)}


def sc_offload(eng, pub, ctx):
    a = chain(3, 4)
    pub.publish(eng.batch([eng.stored(a, 0, 4)]))
    # The connector offloads every block to CPU (placeholders), then the GPU reallocates the
    # tail: the CPU copies stay.
    pub.publish(eng.batch(eng.offloaded(a, range(4))))
    pub.publish(eng.batch([eng.removed(a, [3]), eng.removed(a, [2])]))
    # A self-describing CPU store (kv_connector_extra_config self_describing_kv_events) of a
    # chain the GPU never announced, continuing a's block 1 from the CPU tier.
    b = chain(4, 3, share=a, shared_blocks=2)
    pub.publish(eng.batch([eng.stored(b, 2, 1, medium="CPU")]))
    return {"GPU": S.prefixes(a, BS)[:2], "CPU": S.prefixes(a, BS) + S.prefixes(b, BS)[2:3]}


def sc_groups(eng, pub, ctx):
    # A hybrid model: the same hashes in a full-attention group and a sliding-window group.
    a = chain(5, 3)
    pub.publish(
        eng.batch(
            [
                eng.stored(a, 0, 3, group=0, kind="full_attention"),
                eng.stored(
                    a, 0, 3, group=1, kind="sliding_window", kv_cache_spec_sliding_window=32
                ),
            ]
        )
    )
    # The sliding-window group frees its old blocks early: the full-attention group still
    # holds them, and a prefix hit needs the full-attention group's blocks: still known.
    pub.publish(eng.batch([eng.removed(a, [0, 1], group=1)]))
    # Then the full-attention group evicts the tail: the sliding-window group alone cannot serve
    # that block as a prefix, so it is no longer known.
    pub.publish(eng.batch([eng.removed(a, [2], group=0)]))
    return {"GPU": S.prefixes(a, BS)[:2], "gone": S.prefixes(a, BS)[2:]}


def sc_refcount(eng, pub, ctx):
    # Overlapping offload chunks re-announce shared hashes once per chunk, and removals fan out
    # the same way: a block stays while any announcement is not yet removed.
    a = chain(6, 3)
    pub.publish(eng.batch([eng.stored(a, 0, 2, medium="CPU"), eng.stored(a, 0, 3, medium="CPU")]))
    pub.publish(eng.batch([eng.removed(a, [0, 1], medium="CPU")]))
    return {"CPU": S.prefixes(a, BS)}


def sc_cleared(eng, pub, ctx):
    a = chain(7, 3)
    b = chain(8, 2)
    pub.publish(eng.batch([eng.stored(a, 0, 3), eng.stored(b, 0, 2)]))
    pub.publish(eng.batch(eng.offloaded(a, range(3))))
    # reset_prefix_cache: the GPU pool is cleared; the CPU tier is kept by default.
    pub.publish(eng.batch([eng.kve.AllBlocksCleared()]))
    c = chain(9, 2)
    pub.publish(eng.batch([eng.stored(c, 0, 2)]))
    return {"GPU": S.prefixes(c, BS), "CPU": S.prefixes(a, BS)}


def sc_remote(eng, pub, ctx):
    a = chain(10, 2)
    r = chain(11, 3)
    u = chain(12, 2)
    pub.publish(
        eng.batch(
            [
                eng.stored(a, 0, 2),
                # Blocks another node holds: not this worker's.
                eng.stored(r, 0, 3, locality="REMOTE"),
                # A connector's own medium string (LMCache): not the GPU.
                eng.stored(u, 0, 2, medium="LocalDiskBackend"),
            ]
        )
    )
    return {"GPU": S.prefixes(a, BS), "not_gpu": S.prefixes(u, BS), "gone": S.prefixes(r, BS)}


def sc_lookahead(eng, pub, ctx):
    # EAGLE: each block's hash also covers the next LOOK tokens, sent as lookahead_token_ids.
    look = 3
    a = chain(13, 3) + chain(14, 1)[:look]
    full = a[: 3 * BS]
    extra = [("lookahead", tuple(a[(i + 1) * BS : (i + 1) * BS + look])) for i in range(3)]
    lookahead = [list(a[(i + 1) * BS : (i + 1) * BS + look]) for i in range(3)]
    pub.publish(
        eng.batch([eng.stored(full, 0, 3, extra=extra, lookahead_token_ids=lookahead)])
    )
    return {"GPU": S.prefixes(full, BS)}


def sc_restart(eng, pub, ctx):
    a = chain(15, 3)
    pub.publish(eng.batch([eng.stored(a, 0, 3)]))
    pub.publish(eng.batch([eng.stored(chain(16, 1), 0, 1)]))
    time.sleep(0.5)
    # The engine restarts: a new publisher process state (sequence from 0), an empty cache.
    pub.shutdown()
    pub2 = ctx["new_publisher"]()
    ctx["publisher"] = pub2
    time.sleep(1.0)  # the subscriber reconnects
    b = chain(17, 2)
    pub2.publish(eng.batch([eng.stored(b, 0, 2)]))
    return {"GPU": S.prefixes(b, BS)}


class DropOnce:
    """Wraps the PUB socket and swallows the send of one sequence number: a batch PUB dropped
    (the publisher still buffers it for replay)."""

    def __init__(self, sock, seq):
        self.sock, self.seq, self.dropped = sock, seq, False

    def send_multipart(self, frames, *a, **k):
        if int.from_bytes(frames[1], "big") == self.seq and not self.dropped:
            self.dropped = True
            return None
        return self.sock.send_multipart(frames, *a, **k)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def sc_replay(eng, pub, ctx):
    a = chain(18, 4)
    pub.publish(eng.batch([eng.stored(a, 0, 1)]))
    pub.publish(eng.batch([eng.stored(a, 1, 2)]))  # seq 1: dropped on PUB
    pub.publish(eng.batch([eng.stored(a, 3, 1)]))
    return {"GPU": S.prefixes(a, BS)}


SCENARIOS = {
    "chains": sc_chains,
    "offload": sc_offload,
    "groups": sc_groups,
    "refcount": sc_refcount,
    "cleared": sc_cleared,
    "remote": sc_remote,
    "lookahead": sc_lookahead,
    "restart": sc_restart,
    "replay": sc_replay,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--engines", required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--replay", type=int, required=True)
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--go", required=True)
    p.add_argument("--expect", required=True)
    a = p.parse_args()
    kve, kcu, hash_fn = load(a.engines)

    def new_publisher():
        # After a shutdown ZMQ releases the ports asynchronously: a restarted engine binds
        # them again once they are free.
        S.wait_free([a.events, a.replay])
        deadline = time.time() + 10
        while True:
            try:
                return kve.ZmqEventPublisher(
                    data_parallel_rank=0,
                    endpoint=S.loopback_bind(a.events),
                    replay_endpoint=f"tcp://127.0.0.1:{a.replay}",
                )
            except Exception as e:  # zmq.ZMQError: address in use
                if time.time() > deadline:
                    raise
                print(f"binding again: {e}", file=sys.stderr)
                time.sleep(0.2)

    pub = new_publisher()
    if a.scenario == "replay":
        pub._pub = DropOnce(pub._pub, 1)
    ctx = {"publisher": pub, "new_publisher": new_publisher}
    S.ready()
    S.wait_go(a.go)
    tracker, base = load_offloading(a.engines)
    eng = Engine(kve, kcu, hash_fn, tracker, base)
    tiers = SCENARIOS[a.scenario](eng, pub, ctx)
    # Let the publisher thread send what is queued before the expectation is announced.
    pub = ctx["publisher"]
    deadline = time.time() + 10
    while not pub._event_queue.empty() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    expect = {
        "block_size": BS,
        "tiers": {t: v for t, v in tiers.items() if t not in ("not_gpu", "gone")},
        "not_gpu": tiers.get("not_gpu", []),
        "gone": tiers.get("gone", []),
    }
    S.write_expect(a.expect, expect)
    S.linger()


if __name__ == "__main__":
    main()
