// Rows of an array picked by their numbers: numpy's x[rows] (an integer array indexing the first axis) and
// np.take(x, rows, axis=0).
//
// Values move as their 32 bits (float32, int32 and uint32 alike, NaN payloads and -0.0 included):
// out[i] = x[rows[i / width] * width + i % width], where `rows` holds row numbers the host has checked and made
// non-negative. Workgroups are numbered linearly, folded over x and y.

const WG: u32 = 256u;

struct Params {
    n: u32, width: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> rows: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn take_rows(@builtin(workgroup_id) wg: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if (i >= p.n) {
        return;
    }
    let row = i / p.width;
    out[i] = x[rows[row] * p.width + (i - row * p.width)];
}
