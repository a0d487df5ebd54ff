// A browser tab as a remote-magic GPU worker: runs the batches of WebGPU calls an executor sends
// (worker/gpu/tab_device.py) and answers with what they read back. It runs WGSL and nothing else.
"use strict";

const ALIVE_INTERVAL_MS = 1000;   // the bridge fails a tab's work when it hears nothing for a few seconds
const RECONNECT_DELAY_MS = 2000;
const show = (id, text) => { document.getElementById(id).textContent = text; };
const state = (text, kind) => { show("state", text); document.body.className = kind || ""; };
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const clock = () => new Date().toLocaleTimeString();

const secret = decodeURIComponent(location.hash.slice(1));
const params = new URLSearchParams(location.search);
let adapter = null;
let socket = null;
let backgrounded = false;
let refused = false;
const objects = new Map();       // id -> WebGPU object, ids chosen by the executors
// An adapter makes one device, so every executor shares it: {device, lost: why it was lost, or null}.
let shared = null;
let queue = Promise.resolve();   // batches run one after another, in the order they came

function adapterInfo() {
  const info = adapter.info || {};
  return { vendor: info.vendor || "", architecture: info.architecture || "", device: info.device || "",
           description: info.description || "", fallback: Boolean(info.isFallbackAdapter || adapter.isFallbackAdapter) };
}

function limitsOf(limits) {
  const out = {};
  for (const key in limits) { if (typeof limits[key] === "number") out[key] = limits[key]; }
  return out;
}

// Why a browser gives this page no GPU, and what to do: {why, todo}.
class NoWebGPU extends Error {
  constructor(why, todo) { super(why); this.todo = todo; }
}

async function findAdapter() {
  if (!window.isSecureContext) {
    throw new NoWebGPU("this page was opened over plain HTTP from another device, and browsers offer WebGPU only " +
                       "to a secure context", "Open it over HTTPS: start remote-worker with --ngrok (an HTTPS link " +
                       "that opens anywhere), or with --browser-cert and --browser-key; or open it on the " +
                       "machine that runs remote-worker.");
  }
  if (!navigator.gpu) {
    throw new NoWebGPU("this browser has no WebGPU", "Open the link in a browser that has it: Chrome or Edge 113 " +
                       "and later, Safari on iOS, iPadOS and macOS 26 (earlier versions: turn on WebGPU in " +
                       "Settings → Apps → Safari → Advanced → Feature Flags), Firefox 141 and later on Windows.");
  }
  const found = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!found) {
    throw new NoWebGPU("this browser has WebGPU but offers no WebGPU adapter (requestAdapter() gave none): its GPU " +
                       "is blocked or missing", "Check the browser's GPU settings (Chrome: chrome://gpu; Chrome " +
                       "on Linux needs --enable-unsafe-webgpu), or open the link in another browser or device.");
  }
  return found;
}

// -- one batch -------------------------------------------------------------------------------
function pad8(n) { return Math.ceil(n / 8) * 8; }

function held(id) {
  const found = objects.get(id);
  if (found === undefined) throw new Error(`no object ${id} in this tab`);
  return found;
}

function resolve(value, blobs) {
  if (Array.isArray(value)) return value.map(v => resolve(v, blobs));
  if (value && typeof value === "object") {
    if ("$" in value) return held(value.$);
    if ("$b" in value) return new Uint8Array(blobs.buffer, blobs.byteOffset + value.$b[0], value.$b[1]);
    const out = {};
    for (const key in value) out[key] = resolve(value[key], blobs);
    return out;
  }
  return value;
}

async function openDevice(id) {
  if (!shared || shared.lost) {
    if (shared) adapter = await findAdapter();   // an adapter that made a device can't make another
    const requiredLimits = limitsOf(adapter.limits);
    const current = { device: await adapter.requestDevice({ requiredLimits }), lost: null };
    current.device.lost.then(info => {
      current.lost = info.message || info.reason || "no reason given";
      send({ type: "lost", reason: current.lost });
    });
    shared = current;
  }
  objects.set(id, shared.device);
  return { limits: limitsOf(shared.device.limits), adapter: adapterInfo() };
}

