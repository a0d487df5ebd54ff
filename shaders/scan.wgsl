// Inclusive scans (cumsum, cumprod) along one axis of a contiguous float32 array.
//
// The host views the input as (outer, len, inner) and scans the middle axis; the result has the
// input's shape. A line of the axis can be cut into `chunks` spans of `chunk` values, numbered
// (outer, chunk, inner) like the outputs of reduce.wgsl. Entry points:
//
// - `threads`: one invocation scans one span, value after value (short axes, many lines).
// - `rows`: one workgroup scans one span, block after block of BLOCK values: each invocation adds
//   up its K adjacent values (one vec4 load through `x4`, the same buffer as `x`, when `quads` != 0:
//   inner 1 and every span starting on a vec4), the workgroup scans those 256 totals in workgroup
//   memory (raking: 16 invocations scan 16 each, then one scans their 16 totals; four barriers a
//   block), and each invocation then walks its values again from its prefix: work-efficient,
//   every value read and written once. A running carry joins the blocks. With `carried` != 0 a
//   span other than the first of its line starts from `carry_in[o - inner]` (hi; lo at
//   `carry_lo + o - inner`): the scanned totals of the spans before it.
// - `totals`: one workgroup reduces one span to its total (the first pass of a long axis), in the
//   order `rows` combines the span's values.
//
// A long axis with few lines takes three passes: `totals` of its spans, a scan of those totals
// (`threads` or `rows`), and `rows` of the spans from the scanned totals as carries.
//
// OP: 0 cumsum, 1 cumprod. Both are carried as unevaluated float-float pairs hi + lo: sums with
// Knuth's TwoSum (as in reduce.wgsl), products with Dekker's TwoProduct. Every prefix is exact to
// about 2^-44 of the magnitude of its terms (of its own magnitude, for products) before its one
// rounding to float32, however long the axis and in whatever order the scan combines values. (Plain
// float32 products would not do: combining factors near 1 in a tree rounds down more often than up,
// about 10 ulps every 4096 factors.) Pairs travel between passes with their lo values after the
// `count` his (`lo_in`, `lo_out`: element offsets, 0 for plain float32).
// NaN and infinities propagate as in numpy: a NaN makes every later prefix NaN.

override OP: u32 = 0u;
const WG: u32 = 256u;
const K: u32 = 4u;  // values an invocation scans in a block
const BLOCK: u32 = 1024u;  // WG * K
const RAKE: u32 = 16u;  // WG = RAKE * RAKE: workgroup scans in two levels of RAKE

struct Params {
    outer: u32, len: u32, inner: u32, chunks: u32,
    chunk: u32, count: u32, lo_in: u32, lo_out: u32,
    carried: u32, carry_lo: u32, one: f32, quads: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> carry_in: array<f32>;
@group(0) @binding(4) var<storage, read> x4: array<vec4<f32>>;  // x, for `rows` when `quads` != 0

var<workgroup> part_hi: array<f32, WG>;
var<workgroup> part_lo: array<f32, WG>;
var<workgroup> rake_hi: array<f32, RAKE>;
var<workgroup> rake_lo: array<f32, RAKE>;

// A running result, hi + lo (|lo| at most half an ulp of hi).
struct Acc {
    hi: f32,
    lo: f32,
}

// Special values by bit pattern, through a function: NaN and infinity as constant expressions are a
// shader-creation error by the WGSL spec (Chrome's compiler refuses them).
fn f32_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// -0.0 for sums (so a line of -0.0 stays -0.0, as numpy's), 1.0 for products.
fn identity() -> Acc {
    if (OP == 1u) {
        return Acc(1.0, 0.0);
    }
    return Acc(f32_bits(0x80000000u), 0.0);
}

// `v` unchanged, in a way no compiler can see through: `p.one` is 1.0, but only at run time.
// Without it, optimisers that treat float addition as associative rewrite (a + b) - a as b,
// which is exactly the rounding error TwoSum exists to capture.
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
    if (err == 0.0) {
        return Acc(s, 0.0);  // exact: s keeps the sign of a zero sum (-0.0 + -0.0 is -0.0)
    }
    let hi = opaque(s + err);
    return Acc(hi, err - (hi - s));
}

