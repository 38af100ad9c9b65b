"""Plays a named scenario through SGLang's own KV-event code of the pinned sglang 0.5.23 wheel,
unmodified: the publisher (sglang/srt/disaggregation/kv_events.py: ZmqEventPublisher,
BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch) and the radix cache's event recorder
(sglang/srt/mem_cache/events.py: KVCacheEventRecorder, which turns radix-tree nodes into
events exactly as RadixCache/HiRadixCache call it: record_store on insert, with
medium=CPU_PINNED on host write-back, record_remove on eviction, record_all_cleared on reset).
For the conformance test integration/tests/engine_sglang.rs.

Stand-ins, and why: RadixCache itself needs torch (tensor values, devices), so the tree here is
a small one of plain nodes carrying what the recorder reads (key token ids, extra_key,
cache_salt, bigram flag, parent, hash values), split the way RadixCache splits (a split node
keeps the page hashes of its part). The page hash (a C++ extension in the wheel, not shipped as
Python) is a SHA-256 page chain written here; consumers must not depend on its values.

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


def page_hashes(key, prior_hex, page_size):
    """Stand-in for SGLang's native page hash: SHA-256 over each page's token ids chained on
    the previous page's digest; one hex string per page (as the recorder expects)."""
    raw = key.token_ids if hasattr(key, "token_ids") else list(key)
    n = len(key)
    out, prior = [], bytes.fromhex(prior_hex) if prior_hex else b""
    for start in range(0, n, page_size):
        page = raw[start : min(start + page_size, n) + (1 if getattr(key, "is_bigram", False) else 0)]
        h = hashlib.sha256(prior + b"".join(int(t).to_bytes(8, "little") for t in page))
        prior = h.digest()
        out.append(h.hexdigest())
    return out


def int64_of_hex(h):
    v = int(h[:16], 16)
    return v - (1 << 64) if v >= (1 << 63) else v


def load(root):
    S.package(root, "sglang")
    S.package(root, "sglang.srt")
    S.package(root, "sglang.srt.disaggregation")
    S.package(root, "sglang.srt.mem_cache")
    # Parallel layout and address parsing: only for rank selection and advertising endpoints.
    S.stub("sglang.srt.runtime_context", get_parallel=lambda: S.Anything())
    S.package(root, "sglang.srt.utils")
    S.stub("sglang.srt.utils.network")

    def node_hashes(node, page_size):
        parent = None
        if node.parent is not None and node.parent.hash_value:
            parent = node.parent.hash_value[-1]
        return page_hashes(node.key, parent, page_size)

    def event_hashes(node, page_size):
        # Namespaced keys (extra_key, cache_salt) are hashed from their tokens alone in the
        # default format: the same values as an unnamespaced chain.
        if node.event_hash_value is None:
            parent = node.parent.event_hash_value[-1] if node.parent and node.parent.event_hash_value else None
            node.event_hash_value = page_hashes(node.key, parent, page_size)
        return node.event_hash_value

    S.stub(
        "sglang.srt.mem_cache.utils",
        compute_node_hash_values=node_hashes,
        compute_node_event_hash_values=event_hashes,
        hash_str_to_int64=int64_of_hex,
    )
    import sglang.srt.disaggregation.kv_events as kve
    import sglang.srt.mem_cache.events as ev

    return kve, ev


class Key:
    """What the recorder reads of a RadixKey."""

    def __init__(self, tokens, extra_key=None, cache_salt=None, bigram=False):
        self.token_ids = list(tokens)
        self.extra_key, self.cache_salt, self.is_bigram = extra_key, cache_salt, bigram

    def __len__(self):
        # A bigram view over n+1 raw tokens has n logical entries.
        return len(self.token_ids) - 1 if self.is_bigram else len(self.token_ids)


class Node:
    def __init__(self, key, parent):
        self.key, self.parent = key, parent
        self.hash_value = None
        self.event_hash_value = None