async function compile(id, label, code, device) {
  kernels++;
  compiling = `kernel ${kernels}${label ? ` (${label})` : ""}`;
  describeWork();
  const module = device.createShaderModule({ label, code });
  kernelOf.set(module, compiling);
  const info = await module.getCompilationInfo();
  const error = info.messages.find(m => m.type === "error");
  if (error) throw Object.assign(new Error(error.message), { line: error.lineNum, column: error.linePos });
  objects.set(id, module);
}

async function runBatch(header, blobs) {
  const started = performance.now();
  const reply = { id: header.id };
  const reads = [];
  const device = header.device ? objects.get(header.device) : null;
  const lost = () => device && shared && device === shared.device ? shared.lost : device ? "replaced" : null;
  if (lost()) {
    throw Object.assign(new Error(`the browser tab “${workerName}” lost its GPU device (${lost()})`), { lost: true });
  }
  if (device) { device.pushErrorScope("out-of-memory"); device.pushErrorScope("validation"); }
  let failure = null;
  try {
    for (const call of header.calls) {
      const op = call[0];
      if (op === "call") {
        const [, target, method, args, result] = call;
        const object = held(target);
        if (method === "destroy" && object === device) continue;   // shared: an executor that closes lets go of it
        const resolved = resolve(args, blobs);
        if (method === "createComputePipeline") {   // where a kernel is compiled for the GPU: seconds, the first time
          compiling = kernelOf.get(resolved[0]?.compute?.module) || "a kernel";
          describeWork();
        }
        const value = object[method](...resolved);
        if (result !== null) objects.set(result, value);
      } else if (op === "get") {
        objects.set(call[3], objects.get(call[1])[call[2]]);
      } else if (op === "device") {
        Object.assign(reply, await openDevice(call[1]), { tab: workerName });
      } else if (op === "compile") {
        await compile(call[1], call[2], call[3], device);
      } else if (op === "read") {
        const [, target, offset, size] = call;
        const buffer = held(target);
        await buffer.mapAsync(GPUMapMode.READ, offset, size);
        reads.push(buffer.getMappedRange(offset, size).slice(0));
        buffer.unmap();
      } else if (op === "drop") {
        for (const id of call[1]) objects.delete(id);
      } else if (op === "dispatches") {
        const pass = held(call[1]);
        for (const [pipeline, group, x, y, z] of call[2]) {
          pass.setPipeline(held(pipeline));
          pass.setBindGroup(0, held(group));
          pass.dispatchWorkgroups(x, y, z);
        }
      } else {
        throw new Error(`unknown operation ${op}`);
      }
      callsDone++;
    }
  } catch (exc) {
    failure = exc;
  }
  if (device) {
    const validation = await device.popErrorScope();   // waits for the GPU: a kernel's compiling happens here
    const memory = await device.popErrorScope();
    failure = failure || validation || memory;
  }
  compiling = null;
  reply.ms = performance.now() - started;   // the batch's time in the tab, GPU waits included
  if (failure) {
    const why = lost();
    reply.error = { message: why ? `the browser tab “${workerName}” lost its GPU device (${why})` : failure.message || String(failure),
                    line: failure.line ?? null, column: failure.column ?? null, lost: Boolean(why) };
  }
  return [reply, reads];
}

function encode(seq, header, blobs) {
  let end = 0;   // blob offsets are from the start of the blobs, so they don't depend on the header's length
  header.reads = blobs.map(b => { const at = end; end += pad8(b.byteLength); return [at, b.byteLength]; });
  const text = new TextEncoder().encode(JSON.stringify(header));
  const start = 4 + pad8(4 + text.length);
  const out = new Uint8Array(start + end);
  const view = new DataView(out.buffer);
  view.setUint32(0, seq, true);
  view.setUint32(4, text.length, true);
  out.set(text, 8);
  blobs.forEach((b, i) => out.set(new Uint8Array(b), start + header.reads[i][0]));
  return out;
}

