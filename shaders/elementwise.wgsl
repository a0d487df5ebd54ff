// Elementwise float32 operations with numpy broadcasting.
//
// The operation is the override constant OP, so each operation is one pipeline that serves
// every shape. Shapes and strides (in elements, 0 along broadcast dimensions) travel in the
// uniform; a dense operand (same shape as the output) skips the index arithmetic, and a Python
// scalar operand travels in the uniform instead of a buffer.
//
// Entry points: `unary` and `binary` compute one output per invocation, for any broadcast.
// `unary4` and `binary4` compute four, with vec4 loads and stores, when every array operand is
// dense; `broadcast4` does the same for a binary broadcast whose last dimension is a multiple of
// 4, working out the operands' offsets once per four outputs. The vec4 entry points see the
// buffers through the `*4` bindings, which the host binds rounded up to whole vec4s (the pool's
// buffers are): the last vec4 may run past `n`, into the buffers' padding.
//
// IEEE special values are handled explicitly: WGSL leaves NaN and infinity behaviour of several
// builtins to the implementation, and numpy's answer is the one we must give.
//
// Unary OP codes:  0 copy, 1 negative, 2 abs, 3 exp, 4 log, 5 sqrt, 6 tanh, 7 sigmoid, 8 relu
// Binary OP codes: 0 add, 1 subtract, 2 multiply, 3 divide, 4 power, 5 maximum, 6 minimum,
//                  7 greater, 8 greater_equal, 9 less, 10 less_equal, 11 equal, 12 not_equal
// Comparisons write 1.0 for true and 0.0 for false.

override OP: u32 = 0u;
const WG: u32 = 256u;

const A_DENSE: u32 = 1u;
const B_DENSE: u32 = 2u;
const A_SCALAR: u32 = 4u;
const B_SCALAR: u32 = 8u;
const A_ALONG: u32 = 16u;  // a runs along the last dimension (stride 1 there), for broadcast4
const B_ALONG: u32 = 32u;

struct Params {
    n: u32, ndim: u32, flags: u32, scalar: f32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;

// NaN and infinity by bit pattern, through a function: as a constant expression they are a shader-creation
// error by the WGSL spec (Chrome's compiler refuses them; wgpu's accepts them).
fn f32_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}

fn nan() -> f32 {
    return f32_bits(0x7fc00000u);
}

fn inf() -> f32 {
    return f32_bits(0x7f800000u);
}

fn is_odd_integer(y: f32) -> bool {
    return abs(y) < 16777216.0 && floor(y) == y && (i32(y) & 1) == 1;
}

// numpy's float32 power, including negative bases with integral exponents.
fn power(x: f32, y: f32) -> f32 {
    if (y == 0.0 || x == 1.0) {
        return 1.0;
    }
    if (is_nan(x) || is_nan(y)) {
        return nan();
    }
    let ax = abs(x);
    if (x == 0.0) {
        if (y < 0.0) {
            return select(inf(), -inf(), is_odd_integer(y) && bitcast<u32>(x) == 0x80000000u);
        }
        return select(0.0, x, is_odd_integer(y));
    }
    if (is_inf(y)) {
        if (ax == 1.0) {
            return 1.0;
        }
        return select(0.0, inf(), (ax > 1.0) == (y > 0.0));
    }
    if (is_inf(x)) {
        let magnitude = select(0.0, inf(), y > 0.0);
        return select(magnitude, -magnitude, x < 0.0 && is_odd_integer(y));
    }
    if (x < 0.0) {
        if (floor(y) != y) {
            return nan();
        }
        let r = exp2(y * log2(ax));
        return select(r, -r, is_odd_integer(y));
    }
    return exp2(y * log2(x));
}

fn unary_op(x: f32) -> f32 {
    if (is_nan(x) && OP != 0u && OP != 1u && OP != 2u) {
        return x;
    }
    switch OP {
        case 1u: { return -x; }
        case 2u: { return abs(x); }
        case 3u: {
            if (x > 88.8) { return inf(); }
            return exp(x);
        }
        case 4u: {
            if (x < 0.0) { return nan(); }
            if (x == 0.0) { return -inf(); }
            if (is_inf(x)) { return x; }
            return log(x);
        }
        case 5u: {
            if (x < 0.0) { return nan(); }
            if (is_inf(x)) { return x; }
            return sqrt(x);
        }
        case 6u: {
            if (abs(x) > 10.0) { return sign(x); }
            return tanh(x);
        }
        case 7u: {
            if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); }
            let e = exp(x);
            return e / (1.0 + e);
        }
        case 8u: { return max(x, 0.0); }
        default: { return x; }
    }
}

