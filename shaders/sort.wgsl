// Sorting each row of a contiguous array of 32-bit values (float32, int32 or uint32: KEY), as
// numpy's stable sort and argsort do.
//
// The host views the input as (rows, len). Each row is padded to `1 << shift` slots (a power of
// two) and sorted by a bitonic network over (key, index) pairs, `total` = rows << shift slots in all:
//
// - the key is the value's bit pattern made monotone as an unsigned integer (float32: negative
//   values complemented, positive ones with the sign bit set, -0.0 read as 0.0 and every NaN as
//   0xffffffff, above +inf: numpy's order, NaN last; int32: the sign bit flipped);
// - the index (the value's place in its row) breaks ties, so equal values keep their order (stable),
//   -0.0 and 0.0 among them. Padding slots are (0xffffffff, their own place): after every value.
//
// The result reads each value back from the input by its index, through u32 views of the buffers,
// so values come out bit for bit as they went in (-0.0, NaN payloads, subnormals).
//
// The network: stage k (2, 4, ... 1 << shift) merges runs of k slots by steps of strides k/2, ...,
// 1, each comparing slot i with slot i + j (bit j of i clear) and exchanging them if out of order.
// Stage k sorts ascending in slots whose bit k is 0 and descending in the others, except the last
// stage of a row (k = 1 << shift), ascending throughout: every row ends ascending. Three steps in a
// row (strides 4s, 2s, s) are run by one invocation on 8 slots in registers, so they cost one
// pass over memory (one barrier in workgroup memory); so are stages 2, 4 and 8 together.
//
// Entry points: `block` runs every step with a stride below BLOCK on BLOCK slots in workgroup
// memory: the stages `k`, 2k, ... (`steps` of them), each from stride min(k/2, BLOCK/2) down.
// flags bit 0 reads the slots from `x` (the first pass), else from `pairs`; bit 1 writes the
// sorted rows (`out`, and `out_idx` when INDICES is 1) instead of `pairs` (the last pass).
// `step3` runs three steps of stage `k`, strides j, j/2, j/4, on `pairs`; `step` one, stride j.
// Workgroups are numbered linearly, folded by the host over x and y.

override INDICES: u32 = 0u;
override KEY: u32 = 0u;  // the values' type: 0 float32, 1 int32, 2 uint32 (see key_of)
const WG: u32 = 256u;
const BLOCK: u32 = 2048u;  // slots a `block` workgroup sorts: 16 KiB of workgroup memory, WebGPU's minimum limit
const LAST: u32 = 0xffffffffu;

