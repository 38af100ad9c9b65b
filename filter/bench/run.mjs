// kvroute-filter-bench: the built filter (`kvroute_filter.wasm`) driven through the proxy-wasm
// ABI under Node's V8, one short chat request after another, so that `node --cpu-prof` names
// the functions a request's callbacks spend their time in. Envoy's own binary is stripped and
// its V8 writes no symbols for wasm code: a profile of Envoy shows only how much time is in
// wasm, not where.
//
// node --no-liftoff filter/bench/run.mjs WASM QWEN3_DIR [REQUESTS] [--threads N] [--inflight K]
//   [--prompt short|8k] [--calls] [--phases]
//
// What it models: Envoy with N worker threads (default 2), each its own instance of the
// module over one shared-data store and one set of shared queues, as Envoy's VMs with one
// vm_id share them; requests go to the threads in turn, K of them (default 16) in flight on
// each thread: a request's headers and body arrive, then the response of the request K
// before it on that thread (headers, a small OpenAI chat completion, the stream's end). The
// plugin configuration is `kvroute-proxybench`'s: one Qwen3 pool of two workers, the bundle
// inline. Each prompt is new (a number leads it), as in `kvroute-proxybench`. The clock is
// the real one; each thread's tick runs when its period has passed. It measures the
// filter's code and its host calls as V8 runs them, not Envoy's: no network, no HTTP codec,
// and the host functions here are JavaScript, not Envoy's C++.
//
// It prints the wall-clock µs per request in each callback, summed over the threads; with
// --calls, the host calls per request by function and shared-data key; with --phases, the
// decision header on and the p50 / p99 of its timers (parse, catch-up, journal, decide).
// Profile: node --no-liftoff --cpu-prof --cpu-prof-dir=D filter/bench/run.mjs ..., then
// node core/turn-bench/run.mjs --summary D/*.cpuprofile 40
import { readFileSync } from "node:fs";
import { WASI } from "node:wasi";

const argv = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = argv.indexOf(name);
  if (i < 0) return dflt;
  const v = argv[i + 1];
  argv.splice(i, 2);
  return v;
};
const threads = Number(flag("--threads", "2"));
const inflight = Number(flag("--inflight", "16"));
const promptKind = flag("--prompt", "short");
const countCalls = argv.includes("--calls");
if (countCalls) argv.splice(argv.indexOf("--calls"), 1);
// The filter's decision header on, and its timers summarised (the header costs a little).
const showPhases = argv.includes("--phases");
if (showPhases) argv.splice(argv.indexOf("--phases"), 1);
const [wasmPath, bundleDir, requestsArg = "20000"] = argv;
if (!wasmPath || !bundleDir || !(threads >= 1) || !(inflight >= 1)) {
  console.error(
    "usage: node --no-liftoff filter/bench/run.mjs WASM QWEN3_DIR [REQUESTS] [--threads N] [--inflight K] [--prompt short|8k]",
  );
  process.exit(2);
}
const requests = Number(requestsArg);

// Status codes and enums of the ABI (proxy-wasm spec, v0.2.1).
const OK = 0, NOT_FOUND = 1, BAD_ARGUMENT = 2, EMPTY = 7, CAS_MISMATCH = 8;
const REQUEST_HEADERS = 0, RESPONSE_HEADERS = 2;
const REQUEST_BODY = 0, RESPONSE_BODY = 1, VM_CONFIGURATION = 6, PLUGIN_CONFIGURATION = 7;

const enc = new TextEncoder();
const dec = new TextDecoder();
const now = () => process.hrtime.bigint();

// What Envoy shares between the VMs of one vm_id.
const shared = new Map(); // key -> { value: Uint8Array, cas }
let nextCas = 1;
const queues = []; // id - 1 -> { name, messages, owner }

