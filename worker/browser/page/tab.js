// A browser tab as a remote-magic GPU worker: runs the batches of WebGPU calls an executor sends
// (worker/gpu/tab_device.py) and answers with what they read back. It runs WGSL and nothing else.
"use strict";

const ALIVE_INTERVAL_MS = 1000;   // the bridge fails a tab's work when it hears nothing for a few seconds
const RECONNECT_DELAY_MS = 2000;
const show = (id, text) => { document.getElementById(id).textContent = text; };
const state = (text, kind) => { show("state", text); document.body.className = kind || ""; };

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

async function findAdapter() {
  if (!window.isSecureContext) {
    throw new Error("this page is not a secure context, and WebGPU needs one: open it as https://, or on localhost");
  }
  if (!navigator.gpu) {
    throw new Error("this browser has no WebGPU (navigator.gpu is missing). Safari: turn on WebGPU in Settings → " +
                    "Apps → Safari → Advanced → Feature Flags; Chrome or Edge 113 and later have it on");
  }
  const found = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!found) {
    throw new Error("this browser offers no WebGPU adapter (requestAdapter() gave none): its GPU is blocked or " +
                    "missing. Chrome on Linux needs --enable-unsafe-webgpu; check chrome://gpu");
  }
  return found;
}

// -- one batch -------------------------------------------------------------------------------
function pad8(n) { return Math.ceil(n / 8) * 8; }

function resolve(value, blobs) {
  if (Array.isArray(value)) return value.map(v => resolve(v, blobs));
  if (value && typeof value === "object") {
    if ("$" in value) {
      const found = objects.get(value.$);
      if (found === undefined) throw new Error(`no object ${value.$} in this tab`);
      return found;
    }
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
  const module = device.createShaderModule({ label, code });
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
        const object = objects.get(target);
        if (object === undefined) throw new Error(`no object ${target} in this tab`);
        if (method === "destroy" && object === device) continue;   // shared: an executor that closes lets go of it
        const value = object[method](...resolve(args, blobs));
        if (result !== null) objects.set(result, value);
      } else if (op === "get") {
        objects.set(call[3], objects.get(call[1])[call[2]]);
      } else if (op === "device") {
        Object.assign(reply, await openDevice(call[1]), { tab: workerName });
      } else if (op === "compile") {
        await compile(call[1], call[2], call[3], device);
      } else if (op === "read") {
        const [, target, offset, size] = call;
        const buffer = objects.get(target);
        await buffer.mapAsync(GPUMapMode.READ, offset, size);
        reads.push(buffer.getMappedRange(offset, size).slice(0));
        buffer.unmap();
      } else if (op === "drop") {
        for (const id of call[1]) objects.delete(id);
      } else {
        throw new Error(`unknown operation ${op}`);
      }
      callsDone++;
    }
  } catch (exc) {
    failure = exc;
  }
  if (device) {
    const validation = await device.popErrorScope();
    const memory = await device.popErrorScope();
    failure = failure || validation || memory;
  }
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
    show("work", `${++batches} batches run`);
  } catch (exc) {
    reply = { id: header.id, error: { message: exc.message || String(exc), lost: Boolean(exc.lost),
                                      line: null, column: null } };
  }
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(encode(seq, reply, reads));
}
let batches = 0;
let callsDone = 0;   // told with each "alive": the worker's measure of progress on a batch it waits for

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
    alive = setInterval(() => send({ type: "alive", done: callsDone }), ALIVE_INTERVAL_MS);
  };
  socket.onmessage = event => {
    if (typeof event.data === "string") {
      const message = JSON.parse(event.data);
      if (message.type === "welcome") {   // named at once, then once more when its worker has joined
        workerName = message.name;
        if (message.joined) state(`Joined the fleet as worker “${message.name}”.`, "joined");
      }
      return;
    }
    queue = queue.then(() => onBatch(event.data));
  };
  socket.onclose = closed;
}

function closed(event) {
  clearInterval(alive);
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
    connect();
  }
});

window.addEventListener("pagehide", () => { if (socket) socket.close(4001, "closed or reloaded"); });

(async () => {
  if (!secret) { state("Not joined: this link has no secret after its #. Open the whole link remote-worker printed.", "failed"); return; }
  try {
    adapter = await findAdapter();
  } catch (exc) {
    state(`No GPU here: ${exc.message}`, "failed");
    return;
  }
  const info = adapterInfo();
  show("adapter", `WebGPU adapter: ${[info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "unnamed"}`);
  state("Joining…");
  connect();
})();
