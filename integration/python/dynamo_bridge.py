"""Puts kvroute's simulated workers behind NVIDIA Dynamo's KV router (ai-dynamo 1.6.1).

Dynamo's frontend (`python -m dynamo.frontend --router-mode kv`) routes only to workers that
register through Dynamo's runtime and serve its request plane; it cannot be pointed at an
OpenAI-compatible URL. Three roles, one process each, started by stack/src/dynamo.rs:

  worker  registers one simulated worker as a Dynamo worker (token-id input, chat and
          completions), forwards each preprocessed request (token ids, max_tokens) to the
          worker's /v1/completions, streams the answer back as token ids, and relays the
          worker's vLLM-format ZMQ KV events into Dynamo's event plane (Dynamo's own
          KvEventPublisher relay mode, as dynamo.vllm does for a real vLLM).
  broker  a ZMQ XSUB/XPUB relay on 127.0.0.1 for Dynamo's event plane in broker mode
          (DYN_ZMQ_BROKER_URL): without a broker every Dynamo event publisher binds its own
          PUB socket on 0.0.0.0, which no setting changes; with one, publishers and subscribers
          connect to this relay instead and nothing listens beyond loopback.
  frontend  Dynamo's frontend itself (`python -m dynamo.frontend ARGS`, unchanged), only so that
          it too exits when its parent dies.

Every listener binds 127.0.0.1: the ports come from the command line, the request plane's
host from DYN_TCP_RPC_HOST. The process exits on SIGTERM/SIGINT or when its parent dies.
Nothing here logs prompt or output text.
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("dynamo_bridge")


def loopback_env(broker: str | None) -> None:
    """Dynamo's runtime settings for a loopback-only worker; set before dynamo is imported."""
    os.environ.setdefault("DYN_TCP_RPC_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_EVENT_PLANE_HOST", "127.0.0.1")
    if broker:
        xsub, xpub = broker.split(",")
        os.environ["DYN_ZMQ_BROKER_URL"] = (
            f"xsub=tcp://127.0.0.1:{int(xsub)} , xpub=tcp://127.0.0.1:{int(xpub)}"
        )


