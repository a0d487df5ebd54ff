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
// WGSL's own exponential, logarithmic, trigonometric and hyperbolic builtins may be off by 2^-11
// absolute or 4096 ulps, so exp and the operations added beside it compute from + - * /, sqrt and
// integer arithmetic, with the reductions and polynomials of Cephes and fdlibm (the "math library"
// section below): within 4 ulps of the exact result for every float32 argument, as numpy's are
// (subnormal arguments and results aside: GPUs may flush them to zero). log, sqrt, tanh and
// sigmoid keep the builtins.
//
// Unary OP codes:  0 copy, 1 negative, 2 abs, 3 exp, 4 log, 5 sqrt, 6 tanh, 7 sigmoid, 8 relu,
//                  9 sin, 10 cos, 11 tan, 12 arcsin, 13 arccos, 14 arctan, 15 sinh, 16 cosh,
//                  17 arcsinh, 18 arccosh, 19 arctanh, 20 floor, 21 ceil, 22 trunc, 23 rint,
//                  24 sign, 25 square, 26 reciprocal, 27 log2, 28 log10, 29 log1p, 30 expm1,
//                  31 exp2, 32 fabs, 33 logical_not, 34 isnan, 35 isinf, 36 isfinite, 37 signbit
// Binary OP codes: 0 add, 1 subtract, 2 multiply, 3 divide, 4 power, 5 maximum, 6 minimum,
//                  7 greater, 8 greater_equal, 9 less, 10 less_equal, 11 equal, 12 not_equal,
//                  13 arctan2, 14 hypot, 15 fmax, 16 fmin, 17 copysign, 18 logaddexp,
//                  19 floor_divide, 20 remainder, 21 fmod
// Comparisons and the predicates (33 to 37) write 1.0 for true and 0.0 for false.

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
    one: f32,  // 1.0, for opaque()
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

// ---- Math library: numpy's float32 functions from + - * / and sqrt -------------------------------

const PIO4_HI: f32 = 0.78539818525314331;   // float32(π/4), and π/4 minus it
const PIO4_LO: f32 = -2.1855695031547384e-8;
const PIO2_HI: f32 = 1.5707963705062866;    // float32(π/2)
const PIO2_LO: f32 = -4.3711390063094768e-8;
const PI_HI: f32 = 3.1415927410125732;      // float32(π)
const PI_LO: f32 = -8.7422780126189537e-8;
const LN2: f32 = 0.69314718055994531;
const LN2_HI: f32 = 0.693359375;            // ln 2 in two parts, k * LN2_HI exact for |k| < 2^15
const LN2_LO: f32 = -2.1219444005469057e-4;
const LOG2E: f32 = 1.4426950408889634;
const IVLN2_HI: f32 = 1.44287109375;        // 1 / ln 2, 1 / ln 10 and log10(2) in two parts, the first of 12 bits
const IVLN2_LO: f32 = -1.7605285393074155e-4;
const IVLN10_HI: f32 = 0.434326171875;
const IVLN10_LO: f32 = -3.168997136526741e-5;
const LOG10_2_HI: f32 = 0.301029205322265625;
const LOG10_2_LO: f32 = 7.903415166765626e-7;
const TWO_POW_23: f32 = 8388608.0;          // floats at least this large are integers

fn copysign(magnitude: f32, sign_of: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(magnitude) & 0x7fffffffu) | (bitcast<u32>(sign_of) & 0x80000000u));
}

fn sign_bit(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x80000000u) != 0u;
}

// `v` unchanged, in a way no compiler can see through: `p.one` is 1.0, but only at run time.
// Without it, optimisers that treat float addition as associative (Mesa's, Metal's fast math)
// rewrite x - ((1 + x) - 1) as 0, which is exactly the rounding error log1p must carry.
fn opaque(v: f32) -> f32 {
    return v * p.one;
}

fn signed_zero(negative: bool) -> f32 {
    return bitcast<f32>(select(0u, 0x80000000u, negative));
}

fn flag(b: bool) -> f32 {
    return select(0.0, 1.0, b);
}

// x = j π/4 + r with j even (mod 8) and |r| <= π/4, for finite x >= 0. Every x beyond π/4 takes
// Payne and Hanek's reduction, in integers: exact to 2^-61, so the result stays within a few ulps
// even next to a multiple of π, where a Cody-Waite reduction in float32 loses most of its digits.
struct Octant {
    r: f32,
    j: u32,  // 0, 2, 4 or 6
}