async function onBatch(data) {
  const view = new DataView(data);
  const seq = view.getUint32(0, true);
  let header = { id: null };
  let reply, reads = [];
  try {
    const length = view.getUint32(4, true);
    header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 8, length)));
    const blobs = new Uint8Array(data, 4 + pad8(4 + length));
    [reply, reads] = await runBatch(header, blobs);
  } catch (exc) {
    reply = { id: header.id, error: { message: exc.message || String(exc), lost: Boolean(exc.lost),
                                      line: null, column: null } };
  }
  batches++;
  if (job) {
    job.batches++;
    if (reply.error) job.failure = reply.error.message;
  }
  describeWork();
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(encode(seq, reply, reads));
}
let callsDone = 0;   // told with each "alive": the worker's measure of progress on a batch it waits for

// -- what the page says it is doing ----------------------------------------------------------
let joinedAs = null;   // the tab's worker's name, while it is in the fleet
let batches = 0;       // batches of GPU work run, in all
let kernels = 0;       // kernels compiled on this tab's device, in all
let compiling = null;  // the kernel being compiled now, in words
const kernelOf = new WeakMap();   // shader module -> its kernel, in words
let jobsRun = 0;
let job = null;        // the job the tab's worker runs: {id, number, since, batches, kernelsBefore, failure}
let lastJob = null;    // the last one that ended, with its kernels and when it ended

function onJob(id) {   // the worker says which job it runs now (null: none)
  if (job && job.id === id) return;
  if (job) { lastJob = Object.assign(job, { kernels: kernels - job.kernelsBefore, ended: clock() }); job = null; }
  if (id !== null) {
    job = { id, number: ++jobsRun, since: clock(), batches: 0, kernelsBefore: kernels, failure: null };
  }
  describeWork();
}

function describeWork() {
  if (!joinedAs) { show("doing", ""); return; }
  if (job) {
    const doing = compiling ? `compiling ${compiling}: the first use of each kernel takes a few seconds here`
      : job.batches ? `${plural(job.batches, "batch", "batches")} of GPU work done` : "no GPU work yet";
    show("doing", `Running job ${job.number} (since ${job.since}): ${doing}.`);
  } else if (compiling) {
    show("doing", `Compiling ${compiling} for the worker.`);
  } else if (lastJob) {
    const done = `${plural(lastJob.batches, "batch", "batches")} of GPU work` +
                 (lastJob.kernels ? `, ${plural(lastJob.kernels, "kernel")} compiled` : "");
    const ran = jobsRun === 1 ? `Ran 1 job: ${done}.` : `Ran ${jobsRun} jobs, the last one: ${done}.`;
    const failed = lastJob.failure ? ` Its GPU work failed: ${lastJob.failure}` : "";
    show("doing", `Idle since ${lastJob.ended}, waiting for work. ${ran}${failed}`);
  } else {
    show("doing", `Waiting for work: the GPU work of the cells placed on worker “${joinedAs}” will run here.`);
  }
}

// -- keeping the screen on while joined (a phone whose screen locks puts the tab in the background) --
let wakeLock = null;
let askingForWakeLock = false;

async function keepAwake() {
  if (!joinedAs || document.visibilityState !== "visible" || askingForWakeLock || (wakeLock && !wakeLock.released)) {
    return;
  }
  if (!("wakeLock" in navigator)) {
    show("awake", "This browser can't keep the screen on (it has no Screen Wake Lock): set the screen to stay " +
                  "on (auto-lock: never) while this tab works, or it leaves the fleet when the screen locks.");
    return;
  }
  askingForWakeLock = true;
  try {
    const lock = await navigator.wakeLock.request("screen");
    if (!joinedAs) { lock.release().catch(() => {}); return; }   // left the fleet while the browser decided
    wakeLock = lock;
    show("awake", "Keeping the screen on while this tab is in the fleet.");
    lock.addEventListener("release", () => {
      if (joinedAs && lock === wakeLock) show("awake", "The browser let the screen lock again; it keeps it on " +
                                                       "again when this tab is shown.");
    });
  } catch (exc) {
    if (joinedAs) {
      show("awake", `The browser refused to keep the screen on (${exc.name}: ${exc.message}): set the screen to ` +
                    "stay on (auto-lock: never) while this tab works, or it leaves the fleet when the screen locks.");
    }
  } finally {
    askingForWakeLock = false;
  }
}

