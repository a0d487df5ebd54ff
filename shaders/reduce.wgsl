// Float32 reductions (sum, max, min) along one axis of a contiguous array.
//
// The host views the input as (outer, len, inner) and reduces the middle axis. A long axis can
// be cut into `chunks` pieces of `chunk` values: a first pass writes (outer, chunks, inner)
// partial results and a second pass reduces those, so a reduction of a whole large array still
// uses many workgroups. `scale` multiplies the result (1/len for mean, in the last pass).
//
// Entry points: `groups` gives each output one workgroup (long axes); `threads` gives each
// output one invocation (short axes, many outputs); `contiguous` is `groups` for an axis whose
// values are adjacent (inner 1) and whose spans start on a vec4, reading four values a load
// through `x4` (the same buffer as `x`). Output i is numbered (outer, chunk, inner), and
// workgroups are numbered linearly, folded by the host over x and y.
//
// OP: 0 sum, 1 max, 2 min. max and min propagate NaN as numpy does.
//
// Sums are carried as unevaluated pairs hi + lo (float-float, built on Knuth's TwoSum): about 48
// bits, so the small terms of a sum whose large terms cancel are not lost. A first pass
// writes the pairs (lo after the `count` his) and the second pass reads them back: `lo_in` is
// the element offset of the input's lo values, 0 when the input is plain float32. `contiguous`
// keeps four such sums an invocation in the cheaper form of Ogita, Rump and Oishi's Sum2 (the
// TwoSum error of each addition added up in lo, renormalised once at the end); each lane sees
// only a few values, so the result keeps the pairs' accuracy.

override OP: u32 = 0u;
const WG: u32 = 256u;
const WG4: u32 = 64u;  // `contiguous`: four values a load, so fewer invocations fill a span

struct Params {
    outer: u32, len: u32, inner: u32, chunks: u32,
    chunk: u32, count: u32, scale: f32, lo_in: u32,
    lo_out: u32, one: f32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;

var<workgroup> part_hi: array<f32, WG>;
var<workgroup> part_lo: array<f32, WG>;

// A running result: hi + lo for sums, hi alone (lo = 0) for max and min.
struct Acc {
    hi: f32,
    lo: f32,
}

// NaN and infinity by bit pattern, through a function: as a constant expression they are a shader-creation
// error by the WGSL spec (Chrome's compiler refuses them; wgpu's accepts them).
fn f32_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

fn identity() -> Acc {
    switch OP {
        case 1u: { return Acc(f32_bits(0xff800000u), 0.0); }  // -inf
        case 2u: { return Acc(f32_bits(0x7f800000u), 0.0); }  // +inf
        default: { return Acc(0.0, 0.0); }
    }
}

// `v` unchanged, in a way no compiler can see through: `p.one` is 1.0, but only at run time.
// Without it, optimisers that treat float addition as associative (Mesa's, Metal's fast math)
// rewrite (a + b) - a as b, which is exactly the rounding error TwoSum exists to capture.
fn opaque(v: f32) -> f32 {
    return v * p.one;
}

// (u.hi + u.lo) + (v.hi + v.lo) as a float-float pair. Infinities and NaN pass through as hi.
fn add(u: Acc, v: Acc) -> Acc {
    let s = opaque(u.hi + v.hi);
    if (!is_finite(s)) {
        return Acc(s, 0.0);
    }
    let bb = opaque(s - u.hi);
    let err = (u.hi - (s - bb)) + (v.hi - bb) + u.lo + v.lo;
    let hi = opaque(s + err);
    return Acc(hi, err - (hi - s));
}

fn is_nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// Four running results: sums as hi + lo with lo the sum of every addition's rounding error
// (TwoSum, exact), max and min in hi alone.
struct Acc4 {
    hi: vec4<f32>,
    lo: vec4<f32>,
}

fn combine4(u: Acc4, v: vec4<f32>) -> Acc4 {
    switch OP {
        case 1u, 2u: {
            let m = select(min(u.hi, v), max(u.hi, v), OP == 1u);
            return Acc4(select(m, vec4<f32>(f32_bits(0x7fc00000u)), is_nan4(u.hi) | is_nan4(v)), u.lo);
        }
        default: {
            let s = (u.hi + v) * p.one;  // TwoSum, as in add(); `* p.one` is opaque() for a vec4
            let bb = (s - u.hi) * p.one;
            return Acc4(s, u.lo + ((u.hi - (s - bb)) + (v - bb)));
        }
    }
}

// The four lanes as one result (infinities and NaN in hi win over a lo they made NaN).
fn fold4(u: Acc4) -> Acc {
    let xy = combine(Acc(u.hi.x, u.lo.x), Acc(u.hi.y, u.lo.y));
    let zw = combine(Acc(u.hi.z, u.lo.z), Acc(u.hi.w, u.lo.w));
    return combine(xy, zw);
}

fn combine(u: Acc, v: Acc) -> Acc {
    switch OP {
        case 1u: {
            if (is_nan(u.hi) || is_nan(v.hi)) { return Acc(f32_bits(0x7fc00000u), 0.0); }
            return Acc(max(u.hi, v.hi), 0.0);
        }
        case 2u: {
            if (is_nan(u.hi) || is_nan(v.hi)) { return Acc(f32_bits(0x7fc00000u), 0.0); }
            return Acc(min(u.hi, v.hi), 0.0);
        }
        default: { return add(u, v); }
    }
}

fn load(i: u32) -> Acc {
    if (p.lo_in == 0u) {
        return Acc(x[i], 0.0);
    }
    return Acc(x[i], x[p.lo_in + i]);
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

fn store(o: u32, v: Acc) {
    out[o] = v.hi * p.scale;  // scale is 1 except in the last pass of a mean
    if (p.lo_out != 0u) {
        out[p.lo_out + o] = v.lo;
    }
}

// The result of `size` invocations' values `v` (every invocation of the workgroup calls it).
fn across_workgroup(li: u32, size: u32, v: Acc) -> Acc {
    part_hi[li] = v.hi;
    part_lo[li] = v.lo;
    workgroupBarrier();
    for (var half = size / 2u; half > 0u; half = half / 2u) {
        if (li < half) {
            let r = combine(Acc(part_hi[li], part_lo[li]), Acc(part_hi[li + half], part_lo[li + half]));
            part_hi[li] = r.hi;
            part_lo[li] = r.lo;
        }
        workgroupBarrier();
    }
    return Acc(part_hi[0], part_lo[0]);
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
        acc = combine(acc, load(s.first + j * p.inner));
    }
    let total = across_workgroup(li, WG, acc);
    if (li == 0u) {
        store(o, total);
    }
}

@compute @workgroup_size(WG4)
fn contiguous(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let o = wg.x + wg.y * nwg.x;
    if (o >= p.count) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let s = span(o);  // s.first is a multiple of 4
    let quads = s.count / 4u;
    var acc4 = Acc4(vec4<f32>(identity().hi), vec4<f32>(0.0));
    for (var j = li; j < quads; j += WG4) {
        acc4 = combine4(acc4, x4[s.first / 4u + j]);
    }
    var acc = fold4(acc4);
    if (li < s.count % 4u) {  // the last values, short of a vec4
        acc = combine(acc, load(s.first + 4u * quads + li));
    }
    let total = across_workgroup(li, WG4, acc);
    if (li == 0u) {
        store(o, total);
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
        acc = combine(acc, load(s.first + j * p.inner));
    }
    store(o, acc);
}