// `a` as hi + lo, each with at most 12 significant bits, so that products of halves are exact
// (Veltkamp's split). For |a| up to 2^112, short of where 4097 * a overflows.
fn split(a: f32) -> Acc {
    let c = opaque(4097.0 * a);
    let hi = opaque(c - opaque(c - a));
    return Acc(hi, a - hi);
}

// (u.hi + u.lo) * (v.hi + v.lo) as a float-float pair: the product of the his exactly (Dekker's
// TwoProduct, which needs no fma), plus the cross terms. Infinities, NaN, zeros and factors too
// large to split are plain float32 products.
fn mul(u: Acc, v: Acc) -> Acc {
    let prod = opaque(u.hi * v.hi);
    let big = f32_bits(0x77800000u);  // 2^112
    if (!is_finite(prod) || prod == 0.0 || abs(u.hi) > big || abs(v.hi) > big) {
        return Acc(prod, 0.0);
    }
    let a = split(u.hi);
    let b = split(v.hi);
    let exact = ((a.hi * b.hi - prod) + a.hi * b.lo + a.lo * b.hi) + a.lo * b.lo;
    let err = exact + (u.hi * v.lo + u.lo * v.hi);
    if (err == 0.0) {
        return Acc(prod, 0.0);
    }
    let hi = opaque(prod + err);
    return Acc(hi, err - opaque(hi - prod));
}

fn combine(u: Acc, v: Acc) -> Acc {
    if (OP == 1u) {
        return mul(u, v);
    }
    return add(u, v);
}

fn load(i: u32) -> Acc {
    if (p.lo_in == 0u) {
        return Acc(x[i], 0.0);
    }
    return Acc(x[i], x[p.lo_in + i]);
}

fn store(i: u32, v: Acc) {
    out[i] = v.hi;  // pairs are normalised: hi is the pair rounded to float32
    if (p.lo_out != 0u) {
        out[p.lo_out + i] = v.lo;
    }
}

struct Span {
    first: u32,  // element offset of the span's first value
    count: u32,  // number of values
    c: u32,      // which span of its line
}

// The values of span o: every `inner`-th element from `first`.
fn span(o: u32) -> Span {
    let inner_i = o % p.inner;
    let rest = o / p.inner;
    let c = rest % p.chunks;
    let outer_i = rest / p.chunks;
    let begin = c * p.chunk;
    let end = min(begin + p.chunk, p.len);
    return Span((outer_i * p.len + begin) * p.inner + inner_i, end - begin, c);
}

@compute @workgroup_size(64)
fn threads(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.x + gid.y * nwg.x * 64u;
    if (o >= p.count) {
        return;
    }
    let s = span(o);
    var run = identity();
    for (var j = 0u; j < s.count; j++) {
        let i = s.first + j * p.inner;
        run = combine(run, load(i));
        store(i, run);
    }
}

// The total of `v` over the workgroup's invocations, in their order (every invocation calls it, and
// gets it): RAKE invocations combine RAKE values each, then each invocation those RAKE results. Two
// barriers, not log2(WG); a next call may follow at once (its first barrier waits for these reads).
fn workgroup_total(li: u32, v: Acc) -> Acc {
    part_hi[li] = v.hi;
    part_lo[li] = v.lo;
    workgroupBarrier();
    if (li < RAKE) {
        var r = Acc(part_hi[li * RAKE], part_lo[li * RAKE]);
        for (var m = 1u; m < RAKE; m++) {
            r = combine(r, Acc(part_hi[li * RAKE + m], part_lo[li * RAKE + m]));
        }
        rake_hi[li] = r.hi;
        rake_lo[li] = r.lo;
    }
    workgroupBarrier();
    var total = Acc(rake_hi[0], rake_lo[0]);
    for (var g = 1u; g < RAKE; g++) {
        total = combine(total, Acc(rake_hi[g], rake_lo[g]));
    }
    return total;
}

