"""Drives kvroute through Envoy with the official OpenAI and Anthropic Python SDKs.

Usage: sdk_check.py BASE_URL MODEL

Every call runs twice with the same prompt (the second should reuse the first's KV cache) through
each SDK's raw-response API, which gives the filter's decision header. Prints one JSON object:
{"results": [{"name", "ok", "error", "runs": [{"cached", "decision", "worker", "finish",
"chars"}]}]}. Never prints prompt text.
"""

import json
import sys
import traceback

import anthropic
import openai

DECISION = "x-kvroute-decision"
WORKER = "x-worker-id"

WORDS = (
    "route cache prefix block token worker queue decode prefill engine batch stream "
    "latency window tenant salt model adapter shard replica event snapshot bundle"
).split()


def prompt(name: str, words: int = 160) -> str:
    """A deterministic text of `words` words, different for each call name."""
    h = 2166136261
    for c in name.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    out = []
    for i in range(words):
        h = (h * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(WORDS[h % len(WORDS)])
        if i % 13 == 12:
            out[-1] += "."
    return f"Conversation {name}: " + " ".join(out)


def run_of(raw, cached, finish, text):
    return {
        "cached": cached,
        "decision": raw.headers.get(DECISION),
        "worker": raw.headers.get(WORKER),
        "finish": finish,
        "chars": len(text or ""),
    }


def chat(oa, model, name):
    raw = oa.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt(name)}],
        max_tokens=8,
    )
    c = raw.parse()
    u = c.usage
    cached = u.prompt_tokens_details.cached_tokens if u and u.prompt_tokens_details else None
    return run_of(raw, cached, c.choices[0].finish_reason, c.choices[0].message.content)


def chat_stop(oa, model, name):
    raw = oa.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt(name)}],
        max_tokens=48,
        stop=["e"],
    )
    c = raw.parse()
    u = c.usage
    cached = u.prompt_tokens_details.cached_tokens if u and u.prompt_tokens_details else None
    text = c.choices[0].message.content or ""
    if "e" in text:
        raise AssertionError("the stop string is in the output")
    return run_of(raw, cached, c.choices[0].finish_reason, text)


def chat_stream(oa, model, name):
    raw = oa.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt(name)}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, cached = "", None, None
    for chunk in raw.parse():
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    return run_of(raw, cached, finish, text)


def completions(oa, model, name):
    raw = oa.completions.with_raw_response.create(model=model, prompt=prompt(name), max_tokens=8)
    c = raw.parse()
    u = c.usage
    cached = u.prompt_tokens_details.cached_tokens if u and u.prompt_tokens_details else None
    return run_of(raw, cached, c.choices[0].finish_reason, c.choices[0].text)


def responses(oa, model, name):
    raw = oa.responses.with_raw_response.create(
        model=model,
        instructions="Answer briefly.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": prompt(name)}]}],
        max_output_tokens=8,
    )
    r = raw.parse()
    cached = r.usage.input_tokens_details.cached_tokens if r.usage else None
    finish = r.status if r.incomplete_details is None else f"{r.status}:{r.incomplete_details.reason}"
    return run_of(raw, cached, finish, r.output_text)


def responses_stream(oa, model, name):
    raw = oa.responses.with_raw_response.create(
        model=model, input=prompt(name), max_output_tokens=8, stream=True
    )
    text, finish, cached, kinds = "", None, None, []
    for ev in raw.parse():
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type in ("response.completed", "response.incomplete"):
            r = ev.response
            finish = r.status
            cached = r.usage.input_tokens_details.cached_tokens if r.usage else None
            if r.output_text != text:
                raise AssertionError("the final response's text is not the deltas'")
    if kinds[:2] != ["response.created", "response.in_progress"]:
        raise AssertionError(f"stream starts with {kinds[:2]}")
    return run_of(raw, cached, finish, text)


def messages(an, model, name):
    raw = an.messages.with_raw_response.create(
        model=model,
        max_tokens=8,
        system="Answer briefly.",
        messages=[{"role": "user", "content": prompt(name)}],
    )
    m = raw.parse()
    text = "".join(b.text for b in m.content if b.type == "text")
    return run_of(raw, m.usage.cache_read_input_tokens, m.stop_reason, text)


def messages_stop(an, model, name):
    raw = an.messages.with_raw_response.create(
        model=model,
        max_tokens=48,
        stop_sequences=["e"],
        messages=[{"role": "user", "content": prompt(name)}],
    )
    m = raw.parse()
    text = "".join(b.text for b in m.content if b.type == "text")
    if m.stop_reason == "stop_sequence" and m.stop_sequence != "e":
        raise AssertionError(f"stop_sequence {m.stop_sequence!r}")
    return run_of(raw, m.usage.cache_read_input_tokens, m.stop_reason, text)


def messages_stream(an, model, name):
    # The SDK's own stream helper: it accumulates the events into the final message.
    with an.messages.stream(
        model=model, max_tokens=8, messages=[{"role": "user", "content": prompt(name)}]
    ) as stream:
        text = "".join(stream.text_stream)
        m = stream.get_final_message()
        raw = stream.response
    if "".join(b.text for b in m.content if b.type == "text") != text:
        raise AssertionError("the final message's text is not the deltas'")
    return run_of(raw, m.usage.cache_read_input_tokens, m.stop_reason, text)


CALLS = [
    ("chat", "openai", chat),
    ("chat_stop", "openai", chat_stop),
    ("chat_stream", "openai", chat_stream),
    ("completions", "openai", completions),
    ("responses", "openai", responses),
    ("responses_stream", "openai", responses_stream),
    ("messages", "anthropic", messages),
    ("messages_stop", "anthropic", messages_stop),
    ("messages_stream", "anthropic", messages_stream),
]


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="kvroute-test", max_retries=0, timeout=30)
    an = anthropic.Anthropic(base_url=base, api_key="kvroute-test", max_retries=0, timeout=30)
    clients = {"openai": oa, "anthropic": an}
    results = []
    for name, sdk, call in CALLS:
        res = {"name": name, "ok": True, "error": None, "runs": []}
        try:
            for _ in range(2):
                res["runs"].append(call(clients[sdk], model, name))
        except Exception as e:  # noqa: BLE001 - reported to the Rust test
            res["ok"] = False
            res["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        results.append(res)
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