const config = JSON.stringify({
  models: [
    {
      name: "qwen3",
      workers: ["127.0.0.1:10001", "127.0.0.1:10002"],
      tokenizer: JSON.parse(readFileSync(`${bundleDir}/tokenizer.json`, "utf8")),
      tokenizer_config: JSON.parse(readFileSync(`${bundleDir}/tokenizer_config.json`, "utf8")),
    },
  ],
  expose_decision_header: showPhases,
});
const RESPONSE = enc.encode(
  '{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}',
);
const SHORT = "Summarize the plot of a short story about a lighthouse keeper.";
const LONG = Array.from({ length: 6400 }, (_, i) => `word${(i * 7919) % 5000}`).join(" ");
const body = (n) =>
  enc.encode(
    JSON.stringify({
      model: "qwen3",
      max_tokens: 1,
      messages: [{ role: "user", content: `${n} ${promptKind === "8k" ? LONG : SHORT}` }],
    }),
  );

const module = await WebAssembly.compile(readFileSync(wasmPath));

// One Envoy worker thread: an instance of the module and the state Envoy keeps for it.
async function thread(index) {
  const t = { index, stream: null, tickMs: 0, lastTick: now(), localReplies: 0 };
  let inst;
  // Views of the module's memory, made again only when it grows (kept cheap, so that a
  // profile shows the module's time rather than this host's).
  let buffer = null, view = null, u8 = null;
  const mem = () => {
    if (inst.exports.memory.buffer !== buffer) {
      buffer = inst.exports.memory.buffer;
      view = new DataView(buffer);
      u8 = new Uint8Array(buffer);
    }
    return view;
  };
  const bytes = (ptr, len) => (mem(), u8.subarray(ptr, ptr + len));
  const str = (ptr, len) => dec.decode(bytes(ptr, len));
  // Copies `data` into memory the module allocates and returns through two out-pointers.
  const give = (data, ptrPtr, sizePtr) => {
    const p = inst.exports.proxy_on_memory_allocate(data.length);
    bytes(p, data.length).set(data);
    mem().setUint32(ptrPtr, p, true);
    mem().setUint32(sizePtr, data.length, true);
    return OK;
  };
  const mapOf = (type) =>
    type === REQUEST_HEADERS ? t.stream?.request : type === RESPONSE_HEADERS ? t.stream?.response : null;
  const pairs = (m) => {
    const entries = [...m.entries()].map(([k, v]) => [enc.encode(k), enc.encode(v)]);
    let size = 4 + 8 * entries.length;
    for (const [k, v] of entries) size += k.length + v.length + 2;
    const out = new Uint8Array(size);
    const dv = new DataView(out.buffer);
    dv.setUint32(0, entries.length, true);
    let at = 4;
    for (const [k, v] of entries) {
      dv.setUint32(at, k.length, true);
      dv.setUint32(at + 4, v.length, true);
      at += 8;
    }
    for (const [k, v] of entries) {
      out.set(k, at);
      at += k.length + 1;
      out.set(v, at);
      at += v.length + 1;
    }
    return out;
  };
  const bufferOf = (type) =>
    type === REQUEST_BODY ? t.stream?.body
      : type === RESPONSE_BODY ? t.stream?.responseBody
        : type === PLUGIN_CONFIGURATION ? enc.encode(config)
          : type === VM_CONFIGURATION ? new Uint8Array(0) : null;
  const properties = (path) => {
    if (path === "plugin_vm_id") return "kvroute";
    if (path === "plugin_root_id") return "kvroute";
    // override_host sends the request to the first address of the list.
    if (path === "upstream\0address") return t.stream?.request.get("x-gateway-destination-endpoint")?.split(",")[0];
    if (path === "response\0code_details") return t.stream?.responseBody ? "via_upstream" : undefined;
    if (path === "response\0code") return t.stream?.responseBody ? "200" : undefined;
    return undefined;
  };
  const metrics = [];
  const env = {
    proxy_log: (level, p, l) => (level >= 3 && console.error(`thread ${index}: ${str(p, l)}`), OK),
    proxy_get_log_level: (p) => (mem().setUint32(p, 2, true), OK),
    proxy_set_tick_period_milliseconds: (ms) => ((t.tickMs = ms), OK),
    proxy_get_current_time_nanoseconds: (p) => {
      // Unix ns as a double (exact to 256 ns), written as two halves: no BigInt per call.
      const ns = (performance.timeOrigin + performance.now()) * 1e6;
      const hi = Math.floor(ns / 4294967296);
      mem().setUint32(p, ns - hi * 4294967296, true);
      view.setUint32(p + 4, hi, true);
      return OK;
    },
    proxy_get_buffer_bytes: (type, start, max, pp, sp) => {
      const b = bufferOf(type);
      if (!b) return NOT_FOUND;
      // Unsigned arguments arrive as signed 32-bit numbers (the SDK asks for usize::MAX).
      return give(b.subarray(start >>> 0, (start >>> 0) + (max >>> 0)), pp, sp);
    },
    proxy_set_buffer_bytes: () => OK,
    proxy_get_header_map_pairs: (type, pp, sp) => {
      const m = mapOf(type);
      return m ? give(pairs(m), pp, sp) : NOT_FOUND;
    },
    proxy_set_header_map_pairs: () => OK,
    proxy_get_header_map_value: (type, kp, kl, pp, sp) => {
      const v = mapOf(type)?.get(str(kp, kl));
      return v === undefined ? NOT_FOUND : give(enc.encode(v), pp, sp);
    },
    proxy_add_header_map_value: (type, kp, kl, vp, vl) => (mapOf(type)?.set(str(kp, kl), str(vp, vl)), OK),
    proxy_replace_header_map_value: (type, kp, kl, vp, vl) => (mapOf(type)?.set(str(kp, kl), str(vp, vl)), OK),
    proxy_remove_header_map_value: (type, kp, kl) => (mapOf(type)?.delete(str(kp, kl)), OK),
    proxy_get_property: (pp, pl, rp, rs) => {
      const v = properties(str(pp, pl).replace(/\0$/, ""));
      return v === undefined ? NOT_FOUND : give(enc.encode(v), rp, rs);
    },
    proxy_set_property: () => OK,
    proxy_get_shared_data: (kp, kl, rp, rs, casp) => {
      const e = shared.get(str(kp, kl));
      if (!e) return NOT_FOUND;
      give(e.value, rp, rs);
      mem().setUint32(casp, e.cas, true);
      return OK;
    },
    proxy_set_shared_data: (kp, kl, vp, vl, cas) => {
      const key = str(kp, kl);
      const e = shared.get(key);
      if (e && cas !== 0 && cas >>> 0 !== e.cas) return CAS_MISMATCH;
      shared.set(key, { value: bytes(vp, vl).slice(), cas: nextCas++ });
      return OK;
    },
    proxy_register_shared_queue: (np, nl, rp) => {
      const name = str(np, nl);
      let i = queues.findIndex((q) => q.name === name);
      if (i < 0) i = queues.push({ name, messages: [], owner: t }) - 1;
      queues[i].owner = t;
      mem().setUint32(rp, i + 1, true);
      return OK;
    },
    proxy_resolve_shared_queue: (vp, vl, np, nl, rp) => {
      const i = queues.findIndex((q) => q.name === str(np, nl));
      if (i < 0) return NOT_FOUND;
      mem().setUint32(rp, i + 1, true);
      return OK;
    },
    proxy_enqueue_shared_queue: (id, vp, vl) => {
      const q = queues[id - 1];
      if (!q) return NOT_FOUND;
      q.messages.push(bytes(vp, vl).slice());
      q.owner.pendingQueues.add(id);
      return OK;
    },
    proxy_dequeue_shared_queue: (id, rp, rs) => {
      const q = queues[id - 1];
      if (!q) return NOT_FOUND;
      if (!q.messages.length) return EMPTY;
      return give(q.messages.shift(), rp, rs);
    },
    proxy_define_metric: (type, np, nl, rp) => {
      metrics.push({ name: str(np, nl), value: 0n });
      mem().setUint32(rp, metrics.length, true);
      return OK;
    },
    proxy_increment_metric: (id, by) => (metrics[id - 1] && (metrics[id - 1].value += BigInt(by)), OK),
    proxy_record_metric: (id, v) => (metrics[id - 1] && (metrics[id - 1].value = BigInt(v)), OK),
    proxy_get_metric: (id, rp) => (mem().setBigUint64(rp, metrics[id - 1]?.value ?? 0n, true), OK),
    proxy_send_local_response: (status) => {
      t.localReplies += 1;
      if (t.stream) t.stream.replied = status;
      return OK;
    },
    proxy_continue_stream: () => OK,
    proxy_close_stream: () => OK,
    proxy_set_effective_context: () => OK,
    proxy_done: () => OK,
    proxy_http_call: () => BAD_ARGUMENT,
    proxy_get_status: () => NOT_FOUND,
    proxy_call_foreign_function: () => NOT_FOUND,
    proxy_grpc_call: () => BAD_ARGUMENT,
    proxy_grpc_stream: () => BAD_ARGUMENT,
    proxy_grpc_send: () => BAD_ARGUMENT,
    proxy_grpc_cancel: () => BAD_ARGUMENT,
    proxy_grpc_close: () => BAD_ARGUMENT,
  };
  // Every host call counted by function (and shared-data key, with whether it found a value).
  for (const [name, f] of Object.entries(env)) {
    env[name] = (...a) => {
      let what = name;
      if (name === "proxy_get_shared_data" || name === "proxy_set_shared_data") {
        what += ` ${str(a[0], a[1]).replace(/\.[0-9]+$/, ".N")}`;
      }
      const r = f(...a);
      if (name === "proxy_get_shared_data" || name === "proxy_get_header_map_value" || name === "proxy_get_property") {
        what += r === OK ? " (found)" : " (absent)";
      }
      if (counting) calls.set(what, (calls.get(what) ?? 0) + 1);
      return r;
    };
  }
  t.pendingQueues = new Set();
  const wasi = new WASI({ version: "preview1", args: ["kvroute"], env: {}, returnOnExit: true });
  inst = await WebAssembly.instantiate(module, { env, wasi_snapshot_preview1: wasi.wasiImport });
  wasi.initialize(inst);
  const x = inst.exports;
  t.exports = x;
  t.root = 1;
  t.nextContext = 2;
  x.proxy_on_context_create(t.root, 0);
  if (!x.proxy_on_vm_start(t.root, 0)) throw new Error(`thread ${index}: on_vm_start refused`);
  if (!x.proxy_on_configure(t.root, enc.encode(config).length)) {
    throw new Error(`thread ${index}: on_configure refused the configuration`);
  }
  return t;
}

