"""CUDA source of the L1 probe+gather kernels (one table, many tables), warp-cooperative.

A warp is split into tiles of ``tile`` lanes (8, 16 or 32; a power of two chosen from the
row size, :func:`hps.cache.kernels_cupy.tile_for`), one requested key per tile:

- probe: the first 8 lanes of a tile read the 8 slots of the key's current group (one
  64-byte line, read by 8 lanes at once); two ballots say which lane holds the key and
  whether the group has an ``EMPTY`` slot (which ends the probe), and the matching lane's
  row index reaches the tile with a shuffle. The loop runs while any tile of the warp is
  still probing, so every lane takes part in every warp intrinsic (no divergent ballots);
- copy: the tile's lanes take consecutive elements of the row (or 4-element vectors when
  the row and the output are 16-byte aligned and ``dim`` is a multiple of 4), so loads and
  stores coalesce; float16 and int8 rows are dequantized in the same pass, rounded as
  ``RowFormat.decode`` (a product, then a sum, each rounded: ``__fmul_rn``, ``__fadd_rn``);
- books: the tile's first lane stamps the row's tick (an atomic exchange: a row whose tick
  already was this call's was hit before, so it is not a distinct hit) and bumps its access
  count (a compare-and-swap loop that stops at the cap, never wrapping); the distinct hits
  of the warp are counted with a ballot and kept by its first lane over all its steps, then
  added with one atomic per warp and table (no contended atomic per key, even where a tile
  is the whole warp); a step with misses reserves their places in the miss list with one
  atomic, each miss going there from that base (the list is sorted afterwards, so positions
  come back in request order).

Every loop over keys is a warp-uniform grid-stride loop: any grid computes the same result.
The host launches at most what the GPU runs at once (:func:`hps.cache.kernels_cupy.blocks_for`),
so at scale each warp takes many steps and its atomics are few.
The many-table kernel gives each table its own warps (``plan``: first warp, tile, vector
flag per table); a warp finds its table by a binary search over the tables' first warps
and then runs the same warp step as the one-table kernel, so all tables of a request are
probed in one launch. The index's constants (``GROUP``, ``EMPTY_KEY``, ``TOMB``) and the
format codes are defined by :func:`hps.cache.kernels_cupy.kernel_source`.
"""

