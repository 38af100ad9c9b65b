"""Plays a named scenario through SGLang's own KV-cache code of the pinned sglang 0.5.23 wheel,
unmodified: its RadixCache (sglang/srt/mem_cache/radix_cache.py, built with its own
`create_simulated`, driven by insert / evict / reset, EAGLE's bigram keys, extra_key
namespaces), whose event recorder (mem_cache/events.py) makes the events, published by its
ZmqEventPublisher (sglang/srt/disaggregation/kv_events.py) in KVEventBatch batches.
For the conformance test integration/tests/suite/engine_sglang.rs.

Stand-ins, and why:
- torch: RadixCache keeps KV indices in tensors; a list-backed `Tensor` with the few operations
  it uses (tensor, cat, empty, slicing, to) stands in, values are the token ids (RadixCache's
  own fallback when no KV indices are given);
- the page hash: a C++ extension in the wheel (not shipped as Python); a SHA-256 page chain
  written here stands in (consumers must not depend on engine hash values);
- metrics collector, allocator and memory-pool modules, runtime context, kernels: not used by
  a simulated cache with events on; the allocator is a no-op object;
- HiCache's host tier: HiRadixCache needs a cache controller and host memory pool; the
  host write-back is played through the same recorder call HiRadixCache makes
  (record_store(node, medium=StorageMedium.CPU)) on a node of the real RadixCache.

    sglang_driver.py --engines .cache/engines/sglang --events PORT --replay PORT
                     --scenario NAME --go FILE --expect FILE --page-size P --block-size K

`--block-size` is kvroute's block size for the model: the expectation lists the chains' full
blocks of K tokens (see vllm_driver.py for the protocol and the expectation's format).
"""

import argparse
import hashlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_stubs as S  # noqa: E402


class Tensor:
    """List-backed stand-in for the torch tensors RadixCache keeps its values in."""

    def __init__(self, data):
        self.data = list(data)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return Tensor(self.data[i]) if isinstance(i, slice) else self.data[i]

    def __iter__(self):
        return iter(self.data)

    def to(self, *a, **k):
        return Tensor(self.data)

    def clone(self):
        return Tensor(self.data)

    def tolist(self):
        return list(self.data)

    def numel(self):
        return len(self.data)


def native_hash(key, prior_digest, page_size):
    """Stand-in for the wheel's native page hash (see the module doc): one hex digest per
    page of `key` (a RadixKey, bigram pages include their boundary token), chained."""
    raw = list(getattr(key, "token_ids", key))
    n = len(key)
    bigram = getattr(key, "is_bigram", False)
    out, prior = [], prior_digest or b""
    for start in range(0, n, page_size):
        page = raw[start : min(start + page_size, n) + (1 if bigram else 0)]
        h = hashlib.sha256(prior + b"".join(int(t).to_bytes(8, "little", signed=True) for t in page))
        prior = h.digest()
        out.append(h.hexdigest())
    return out


class Allocator:
    """A simulated cache's allocator: frees nothing (there is no memory pool)."""

    device = "cpu"

    def free(self, *a, **k):
        pass

    def free_segment(self, *a, **k):
        pass