function letSleep() {
  if (wakeLock) { wakeLock.release().catch(() => {}); wakeLock = null; }
  show("awake", "");
}

// -- the connection --------------------------------------------------------------------------
let workerName = "";
function send(message) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
}

// The secret is proven on a socket of its own, which takes only a small message; the one-time ticket it
// answers with opens the socket the work goes over.
function prove(scheme) {
  return new Promise((resolve, reject) => {
    const door = new WebSocket(`${scheme}://${location.host}/hello`);
    door.onopen = () => door.send(JSON.stringify({ type: "hello", secret, name: params.get("name") || "",
                                                   adapter: adapterInfo(), limits: limitsOf(adapter.limits) }));
    door.onmessage = event => {
      const message = JSON.parse(event.data);
      if (message.type === "ticket") resolve(message.ticket);
    };
    door.onclose = reject;   // after the ticket came, this changes nothing
  });
}

let alive = null;
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  prove(scheme).then(ticket => open(scheme, ticket), closed);
}

function open(scheme, ticket) {
  socket = new WebSocket(`${scheme}://${location.host}/ws?ticket=${encodeURIComponent(ticket)}`);
  socket.binaryType = "arraybuffer";
  socket.onopen = () => {
    alive = setInterval(() => send({ type: "alive", done: callsDone, compiling: compiling !== null }), ALIVE_INTERVAL_MS);
  };
  socket.onmessage = event => {
    if (typeof event.data === "string") {
      const message = JSON.parse(event.data);
      if (message.type === "welcome") {   // named at once, then once more when its worker has joined
        workerName = message.name;
        if (message.joined) {
          joinedAs = message.name;
          state(`Joined the fleet as worker “${message.name}”.`, "joined");
          describeWork();
          keepAwake();
        }
      } else if (message.type === "job") {
        onJob(message.id);
      }
      return;
    }
    queue = queue.then(() => onBatch(event.data));
  };
  socket.onclose = closed;
}

function closed(event) {
  clearInterval(alive);
  joinedAs = null;
  if (job) onJob(null);
  describeWork();
  letSleep();
  if (event.code >= 4400 && event.code < 4500) {   // refused: retrying won't help
    refused = true;
    state(`Not joined: ${event.reason}`, "failed");
    return;
  }
  for (const id of objects.keys()) objects.delete(id);
  if (backgrounded) { state("Paused while in the background; comes back when shown.", ""); return; }
  state(`Disconnected (${event.reason || "the worker is gone"}); trying again…`, "failed");
  setTimeout(connect, RECONNECT_DELAY_MS);
}

// A tab being closed is hidden first, then its page hides: the background close waits a moment so the
// closing one can say what it is.
document.addEventListener("visibilitychange", () => {
  if (refused) return;
  if (document.visibilityState === "hidden") {
    backgrounded = true;
    setTimeout(() => { if (socket && document.visibilityState === "hidden") socket.close(4000, "went to the background"); }, 0);
  } else if (backgrounded) {
    backgrounded = false;
    connect();   // the wake lock, released while hidden, is asked for again once the tab has joined again
  } else {
    keepAwake();   // a lock the browser released while the page was hidden
  }
});

window.addEventListener("pagehide", () => { if (socket) socket.close(4001, "closed or reloaded"); });

(async () => {
  if (!secret) { state("Not joined: this link has no secret after its #. Open the whole link remote-worker printed.", "failed"); return; }
  try {
    adapter = await findAdapter();
  } catch (exc) {
    state(`This tab can't be a GPU worker: ${exc.message}.`, "failed");
    show("about", exc.todo || "");
    return;
  }
  const info = adapterInfo();
  show("adapter", `WebGPU adapter: ${[info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "unnamed"}`);
  state("Joining…");
  connect();
})();