fn octant(ax: f32) -> Octant {
    if (ax <= PIO4_HI) {
        return Octant(ax, 0u);
    }
    return octant_large(ax);
}

// The bits of 4/π, from the one of weight 2^32 (so the first word is 0) to 2^-255.
var<private> FOUR_OVER_PI: array<u32, 9> = array<u32, 9>(0x00000000u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u,
    0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu, 0xdebbc561u);

// 32 bits of 4/π from bit k * 32 + shift on.
fn four_over_pi_bits(k: u32, shift: u32) -> u32 {
    if (shift == 0u) {
        return FOUR_OVER_PI[k];
    }
    return (FOUR_OVER_PI[k] << shift) | (FOUR_OVER_PI[k + 1u] >> (32u - shift));
}

// m w for m < 2^24, as (low word, high word).
fn mul_wide(m: u32, w: u32) -> vec2<u32> {
    let m_lo = m & 0xffffu;
    let m_hi = m >> 16u;
    let w_lo = w & 0xffffu;
    let w_hi = w >> 16u;
    let middle = m_lo * w_hi + m_hi * w_lo;  // may carry out (2^48, i.e. 2^16 in the high word)
    let middle_carry = select(0u, 0x10000u, middle < m_lo * w_hi);
    let low = m_lo * w_lo + (middle << 16u);
    let low_carry = select(0u, 1u, low < m_lo * w_lo);
    return vec2<u32>(low, m_hi * w_hi + (middle >> 16u) + middle_carry + low_carry);
}

// Payne and Hanek: ax = m 2^e (m < 2^24, e >= -30), so x 4/π mod 8 needs only the bits of 4/π of
// weight 2^(2 - e) and below; m times 96 of them gives the octant and 61 bits of its fraction.
fn octant_large(ax: f32) -> Octant {
    let bits = bitcast<u32>(ax);
    let m = (bits & 0x007fffffu) | 0x00800000u;
    let first = (bits >> 23u) - 120u;  // the bit of weight 2^(2 - e), counted from 2^32: 30 + e
    let k = first / 32u;
    let shift = first % 32u;
    let a = mul_wide(m, four_over_pi_bits(k, shift));  // times 2^64
    let b = mul_wide(m, four_over_pi_bits(k + 1u, shift));  // times 2^32
    let c = mul_wide(m, four_over_pi_bits(k + 2u, shift));
    let word1 = c.y + b.x;
    let word2 = b.y + a.x + select(0u, 1u, word1 < c.y);  // bits 64 to 95 of the product (2^-93 each)
    var j = word2 >> 29u;
    var hi = word2 & 0x1fffffffu;  // the fraction: hi 2^-29 + lo 2^-61
    var lo = word1;
    let odd = (j & 1u) != 0u;
    if (odd) {  // to the next even octant: the fraction becomes 1 - itself, and r negative
        j += 1u;
        hi = select(0x1fffffffu - hi, 0x20000000u - hi, lo == 0u);
        lo = 0u - lo;
    }
    // the fraction as two floats: its top 24 bits exactly, and the next 32 rounded
    let f_hi = f32(hi >> 5u) * 5.9604644775390625e-8;  // 2^-24
    let f_lo = f32(((hi & 31u) << 27u) | (lo >> 5u)) * 1.3877787807814457e-17;  // 2^-56
    let r = f_hi * PIO4_HI + (f_hi * PIO4_LO + f_lo * PIO4_HI);
    return Octant(select(r, -r, odd), j & 7u);
}

// sin(r) and cos(r) for |r| <= π/4 (Cephes sinf / cosf polynomials).
fn sin_poly(r: f32) -> f32 {
    let z = r * r;
    return ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
}

fn cos_poly(r: f32) -> f32 {
    let z = r * r;
    return ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
}

// sin(x), or cos(x) when `cosine`, of a finite x.
fn sin_cos(x: f32, cosine: bool) -> f32 {
    let o = octant(abs(x));
    var j = o.j;
    if (cosine) {
        j = (j + 2u) & 7u;  // cos(x) = sin(|x| + π/2)
    }
    var v = select(sin_poly(o.r), cos_poly(o.r), j == 2u || j == 6u);
    if (j >= 4u) {
        v = -v;
    }
    if (!cosine && x < 0.0) {
        v = -v;
    }
    return select(v, x, !cosine && x == 0.0);  // sin(-0) = -0
}