def load(root):
    import types

    S.stub(
        "torch",
        Tensor=Tensor,
        int64="int64",
        int32="int32",
        tensor=lambda d, **k: Tensor(d),
        cat=lambda ts, **k: Tensor([x for t in ts for x in t]),
        empty=lambda shape, **k: Tensor([0] * (shape[0] if isinstance(shape, tuple) else shape)),
        device=lambda d: d,
        iinfo=lambda dt: types.SimpleNamespace(max=2**63 - 1),
    )
    for name in [
        "sglang",
        "sglang.srt",
        "sglang.srt.disaggregation",
        "sglang.srt.mem_cache",
        "sglang.srt.mem_cache.cpp_utils",
        "sglang.srt.utils",
        "sglang.srt.observability",
    ]:
        S.package(root, name)
    # Parallel layout, observability, address parsing: rank selection and metrics only.
    S.stub(
        "sglang.srt.runtime_context",
        get_parallel=lambda: S.Anything(),
        get_observability=lambda: S.Anything(),
    )
    S.stub("sglang.srt.utils.network")
    S.stub("sglang.srt.utils.common", ceil_align=lambda x, a: (x + a - 1) // a * a)
    S.stub("sglang.srt.observability.metrics_collector")
    S.stub("sglang.srt.environ", envs=S.Anything())
    for name in [
        "sglang.srt.mem_cache.allocator",
        "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.mem_cache.unified_cache",
        "sglang.srt.mem_cache.unified_cache.component_type",
        "sglang.kernels",
        "sglang.kernels.ops",
        "sglang.kernels.ops.kvcache",
        "sglang.kernels.ops.kvcache.mla_buffer",
    ]:
        S.stub(name)
    S.stub("sglang.srt.mem_cache.cpp_utils.native_hash", get_native_hash=native_hash)
    import sglang.srt.disaggregation.kv_events as kve
    import sglang.srt.mem_cache.base_prefix_cache as bpc
    import sglang.srt.mem_cache.radix_cache as rc

    return kve, rc, bpc


def toks(seed, n):
    return [(seed * 7919 + i * 31) % 50000 + 1 for i in range(n)]


class Engine:
    """SGLang's radix cache with events on, and its publisher."""

    def __init__(self, kve, rc, bpc, pub, page_size, eagle=False):
        self.kve, self.rc, self.bpc, self.pub = kve, rc, bpc, pub
        self.cache = rc.RadixCache.create_simulated(
            mock_allocator=Allocator(), page_size=page_size, enable_kv_cache_events=True
        )
        self.cache.is_eagle = eagle
        self.page = page_size

    def key(self, tokens, **kw):
        from array import array

        return self.rc.RadixKey(array("q", tokens), **kw)

    def insert(self, tokens, **kw):
        r = self.cache.insert(self.bpc.InsertParams(key=self.key(tokens, **kw)))
        time.sleep(0.01)  # distinct access times for the LRU
        return r

    def evict(self, n_tokens):
        return self.cache.evict(self.bpc.EvictParams(num_tokens=n_tokens))

    def flush(self):
        """What the scheduler does each step: publish what the cache recorded."""
        events = self.cache.kv_events.take()
        if events:
            self.pub.publish(self.kve.KVEventBatch(ts=time.time(), events=events))


def sc_pages(e, K):
    unit = max(e.page, K)
    a = toks(1, 4 * unit)
    e.insert(a)
    e.flush()
    # A second request shares a's first half: the tree splits a's node there.
    share = 2 * unit
    b = a[:share] + toks(2, 2 * unit)
    e.insert(b)
    e.flush()
    # Memory pressure: the least recently used leaf (a's tail) is evicted.
    e.evict(2 * unit)
    e.flush()
    return {"GPU": S.prefixes(b, K), "gone": S.prefixes(a, K)[share // K :]}


def sc_bigram(e, K):
    # EAGLE: the tree is keyed by token pairs (t_i, t_i+1) over the raw tokens.
    raw = toks(3, 3 * K + 1)
    e.insert(raw)
    e.flush()
    return {"GPU": S.prefixes(raw[: 3 * K], K)}


def sc_extra_key(e, K):
    # Two namespaces (extra_key) with the same tokens: apart in the tree, one hash in events.
    a = toks(4, 2 * K)
    e.insert(a, extra_key="ns-one")
    e.insert(a, extra_key="ns-two")
    e.flush()
    # The older namespace's leaf is evicted; the other still holds the blocks.
    e.evict(len(a))
    e.flush()
    return {"GPU": S.prefixes(a, K)}


def sc_hicache(e, K):
    a = toks(5, 3 * K)
    e.insert(a)
    e.flush()
    node = e.cache.match_prefix(e.bpc.MatchPrefixParams(key=e.key(a))).last_device_node
    # HiCache writes the node back to host memory (HiRadixCache's recorder call), then the
    # device copy is evicted.
    e.cache.kv_events.record_store(node, medium=e.kve.StorageMedium.CPU)
    e.flush()
    e.evict(len(a))
    e.flush()
    return {"CPU": S.prefixes(a, K)}


def sc_flush(e, K):
    e.insert(toks(6, 2 * K))
    e.flush()
    # /flush_cache resets the tree.
    e.cache.reset()
    e.flush()
    b = toks(7, 2 * K)
    e.insert(b)
    e.flush()
    return {"GPU": S.prefixes(b, K)}


def sc_replay(e, K):
    unit = max(e.page, K)
    a = toks(8, 3 * unit)
    for i in range(3):
        e.insert(a[: (i + 1) * unit])
        e.flush()  # the second batch is dropped on PUB
    return {"GPU": S.prefixes(a, K)}


SCENARIOS = {
    "pages": sc_pages,
    "bigram": sc_bigram,
    "extra_key": sc_extra_key,
    "hicache": sc_hicache,
    "flush": sc_flush,
    "replay": sc_replay,
}


class DropOnce:
    """Swallows the PUB send of one sequence number (the publisher still buffers it)."""

    def __init__(self, sock, seq):
        self.sock, self.seq, self.dropped = sock, seq, False

    def send_multipart(self, frames, *a, **k):
        if int.from_bytes(frames[1], "big") == self.seq and not self.dropped:
            self.dropped = True
            return None
        return self.sock.send_multipart(frames, *a, **k)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--engines", required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--replay", type=int, required=True)
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--go", required=True)
    p.add_argument("--expect", required=True)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args()
    kve, rc, bpc = load(a.engines)
    # SGLang's own switch for binding a concrete (loopback) address.
    pub = kve.ZmqEventPublisher(
        attn_dp_rank=0,
        endpoint=f"tcp://127.0.0.1:{a.events}",
        replay_endpoint=f"tcp://127.0.0.1:{a.replay}",
        bind=True,
    )
    if a.scenario == "replay":
        pub._pub = DropOnce(pub._pub, 1)
    eng = Engine(kve, rc, bpc, pub, a.page_size, eagle=a.scenario == "bigram")
    S.ready()
    S.wait_go(a.go)
    # The cache's construction recorded a reset (AllBlocksCleared): published first.
    eng.flush()
    tiers = SCENARIOS[a.scenario](eng, a.block_size)
    deadline = time.time() + 10
    while not pub._event_queue.empty() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    S.write_expect(
        a.expect,
        {
            "block_size": a.block_size,
            "tiers": {t: v for t, v in tiers.items() if t not in ("not_gpu", "gone")},
            "not_gpu": tiers.get("not_gpu", []),
            "gone": tiers.get("gone", []),
        },
    )
    S.linger()


if __name__ == "__main__":
    main()
