// numpy's unique of sorted values (what sort.wgsl writes to `out`): the first value of each run of
// equal values, and the place where each run starts. Compiled with sort.wgsl (shaders.EXTENDS), whose
// bindings, uniform (`len`: the number of values), KEY and key_of it uses: two values are equal when
// their sort keys are, so -0.0 equals 0.0 and every NaN is one value, as in numpy's unique (equal_nan).
//
// `starts` writes 1.0 where a run starts (value i's key differs from value i - 1's) and 0.0 elsewhere,
// as float32 into `out`; scan.wgsl's cumsum of those is each value's run number + 1 (`ranks`, exact
// up to 2^24 values). `compact` then writes run r's first value to out[r] and its first place to
// out_idx[r], and the number of runs to found[0].
//
// With the sort's `order` (sorted place -> place in the input, stable), `firsts` writes where each
// run's first value was in the input (numpy's return_index), and `inverse` each input value's run
// (numpy's return_inverse), into `places`.

@group(0) @binding(5) var<storage, read> ranks: array<f32>;
@group(0) @binding(6) var<storage, read_write> found: array<u32>;
@group(0) @binding(7) var<storage, read> order: array<u32>;
@group(0) @binding(8) var<storage, read_write> places: array<u32>;

const ONE_BITS: u32 = 0x3f800000u;  // 1.0

fn starts_run(i: u32) -> bool {
    return i == 0u || key_of(x[i]) != key_of(x[i - 1u]);
}

@compute @workgroup_size(WG)
fn starts(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i < p.len) {
        out[i] = select(0u, ONE_BITS, starts_run(i));
    }
}

@compute @workgroup_size(WG)
fn compact(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.len) {
        return;
    }
    let rank = u32(ranks[i]);
    if (starts_run(i)) {
        out[rank - 1u] = x[i];
        out_idx[rank - 1u] = i;
    }
    if (i == p.len - 1u) {
        found[0] = rank;
    }
}

@compute @workgroup_size(WG)
fn firsts(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i < p.len && starts_run(i)) {
        places[u32(ranks[i]) - 1u] = order[i];
    }
}

@compute @workgroup_size(WG)
fn inverse(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i < p.len) {
        places[order[i]] = u32(ranks[i]) - 1u;
    }
}