// tan(x) of a finite x (Cephes tanf).
fn tangent(x: f32) -> f32 {
    let o = octant(abs(x));
    let z = o.r * o.r;
    var t = (((((9.38540185543e-3 * z + 3.11992232697e-3) * z + 2.44301354525e-2) * z + 5.34112807005e-2) * z
              + 1.33387994085e-1) * z + 3.33331568548e-1) * z * o.r + o.r;
    if ((o.j & 2u) != 0u) {
        t = -1.0 / t;
    }
    return select(t, -t, sign_bit(x));  // tan is odd, and tan(-0) = -0
}

// arcsin(a) for 0 <= a <= 0.5 (Cephes asinf).
fn asin_poly(a: f32) -> f32 {
    let z = a * a;
    return ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z + 7.4953002686e-2) * z
            + 1.6666752422e-1) * z * a + a;
}

fn arcsin(x: f32) -> f32 {
    let a = abs(x);
    if (a > 1.0) {
        return nan();
    }
    if (a <= 0.5) {
        return copysign(asin_poly(a), x);
    }
    // arcsin(a) = π/2 - 2 arcsin(sqrt((1 - a) / 2))
    return copysign(PIO2_HI + (PIO2_LO - 2.0 * asin_poly(sqrt(0.5 * (1.0 - a)))), x);
}

fn arccos(x: f32) -> f32 {
    if (abs(x) > 1.0) {
        return nan();
    }
    if (x > 0.5) {
        return 2.0 * asin_poly(sqrt(0.5 * (1.0 - x)));
    }
    if (x < -0.5) {
        return PI_HI + (PI_LO - 2.0 * asin_poly(sqrt(0.5 * (1.0 + x))));
    }
    return PIO2_HI + (PIO2_LO - copysign(asin_poly(abs(x)), x));
}

// arctan(a) for finite a >= 0 (Cephes atanf: reduced to |t| <= tan(π/8) around 0, π/4 or π/2).
fn atan_nonnegative(a: f32) -> f32 {
    var hi = 0.0;
    var lo = 0.0;
    var t = a;
    if (a > 2.414213562373095) {
        hi = PIO2_HI;
        lo = PIO2_LO;
        t = -1.0 / a;
    } else if (a > 0.41421356237309503) {
        hi = PIO4_HI;
        lo = PIO4_LO;
        t = (a - 1.0) / (a + 1.0);
    }
    let z = t * t;
    let p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t;
    return hi + (t + (p + lo));
}

fn arctan(x: f32) -> f32 {
    if (is_inf(x)) {
        return copysign(PIO2_HI, x);
    }
    return copysign(atan_nonnegative(abs(x)), x);
}

// arctan2(y, x) with C99's (and numpy's) signed zeros and infinities: the arctangent of
// min(|x|, |y|) / max(|x|, |y|), carried to the octant of (x, y).
fn arctan2(y: f32, x: f32) -> f32 {
    if (is_nan(x) || is_nan(y)) {
        return nan();
    }
    let ax = abs(x);
    let ay = abs(y);
    let hi = max(ax, ay);
    var t = 0.0;  // (a finite value over an infinite one, or 0 / 0)
    if (is_inf(ax) && is_inf(ay)) {
        t = 1.0;
    } else if (hi != 0.0 && !is_inf(hi)) {
        t = min(ax, ay) / hi;
    }
    var r = atan_nonnegative(t);
    if (ay > ax) {
        r = PIO2_HI + (PIO2_LO - r);
    }
    if (sign_bit(x)) {
        r = PI_HI + (PI_LO - r);
    }
    return copysign(r, y);
}

// log(1 + f) = f - h + t for f in [sqrt(1/2) - 1, sqrt(2) - 1]: (h, t) = (f^2 / 2, the rest), the
// kernel of FreeBSD's logf, log1pf, log2f and log10f. The exact f comes in last, for about an ulp.
fn log_terms(f: f32) -> vec2<f32> {
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let r = z * (0.66666662693 + w * 0.28498786688) + w * (0.40000972152 + w * 0.24279078841);
    let h = 0.5 * f * f;
    return vec2<f32>(h, s * (h + r));
}

