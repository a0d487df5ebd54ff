// Batched float32 matrix product: C = A @ B, or C += A @ B when `accumulate` is set.
//
// Three entry points, one per kind of tiling; the host (worker/gpu/matmul.py) picks one by shape
// and adapter and sets the override constants below:
//
// * `naive`: one invocation per element of C, every operand value read from global memory. For
//   small and skinny products, where a tile would mostly hold padding.
// * `tiled4`: a workgroup of WX x WY invocations computes a (4*WY) x (4*WX) tile of C, each
//   invocation a 4x4 block (four vec4 accumulators).
// * `tiled8`: the same with 8x8 blocks (sixteen vec4 accumulators): (8*WY) x (8*WX) tiles.
//
// The tiled kernels walk K in steps of BK through workgroup memory, so every value loaded from
// global memory feeds TM multiply-adds from workgroup memory.
//
// A and B are declared as vec4 arrays. With VEC4 set (the host's promise that K, N, lda, ldb, the
// element offsets and the batch strides are multiples of 4), tiles are loaded a vec4 at a time;
// otherwise one element at a time (`A[i / 4][i % 4]`), which serves any shape. The host binds
// A and B with sizes rounded up to 16 bytes, so the last partial vec4 is inside the binding.
//
// TRANS_A and TRANS_B read A stored K x M and B stored N x K (tinygrad's `x @ w.T` and `g.T @ x`, run
// by worker/gpu/tinygrad_matmul.py), one element at a time; the subgroup kernel has no such layouts.
//
// Split-K (the host's choice for a C too small to fill the GPU with tiles): the host makes each of S
// parts of K a batch entry of its own, whose product goes to partial sums, and `sum_splits` adds them.
//
// Dispatch: one workgroup per (column tile, row tile, batch), numbered linearly and folded by
// the host over x and y when the count passes the 65,535-per-dimension limit. Leading (batch)
// dimensions broadcast as in numpy: the host passes the batch shape and each operand's batch
// strides (0 where an operand is broadcast). Matrices are addressed with leading dimensions
// (lda, ldb, ldc) and element offsets, so the host can bind slices of larger buffers when it
// splits a product that exceeds one binding's size.

override WX: u32 = 16u;       // invocations per workgroup along N
override WY: u32 = 16u;       // invocations per workgroup along M
override TM: u32 = 8u;        // rows and columns of C per invocation: 4 (tiled4) or 8 (tiled8)
override VEC4: bool = false;  // load A and B tiles as vec4 (shapes aligned to 4; see above)
override TRANS_A: bool = false;  // A is stored K x M: A's (m, k) at k * lda + m (never with VEC4)
override TRANS_B: bool = false;  // B is stored N x K: B's (k, n) at n * ldb + k (never with VEC4)
const BK: u32 = 16u;          // K step through workgroup memory

