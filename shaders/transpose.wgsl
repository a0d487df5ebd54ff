// Float32 transpose: writes a contiguous copy of a permuted view of a contiguous array.
//
// `tiles` swaps the last two axes of a (batch, rows, cols) array through a 16x16 tile in
// workgroup memory, so reads and writes are both contiguous. `permute` handles any axis order:
// output element i reads the input at sum(index_d * strides_d), where the host has permuted the
// input strides into output order. Workgroups are numbered linearly, folded over x and y.

const T: u32 = 16u;
const WG: u32 = 256u;

struct Params {
    n: u32, ndim: u32, rows: u32, cols: u32,
    batch: u32, tiles_r: u32, tiles_c: u32, _pad: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> tile: array<f32, T * (T + 1u)>;

fn get4(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

@compute @workgroup_size(T, T)
fn tiles(@builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
    let wid = wg.x + wg.y * nwg.x;
    let per_batch = p.tiles_r * p.tiles_c;
    if (wid >= per_batch * p.batch) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let b = wid / per_batch;
    let r0 = ((wid % per_batch) / p.tiles_c) * T;
    let c0 = (wid % p.tiles_c) * T;
    let base = b * p.rows * p.cols;

    let r = r0 + lid.y;
    let c = c0 + lid.x;
    if (r < p.rows && c < p.cols) {
        tile[lid.y * (T + 1u) + lid.x] = x[base + r * p.cols + c];
    }
    workgroupBarrier();
    let orow = c0 + lid.y;  // output row = input column
    let ocol = r0 + lid.x;  // output column = input row
    if (orow < p.cols && ocol < p.rows) {
        out[base + orow * p.rows + ocol] = tile[lid.x * (T + 1u) + lid.y];
    }
}

@compute @workgroup_size(WG)
fn permute(@builtin(workgroup_id) wg: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    if (i >= p.n) {
        return;
    }
    var rest = i;
    var src = 0u;
    for (var d = i32(p.ndim) - 1; d >= 0; d--) {
        let size = get4(p.shape, u32(d));
        src += (rest % size) * get4(p.strides, u32(d));
        rest = rest / size;
    }
    out[i] = x[src];
}
