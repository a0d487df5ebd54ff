// Elementwise 32-bit integer operations with numpy's int32 and uint32 semantics, and numpy broadcasting.
//
// Values travel as their 32 bits (array<u32>); SIGNED (an override constant, 1 for int32 and 0 for
// uint32) says how to read them where it matters: comparisons, maximum and minimum, division,
// right shifts, absolute and sign. Addition, subtraction, multiplication and negation wrap around
// as two's complement, as numpy's C loops do; the cases where WGSL's own operators differ from C's
// or numpy's (shift counts of 32 and more or negative, division by zero, INT_MIN / -1) are spelled
// out here rather than left to WGSL's rules.
//
// The operation is the override constant OP, so each operation is one pipeline serving every shape.
// Operands as in elementwise.wgsl: an array read through its strides (in elements, 0 along broadcast
// dimensions); a dense array (the output's shape, read at the output's own index); or a Python scalar,
// carried in the uniform as its 32 bits (at most one operand). `unary4` and `binary4` compute four
// outputs per invocation through the `*4` bindings when every array operand is dense; the host binds
// those rounded up to whole vec4s (the pool's buffers are), so the last vec4 may run past `n`.
//
// Unary OP codes:  0 negative, 1 absolute, 2 invert, 3 square, 4 sign, 5 logical_not
// Binary OP codes: 0 add, 1 subtract, 2 multiply, 3 bitwise_and, 4 bitwise_or, 5 bitwise_xor,
//                  6 left_shift, 7 right_shift, 8 maximum, 9 minimum, 10 floor_divide, 11 remainder,
//                  12 equal, 13 not_equal, 14 less, 15 less_equal, 16 greater, 17 greater_equal
// logical_not and the comparisons write 1 for true and 0 for false.

override OP: u32 = 0u;
override SIGNED: u32 = 1u;
const WG: u32 = 256u;

const A_DENSE: u32 = 1u;
const B_DENSE: u32 = 2u;
const A_SCALAR: u32 = 4u;
const B_SCALAR: u32 = 8u;

struct Params {
    n: u32, ndim: u32, flags: u32, scalar: u32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> a4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> b4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<u32>>;

const SIGN_BIT: u32 = 0x80000000u;

fn is_signed() -> bool {
    return SIGNED != 0u;
}

fn flag(b: bool) -> u32 {
    return select(0u, 1u, b);
}

// x < y as int32 or as uint32. Flipping the sign bit maps int32 order onto uint32 order.
fn less(x: u32, y: u32) -> bool {
    if (is_signed()) {
        return (x ^ SIGN_BIT) < (y ^ SIGN_BIT);
    }
    return x < y;
}

fn negative(x: u32) -> u32 {
    return 0u - x;  // wraps: -INT_MIN is INT_MIN, as in C
}

// numpy's left_shift: 0 for a count of 32 or more, or negative (as int32; such a count is >= 2^31 as bits).
fn left_shift(x: u32, count: u32) -> u32 {
    return select(0u, x << count, count < 32u);
}

// numpy's right_shift: arithmetic for int32; past 31 (or negative) the sign fill: 0, or -1 for a negative int32.
fn right_shift(x: u32, count: u32) -> u32 {
    if (is_signed()) {
        return bitcast<u32>(bitcast<i32>(x) >> min(count, 31u));
    }
    return select(0u, x >> count, count < 32u);
}

// numpy's floor_divide and remainder as (quotient, remainder): the quotient rounded toward -inf and
// the remainder taking the divisor's sign; both 0 for a zero divisor, and INT_MIN // -1 is INT_MIN
// (remainder 0), as numpy's loops give.
fn divmod(x: u32, y: u32) -> vec2<u32> {
    if (y == 0u) {
        return vec2<u32>(0u);
    }
    if (!is_signed()) {
        return vec2<u32>(x / y, x % y);
    }
    if (y == 0xffffffffu) {  // -1: no division, so no INT_MIN / -1 overflow
        return vec2<u32>(negative(x), 0u);
    }
    let xs = bitcast<i32>(x);
    let ys = bitcast<i32>(y);
    // |x| and |y| as uint32 (|INT_MIN| = 2^31 fits), then truncating division without signed overflow
    let ax = select(x, negative(x), xs < 0);
    let ay = select(y, negative(y), ys < 0);
    let aq = ax / ay;
    let ar = ax - aq * ay;
    var q = select(aq, negative(aq), (xs < 0) != (ys < 0));
    var r = select(ar, negative(ar), xs < 0);  // C's remainder: the dividend's sign
    if (ar != 0u && (xs < 0) != (ys < 0)) {  // round the quotient down; move the remainder to y's sign
        q = q - 1u;
        r = r + y;
    }
    return vec2<u32>(q, r);
}

fn unary_op(x: u32) -> u32 {
    switch (OP) {
        case 0u: { return negative(x); }
        case 1u: { return select(x, negative(x), is_signed() && x >= SIGN_BIT); }
        case 2u: { return ~x; }
        case 3u: { return x * x; }
        case 4u: { return select(flag(x != 0u), 0xffffffffu, is_signed() && x >= SIGN_BIT); }
        case 5u: { return flag(x == 0u); }
        default: { return 0u; }
    }
}

fn binary_op(x: u32, y: u32) -> u32 {
    switch (OP) {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x & y; }
        case 4u: { return x | y; }
        case 5u: { return x ^ y; }
        case 6u: { return left_shift(x, y); }
        case 7u: { return right_shift(x, y); }
        case 8u: { return select(x, y, less(x, y)); }
        case 9u: { return select(x, y, less(y, x)); }
        case 10u: { return divmod(x, y).x; }
        case 11u: { return divmod(x, y).y; }
        case 12u: { return flag(x == y); }
        case 13u: { return flag(x != y); }
        case 14u: { return flag(less(x, y)); }
        case 15u: { return flag(!less(y, x)); }
        case 16u: { return flag(less(y, x)); }
        case 17u: { return flag(!less(x, y)); }
        default: { return 0u; }
    }
}

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

