// numpy's where(cond, a, b) and clip(x, lo, hi) on float32, with numpy broadcasting.
//
// Three operands, a, b and c (cond, a, b for `select_where`; x, lo, hi for `clip`), each one of:
// an array read through its strides (in elements, 0 along broadcast dimensions), as elementwise.wgsl
// does; a dense array (the output's shape: read at the output's own index); or a Python scalar,
// carried in the uniform as its float32 bits. (`where` is a reserved word in WGSL.)
//
// Values are handled as their bits, never as floats: where copies them exactly (NaN payloads and
// -0.0 included), and clip orders them by their bits, so NaN, signed zeros and subnormals come out
// as numpy's whatever the GPU does with floats (WGSL lets it assume there is no NaN, and flush
// subnormals to zero).

const WG: u32 = 256u;

// flags: DENSE << k and SCALAR << k for operand k (a = 0, b = 1, c = 2), and CONSTANT_BOUNDS.
const DENSE: u32 = 1u;
const SCALAR: u32 = 8u;
const CONSTANT_BOUNDS: u32 = 64u;  // clip's lo and hi are one value each: numpy's loop for that case

struct Params {
    n: u32, ndim: u32, flags: u32, a_bits: u32,
    b_bits: u32, c_bits: u32, _pad1: u32, _pad2: u32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
    c_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read> c: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

// Element offsets of output element i in a, b and c (broadcast through zero strides).
fn offsets(i: u32) -> vec3<u32> {
    if (p.ndim == 2u) {  // the common broadcast of a row or a column, without the loop
        let row = i / p.shape[0].y;
        let at = vec2<u32>(row, i - row * p.shape[0].y);
        return vec3<u32>(dot(at, p.a_strides[0].xy), dot(at, p.b_strides[0].xy), dot(at, p.c_strides[0].xy));
    }
    var rest = i;
    var o = vec3<u32>(0u);
    for (var d = i32(p.ndim) - 1; d >= 0; d--) {
        let k = u32(d);
        let size = get4(p.shape, k);
        let at = rest % size;
        rest = rest / size;
        o += at * vec3<u32>(get4(p.a_strides, k), get4(p.b_strides, k), get4(p.c_strides, k));
    }
    return o;
}

fn is_set(flag: u32) -> bool {
    return (p.flags & flag) != 0u;
}

// The bits of a, b and c for output element i.
fn operands(i: u32) -> vec3<u32> {
    var o = vec3<u32>(i);
    let direct = (p.flags | (p.flags >> 3u)) & 7u;  // bit k: operand k is dense or a scalar
    if (direct != 7u) {
        let strided = offsets(i);
        o = select(strided, o, vec3<bool>(is_set(DENSE), is_set(DENSE << 1u), is_set(DENSE << 2u)));
    }
    var v = vec3<u32>(p.a_bits, p.b_bits, p.c_bits);
    if (!is_set(SCALAR)) { v.x = a[o.x]; }
    if (!is_set(SCALAR << 1u)) { v.y = b[o.y]; }
    if (!is_set(SCALAR << 2u)) { v.z = c[o.z]; }
    return v;
}

fn is_nan(v: u32) -> bool {
    return (v & 0x7fffffffu) > 0x7f800000u;
}

// A float's place in float order, as a signed integer: negative floats' magnitude bits flipped.
fn order(v: u32) -> i32 {
    return bitcast<i32>(select(v, v ^ 0x7fffffffu, v >= 0x80000000u));
}

// IEEE x > y on float bits: false when either is NaN, and for 0.0 against -0.0 (they are equal).
fn greater(x: u32, y: u32) -> bool {
    return !is_nan(x) && !is_nan(y) && ((x | y) & 0x7fffffffu) != 0u && order(x) > order(y);
}

// numpy's clip: minimum(maximum(x, lo), hi), so lo > hi gives hi. numpy has two loops, which differ
// only in which NaN and which zero they give: one for bounds constant throughout, one for the rest.
fn clip_bits(x: u32, lo: u32, hi: u32) -> u32 {
    if (is_set(CONSTANT_BOUNDS)) {  // a NaN bound wins over a NaN x; a tie keeps x
        if (is_nan(lo)) { return lo; }
        if (is_nan(hi)) { return hi; }
        let t = select(x, lo, greater(lo, x));
        return select(t, hi, greater(t, hi));
    }
    // The first NaN of x, lo, hi wins; a tie takes the bound.
    let t = select(lo, x, is_nan(x) || greater(x, lo));
    return select(hi, t, is_nan(t) || greater(hi, t));
}

fn index(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + li;
}

@compute @workgroup_size(WG)
fn select_where(@builtin(workgroup_id) wg: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n) {
        return;
    }
    let v = operands(i);
    out[i] = select(v.z, v.y, (v.x & 0x7fffffffu) != 0u);  // any cond but ±0 is true, NaN included
}

@compute @workgroup_size(WG)
fn clip(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n) {
        return;
    }
    let v = operands(i);
    out[i] = clip_bits(v.x, v.y, v.z);
}