// k ln 2 + log(1 + f) + c, for a small correction c.
fn log_sum(k: f32, f: f32, c: f32) -> f32 {
    let t = log_terms(f);
    return k * LN2_HI - ((t.x - (t.y + (k * LN2_LO + c))) - f);
}

// log(1 + f) as hi + lo, hi with its low 12 bits clear: hi times a 12-bit constant is exact.
fn log_split(f: f32) -> vec2<f32> {
    let t = log_terms(f);
    let hi = bitcast<f32>(bitcast<u32>(f - t.x) & 0xfffff000u);
    return vec2<f32>(hi, (f - hi) - t.x + t.y);
}

// A positive finite x as 2^k m with m in [sqrt(1/2), sqrt(2)): (k, m - 1).
fn log_parts(x: f32) -> vec2<f32> {
    var bits = bitcast<u32>(x);
    var k = 0;
    if (bits < 0x00800000u) {  // subnormal: normalize the integer significand
        let shift = countLeadingZeros(bits) - 8u;
        bits = ((bits << shift) & 0x007fffffu) | 0x00800000u;
        k = -i32(shift);
    }
    k += i32(bits >> 23u) - 127;
    var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        k += 1;
    }
    return vec2<f32>(f32(k), m - 1.0);
}

// The natural logarithm of a positive finite x.
fn log_positive(x: f32) -> f32 {
    let p = log_parts(x);
    return log_sum(p.x, p.y, 0.0);
}

// The base-2 and base-10 logarithms (the natural one is OP 4, the builtin `log`).
fn log_base2(x: f32) -> f32 {
    if (x < 0.0) { return nan(); }
    if (x == 0.0) { return -inf(); }
    if (is_inf(x)) { return x; }
    let p = log_parts(x);
    let l = log_split(p.y);
    return (l.y + l.x) * IVLN2_LO + l.y * IVLN2_HI + l.x * IVLN2_HI + p.x;
}

fn log_base10(x: f32) -> f32 {
    if (x < 0.0) { return nan(); }
    if (x == 0.0) { return -inf(); }
    if (is_inf(x)) { return x; }
    let p = log_parts(x);
    let l = log_split(p.y);
    return p.x * LOG10_2_LO + (l.y + l.x) * IVLN10_LO + l.y * IVLN10_HI + l.x * IVLN10_HI + p.x * LOG10_2_HI;
}

// log(1 + x), accurate for small |x| (fdlibm's log1pf): the rounding error of u = 1 + x is carried as c.
fn log1p(x: f32) -> f32 {
    if (x < -1.0) { return nan(); }
    if (x == -1.0) { return -inf(); }
    if (is_inf(x) || x == 0.0) { return x; }  // keeps -0
    if (x > -0.29289321881345248 && x < 0.41421356237309503) {
        return log_sum(0.0, x, 0.0);  // 1 + x in [sqrt(1/2), sqrt(2)): no reduction, and x is exact
    }
    let u = opaque(1.0 + x);
    let c = select(x - (u - 1.0), 1.0 - (u - x), x > 1.0) / u;  // log(1 + x) = log(u) + c, nearly
    let p = log_parts(u);
    return log_sum(p.x, p.y, c);
}

// The exponentials, to about an ulp (WGSL's exp may be off by 3 + 2|x| ulps): x = k ln 2 + r with
// |r| <= ln(2) / 2, e^r - 1 by its Taylor series (to r^8: under half an ulp), then scaled by 2^k.
const EXP_MAX: f32 = 88.72283172607422;      // the largest x with a finite float32 exp(x)
const EXP_MIN: f32 = -103.97208404541016;    // exp(x) rounds to 0 at and below it
const HALF_EXP_MAX: f32 = 89.41598510742188; // the same for exp(x) / 2 (sinh, cosh)

fn expm1_poly(r: f32) -> f32 {
    return r + r * r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0
               + r * (1.0 / 5040.0 + r * (1.0 / 40320.0)))))));
}

// 2^k for an integer k in [-126, 127].
fn pow2(k: i32) -> f32 {
    return bitcast<f32>(u32(k + 127) << 23u);
}

// v 2^k for an integer k in [-252, 254], in two exact steps, so rounded at most once.
fn scale2(v: f32, k: i32) -> f32 {
    let half = k / 2;
    return v * pow2(half) * pow2(k - half);
}