PROBE_SOURCE = r"""
#define FULL_WARP 0xffffffffu
#define DESC 13   // columns of a table's descriptor (hps.cache.kernels.DESCRIPTOR)
#define PLAN 6    // columns of a table's plan: first key, end key, out offset, first warp,
                  // tile, vector copies

// float16 bits to float32 in integer code (no cuda_fp16.h needed): exact, NaN bits kept.
__device__ float half_to_float(const unsigned int h)
{
    const unsigned int em = h & 0x7fffu;
    const unsigned int sign = (h & 0x8000u) << 16;
    unsigned int bits = (em << 13) + (112u << 23);  // exponent bias 15 -> 127
    if (em >= 0x7c00u) {  // inf, nan
        bits += 112u << 23;
    } else if (em < 0x0400u) {  // zero, subnormal: renormalised by a float subtraction
        bits = __float_as_uint(__fsub_rn(__uint_as_float(bits + (1u << 23)),
                                         __uint_as_float(113u << 23)));
    }
    return __uint_as_float(bits | sign);
}

// The float32 at byte p of an int8 row (not 4-byte aligned unless dim is a multiple of 4).
__device__ float float_at(const unsigned char* p)
{
    return __uint_as_float((unsigned int)p[0] | ((unsigned int)p[1] << 8) |
                           ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24));
}

__device__ float dequantize(const unsigned int code, const float scale, const float offset)
{
    return __fadd_rn(__fmul_rn((float)code, scale), offset);  // rounded as NumPy rounds it
}

struct Table {  // one cache, as the probe reads it
    const long long* slot_keys; const int* slot_rows; long long gmask;
    const void* values; int dim; int width; int format; int vec;
    unsigned long long* ticks; unsigned long long tick; int* counts; int cap;
};

struct Lanes {  // this lane's place: its lane in the warp, its tile and its lane in the tile
    int lane; int tile; int tlane; int tbase; unsigned int tmask;
};

__device__ Lanes lanes_of(const int tile)
{
    Lanes l;
    l.lane = (int)(threadIdx.x & 31u);
    l.tile = tile;
    l.tlane = l.lane & (tile - 1);
    l.tbase = l.lane - l.tlane;
    l.tmask = (tile == 32 ? FULL_WARP : ((1u << tile) - 1u)) << l.tbase;
    return l;
}

__device__ long long home_group(const long long k, const long long gmask)
{
    unsigned long long x = (unsigned long long)k;  // splitmix64's finaliser (hps.index.mix)
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27; x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return (long long)(x & (unsigned long long)gmask);
}

// The row of key k (-1: absent, or a reserved key), for the tile's key where `active`.
// Every lane of the warp calls it: the loop runs while any tile still probes.
__device__ long long warp_find(const long long* slot_keys, const int* slot_rows,
                               const long long gmask, const long long k, const bool active,
                               const Lanes& l)
{
    bool pending = active && k > TOMB;
    long long g = home_group(k, gmask), r = 1, row = -1;
    while (__any_sync(FULL_WARP, pending)) {
        const bool reads = pending && l.tlane < GROUP;
        const long long slot = g * GROUP + l.tlane;
        const long long sk = reads ? slot_keys[slot] : EMPTY_KEY;
        const bool match = reads && sk == k;
        const int here = match ? slot_rows[slot] : -1;
        const unsigned int hit = __ballot_sync(FULL_WARP, match) & l.tmask;
        const unsigned int ended = __ballot_sync(FULL_WARP, reads && sk == EMPTY_KEY) & l.tmask;
        const int found = __shfl_sync(FULL_WARP, here, hit ? __ffs((int)hit) - 1 : l.lane);
        if (pending) {
            if (hit) {
                row = found;
                pending = false;
            } else if (ended || r > gmask + 1) {
                pending = false;
            } else {
                g = (g + r) & gmask;
                ++r;
            }
        }
    }
    return row;
}

// The tile copies stored row `row` of t (zeros where row < 0) into dst[0, dim), as float32.
__device__ void tile_copy(const Table& t, const long long row, float* dst, const Lanes& l)
{
    const int dim = t.dim;
    const int quads = t.vec ? dim / 4 : 0;  // 4-element vectors (t.vec: dim % 4 == 0)
    float4* dst4 = (float4*)dst;
    if (row < 0) {
        for (int q = l.tlane; q < quads; q += l.tile) dst4[q] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int d = quads * 4 + l.tlane; d < dim; d += l.tile) dst[d] = 0.0f;
    } else if (t.format == FORMAT_FLOAT16) {
        const unsigned short* src = (const unsigned short*)t.values + row * t.width;
        for (int q = l.tlane; q < quads; q += l.tile) {
            const uint2 h = ((const uint2*)src)[q];
            dst4[q] = make_float4(half_to_float(h.x & 0xffffu), half_to_float(h.x >> 16),
                                  half_to_float(h.y & 0xffffu), half_to_float(h.y >> 16));
        }
        for (int d = quads * 4 + l.tlane; d < dim; d += l.tile) dst[d] = half_to_float(src[d]);
    } else if (t.format == FORMAT_INT8) {  // dim codes, then the row's scale and offset
        const unsigned char* src = (const unsigned char*)t.values + row * t.width;
        const float scale = float_at(src + dim), offset = float_at(src + dim + 4);
        for (int q = l.tlane; q < quads; q += l.tile) {
            const unsigned int c = ((const unsigned int*)src)[q];
            dst4[q] = make_float4(dequantize(c & 0xffu, scale, offset),
                                  dequantize((c >> 8) & 0xffu, scale, offset),
                                  dequantize((c >> 16) & 0xffu, scale, offset),
                                  dequantize(c >> 24, scale, offset));
        }
        for (int d = quads * 4 + l.tlane; d < dim; d += l.tile) {
            dst[d] = dequantize(src[d], scale, offset);
        }
    } else {
        const float* src = (const float*)t.values + row * t.width;
        for (int q = l.tlane; q < quads; q += l.tile) dst4[q] = ((const float4*)src)[q];
        for (int d = quads * 4 + l.tlane; d < dim; d += l.tile) dst[d] = src[d];
    }
}

// One step of a warp over keys[base, base + 32 / tile) of n: probe, copy, books. Returns
// the distinct hits of the step (the same in every lane), for the caller to add up.
__device__ unsigned int warp_step(const Table& t, const long long* keys, const long long n,
                                  const long long base, float* out, long long* miss_pos,
                                  unsigned long long* n_miss, const Lanes& l)
{
    const long long i = base + l.lane / l.tile;
    const bool active = i < n;
    const long long k = active ? keys[i] : EMPTY_KEY;
    const long long row = warp_find(t.slot_keys, t.slot_rows, t.gmask, k, active, l);
    if (active) tile_copy(t, row, out + i * t.dim, l);
    const bool leader = active && l.tlane == 0;
    bool first = false;
    if (leader && row >= 0) {
        first = atomicExch(t.ticks + row, t.tick) != t.tick;
        if (t.counts) {  // a saturating add: an add then a clamp would wrap at INT_MAX
            int c = t.counts[row];
            while (c < t.cap) {
                const int seen = atomicCAS(t.counts + row, c, c + 1);
                if (seen == c) break;
                c = seen;
            }
        }
    }
    const unsigned int firsts = __ballot_sync(FULL_WARP, first);
    const unsigned int misses = __ballot_sync(FULL_WARP, leader && row < 0);
    unsigned long long at = 0;
    if (l.lane == 0 && misses) at = atomicAdd(n_miss, (unsigned long long)__popc(misses));
    at = __shfl_sync(FULL_WARP, at, 0);
    if (leader && row < 0) miss_pos[at + __popc(misses & ((1u << l.lane) - 1u))] = i;
    return (unsigned int)__popc(firsts);
}

// The distinct hits a warp kept, added to *n_hit by its first lane (one atomic).
__device__ void add_hits(unsigned long long* n_hit, const unsigned long long hits, const Lanes& l)
{
    if (l.lane == 0 && hits) atomicAdd(n_hit, hits);
}

__device__ long long warp_id() { return ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; }
__device__ long long warp_count() { return (long long)gridDim.x * (blockDim.x / 32); }

// One table: tallies[0] += misses, tallies[1] += distinct rows hit.
extern "C" __global__ void probe_gather(
    const long long* slot_keys, const int* slot_rows, const long long gmask,
    const void* values, const int dim, const int width, const int format, const int vec,
    const int tile, const long long* keys, const long long n,
    float* out, unsigned long long* ticks, const unsigned long long tick,
    int* counts, const int use_counts, const int cap,
    long long* miss_pos, unsigned long long* tallies)
{
    Table t;
    t.slot_keys = slot_keys; t.slot_rows = slot_rows; t.gmask = gmask;
    t.values = values; t.dim = dim; t.width = width; t.format = format; t.vec = vec;
    t.ticks = ticks; t.tick = tick; t.counts = use_counts ? counts : 0; t.cap = cap;
    const Lanes l = lanes_of(tile);
    const long long per = 32 / tile;
    unsigned long long hits = 0;
    for (long long base = warp_id() * per; base < n; base += warp_count() * per) {
        hits += warp_step(t, keys, n, base, out, miss_pos, tallies, l);
    }
    add_hits(tallies + 1, hits, l);
}

// Every table of a request: desc [T, DESC] (addresses and sizes), plan [T, PLAN]; table t's
// misses go to miss_pos from its first key, its tallies to result[2t] (misses), [2t + 1].
extern "C" __global__ void probe_gather_tables(
    const long long* desc, const long long* plan, const int n_tables,
    const long long total_warps, const long long* keys, float* out, long long* miss_pos,
    unsigned long long* result)
{
    const Lanes lane = lanes_of(32);  // this lane's place in the warp, whatever the tile
    int table = -1;  // the table whose distinct hits `hits` holds
    unsigned long long hits = 0;
    for (long long w = warp_id(); w < total_warps; w += warp_count()) {
        int lo = 0, hi = n_tables - 1;  // the last table whose first warp is <= w
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (plan[mid * PLAN + 3] <= w) lo = mid; else hi = mid - 1;
        }
        if (lo != table) {  // warp-uniform: w is
            if (table >= 0) add_hits(result + 2 * table + 1, hits, lane);
            table = lo;
            hits = 0;
        }
        const long long* d = desc + (long long)lo * DESC;
        const long long* p = plan + (long long)lo * PLAN;
        Table t;
        t.slot_keys = (const long long*)d[0]; t.slot_rows = (const int*)d[1]; t.gmask = d[3];
        t.values = (const void*)d[4]; t.dim = (int)d[5]; t.ticks = (unsigned long long*)d[7];
        t.tick = (unsigned long long)d[8]; t.counts = (int*)d[9]; t.cap = (int)d[10];
        t.width = (int)d[11]; t.format = (int)d[12]; t.vec = (int)p[5];
        const Lanes l = lanes_of((int)p[4]);
        const long long first = p[0];
        hits += warp_step(t, keys + first, p[1] - first, (w - p[3]) * (32 / l.tile),
                          out + p[2], miss_pos + first, result + 2 * lo, l);
    }
    if (table >= 0) add_hits(result + 2 * table + 1, hits, lane);
}
"""
