// Runs kvroute-turn-bench built for wasm32-wasip1 under Node's V8, the Qwen3 bundle directory
// preopened. Run Node with `--no-liftoff`, the flag Envoy's V8 runtime sets
// (proxy-wasm-cpp-host: every function compiled by TurboFan up front):
//
// node --no-liftoff core/turn-bench/run.mjs WASM QWEN3_DIR [ITERS [CASES]] [--evict]
// node core/turn-bench/run.mjs --summary PROFILE.cpuprofile [N]
//
// The second form prints the N functions with the most self time in a profile that
// `node --cpu-prof` wrote for the first, Rust names demangled to their paths.
import { readFileSync } from "node:fs";
import { WASI } from "node:wasi";

const args = process.argv.slice(2);
if (args[0] === "--summary") {
  // node run.mjs --summary PROFILE.cpuprofile [N [UNDER]]
  const under = args[3] ? new RegExp(args[3]) : null;
  printTop(JSON.parse(readFileSync(args[1], "utf8")), Number(args[2] ?? 30), under);
  process.exit(0);
}
const evict = args.includes("--evict") ? ["--evict"] : [];
const [wasmPath, bundleDir, iters = "40", cases = "cold,turn,shared,short,mixed"] = args.filter(
  (a) => a !== "--evict",
);
if (!wasmPath || !bundleDir) {
  console.error(
    "usage: node run.mjs WASM QWEN3_DIR [ITERS [CASES]] [--evict] | node run.mjs --summary PROFILE [N [UNDER]]",
  );
  process.exit(2);
}

const wasi = new WASI({
  version: "preview1",
  args: ["kvroute-turn-bench", "/qwen3", iters, cases, ...evict],
  preopens: { "/qwen3": bundleDir },
  returnOnExit: true,
});
const module = await WebAssembly.compile(readFileSync(wasmPath));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
const code = wasi.start(instance);
if (code !== 0) process.exit(code);

// Rust's legacy mangling: _ZN<len><ident>...17h<hash>E.
function demangle(name) {
  const m = /_ZN((?:\d+[^\d].*?)+)E/.exec(name);
  if (!m) return name;
  let rest = m[1];
  const parts = [];
  while (rest.length) {
    const n = /^(\d+)/.exec(rest);
    if (!n) break;
    const len = Number(n[1]);
    parts.push(rest.slice(n[1].length, n[1].length + len));
    rest = rest.slice(n[1].length + len);
  }
  if (parts.length && /^h[0-9a-f]{16}$/.test(parts[parts.length - 1])) parts.pop();
  return parts
    .join("::")
    .replace(/\$LT\$/g, "<")
    .replace(/\$GT\$/g, ">")
    .replace(/\$u20\$/g, " ")
    .replace(/\$RF\$/g, "&")
    .replace(/\$C\$/g, ",")
    .replace(/\.\./g, "::");
}

// The `n` functions with the most self time, and with the most time inclusive of what they
// call, over the samples that have a frame matching `under` (all samples without it).
function printTop(profile, n, under) {
  const byId = new Map(profile.nodes.map((x) => [x.id, x]));
  const parent = new Map();
  for (const x of profile.nodes) for (const c of x.children ?? []) parent.set(c, x.id);
  const name = (id) => demangle(byId.get(id).callFrame.functionName || "(anonymous)");
  const self = new Map();
  const inclusive = new Map();
  const dt = profile.timeDeltas ?? [];
  let total = 0;
  profile.samples.forEach((id, i) => {
    const stack = [];
    for (let at = id; at !== undefined; at = parent.get(at)) stack.push(name(at));
    if (under && !stack.some((f) => under.test(f))) return;
    const t = dt[i] ?? 0;
    total += t;
    self.set(stack[0], (self.get(stack[0]) ?? 0) + t);
    for (const f of new Set(stack)) inclusive.set(f, (inclusive.get(f) ?? 0) + t);
  });
  const print = (title, m) => {
    console.log(`${title}, of ${(total / 1e3).toFixed(0)} ms sampled${under ? ` under ${under}` : ""}:`);
    for (const [f, t] of [...m.entries()].sort((a, b) => b[1] - a[1]).slice(0, n)) {
      console.log(`${((100 * t) / total).toFixed(1).padStart(5)} %  ${f}`);
    }
  };
  print("self time", self);
  print("inclusive time", inclusive);
}