// Host calls by kind, counted once the threads are configured (with --calls).
const calls = new Map();
let counting = false;

// Time per callback, summed over the threads, in ns.
const spent = new Map();
function timed(name, f) {
  const s = now();
  const r = f();
  spent.set(name, (spent.get(name) ?? 0n) + (now() - s));
  return r;
}

function upkeep(t) {
  for (const id of t.pendingQueues) {
    t.pendingQueues.delete(id);
    const q = queues[id - 1];
    while (q.messages.length) {
      const before = q.messages.length;
      timed("queue", () => t.exports.proxy_on_queue_ready(t.root, id));
      if (q.messages.length >= before) break;
    }
  }
  if (t.tickMs > 0 && now() - t.lastTick >= BigInt(t.tickMs) * 1000000n) {
    t.lastTick = now();
    timed("tick", () => t.exports.proxy_on_tick(t.root));
  }
}

function start(t, n) {
  const x = t.exports;
  const id = t.nextContext++;
  const b = body(n);
  t.stream = {
    id,
    request: new Map([
      [":method", "POST"],
      [":path", "/v1/chat/completions"],
      [":authority", "127.0.0.1"],
      [":scheme", "http"],
      ["content-type", "application/json"],
      ["content-length", String(b.length)],
      ["x-request-id", `bench-${n}`],
    ]),
    response: new Map(),
    body: b,
    responseBody: null,
  };
  timed("context create", () => x.proxy_on_context_create(id, t.root));
  timed("request headers", () => x.proxy_on_request_headers(id, t.stream.request.size, 0));
  timed("request body", () => x.proxy_on_request_body(id, b.length, 1));
  const s = t.stream;
  t.stream = null;
  return s;
}