struct Params {
    rows: u32, len: u32, shift: u32, total: u32,
    k: u32, j: u32, steps: u32, flags: u32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> pairs: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<storage, read_write> out_idx: array<u32>;

var<workgroup> keys: array<u32, BLOCK>;
var<workgroup> ids: array<u32, BLOCK>;

// The sort key of a value's bits: unsigned order is numpy's order. float32 (KEY 0): -0.0 = 0.0,
// NaN last; int32 (KEY 1): the sign bit flipped; uint32 (KEY 2): the bits.
fn key_of(bits: u32) -> u32 {
    if (KEY == 1u) {
        return bits ^ 0x80000000u;
    }
    if (KEY == 2u) {
        return bits;
    }
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return LAST;  // any NaN
    }
    if (bits == 0x80000000u) {
        return 0x80000000u;  // -0.0 as 0.0
    }
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

// Slot a = (key, index) comes before slot b.
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

// Stage k's direction at slot i.
fn ascending(i: u32, k: u32) -> bool {
    return k >= (1u << p.shift) || (i & k) == 0u;
}

// Slots a and b of `v` in order (a first if `up`).
fn exchange(v: ptr<function, array<vec2<u32>, 8>>, a: u32, b: u32, up: bool) {
    let va = (*v)[a];
    let vb = (*v)[b];
    let swap = before(vb, va) == up;
    (*v)[a] = select(va, vb, swap);
    (*v)[b] = select(vb, va, swap);
}

// Three steps on 8 slots: strides 4, 2, 1 of `v`.
fn merge8(v: ptr<function, array<vec2<u32>, 8>>, up: bool) {
    exchange(v, 0u, 4u, up);
    exchange(v, 1u, 5u, up);
    exchange(v, 2u, 6u, up);
    exchange(v, 3u, 7u, up);
    exchange(v, 0u, 2u, up);
    exchange(v, 1u, 3u, up);
    exchange(v, 4u, 6u, up);
    exchange(v, 5u, 7u, up);
    exchange(v, 0u, 1u, up);
    exchange(v, 2u, 3u, up);
    exchange(v, 4u, 5u, up);
    exchange(v, 6u, 7u, up);
}

// Two steps on 4 slots: strides 2, 1 of `v`'s first four.
fn merge4(v: ptr<function, array<vec2<u32>, 8>>, up: bool) {
    exchange(v, 0u, 2u, up);
    exchange(v, 1u, 3u, up);
    exchange(v, 0u, 1u, up);
    exchange(v, 2u, 3u, up);
}

// Stages 2, 4 and 8 on 8 slots from slot i (a multiple of 8): all of their steps.
fn sort8(v: ptr<function, array<vec2<u32>, 8>>, i: u32) {
    exchange(v, 0u, 1u, ascending(i, 2u));
    exchange(v, 2u, 3u, ascending(i + 2u, 2u));
    exchange(v, 4u, 5u, ascending(i + 4u, 2u));
    exchange(v, 6u, 7u, ascending(i + 6u, 2u));
    let up = ascending(i, 4u);
    let up4 = ascending(i + 4u, 4u);
    exchange(v, 0u, 2u, up);
    exchange(v, 1u, 3u, up);
    exchange(v, 4u, 6u, up4);
    exchange(v, 5u, 7u, up4);
    exchange(v, 0u, 1u, up);
    exchange(v, 2u, 3u, up);
    exchange(v, 4u, 5u, up4);
    exchange(v, 6u, 7u, up4);
    merge8(v, ascending(i, 8u));
}

// The first of group g's slots, when groups of 2^bits slots are spaced `low` apart (a power of
// two): g with `bits` 0 bits inserted at bit `low`.
fn group_start(g: u32, low: u32, bits: u32) -> u32 {
    return ((g & ~(low - 1u)) << bits) | (g & (low - 1u));
}

// Steps j, j/2, j/4 of stage k on the workgroup's slots (slot 0 is slot `base` of the rows):
// 8 slots an invocation, BLOCK / 8 = WG groups.
fn block_step3(base: u32, li: u32, k: u32, j: u32) {
    let low = j >> 2u;
    let first = group_start(li, low, 3u);
    var v: array<vec2<u32>, 8>;
    for (var s = 0u; s < 8u; s++) {
        v[s] = vec2<u32>(keys[first + s * low], ids[first + s * low]);
    }
    merge8(&v, ascending(base + first, k));
    for (var s = 0u; s < 8u; s++) {
        keys[first + s * low] = v[s].x;
        ids[first + s * low] = v[s].y;
    }
    workgroupBarrier();
}

// Steps j, j/2 of stage k on the workgroup's slots: 4 slots a group, BLOCK / 4 / WG groups an invocation.
fn block_step2(base: u32, li: u32, k: u32, j: u32) {
    let low = j >> 1u;
    for (var t = 0u; t < BLOCK / 4u / WG; t++) {
        let first = group_start(li + t * WG, low, 2u);
        var v: array<vec2<u32>, 8>;
        for (var s = 0u; s < 4u; s++) {
            v[s] = vec2<u32>(keys[first + s * low], ids[first + s * low]);
        }
        merge4(&v, ascending(base + first, k));
        for (var s = 0u; s < 4u; s++) {
            keys[first + s * low] = v[s].x;
            ids[first + s * low] = v[s].y;
        }
    }
    workgroupBarrier();
}

// Stages 2, 4, 8 on the workgroup's slots: 8 consecutive slots an invocation.
fn block_sort8(base: u32, li: u32) {
    let first = li * 8u;
    var v: array<vec2<u32>, 8>;
    for (var s = 0u; s < 8u; s++) {
        v[s] = vec2<u32>(keys[first + s], ids[first + s]);
    }
    sort8(&v, base + first);
    for (var s = 0u; s < 8u; s++) {
        keys[first + s] = v[s].x;
        ids[first + s] = v[s].y;
    }
    workgroupBarrier();
}

// Step j of stage k on the workgroup's slots: BLOCK / 2 pairs, BLOCK / 2 / WG an invocation.
fn block_step(base: u32, li: u32, k: u32, j: u32) {
    for (var t = 0u; t < BLOCK / 2u / WG; t++) {
        let a = group_start(li + t * WG, j, 1u);
        let b = a + j;
        let va = vec2<u32>(keys[a], ids[a]);
        let vb = vec2<u32>(keys[b], ids[b]);
        if (before(vb, va) == ascending(base + a, k)) {
            keys[a] = vb.x;
            ids[a] = vb.y;
            keys[b] = va.x;
            ids[b] = va.y;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn block(@builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let base = (wg.x + wg.y * nwg.x) * BLOCK;
    if (base >= p.total) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let mask = (1u << p.shift) - 1u;
    for (var t = 0u; t < BLOCK / WG; t++) {
        let l = li + t * WG;
        let e = base + l;
        let c = e & mask;
        var key = LAST;
        var id = c;  // slots past the end (a short last block) sort last, and are not written
        if ((p.flags & 1u) != 0u) {
            if (e < p.total && c < p.len) {
                key = key_of(x[(e >> p.shift) * p.len + c]);
            }
        } else if (e < p.total) {
            let v = pairs[e];
            key = v.x;
            id = v.y;
        }
        keys[l] = key;
        ids[l] = id;
    }
    workgroupBarrier();
    var k = p.k;
    var stages = p.steps;
    if (k == 2u && stages >= 3u) {
        block_sort8(base, li);
        k = 16u;
        stages -= 3u;
    }
    for (var s = 0u; s < stages; s++) {
        var j = min(k >> 1u, BLOCK >> 1u);
        while (j >= 4u) {
            block_step3(base, li, k, j);
            j >>= 3u;
        }
        if (j == 2u) {
            block_step2(base, li, k, j);
        } else if (j == 1u) {
            block_step(base, li, k, j);
        }
        k <<= 1u;
    }
    for (var t = 0u; t < BLOCK / WG; t++) {
        let l = li + t * WG;
        let e = base + l;
        if (e < p.total) {
            if ((p.flags & 2u) != 0u) {
                let c = e & mask;
                if (c < p.len) {
                    let row = (e >> p.shift) * p.len;
                    let id = ids[l];
                    out[row + c] = x[row + id];
                    if (INDICES != 0u) {
                        out_idx[row + c] = id;
                    }
                }
            } else {
                pairs[e] = vec2<u32>(keys[l], ids[l]);
            }
        }
    }
}

@compute @workgroup_size(WG)
fn step3(@builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let g = (wg.x + wg.y * nwg.x) * WG + li;
    if (g >= (p.total >> 3u)) {
        return;
    }
    let low = p.j >> 2u;
    let first = group_start(g, low, 3u);
    var v: array<vec2<u32>, 8>;
    for (var s = 0u; s < 8u; s++) {
        v[s] = pairs[first + s * low];
    }
    merge8(&v, ascending(first, p.k));
    for (var s = 0u; s < 8u; s++) {
        pairs[first + s * low] = v[s];
    }
}

@compute @workgroup_size(WG)
fn step(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = (wg.x + wg.y * nwg.x) * WG + li;
    if (g >= (p.total >> 1u)) {
        return;
    }
    let a = group_start(g, p.j, 1u);
    let va = pairs[a];
    let vb = pairs[a + p.j];
    if (before(vb, va) == ascending(a, p.k)) {
        pairs[a] = vb;
        pairs[a + p.j] = va;
    }
}
