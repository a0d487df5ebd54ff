// Numerically stable float32 softmax along one axis: exp(x - max) / sum(exp(x - max)).
//
// The host views the input as (outer, len, inner) and normalises along the middle axis; each
// of the outer * inner rows is independent. Entry points: `groups` gives each row one
// workgroup (long rows), `threads` gives each row one invocation (short rows, many of them).
// Rows and workgroups are numbered linearly, folded by the host over x and y.
//
// A NaN anywhere in a row makes the whole row NaN, as the formula does in numpy.

const WG: u32 = 256u;

struct Params {
    outer: u32, len: u32, inner: u32, rows: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> part: array<f32, WG>;

// NaN and infinity by bit pattern, through a function: as a constant expression they are a shader-creation
// error by the WGSL spec (Chrome's compiler refuses them; wgpu's accepts them).
fn f32_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn nan_max(u: f32, v: f32) -> f32 {
    if (is_nan(u) || is_nan(v)) {
        return f32_bits(0x7fc00000u);
    }
    return max(u, v);
}

fn first(row: u32) -> u32 {
    return (row / p.inner) * p.len * p.inner + row % p.inner;
}

@compute @workgroup_size(WG)
fn groups(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;  // a spare workgroup from folding; uniform across the workgroup
    }
    let base = first(row);

    var m = f32_bits(0xff800000u);
    for (var j = li; j < p.len; j += WG) {
        m = nan_max(m, x[base + j * p.inner]);
    }
    part[li] = m;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        if (li < half) {
            part[li] = nan_max(part[li], part[li + half]);
        }
        workgroupBarrier();
    }
    let row_max = part[0];
    workgroupBarrier();

    var s = 0.0;
    for (var j = li; j < p.len; j += WG) {
        s += exp(x[base + j * p.inner] - row_max);
    }
    part[li] = s;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        if (li < half) {
            part[li] = part[li] + part[li + half];
        }
        workgroupBarrier();
    }
    let total = part[0];

    for (var j = li; j < p.len; j += WG) {
        let at = base + j * p.inner;
        out[at] = exp(x[at] - row_max) / total;
    }
}

@compute @workgroup_size(64)
fn threads(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;
    if (row >= p.rows) {
        return;
    }
    let base = first(row);
    var m = f32_bits(0xff800000u);
    for (var j = 0u; j < p.len; j++) {
        m = nan_max(m, x[base + j * p.inner]);
    }
    var s = 0.0;
    for (var j = 0u; j < p.len; j++) {
        s += exp(x[base + j * p.inner] - m);
    }
    for (var j = 0u; j < p.len; j++) {
        let at = base + j * p.inner;
        out[at] = exp(x[at] - m) / s;
    }
}
