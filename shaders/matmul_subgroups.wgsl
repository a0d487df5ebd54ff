// Matmul with subgroup operations: the `subgroups8` entry point, for devices with WebGPU's
// "subgroups" feature only. It adds to matmul.wgsl, which is compiled after this file as one module
// (shaders/__init__.py, EXTENDS): Params, the bindings, `bases`, `store8`, `a_at` and the override
// constants WX and VEC4 are that file's, so matmul.wgsl itself stays valid on any device.
//
// No `enable subgroups;` directive: WGSL asks for one, but the Naga of wgpu-native (wgpu-py 0.32)
// rejects it ("not yet implemented") and accepts the builtins without it. Only wgpu devices run this
// file; a browser tab's device reports no subgroups, so Tint never sees it.
//
// A workgroup of WX invocations (one subgroup) computes an 8 x (8*WX) tile of C, each invocation
// an 8x8 block in registers (as `tiled8`), all of the same 8 rows. No workgroup memory and no
// barriers: K is walked in steps of WX, each invocation loading the 8 values of A at one k, and
// every invocation takes the step's values from the others with `subgroupShuffle`; B is read
// straight from global memory (a vec4 pair per k with VEC4, else element by element).
//
// Which invocations share a subgroup is the adapter's business: sharing is used only when the
// workgroup's WX invocations are one subgroup with ids 0..WX-1 (checked with subgroupAdd and
// subgroupMax; the host sets WX to at most the subgroup size). Otherwise (a subgroup smaller than
// WX) each invocation loads A itself: slower, still correct.

@compute @workgroup_size(WX)
fn subgroups8(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32,
              @builtin(subgroup_invocation_id) sid: u32) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_n * p.tiles_m;
    if (wid >= per_batch * p.batch) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let n0 = (wid % p.tiles_n) * 8u * WX;
    let m0 = ((wid / p.tiles_n) % p.tiles_m) * 8u;
    let base = bases(wid / per_batch);

    // One subgroup with ids 0..WX-1: every invocation's id is its lane, and lane kk holds step kk.
    let sharing = subgroupAdd(1u) == WX && subgroupMax(sid) == WX - 1u;
    let lane = select(li, sid, sharing);
    let col = n0 + lane * 8u;
    let a_row = base.x + m0 * p.lda;

    var r0a = vec4<f32>(0.0); var r0b = vec4<f32>(0.0);
    var r1a = vec4<f32>(0.0); var r1b = vec4<f32>(0.0);
    var r2a = vec4<f32>(0.0); var r2b = vec4<f32>(0.0);
    var r3a = vec4<f32>(0.0); var r3b = vec4<f32>(0.0);
    var r4a = vec4<f32>(0.0); var r4b = vec4<f32>(0.0);
    var r5a = vec4<f32>(0.0); var r5b = vec4<f32>(0.0);
    var r6a = vec4<f32>(0.0); var r6b = vec4<f32>(0.0);
    var r7a = vec4<f32>(0.0); var r7b = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.K; k0 += WX) {
        let steps = min(WX, p.K - k0);
        // This lane's k of the step: A's 8 rows there (zero past M or K).
        let mine = column8(a_row, m0, k0 + lane, lane < steps);
        for (var kk = 0u; kk < steps; kk++) {
            var alo = subgroupShuffle(mine[0], kk);
            var ahi = subgroupShuffle(mine[1], kk);
            if (!sharing) {
                let own = column8(a_row, m0, k0 + kk, true);
                alo = own[0];
                ahi = own[1];
            }
            let b_at_k = base.y + (k0 + kk) * p.ldb + col;
            var b0 = vec4<f32>(0.0);
            var b1 = vec4<f32>(0.0);
            if (VEC4) {
                // N and every offset are multiples of 4: a vec4 starting inside a row lies inside it
                if (col < p.N) { b0 = B[b_at_k / 4u]; }
                if (col + 4u < p.N) { b1 = B[b_at_k / 4u + 1u]; }
            } else {
                for (var j = 0u; j < 4u; j++) {
                    if (col + j < p.N) { b0[j] = b_at(b_at_k + j); }
                    if (col + 4u + j < p.N) { b1[j] = b_at(b_at_k + 4u + j); }
                }
            }
            r0a = fma(vec4<f32>(alo.x), b0, r0a); r0b = fma(vec4<f32>(alo.x), b1, r0b);
            r1a = fma(vec4<f32>(alo.y), b0, r1a); r1b = fma(vec4<f32>(alo.y), b1, r1b);
            r2a = fma(vec4<f32>(alo.z), b0, r2a); r2b = fma(vec4<f32>(alo.z), b1, r2b);
            r3a = fma(vec4<f32>(alo.w), b0, r3a); r3b = fma(vec4<f32>(alo.w), b1, r3b);
            r4a = fma(vec4<f32>(ahi.x), b0, r4a); r4b = fma(vec4<f32>(ahi.x), b1, r4b);
            r5a = fma(vec4<f32>(ahi.y), b0, r5a); r5b = fma(vec4<f32>(ahi.y), b1, r5b);
            r6a = fma(vec4<f32>(ahi.z), b0, r6a); r6b = fma(vec4<f32>(ahi.z), b1, r6b);
            r7a = fma(vec4<f32>(ahi.w), b0, r7a); r7b = fma(vec4<f32>(ahi.w), b1, r7b);
        }
    }

    store8(m0, col, base.z, r0a, r0b);
    store8(m0 + 1u, col, base.z, r1a, r1b);
    store8(m0 + 2u, col, base.z, r2a, r2b);
    store8(m0 + 3u, col, base.z, r3a, r3b);
    store8(m0 + 4u, col, base.z, r4a, r4b);
    store8(m0 + 5u, col, base.z, r5a, r5b);
    store8(m0 + 6u, col, base.z, r6a, r6b);
    store8(m0 + 7u, col, base.z, r7a, r7b);
}

// A's values at column k of rows m0..m0+7 (`a_row` is row m0's start): rows 0-3 and 4-7; zero
// past M, and all zero unless `inside` (k within the matrix).
fn column8(a_row: u32, m0: u32, k: u32, inside: bool) -> array<vec4<f32>, 2> {
    var v = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    if (inside) {
        for (var r = 0u; r < 8u; r++) {
            if (m0 + r < p.M) {
                v[r / 4u][r % 4u] = a_at(a_row + r * p.lda + k);
            }
        }
    }
    return v;
}