// (k, r) with x = k ln 2 + r (Cody and Waite's two-part ln 2; k * LN2_HI is exact).
fn reduce_ln2(x: f32) -> vec2<f32> {
    let k = floor(x * LOG2E + 0.5);
    return vec2<f32>(k, (x - k * LN2_HI) - k * LN2_LO);
}

// e^x 2^j, for x and j whose result is within float32's range.
fn exp_scaled(x: f32, j: i32) -> f32 {
    let kr = reduce_ln2(x);
    return scale2(1.0 + expm1_poly(kr.y), i32(kr.x) + j);
}

fn exponential(x: f32) -> f32 {
    if (x > EXP_MAX) { return inf(); }
    if (x <= EXP_MIN) { return 0.0; }
    return exp_scaled(x, 0);
}

// exp(x) - 1, accurate for small |x|: 2^k (e^r - 1) + (2^k - 1) is exact but for one rounding while k < 25.
fn expm1(x: f32) -> f32 {
    if (x == 0.0) { return x; }  // keeps -0
    if (x > EXP_MAX) { return inf(); }
    if (x < -17.4) { return -1.0; }  // exp(x) is below half an ulp of 1
    let kr = reduce_ln2(x);
    let k = i32(kr.x);
    let p = expm1_poly(kr.y);
    if (k == 0) {
        return p;
    }
    if (k < 25) {
        let scale = pow2(k);
        return scale * p + (scale - 1.0);
    }
    return scale2(p + 1.0, k);
}

// 2^x = 2^k 2^f with k the integer nearest x; f = x - k is exact, and 2^f = e^(f ln 2).
fn exp_base2(x: f32) -> f32 {
    if (x > 127.99999237060547) { return inf(); }
    if (x < -151.0) { return 0.0; }
    let k = floor(x + 0.5);
    return scale2(1.0 + expm1_poly((x - k) * LN2), i32(k));
}

fn hyperbolic_sine(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if (a < 1.0) {
        let t = expm1(a);
        r = 0.5 * (2.0 * t - t * t / (t + 1.0));
    } else if (a < 12.0) {
        let t = expm1(a);
        r = 0.5 * (t + t / (t + 1.0));
    } else if (a <= HALF_EXP_MAX) {
        r = exp_scaled(a, -1);  // e^-a is under an ulp
    } else {
        r = inf();
    }
    return copysign(r, x);
}

fn hyperbolic_cosine(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.34657359027997264) {  // ln(2) / 2
        let t = expm1(a);
        return 1.0 + t * t / (2.0 * (1.0 + t));
    }
    if (a < 12.0) {
        let e = exponential(a);
        return 0.5 * e + 0.5 / e;
    }
    if (a <= HALF_EXP_MAX) {
        return exp_scaled(a, -1);
    }
    return inf();
}

// The inverse hyperbolic functions as fdlibm writes them, through log1p where the argument is near 1.
fn arcsinh(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if (is_inf(a)) {
        r = a;
    } else if (a > 268435456.0) {  // 2^28: sqrt(a^2 + 1) = a
        r = log_positive(a) + LN2;
    } else if (a > 2.0) {
        r = log_positive(2.0 * a + 1.0 / (sqrt(a * a + 1.0) + a));
    } else {
        let t = a * a;
        r = log1p(a + t / (1.0 + sqrt(1.0 + t)));
    }
    return copysign(r, x);
}

fn arccosh(x: f32) -> f32 {
    if (x < 1.0) { return nan(); }
    if (is_inf(x)) { return x; }
    if (x > 268435456.0) {
        return log_positive(x) + LN2;
    }
    if (x > 2.0) {
        return log_positive(2.0 * x - 1.0 / (x + sqrt(x * x - 1.0)));
    }
    let t = x - 1.0;
    return log1p(t + sqrt(2.0 * t + t * t));
}

fn arctanh(x: f32) -> f32 {
    let a = abs(x);
    if (a > 1.0) { return nan(); }
    if (a == 1.0) { return copysign(inf(), x); }
    var r: f32;
    if (a < 0.5) {
        let t = a + a;
        r = 0.5 * log1p(t + t * a / (1.0 - a));
    } else {
        r = 0.5 * log1p((a + a) / (1.0 - a));
    }
    return copysign(r, x);
}