def watch_parent(stop) -> None:
    """Calls `stop` once this process's parent has gone (it is re-parented)."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        stop()

    threading.Thread(target=loop, daemon=True).start()


# ---- frontend ------------------------------------------------------------------------------


def run_frontend(args: list[str]) -> None:
    """Dynamo's own `python -m dynamo.frontend ARGS`, unchanged, in this process (same pid), with
    its stdout sent to stderr (one log) and a SIGTERM to itself once the parent has gone."""
    import runpy

    os.dup2(2, 1)
    watch_parent(lambda: os.kill(os.getpid(), signal.SIGTERM))
    sys.argv = ["dynamo.frontend", *args]
    runpy.run_module("dynamo.frontend", run_name="__main__", alter_sys=True)


# ---- broker -------------------------------------------------------------------------------


def run_broker(a: argparse.Namespace) -> None:
    """XSUB (publishers connect) -> XPUB (subscribers connect), both on 127.0.0.1."""
    import zmq

    ctx = zmq.Context.instance()
    xsub = ctx.socket(zmq.XSUB)
    xpub = ctx.socket(zmq.XPUB)
    xsub.bind(f"tcp://127.0.0.1:{a.xsub_port}")
    xpub.bind(f"tcp://127.0.0.1:{a.xpub_port}")

    def stop(*_) -> None:
        # Terminating the context makes zmq.proxy return.
        threading.Thread(target=ctx.term, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watch_parent(stop)
    print(f"broker ready xsub {a.xsub_port} xpub {a.xpub_port}", flush=True)
    try:
        zmq.proxy(xsub, xpub)
    except zmq.ContextTerminated:
        pass
    finally:
        xsub.close(linger=0)
        xpub.close(linger=0)


# ---- worker -------------------------------------------------------------------------------


def completion_chunks(raw_lines):
    """The `choices` of an OpenAI SSE stream, chunk by chunk (an async generator)."""

    async def gen():
        async for raw in raw_lines:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            for choice in json.loads(data).get("choices", []):
                yield choice

    return gen()


async def sim_gpu_blocks(http, sim_url: str) -> int | None:
    """The worker's KV capacity in blocks, from vLLM's `vllm:cache_config_info` gauge."""
    try:
        async with http.get(f"{sim_url}/metrics") as resp:
            text = await resp.text()
    except Exception:  # noqa: BLE001 - the default capacity is used instead
        return None
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            for label in line[line.index("{") + 1 : line.index("}")].split(","):
                key, _, value = label.partition("=")
                if key.strip() == "num_gpu_blocks":
                    return int(value.strip().strip('"'))
    return None


async def run_worker(a: argparse.Namespace) -> None:
    import aiohttp
    from tokenizers import Tokenizer

    from dynamo.llm import (
        KvEventPublisher,
        ModelInput,
        ModelRuntimeConfig,
        ModelType,
        WorkerType,
        register_model,
    )
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq", response_plane="tcp")
    endpoint = runtime.endpoint(a.endpoint)
    # The sim answers text; Dynamo's frontend wants the generated token ids (it detokenizes).
    tokenizer = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json"))
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=a.request_timeout))
    url = f"{a.sim_url}/v1/completions"

    # Relay: subscribe to the sim's PUB socket, republish as Dynamo KV events for this worker.
    relay = KvEventPublisher(
        endpoint=endpoint, kv_block_size=a.block_size, zmq_endpoint=a.sim_events, zmq_topic=""
    )

    async def generate(request, context):
        """One Dynamo PreprocessedRequest -> the sim, streamed back as LLMEngineOutput dicts."""
        prompt = request.get("token_ids") or []
        stop = request.get("stop_conditions") or {}
        body = {
            "model": a.sim_model,
            "prompt": prompt,
            "max_tokens": stop.get("max_tokens") or a.default_max_tokens,
            "stream": True,
        }
        if stop.get("ignore_eos"):
            body["ignore_eos"] = True
        produced = 0
        async with http.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"worker {a.index} answered HTTP {resp.status}")
            async for choice in completion_chunks(resp.content):
                text = choice.get("text") or ""
                ids = tokenizer.encode(text, add_special_tokens=False).ids if text else []
                produced += len(ids)
                out = {"index": 0, "token_ids": ids}
                finish = choice.get("finish_reason")
                if finish:
                    out["finish_reason"] = finish
                    out["completion_usage"] = {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": produced,
                        "total_tokens": len(prompt) + produced,
                    }
                yield out

    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = await sim_gpu_blocks(http, a.sim_url) or a.total_kv_blocks
    rc.max_num_seqs = a.max_num_seqs
    rc.kv_event_publishing_enabled = True
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        a.model_dir,
        a.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=a.block_size,
        runtime_config=rc,
    )

    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))

    def stop() -> None:
        loop.call_soon_threadsafe(serving.cancel)

    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, stop)
    watch_parent(stop)
    # The line stack/src/dynamo.rs waits for: Dynamo's id for this worker (the router's
    # worker_id, the frontend's nvext.worker_id) next to our worker's index.
    print(f"bridge ready worker {a.index} instance {endpoint.connection_id()}", flush=True)
    try:
        await serving
    except asyncio.CancelledError:
        pass
    finally:
        relay.shutdown()
        await http.close()
        runtime.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    b = sub.add_parser("broker", help="ZMQ XSUB/XPUB relay for Dynamo's event plane")
    b.add_argument("--xsub-port", type=int, required=True)
    b.add_argument("--xpub-port", type=int, required=True)
    w = sub.add_parser("worker", help="one simulated worker as a Dynamo worker")
    w.add_argument("--index", type=int, required=True, help="the worker's index (logs only)")
    w.add_argument("--sim-url", required=True, help="http://127.0.0.1:P")
    w.add_argument("--sim-events", required=True, help="the sim's KV-event PUB, tcp://127.0.0.1:E")
    w.add_argument("--sim-model", required=True, help="the model name the sim serves")
    w.add_argument("--model-dir", required=True, help="tokenizer.json + config.json")
    w.add_argument("--model-name", required=True, help="the name Dynamo serves")
    w.add_argument("--block-size", type=int, required=True)
    w.add_argument("--broker", help="XSUB,XPUB ports of the event-plane broker on 127.0.0.1")
    w.add_argument("--endpoint", default="dynamo.backend.generate")
    w.add_argument("--total-kv-blocks", type=int, default=26000, help="unless the sim says")
    w.add_argument("--max-num-seqs", type=int, default=256)
    w.add_argument("--default-max-tokens", type=int, default=16)
    w.add_argument("--request-timeout", type=float, default=600.0)
    sub.add_parser("frontend", help="python -m dynamo.frontend ARGS, stopped with its parent")
    if sys.argv[1:2] == ["frontend"]:
        # Every further argument is the frontend's own.
        run_frontend(sys.argv[2:])
        return
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if a.role == "broker":
        run_broker(a)
        return
    loopback_env(a.broker)
    import uvloop

    uvloop.run(run_worker(a))


if __name__ == "__main__":
    main()
