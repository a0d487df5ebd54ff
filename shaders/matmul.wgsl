// Batched float32 matrix product: C = A @ B, or C += A @ B when `accumulate` is set.
//
// Tiling: a workgroup of WX x WY invocations computes a (8*WY) x (8*WX) tile of C. Each
// invocation keeps an 8x8 block of C in registers (sixteen vec4 accumulators) and walks K in
// steps of BK through workgroup memory, so every value loaded from global memory feeds
// 8 multiply-adds from workgroup memory.
//
// Dispatch: one workgroup per (column tile, row tile, batch), numbered linearly and folded by
// the host over x and y when the count passes the 65,535-per-dimension limit. Leading (batch)
// dimensions broadcast as in numpy: the host passes the batch shape and each operand's batch
// strides (0 where an operand is broadcast). Matrices are addressed with leading dimensions
// (lda, ldb, ldc) and element offsets, so the host can bind slices of larger buffers when it
// splits a product that exceeds one binding's size.

override WX: u32 = 8u;  // invocations per workgroup along N (8 or 16)
override WY: u32 = 8u;  // invocations per workgroup along M (8 or 16)
const BK: u32 = 16u;    // K step through workgroup memory

struct Params {
    M: u32, N: u32, K: u32, batch: u32,
    lda: u32, ldb: u32, ldc: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, batch_ndim: u32,
    tiles_n: u32, tiles_m: u32, c_bstride: u32, _pad: u32,
    batch_shape: array<vec4<u32>, 2>,
    a_bstride: array<vec4<u32>, 2>,
    b_bstride: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// A tile stored K-major (BK rows of 8*WY values), B tile stored K-major (BK rows of 8*WX values):
// 8 KiB in all for 8x8 invocations, 16 KiB (WebGPU's guaranteed minimum) for 16x16.
var<workgroup> As: array<vec4<f32>, BK * 2u * WY>;
var<workgroup> Bs: array<vec4<f32>, BK * 2u * WX>;

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

fn result(at: u32, v: f32) -> f32 {
    if (p.accumulate != 0u) {
        return C[at] + v;
    }
    return v;
}

fn store_row(row: u32, col: u32, base: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (row >= p.M) {
        return;
    }
    let at = base + row * p.ldc + col;
    for (var j = 0u; j < 4u; j++) {
        if (col + j < p.N) {
            C[at + j] = result(at + j, lo[j]);
        }
        if (col + 4u + j < p.N) {
            C[at + 4u + j] = result(at + 4u + j, hi[j]);
        }
    }
}

@compute @workgroup_size(WX, WY)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_n * p.tiles_m;
    if (wid >= per_batch * p.batch) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let bm = 8u * WY;
    let bn = 8u * WX;
    let nt = WX * WY;
    let n0 = (wid % p.tiles_n) * bn;
    let m0 = ((wid / p.tiles_n) % p.tiles_m) * bm;

    // Offsets of this batch entry in A, B and C, broadcasting leading dimensions.
    var rest = wid / per_batch;
    var a_base = p.a_off;
    var b_base = p.b_off;
    let c_base = p.c_off + rest * p.c_bstride;
    for (var d = i32(p.batch_ndim) - 1; d >= 0; d--) {
        let size = get4(p.batch_shape, u32(d));
        let i = rest % size;
        rest = rest / size;
        a_base += i * get4(p.a_bstride, u32(d));
        b_base += i * get4(p.b_bstride, u32(d));
    }

    var r0a = vec4<f32>(0.0); var r0b = vec4<f32>(0.0);
    var r1a = vec4<f32>(0.0); var r1b = vec4<f32>(0.0);
    var r2a = vec4<f32>(0.0); var r2b = vec4<f32>(0.0);
    var r3a = vec4<f32>(0.0); var r3b = vec4<f32>(0.0);
    var r4a = vec4<f32>(0.0); var r4b = vec4<f32>(0.0);
    var r5a = vec4<f32>(0.0); var r5b = vec4<f32>(0.0);
    var r6a = vec4<f32>(0.0); var r6b = vec4<f32>(0.0);
    var r7a = vec4<f32>(0.0); var r7b = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.K; k0 += BK) {
        // A tile: bm x BK values; consecutive invocations read consecutive k of one row.
        for (var e = li; e < bm * BK; e += nt) {
            let m = e / BK;
            let k = e % BK;
            var v = 0.0;
            if (m0 + m < p.M && k0 + k < p.K) {
                v = A[a_base + (m0 + m) * p.lda + k0 + k];
            }
            let at = k * bm + m;
            As[at / 4u][at % 4u] = v;
        }
        // B tile: BK x bn values, four consecutive columns per invocation.
        for (var e = li; e < bn * BK / 4u; e += nt) {
            let k = e / (bn / 4u);
            let n = (e % (bn / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if (k0 + k < p.K) {
                let at = b_base + (k0 + k) * p.ldb + n0 + n;
                if (n0 + n + 3u < p.N) {
                    v = vec4<f32>(B[at], B[at + 1u], B[at + 2u], B[at + 3u]);
                } else {
                    for (var t = 0u; t < 4u; t++) {
                        if (n0 + n + t < p.N) {
                            v[t] = B[at + t];
                        }
                    }
                }
            }
            Bs[e] = v;
        }
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
    store_row(row, col, c_base, r0a, r0b);
    store_row(row + 1u, col, c_base, r1a, r1b);
    store_row(row + 2u, col, c_base, r2a, r2b);
    store_row(row + 3u, col, c_base, r3a, r3b);
    store_row(row + 4u, col, c_base, r4a, r4b);
    store_row(row + 5u, col, c_base, r5a, r5b);
    store_row(row + 6u, col, c_base, r6a, r6b);
    store_row(row + 7u, col, c_base, r7a, r7b);
}