// Round half to even (numpy's rint and round), keeping the sign of zero.
fn rint(x: f32) -> f32 {
    if (abs(x) >= TWO_POW_23) {
        return x;
    }
    var r = floor(x);
    let d = x - r;  // exact
    if (d > 0.5 || (d == 0.5 && (i32(r) & 1) != 0)) {
        r += 1.0;
    }
    return copysign(r, x);
}

// floor, ceil and trunc keep x's sign, so copysign gives numpy's signed zeros (ceil(-0.5) = -0).
fn integral(x: f32, r: f32) -> f32 {
    return select(copysign(r, x), x, abs(x) >= TWO_POW_23);
}

fn reciprocal(x: f32) -> f32 {
    if (x == 0.0) { return copysign(inf(), x); }
    if (is_inf(x)) { return copysign(0.0, x); }
    return 1.0 / x;
}

// hypot without overflow or underflow on the way: scaled by a power of two when large or small.
fn hypot(x: f32, y: f32) -> f32 {
    if (is_inf(x) || is_inf(y)) { return inf(); }  // even with a NaN, as C99 and numpy
    if (is_nan(x) || is_nan(y)) { return nan(); }
    let hi = max(abs(x), abs(y));
    let lo = min(abs(x), abs(y));
    if (hi == 0.0) { return 0.0; }
    // Large or small, hi is scaled by a power of two: the squares then neither overflow nor
    // underflow (subnormals may flush to zero) where the smaller one matters.
    var down = 1.0;
    var up = 1.0;
    if (hi > 1099511627776.0) {  // 2^40
        down = pow2(-70);
        up = pow2(70);
    } else if (hi < 9.094947017729282e-13) {  // 2^-40
        down = pow2(100);
        up = pow2(-100);
    }
    let a = hi * down;
    let b = lo * down;
    return sqrt(a * a + b * b) * up;
}

fn logaddexp(x: f32, y: f32) -> f32 {
    if (is_nan(x) || is_nan(y)) { return nan(); }
    if (x == y) { return x + LN2; }  // also both +inf or both -inf
    let hi = max(x, y);
    let d = -abs(x - y);  // -inf when one is infinite
    return hi + log1p(exponential(d));
}

// fmod of finite x and nonzero finite y, exactly (the remainder x - trunc(x / y) y is a float): a long
// division of the integer significands, eight bits of quotient a step, remainders below 2^32.
fn fmod_finite(x: f32, y: f32) -> f32 {
    let bx = bitcast<u32>(x) & 0x7fffffffu;
    let by = bitcast<u32>(y) & 0x7fffffffu;
    if (bx < by) {
        return x;  // |x| < |y|
    }
    // |v| = m 2^e with m < 2^24 an integer, e >= -149
    let ex = i32(max(bx >> 23u, 1u)) - 150;
    let ey = i32(max(by >> 23u, 1u)) - 150;
    let mx = select(bx & 0x007fffffu, (bx & 0x007fffffu) | 0x00800000u, bx >= 0x00800000u);
    let my = select(by & 0x007fffffu, (by & 0x007fffffu) | 0x00800000u, by >= 0x00800000u);
    var m = mx % my;
    var d = ex - ey;  // >= 0, as |x| >= |y|
    loop {
        if (d <= 0 || m == 0u) { break; }
        let step = min(d, 8);
        m = (m << u32(step)) % my;
        d -= step;
    }
    if (m == 0u) {
        return copysign(0.0, x);
    }
    // m 2^ey as a float, built from bits (exact: it is a multiple of 2^ey below |y|)
    let shift = countLeadingZeros(m) - 8u;  // brings the leading bit to bit 23
    let e = ey - i32(shift) + 150;  // biased exponent
    var bits: u32;
    if (e >= 1) {
        bits = (u32(e) << 23u) | ((m << shift) & 0x007fffffu);
    } else {
        bits = (m << shift) >> u32(1 - e);  // subnormal
    }
    return copysign(bitcast<f32>(bits), x);
}

fn fmod(x: f32, y: f32) -> f32 {
    if (is_nan(x) || is_nan(y) || is_inf(x) || y == 0.0) {
        return nan();
    }
    if (is_inf(y)) {
        return x;
    }
    return fmod_finite(x, y);
}

