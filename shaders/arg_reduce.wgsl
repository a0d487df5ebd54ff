// argmax and argmin along one axis of a contiguous float32 array, as numpy computes them.
//
// The host views the input as (outer, len, inner) and reduces the middle axis to the index of its
// extreme value: the FIRST index of the maximum (minimum), where a NaN counts as the extreme (the
// first NaN wins) and -0.0 equals 0.0. Indices are written as u32 (the caller reads the buffer's
// bits as uint32).
//
// Values are compared as u32 keys, never as floats: `key()` maps a float's bits to a number that
// orders as the float does (for argmin, reversed), with -0.0 made 0.0 and every NaN the largest key.
// So no compiler's float semantics (NaN comparisons, flushed subnormals, fast math) can change an
// answer. A (key, index) pair beats another with a larger key, or an equal key and a lower index.
//
// A long axis can be cut into `chunks` pieces of `chunk` values: a first pass writes (outer, chunks,
// inner) partial pairs (keys at [o], indices at [idx_out + o]) and a second pass reduces those
// (reading indices from [idx_in + i]); `idx_in` 0 means the input is the float32 array itself.
// `idx_out` 0 means the pass is the last one and writes the index alone.
//
// Entry points: `groups` gives each output one workgroup (long axes); `threads` gives each output
// one invocation (short axes, many outputs). Output o is numbered (outer, chunk, inner), and
// workgroups are numbered linearly, folded by the host over x and y.
//
// OP: 0 argmax, 1 argmin.

override OP: u32 = 0u;
const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params {
    outer: u32, len: u32, inner: u32, chunks: u32,
    chunk: u32, count: u32, idx_in: u32, idx_out: u32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;  // float32 bits, or partial (key, index) pairs
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> part_key: array<u32, WG>;
var<workgroup> part_idx: array<u32, WG>;

struct Best {
    key: u32,
    idx: u32,
}

// A float32's bits as an order-preserving key: larger keys are better (larger values for argmax,
// smaller for argmin); -0.0 is 0.0; NaN is the largest key of all, so the first NaN wins.
fn key(bits: u32) -> u32 {
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return NONE;
    }
    let b = select(bits, 0u, bits == 0x80000000u);
    // Non-negative floats above every negative one, each side in the order of its magnitude.
    let ordered = select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);  // in 0x007fffff..0xff800000
    return select(ordered, ~ordered, OP == 1u);  // never NONE, never 0
}

fn no_best() -> Best {
    return Best(0u, NONE);  // key 0 loses to every value's key
}

// The better of two pairs: the larger key, or the lower index of equal keys.
fn better(u: Best, v: Best) -> Best {
    if (v.key > u.key || (v.key == u.key && v.idx < u.idx)) {
        return v;
    }
    return u;
}

struct Span {
    first: u32,  // element offset of the span's first value
    count: u32,  // number of values
    begin: u32,  // index along the axis of the first value
}

// The values that output o reduces: every `inner`-th element from `first`.
fn span(o: u32) -> Span {
    let inner_i = o % p.inner;
    let rest = o / p.inner;
    let c = rest % p.chunks;
    let outer_i = rest / p.chunks;
    let begin = c * p.chunk;
    let end = min(begin + p.chunk, p.len);
    return Span((outer_i * p.len + begin) * p.inner + inner_i, end - begin, begin);
}

// The j-th value of span s as a pair.
fn load(s: Span, j: u32) -> Best {
    let i = s.first + j * p.inner;
    if (p.idx_in == 0u) {
        return Best(key(x[i]), s.begin + j);
    }
    return Best(x[i], x[p.idx_in + i]);
}

fn store(o: u32, b: Best) {
    if (p.idx_out == 0u) {
        out[o] = b.idx;
    } else {
        out[o] = b.key;
        out[p.idx_out + o] = b.idx;
    }
}

@compute @workgroup_size(WG)
fn groups(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let o = wg.x + wg.y * nwg.x;
    if (o >= p.count) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let s = span(o);
    var best = no_best();
    for (var j = li; j < s.count; j += WG) {
        best = better(best, load(s, j));
    }
    part_key[li] = best.key;
    part_idx[li] = best.idx;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        if (li < half) {
            let r = better(Best(part_key[li], part_idx[li]), Best(part_key[li + half], part_idx[li + half]));
            part_key[li] = r.key;
            part_idx[li] = r.idx;
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        store(o, Best(part_key[0], part_idx[0]));
    }
}

@compute @workgroup_size(64)
fn threads(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.x + gid.y * nwg.x * 64u;
    if (o >= p.count) {
        return;
    }
    let s = span(o);
    var best = no_best();
    for (var j = 0u; j < s.count; j++) {
        best = better(best, load(s, j));
    }
    store(o, best);
}