class Tree:
    """The radix tree's shape as RadixCache builds it: insert below a node, split a node."""

    def __init__(self, rec, page_size):
        self.rec, self.page = rec, page_size
        self.root = Node(Key([]), None)
        self.root.hash_value = []
        self.root.event_hash_value = []

    def insert(self, parent, tokens, medium=None, **key):
        n = Node(Key(tokens, **key), parent)
        self.rec.record_store(n, medium=medium)
        return n

    def split(self, node, at):
        """Splits `node` after `at` logical tokens (page aligned): the new parent keeps the
        first pages' hashes (as RadixCache's _split_node does); no event."""
        k = node.key
        pages = at // self.page
        head = Node(Key(k.token_ids[:at], k.extra_key, k.cache_salt, k.is_bigram), node.parent)
        if k.is_bigram:
            head.key.token_ids = k.token_ids[: at + 1]
        for attr in ("hash_value", "event_hash_value"):
            v = getattr(node, attr)
            if v is not None:
                setattr(head, attr, v[:pages])
                setattr(node, attr, v[pages:])
        node.key = Key(k.token_ids[at:], k.extra_key, k.cache_salt, k.is_bigram)
        node.parent = head
        return head


def toks(seed, n):
    return [(seed * 7919 + i * 31) % 50000 + 1 for i in range(n)]


def flush(rec, kve, pub):
    events = rec.take()
    if events:
        pub.publish(kve.KVEventBatch(ts=time.time(), events=events))


def sc_pages(t, rec, kve, pub, K):
    P = t.page
    a = toks(1, 4 * max(P, K))
    na = t.insert(t.root, a)
    flush(rec, kve, pub)
    # A second request shares a's first pages: RadixCache splits a's node there and inserts
    # the rest below the split.
    share = 2 * max(P, K)
    b = a[:share] + toks(2, 2 * max(P, K))
    head = t.split(na, share)
    t.insert(head, b[share:])
    flush(rec, kve, pub)
    # a's tail node is evicted.
    rec.record_remove(na)
    flush(rec, kve, pub)
    return {"GPU": S.prefixes(a[:share], K) + S.prefixes(b, K)[share // K :]}


def sc_bigram(t, rec, kve, pub, K):
    # EAGLE: the tree is keyed by token pairs (t_i, t_i+1) over n+1 raw tokens.
    raw = toks(3, 3 * K + 1)
    t.insert(t.root, raw, bigram=True)
    flush(rec, kve, pub)
    return {"GPU": S.prefixes(raw[: 3 * K], K)}


def sc_extra_key(t, rec, kve, pub, K):
    # Two namespaces (extra_key) with the same tokens: apart in the tree, one hash in events.
    a = toks(4, 2 * K)
    n1 = t.insert(t.root, a, extra_key="ns-one")
    t.insert(t.root, a, extra_key="ns-two")
    flush(rec, kve, pub)
    rec.record_remove(n1)
    flush(rec, kve, pub)
    return {"GPU": S.prefixes(a, K)}


def sc_hicache(t, rec, kve, pub, K):
    a = toks(5, 3 * K)
    n = t.insert(t.root, a)
    flush(rec, kve, pub)
    # HiCache writes the node back to host memory, then the device copy is evicted.
    rec.record_store(n, medium=kve.StorageMedium.CPU)
    flush(rec, kve, pub)
    rec.record_remove(n)
    flush(rec, kve, pub)
    return {"CPU": S.prefixes(a, K)}


def sc_flush(t, rec, kve, pub, K):
    t.insert(t.root, toks(6, 2 * K))
    flush(rec, kve, pub)
    # /flush_cache resets the tree.
    rec.record_all_cleared()
    flush(rec, kve, pub)
    t.root = Tree(rec, t.page).root
    b = toks(7, 2 * K)
    t.insert(t.root, b)
    flush(rec, kve, pub)
    return {"GPU": S.prefixes(b, K)}


def sc_replay(t, rec, kve, pub, K):
    P = t.page
    a = toks(8, 3 * max(P, K))
    parent = t.root
    for i in range(3):
        chunk = a[i * max(P, K) : (i + 1) * max(P, K)]
        parent = t.insert(parent, chunk)
        flush(rec, kve, pub)  # the second batch is dropped on PUB
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
    kve, ev = load(a.engines)
    # SGLang's own switch for binding a concrete (loopback) address.
    pub = kve.ZmqEventPublisher(
        attn_dp_rank=0,
        endpoint=f"tcp://127.0.0.1:{a.events}",
        replay_endpoint=f"tcp://127.0.0.1:{a.replay}",
        bind=True,
    )
    if a.scenario == "replay":
        pub._pub = DropOnce(pub._pub, 1)
    rec = ev.KVCacheEventRecorder(enabled=True, page_size=a.page_size)
    tree = Tree(rec, a.page_size)
    S.ready()
    S.wait_go(a.go)
    tiers = SCENARIOS[a.scenario](tree, rec, kve, pub, a.block_size)
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