// The K adjacent values of span s from its value `mine` (identity past the span's end), one vec4 load
// where it can.
struct Own {
    hi: array<f32, K>,
    lo: array<f32, K>,
}

fn own_values(s: Span, mine: u32) -> Own {
    var v: Own;  // lo zero
    if (p.quads != 0u && mine + K <= s.count) {
        let q = x4[(s.first + mine) / 4u];
        v.hi = array<f32, K>(q.x, q.y, q.z, q.w);
        return v;
    }
    for (var k = 0u; k < K; k++) {
        var a = identity();
        if (mine + k < s.count) {
            a = load(s.first + (mine + k) * p.inner);
        }
        v.hi[k] = a.hi;
        v.lo[k] = a.lo;
    }
    return v;
}

fn own_total(v: Own) -> Acc {
    var acc = Acc(v.hi[0], v.lo[0]);
    for (var k = 1u; k < K; k++) {
        acc = combine(acc, Acc(v.hi[k], v.lo[k]));
    }
    return acc;
}

// Reduces a span block by block, combining values in exactly the order `rows` does: so the carry
// that `rows` reaches at a span's end is this total, and products combine adjacent values first
// (a product that would over- or underflow only if far-apart factors met first stays finite).
@compute @workgroup_size(WG)
fn totals(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let o = wg.x + wg.y * nwg.x;
    if (o >= p.count) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let s = span(o);
    var carry = identity();
    for (var b0 = 0u; b0 < s.count; b0 += BLOCK) {
        carry = combine(carry, workgroup_total(li, own_total(own_values(s, b0 + li * K))));
    }
    if (li == 0u) {
        store(o, carry);
    }
}

@compute @workgroup_size(WG)
fn rows(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let o = wg.x + wg.y * nwg.x;
    if (o >= p.count) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let s = span(o);
    var carry = identity();
    if (p.carried != 0u && s.c > 0u) {
        let before = o - p.inner;  // span c - 1 of the same line
        carry = Acc(carry_in[before], carry_in[p.carry_lo + before]);
    }
    for (var b0 = 0u; b0 < s.count; b0 += BLOCK) {
        let mine = b0 + li * K;
        let v = own_values(s, mine);
        let acc = own_total(v);
        // The invocations' totals scanned, inclusive: RAKE invocations scan RAKE totals each, then
        // one scans those groups' totals.
        part_hi[li] = acc.hi;
        part_lo[li] = acc.lo;
        workgroupBarrier();
        if (li < RAKE) {
            var r = Acc(part_hi[li * RAKE], part_lo[li * RAKE]);
            for (var m = 1u; m < RAKE; m++) {
                r = combine(r, Acc(part_hi[li * RAKE + m], part_lo[li * RAKE + m]));
                part_hi[li * RAKE + m] = r.hi;
                part_lo[li * RAKE + m] = r.lo;
            }
            rake_hi[li] = r.hi;
            rake_lo[li] = r.lo;
        }
        workgroupBarrier();
        if (li == 0u) {
            var r = Acc(rake_hi[0], rake_lo[0]);
            for (var g = 1u; g < RAKE; g++) {
                r = combine(r, Acc(rake_hi[g], rake_lo[g]));
                rake_hi[g] = r.hi;
                rake_lo[g] = r.lo;
            }
        }
        workgroupBarrier();
        // This invocation's values again, from the carry and everything before them in the block.
        var run = carry;
        if (li >= RAKE) {
            run = combine(run, Acc(rake_hi[li / RAKE - 1u], rake_lo[li / RAKE - 1u]));
        }
        if (li % RAKE != 0u) {
            run = combine(run, Acc(part_hi[li - 1u], part_lo[li - 1u]));
        }
        for (var k = 0u; k < K; k++) {
            if (mine + k < s.count) {
                run = combine(run, Acc(v.hi[k], v.lo[k]));
                store(s.first + (mine + k) * p.inner, run);
            }
        }
        carry = combine(carry, Acc(rake_hi[RAKE - 1u], rake_lo[RAKE - 1u]));
        workgroupBarrier();  // the next block's totals overwrite these
    }
}