fn binary_op(x: f32, y: f32) -> f32 {
    let either_nan = is_nan(x) || is_nan(y);
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return power(x, y); }
        case 5u: {
            if (either_nan) { return nan(); }
            return max(x, y);
        }
        case 6u: {
            if (either_nan) { return nan(); }
            return min(x, y);
        }
        case 7u: { return select(0.0, 1.0, !either_nan && x > y); }
        case 8u: { return select(0.0, 1.0, !either_nan && x >= y); }
        case 9u: { return select(0.0, 1.0, !either_nan && x < y); }
        case 10u: { return select(0.0, 1.0, !either_nan && x <= y); }
        case 11u: { return select(0.0, 1.0, !either_nan && x == y); }
        case 12u: { return select(1.0, 0.0, !either_nan && x == y); }
        default: { return x; }
    }
}

fn unary_op4(x: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(unary_op(x.x), unary_op(x.y), unary_op(x.z), unary_op(x.w));
}

fn binary_op4(x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(binary_op(x.x, y.x), binary_op(x.y, y.y), binary_op(x.z, y.z), binary_op(x.w, y.w));
}

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

// Element offsets of output element i in a and b (broadcast through zero strides).
fn offsets(i: u32) -> vec2<u32> {
    if (p.ndim == 2u) {  // the common broadcast of a row or a column, without the loop
        let row = i / p.shape[0].y;
        let col = i - row * p.shape[0].y;
        return vec2<u32>(row * p.a_strides[0].x + col * p.a_strides[0].y,
                         row * p.b_strides[0].x + col * p.b_strides[0].y);
    }
    var rest = i;
    var oa = 0u;
    var ob = 0u;
    for (var d = i32(p.ndim) - 1; d >= 0; d--) {
        let size = get4(p.shape, u32(d));
        let at = rest % size;
        rest = rest / size;
        oa += at * get4(p.a_strides, u32(d));
        ob += at * get4(p.b_strides, u32(d));
    }
    return vec2<u32>(oa, ob);
}

fn index(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + li;
}

@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n) {
        return;
    }
    var ia = i;
    if ((p.flags & A_DENSE) == 0u) {
        ia = offsets(i).x;
    }
    out[i] = unary_op(a[ia]);
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n) {
        return;
    }
    var x: f32;
    var y: f32;
    if ((p.flags & (A_DENSE | B_DENSE)) == (A_DENSE | B_DENSE)) {
        x = a[i];
        y = b[i];
    } else {
        let o = offsets(i);
        x = a[o.x];
        y = b[o.y];
        if ((p.flags & A_DENSE) != 0u) { x = a[i]; }
        if ((p.flags & B_DENSE) != 0u) { y = b[i]; }
    }
    if ((p.flags & A_SCALAR) != 0u) { x = p.scalar; }
    if ((p.flags & B_SCALAR) != 0u) { y = p.scalar; }
    out[i] = binary_op(x, y);
}

// Four outputs per invocation, 4i to 4i + 3: every array operand dense.
@compute @workgroup_size(WG)
fn unary4(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= (p.n + 3u) / 4u) {
        return;
    }
    out4[i] = unary_op4(a4[i]);
}

@compute @workgroup_size(WG)
fn binary4(@builtin(workgroup_id) wg: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= (p.n + 3u) / 4u) {
        return;
    }
    var x: vec4<f32>;
    var y: vec4<f32>;
    if ((p.flags & A_SCALAR) != 0u) { x = vec4<f32>(p.scalar); } else { x = a4[i]; }
    if ((p.flags & B_SCALAR) != 0u) { y = vec4<f32>(p.scalar); } else { y = b4[i]; }
    out4[i] = binary_op4(x, y);
}

// Four outputs per invocation along the last dimension (a multiple of 4, so they share one
// offset per operand): a vec4 of an operand that runs along it, one value of one broadcast along it.
@compute @workgroup_size(WG)
fn broadcast4(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n / 4u) {
        return;
    }
    let o = offsets(4u * i);
    var x: vec4<f32>;
    var y: vec4<f32>;
    if ((p.flags & A_SCALAR) != 0u) {
        x = vec4<f32>(p.scalar);
    } else if ((p.flags & A_DENSE) != 0u) {
        x = a4[i];
    } else if ((p.flags & A_ALONG) != 0u) {
        x = a4[o.x / 4u];
    } else {
        x = vec4<f32>(a4[o.x / 4u][o.x % 4u]);
    }
    if ((p.flags & B_SCALAR) != 0u) {
        y = vec4<f32>(p.scalar);
    } else if ((p.flags & B_DENSE) != 0u) {
        y = b4[i];
    } else if ((p.flags & B_ALONG) != 0u) {
        y = b4[o.y / 4u];
    } else {
        y = vec4<f32>(b4[o.y / 4u][o.y % 4u]);
    }
    out4[i] = binary_op4(x, y);
}
