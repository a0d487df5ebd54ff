// Float32 reductions (sum, max, min) along one axis of a contiguous array.
//
// The host views the input as (outer, len, inner) and reduces the middle axis. A long axis can
// be cut into `chunks` pieces of `chunk` values: a first pass writes (outer, chunks, inner)
// partial results and a second pass reduces those, so a reduction of a whole large array still
// uses many workgroups. `scale` multiplies the result (1/len for mean, in the last pass).
//
// Entry points: `groups` gives each output one workgroup (long axes); `threads` gives each
// output one invocation (short axes, many outputs). Output i is numbered (outer, chunk, inner),
// and workgroups are numbered linearly, folded by the host over x and y.
//
// OP: 0 sum, 1 max, 2 min. max and min propagate NaN as numpy does.

override OP: u32 = 0u;
const WG: u32 = 256u;

struct Params {
    outer: u32, len: u32, inner: u32, chunks: u32,
    chunk: u32, count: u32, scale: f32, _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> part: array<f32, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn identity() -> f32 {
    switch OP {
        case 1u: { return bitcast<f32>(0xff800000u); }  // -inf
        case 2u: { return bitcast<f32>(0x7f800000u); }  // +inf
        default: { return 0.0; }
    }
}

fn combine(u: f32, v: f32) -> f32 {
    switch OP {
        case 1u: {
            if (is_nan(u) || is_nan(v)) { return bitcast<f32>(0x7fc00000u); }
            return max(u, v);
        }
        case 2u: {
            if (is_nan(u) || is_nan(v)) { return bitcast<f32>(0x7fc00000u); }
            return min(u, v);
        }
        default: { return u + v; }
    }
}

struct Span {
    first: u32,  // element offset of the span's first value
    count: u32,  // number of values
}

// The values that output o reduces: every `inner`-th element from `first`.
fn span(o: u32) -> Span {
    let inner_i = o % p.inner;
    let rest = o / p.inner;
    let c = rest % p.chunks;
    let outer_i = rest / p.chunks;
    let begin = c * p.chunk;
    let end = min(begin + p.chunk, p.len);
    return Span((outer_i * p.len + begin) * p.inner + inner_i, end - begin);
}

fn finish(v: f32) -> f32 {
    if (OP == 0u) {
        return v * p.scale;
    }
    return v;
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
    var acc = identity();
    for (var j = li; j < s.count; j += WG) {
        acc = combine(acc, x[s.first + j * p.inner]);
    }
    part[li] = acc;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        if (li < half) {
            part[li] = combine(part[li], part[li + half]);
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[o] = finish(part[0]);
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
    var acc = identity();
    for (var j = 0u; j < s.count; j++) {
        acc = combine(acc, x[s.first + j * p.inner]);
    }
    out[o] = finish(acc);
}
