"""Loading an engine's own modules from its unpacked wheel (.cache/engines/<name>/) without its
package __init__ files and without the dependencies publishing does not need (CUDA, torch,
configuration machinery). The engine's files are imported as they are; only the modules named
here are replaced, each by a small stand-in that says what it stands in for.

Also the driver side of the conformance protocol shared by the vLLM and SGLang drivers:
`READY` on stdout once the publisher is bound, then wait for the test's go file, play the
scenario, and write the expected knowledge as JSON to the expect file.
"""

import json
import logging
import os
import sys
import time
import types


class Anything:
    """Stand-in for a class or value only used in annotations or code paths not taken."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return Anything()

    def __getattr__(self, name):
        return Anything()

    @classmethod
    def register(cls, *args, **kwargs):
        return lambda f: f


def package(root, name, **attrs):
    """Registers package `name` (its directory under `root`) without running its __init__:
    its real submodules still import from their files."""
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(root, *name.split("."))]
    m.__dict__.update(attrs)
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, m)
    return m


def stub(name, **attrs):
    """Registers module `name` as a stand-in holding `attrs`; any other attribute is an
    `Anything` (for names only used in annotations)."""
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__getattr__ = lambda attr: Anything  # PEP 562
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, m)
    return m


class _OnceLogger(logging.LoggerAdapter):
    """vLLM's logger has *_once variants."""

    def info_once(self, msg, *a, **k):
        self.info(msg, *a)

    def warning_once(self, msg, *a, **k):
        self.warning(msg, *a)

    def debug_once(self, msg, *a, **k):
        self.debug(msg, *a)


def init_logger(name):
    return _OnceLogger(logging.getLogger(name), {})


def loopback_bind(port):
    """A PUB endpoint the engines' publishers bind (not connect) and that listens on 127.0.0.1
    only: vLLM binds endpoints holding `*` or `::`, and ZMQ binds the IPv4-mapped address
    `::ffff:127.0.0.1` as 127.0.0.1."""
    return f"tcp://[::ffff:127.0.0.1]:{port}"


def wait_free(ports, timeout=10.0):
    """Waits until every port can be bound on 127.0.0.1 again (as ZMQ binds: SO_REUSEADDR),
    e.g. after a publisher's shutdown closed its sockets."""
    import socket

    deadline = time.time() + timeout
    for port in ports:
        while True:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                s.close()


def ready():
    print("READY", flush=True)


def wait_go(path, timeout=120.0):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit(f"no go file {path} within {timeout} s")
        time.sleep(0.05)


def write_expect(path, expect):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(expect, f)
    os.replace(tmp, path)


def linger():
    """Keeps the process (and the publisher's replay socket) up until the test kills it."""
    while True:
        time.sleep(1)


def prefixes(tokens, block_size):
    """Every full-block prefix of `tokens`: one per block, the block's identity in kvroute's
    chain hash (the test hashes each prefix and keeps the last block's hash)."""
    return [tokens[: (i + 1) * block_size] for i in range(len(tokens) // block_size)]