// numpy's divmod of floats (npy_divmod): (floor_divide, remainder), the remainder with the divisor's sign.
fn divmod(a: f32, b: f32) -> vec2<f32> {
    if (is_nan(a) || is_nan(b)) {
        return vec2<f32>(nan(), nan());
    }
    let negative = sign_bit(a) != sign_bit(b);  // the sign of a / b
    if (b == 0.0) {  // a / b, and fmod's NaN
        return vec2<f32>(select(select(inf(), -inf(), negative), nan(), a == 0.0), nan());
    }
    if (is_inf(a)) {
        return vec2<f32>(nan(), nan());
    }
    if (is_inf(b)) {
        if (a == 0.0 || !negative) {
            return vec2<f32>(signed_zero(negative), select(a, copysign(0.0, b), a == 0.0));
        }
        return vec2<f32>(-1.0, b);
    }
    let m = fmod_finite(a, b);
    var div = (a - m) / b;  // nearly an integer
    var md = m;
    if (m != 0.0) {
        if ((b < 0.0) != (m < 0.0)) {
            md += b;
            div -= 1.0;
        }
    } else {
        md = copysign(0.0, b);
    }
    var q: f32;
    if (div != 0.0) {
        q = floor(div);
        if (div - q > 0.5) {
            q += 1.0;
        }
    } else {
        q = signed_zero(negative);
    }
    return vec2<f32>(q, md);
}

// ---- The operations -----------------------------------------------------------------------------

fn unary_op(x: f32) -> f32 {
    if (OP >= 33u) {  // the predicates, which answer for NaN too
        return predicate(x);
    }
    if (is_nan(x) && OP != 0u && OP != 1u && OP != 2u) {
        return x;
    }
    if (is_inf(x) && OP >= 9u && OP <= 11u) {  // sin, cos, tan
        return nan();
    }
    switch OP {
        case 1u: { return -x; }
        case 2u: { return abs(x); }
        case 3u: { return exponential(x); }
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
        case 9u: { return sin_cos(x, false); }
        case 10u: { return sin_cos(x, true); }
        case 11u: { return tangent(x); }
        case 12u: { return arcsin(x); }
        case 13u: { return arccos(x); }
        case 14u: { return arctan(x); }
        case 15u: { return hyperbolic_sine(x); }
        case 16u: { return hyperbolic_cosine(x); }
        case 17u: { return arcsinh(x); }
        case 18u: { return arccosh(x); }
        case 19u: { return arctanh(x); }
        case 20u: { return integral(x, floor(x)); }
        case 21u: { return integral(x, ceil(x)); }
        case 22u: { return integral(x, trunc(x)); }
        case 23u: { return rint(x); }
        case 24u: { return f32(x > 0.0) - f32(x < 0.0); }  // sign(-0) = 0, as numpy 2
        case 25u: { return x * x; }
        case 26u: { return reciprocal(x); }
        case 27u: { return log_base2(x); }
        case 28u: { return log_base10(x); }
        case 29u: { return log1p(x); }
        case 30u: { return expm1(x); }
        case 31u: { return exp_base2(x); }
        case 32u: { return abs(x); }
        default: { return x; }
    }
}

// logical_not, isnan, isinf, isfinite and signbit, from the bits (NaN and -0 included).
fn predicate(x: f32) -> f32 {
    let magnitude = bitcast<u32>(x) & 0x7fffffffu;
    switch OP {
        case 33u: { return flag(magnitude == 0u); }
        case 34u: { return flag(magnitude > 0x7f800000u); }
        case 35u: { return flag(magnitude == 0x7f800000u); }
        case 36u: { return flag(magnitude < 0x7f800000u); }
        default: { return flag(sign_bit(x)); }
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
        case 13u: { return arctan2(x, y); }
        case 14u: { return hypot(x, y); }
        case 15u: {  // fmax and fmin ignore a NaN
            if (is_nan(x)) { return y; }
            if (is_nan(y)) { return x; }
            return max(x, y);
        }
        case 16u: {
            if (is_nan(x)) { return y; }
            if (is_nan(y)) { return x; }
            return min(x, y);
        }
        case 17u: { return copysign(x, y); }
        case 18u: { return logaddexp(x, y); }
        case 19u: { return divmod(x, y).x; }
        case 20u: { return divmod(x, y).y; }
        case 21u: { return fmod(x, y); }
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