struct Params {
    M: u32, N: u32, K: u32, batch: u32,
    lda: u32, ldb: u32, ldc: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, batch_ndim: u32,
    tiles_n: u32, tiles_m: u32, c_bstride: u32, _pad: u32,
    batch_shape: array<vec4<u32>, 2>,
    a_bstride: array<vec4<u32>, 2>,
    b_bstride: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// A tile stored K-major (BK rows of TM*WY values), B tile stored K-major (BK rows of TM*WX
// values): 16 KiB (WebGPU's guaranteed minimum) for tiled8 at 16x16 invocations.
var<workgroup> As: array<vec4<f32>, BK * TM * WY / 4u>;
var<workgroup> Bs: array<vec4<f32>, BK * TM * WX / 4u>;

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

fn a_at(i: u32) -> f32 {
    return A[i / 4u][i % 4u];
}

fn b_at(i: u32) -> f32 {
    return B[i / 4u][i % 4u];
}

// A's (m, k) and B's (k, n) from the batch entry at `base`, either layout (TRANS_A, TRANS_B).
fn a_elem(base: u32, m: u32, k: u32) -> f32 {
    if (TRANS_A) {
        return a_at(base + k * p.lda + m);
    }
    return a_at(base + m * p.lda + k);
}

fn b_elem(base: u32, k: u32, n: u32) -> f32 {
    if (TRANS_B) {
        return b_at(base + n * p.ldb + k);
    }
    return b_at(base + k * p.ldb + n);
}

// Element offsets of batch entry `entry` in A, B and C, broadcasting leading dimensions.
fn bases(entry: u32) -> vec3<u32> {
    var rest = entry;
    var a_base = p.a_off;
    var b_base = p.b_off;
    for (var d = i32(p.batch_ndim) - 1; d >= 0; d--) {
        let size = get4(p.batch_shape, u32(d));
        let i = rest % size;
        rest = rest / size;
        a_base += i * get4(p.a_bstride, u32(d));
        b_base += i * get4(p.b_bstride, u32(d));
    }
    return vec3<u32>(a_base, b_base, p.c_off + entry * p.c_bstride);
}

fn result(at: u32, v: f32) -> f32 {
    if (p.accumulate != 0u) {
        return C[at] + v;
    }
    return v;
}

// Four values of one row of C from column `col`, those inside the matrix.
fn store4(row: u32, col: u32, base: u32, v: vec4<f32>) {
    if (row >= p.M) {
        return;
    }
    let at = base + row * p.ldc + col;
    for (var j = 0u; j < 4u; j++) {
        if (col + j < p.N) {
            C[at + j] = result(at + j, v[j]);
        }
    }
}

fn store8(row: u32, col: u32, base: u32, lo: vec4<f32>, hi: vec4<f32>) {
    store4(row, col, base, lo);
    store4(row, col + 4u, base, hi);
}

// Loads the tiles of A (rows m0.., K k0..) and B (K k0.., columns n0..) into workgroup memory,
// zero past the matrices' edges. Invocation `li` of the workgroup's `nt` takes every nt-th value.
fn load_tiles(li: u32, m0: u32, n0: u32, k0: u32, a_base: u32, b_base: u32) {
    let bm = TM * WY;
    let bn = TM * WX;
    let nt = WX * WY;
    if (VEC4) {
        // A: bm rows of BK / 4 vec4s; each vec4 is four k of one row, spread over four rows of As.
        for (var e = li; e < bm * BK / 4u; e += nt) {
            let m = e / (BK / 4u);
            let k = (e % (BK / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if (m0 + m < p.M && k0 + k < p.K) {
                v = A[(a_base + (m0 + m) * p.lda + k0 + k) / 4u];
            }
            for (var j = 0u; j < 4u; j++) {
                let at = (k + j) * bm + m;
                As[at / 4u][at % 4u] = v[j];
            }
        }
        for (var e = li; e < bn * BK / 4u; e += nt) {
            let k = e / (bn / 4u);
            let n = (e % (bn / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if (k0 + k < p.K && n0 + n < p.N) {
                v = B[(b_base + (k0 + k) * p.ldb + n0 + n) / 4u];
            }
            Bs[e] = v;
        }
        return;
    }
    // A: bm x BK values; consecutive invocations read consecutive k of one row.
    for (var e = li; e < bm * BK; e += nt) {
        let m = e / BK;
        let k = e % BK;
        var v = 0.0;
        if (m0 + m < p.M && k0 + k < p.K) {
            v = a_elem(a_base, m0 + m, k0 + k);
        }
        let at = k * bm + m;
        As[at / 4u][at % 4u] = v;
    }
    // B: BK x bn values, four consecutive columns per invocation.
    for (var e = li; e < bn * BK / 4u; e += nt) {
        let k = e / (bn / 4u);
        let n = (e % (bn / 4u)) * 4u;
        var v = vec4<f32>(0.0);
        if (k0 + k < p.K) {
            for (var t = 0u; t < 4u; t++) {
                if (n0 + n + t < p.N) {
                    v[t] = b_elem(b_base, k0 + k, n0 + n + t);
                }
            }
        }
        Bs[e] = v;
    }
}

@compute @workgroup_size(WX, WY)
fn naive(@builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_n * p.tiles_m;
    let col = (wid % p.tiles_n) * WX + lid.x;
    let row = ((wid / p.tiles_n) % p.tiles_m) * WY + lid.y;
    if (wid >= per_batch * p.batch || row >= p.M || col >= p.N) {
        return;  // no barriers below: invocations may leave on their own
    }
    let base = bases(wid / per_batch);
    var acc = 0.0;
    for (var k = 0u; k < p.K; k++) {
        acc = fma(a_elem(base.x, row, k), b_elem(base.y, k, col), acc);
    }
    let at = base.z + row * p.ldc + col;
    C[at] = result(at, acc);
}

@compute @workgroup_size(WX, WY)
fn tiled4(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_n * p.tiles_m;
    if (wid >= per_batch * p.batch) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let bm = TM * WY;
    let bn = TM * WX;
    let n0 = (wid % p.tiles_n) * bn;
    let m0 = ((wid / p.tiles_n) % p.tiles_m) * bm;
    let base = bases(wid / per_batch);

    var r0 = vec4<f32>(0.0);
    var r1 = vec4<f32>(0.0);
    var r2 = vec4<f32>(0.0);
    var r3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.K; k0 += BK) {
        load_tiles(li, m0, n0, k0, base.x, base.y);
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = As[k * (bm / 4u) + lid.y];
            let b = Bs[k * (bn / 4u) + lid.x];
            r0 = fma(vec4<f32>(a.x), b, r0);
            r1 = fma(vec4<f32>(a.y), b, r1);
            r2 = fma(vec4<f32>(a.z), b, r2);
            r3 = fma(vec4<f32>(a.w), b, r3);
        }
        workgroupBarrier();
    }

    let row = m0 + lid.y * 4u;
    let col = n0 + lid.x * 4u;
    store4(row, col, base.z, r0);
    store4(row + 1u, col, base.z, r1);
    store4(row + 2u, col, base.z, r2);
    store4(row + 3u, col, base.z, r3);
}

@compute @workgroup_size(WX, WY)
fn tiled8(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_n * p.tiles_m;
    if (wid >= per_batch * p.batch) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let bm = TM * WY;
    let bn = TM * WX;
    let n0 = (wid % p.tiles_n) * bn;
    let m0 = ((wid / p.tiles_n) % p.tiles_m) * bm;
    let base = bases(wid / per_batch);

    var r0a = vec4<f32>(0.0); var r0b = vec4<f32>(0.0);
    var r1a = vec4<f32>(0.0); var r1b = vec4<f32>(0.0);
    var r2a = vec4<f32>(0.0); var r2b = vec4<f32>(0.0);
    var r3a = vec4<f32>(0.0); var r3b = vec4<f32>(0.0);
    var r4a = vec4<f32>(0.0); var r4b = vec4<f32>(0.0);
    var r5a = vec4<f32>(0.0); var r5b = vec4<f32>(0.0);
    var r6a = vec4<f32>(0.0); var r6b = vec4<f32>(0.0);
    var r7a = vec4<f32>(0.0); var r7b = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.K; k0 += BK) {
        load_tiles(li, m0, n0, k0, base.x, base.y);
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let alo = As[k * (bm / 4u) + lid.y * 2u];
            let ahi = As[k * (bm / 4u) + lid.y * 2u + 1u];
            let b0 = Bs[k * (bn / 4u) + lid.x * 2u];
            let b1 = Bs[k * (bn / 4u) + lid.x * 2u + 1u];
            r0a = fma(vec4<f32>(alo.x), b0, r0a); r0b = fma(vec4<f32>(alo.x), b1, r0b);
            r1a = fma(vec4<f32>(alo.y), b0, r1a); r1b = fma(vec4<f32>(alo.y), b1, r1b);
            r2a = fma(vec4<f32>(alo.z), b0, r2a); r2b = fma(vec4<f32>(alo.z), b1, r2b);
            r3a = fma(vec4<f32>(alo.w), b0, r3a); r3b = fma(vec4<f32>(alo.w), b1, r3b);
            r4a = fma(vec4<f32>(ahi.x), b0, r4a); r4b = fma(vec4<f32>(ahi.x), b1, r4b);
            r5a = fma(vec4<f32>(ahi.y), b0, r5a); r5b = fma(vec4<f32>(ahi.y), b1, r5b);
            r6a = fma(vec4<f32>(ahi.z), b0, r6a); r6b = fma(vec4<f32>(ahi.z), b1, r6b);
            r7a = fma(vec4<f32>(ahi.w), b0, r7a); r7b = fma(vec4<f32>(ahi.w), b1, r7b);
        }
        workgroupBarrier();
    }

    let row = m0 + lid.y * 8u;
    let col = n0 + lid.x * 8u;
    store8(row, col, base.z, r0a, r0b);
    store8(row + 1u, col, base.z, r1a, r1b);
    store8(row + 2u, col, base.z, r2a, r2b);
    store8(row + 3u, col, base.z, r3a, r3b);
    store8(row + 4u, col, base.z, r4a, r4b);
    store8(row + 5u, col, base.z, r5a, r5b);
    store8(row + 6u, col, base.z, r6a, r6b);
    store8(row + 7u, col, base.z, r7a, r7b);
}

// Split-K's second pass: C (+)= the sum of the S partial products, bound as A, one after another (p.K = S,
// p.c_bstride values each, C's values too). One invocation per value of C, 256 per workgroup, folded as above.
@compute @workgroup_size(256)
fn sum_splits(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + li;
    if (i >= p.c_bstride) {
        return;
    }
    var total = 0.0;
    for (var part = 0u; part < p.K; part++) {
        total += a_at(part * p.c_bstride + i);
    }
    C[p.c_off + i] = result(p.c_off + i, total);
}