// Element offsets of output element i in a and b (broadcast through zero strides).
fn offsets(i: u32) -> vec2<u32> {
    if (p.ndim == 2u) {  // the common broadcast of a row or a column, without the loop
        let row = i / p.shape[0].y;
        let at = vec2<u32>(row, i - row * p.shape[0].y);
        return vec2<u32>(dot(at, p.a_strides[0].xy), dot(at, p.b_strides[0].xy));
    }
    var rest = i;
    var o = vec2<u32>(0u);
    for (var d = i32(p.ndim) - 1; d >= 0; d--) {
        let k = u32(d);
        let size = get4(p.shape, k);
        let at = rest % size;
        rest = rest / size;
        o += at * vec2<u32>(get4(p.a_strides, k), get4(p.b_strides, k));
    }
    return o;
}

fn is_set(bit: u32) -> bool {
    return (p.flags & bit) != 0u;
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
    var x = p.scalar;
    if (!is_set(A_SCALAR)) {
        x = a[select(offsets(i).x, i, is_set(A_DENSE))];
    }
    out[i] = unary_op(x);
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= p.n) {
        return;
    }
    var o = vec2<u32>(i);
    if ((p.flags & (A_DENSE | B_DENSE)) != (A_DENSE | B_DENSE)) {
        o = select(offsets(i), o, vec2<bool>(is_set(A_DENSE), is_set(B_DENSE)));
    }
    var x = p.scalar;
    var y = p.scalar;
    if (!is_set(A_SCALAR)) { x = a[o.x]; }
    if (!is_set(B_SCALAR)) { y = b[o.y]; }
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
    var x = vec4<u32>(p.scalar);
    if (!is_set(A_SCALAR)) { x = a4[i]; }
    out4[i] = vec4<u32>(unary_op(x.x), unary_op(x.y), unary_op(x.z), unary_op(x.w));
}

@compute @workgroup_size(WG)
fn binary4(@builtin(workgroup_id) wg: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if (i >= (p.n + 3u) / 4u) {
        return;
    }
    var x = vec4<u32>(p.scalar);
    var y = vec4<u32>(p.scalar);
    if (!is_set(A_SCALAR)) { x = a4[i]; }
    if (!is_set(B_SCALAR)) { y = b4[i]; }
    out4[i] = vec4<u32>(binary_op(x.x, y.x), binary_op(x.y, y.y), binary_op(x.z, y.z), binary_op(x.w, y.w));
}
