// Scatter-adds into 32-bit slots: numpy's bincount (counts, and float32 weights) and `np.add.at`.
//
// `scatter` runs one invocation for each (i, j), i < m, j < width: it adds value (i, j) into slot
// `idx[i] * width + j` of `out` (a row of `width` slots per index; a negative index counts from
// the end of `rows` rows, as numpy's does). The value is `vals[i * width + j]`, or the uniform's
// `value` bits for every (i, j) when `scalar` is 1. Slots are atomic: indices may repeat.
//
// OP says how values add: 0 as 32-bit integers (atomicAdd: two's complement, so int32 and uint32
// both wrap around as numpy's do), 1 as float32, by a compare-and-swap loop on the slot's bits
// (WGSL has no float atomics). Float sums then come in whatever order the invocations reach a slot:
// within the rounding of another order of numpy's (left to right) sum.
//
// `copy` writes the first `n` slots of `out` from `a` (bit for bit): add.at's starting values, in a
// buffer of its own, since the input's may be shared with other arrays.
// Workgroups are numbered linearly, folded by the host over x and y.

override OP: u32 = 0u;
const WG: u32 = 256u;

struct Params {
    n: u32, m: u32, width: u32, rows: u32,
    scalar: u32, value: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read> vals: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> p: Params;

// out[slot] += v, as float32: retried until no other invocation changed the slot in between.
fn add_float(slot: u32, v: f32) {
    var old = atomicLoad(&out[slot]);
    loop {
        let sum = bitcast<u32>(bitcast<f32>(old) + v);
        let swapped = atomicCompareExchangeWeak(&out[slot], old, sum);
        if (swapped.exchanged) {
            break;
        }
        old = swapped.old_value;
    }
}

@compute @workgroup_size(WG)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= p.m * p.width) {
        return;
    }
    let i = t / p.width;
    let j = t - i * p.width;
    var row = idx[i];
    if (row < 0) {
        row += i32(p.rows);
    }
    let slot = u32(row) * p.width + j;
    var bits = p.value;
    if (p.scalar == 0u) {
        bits = vals[t];
    }
    if (OP == 1u) {
        add_float(slot, bitcast<f32>(bits));
    } else {
        atomicAdd(&out[slot], bits);
    }
}

@compute @workgroup_size(WG)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t < p.n) {
        atomicStore(&out[t], a[t]);
    }
}