function finish(t, s) {
  const x = t.exports;
  t.stream = s;
  s.response = new Map([
    [":status", "200"],
    ["content-type", "application/json"],
    ["content-length", String(RESPONSE.length)],
  ]);
  if (!s.replied) {
    s.responseBody = RESPONSE;
    timed("response headers", () => x.proxy_on_response_headers(s.id, s.response.size, 0));
    // The decision header's own timers (µs): parse, catch-up, journal, decide, tokenize.
    const header = s.response.get("x-kvroute-decision");
    if (header) {
      for (const field of header.split("; ")) {
        const [k, v] = field.split("=");
        if (PHASES.includes(k)) phases.get(k).push(Number(v));
      }
    }
    timed("response body", () => x.proxy_on_response_body(s.id, RESPONSE.length, 1));
  }
  timed("log", () => x.proxy_on_log(s.id));
  timed("done + delete", () => (x.proxy_on_done(s.id), x.proxy_on_delete(s.id)));
  t.stream = null;
}

const PHASES = ["decision_us", "parse_us", "catchup_us", "journal_us", "decide_us", "tokenize_us"];
const phases = new Map(PHASES.map((k) => [k, []]));
const ts = [];
for (let i = 0; i < threads; i++) ts.push(await thread(i));
const open = ts.map(() => []);
counting = countCalls;
let routed = 0;
const wall = now();
for (let n = 0; n < requests; n++) {
  const i = n % threads;
  const t = ts[i];
  upkeep(t);
  const s = start(t, n);
  if (s.request.has("x-gateway-destination-endpoint")) routed += 1;
  open[i].push(s);
  if (open[i].length > inflight) finish(t, open[i].shift());
}
ts.forEach((t, i) => open[i].forEach((s) => finish(t, s)));
const total = Number(now() - wall) / 1e3;
const replies = ts.reduce((a, t) => a + t.localReplies, 0);
console.log(
  `kvroute-filter-bench: ${requests} ${promptKind} requests, ${threads} threads, ${inflight} in flight each: ` +
    `${routed} routed, ${replies} answered by the filter`,
);
console.log(`µs per request (wall clock, this process): ${(total / requests).toFixed(1)} in all`);
let inCallbacks = 0n;
for (const [k, v] of spent) {
  inCallbacks += v;
  console.log(`  ${k.padEnd(18)} ${(Number(v) / 1e3 / requests).toFixed(2).padStart(8)}`);
}
console.log(`  ${"callbacks".padEnd(18)} ${(Number(inCallbacks) / 1e3 / requests).toFixed(2).padStart(8)}`);
const quantile = (v, q) => [...v].sort((a, b) => a - b)[Math.min(v.length - 1, Math.floor(q * v.length))];
if (phases.get("decision_us").length) {
  console.log("the decision header's timers, µs (p50 / p99):");
  for (const [k, v] of phases) {
    console.log(`  ${k.padEnd(18)} ${String(quantile(v, 0.5)).padStart(8)} ${String(quantile(v, 0.99)).padStart(8)}`);
  }
}
if (countCalls) {
  console.log("host calls per request:");
  for (const [k, v] of [...calls.entries()].sort((a, b) => b[1] - a[1])) {
    console.log(`  ${(v / requests).toFixed(2).padStart(7)}  ${k}`);
  }
}
if (routed === 0) process.exit(1);
