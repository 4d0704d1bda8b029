"""CUDA source of the L1 write kernels: placing new keys, overwriting resident rows.

Both use the tiles of :mod:`hps.cache.cuda_probe` (its source comes first: ``Lanes``,
``home_group``, ``warp_find``) and copy stored rows as they are (no format conversion: rows
enter L1 in the table's format) across the tile's lanes, in 16-byte or 4-byte words where
the row size and both addresses allow (``word``), else byte by byte.

- ``place_rows``: keys known to be absent and unique, with the free rows they go to: each
  tile claims a slot in the first group of its key's probe sequence that has a free slot
  (``EMPTY`` or ``TOMB``: a ballot, then a compare-and-swap by the lane holding the first
  free one; a tile that lost the slot to another key reads the group again, a full group
  sends it on), as :meth:`hps.index.KeyIndex.insert` does, then writes the slot's row, the
  stored row, and the row's key, tick and pinned flag. ``reused[0]`` counts the tombstones
  taken (the index's bookkeeping). One launch per batch.
- ``write_rows``: each key's row (-1: absent) into ``rows_out``; where ``src`` is given and
  ``allow[i]`` (or ``allow`` is null) the stored row ``i`` overwrites the key's row, and with
  ``stamp`` its tick becomes ``tick`` (an upsert of resident keys; a Kafka refresh passes no
  stamp). With ``src`` null it is a lookup. One launch per batch.
"""

WRITE_SOURCE = r"""
// The tile copies row_bytes bytes from src to dst in `word`-byte words (16, 4 or 1).
__device__ void tile_copy_bytes(unsigned char* dst, const unsigned char* src,
                                const long long row_bytes, const int word, const Lanes& l)
{
    if (word == 16) {
        for (long long q = l.tlane; q < row_bytes / 16; q += l.tile) {
            ((uint4*)dst)[q] = ((const uint4*)src)[q];
        }
    } else if (word == 4) {
        for (long long q = l.tlane; q < row_bytes / 4; q += l.tile) {
            ((unsigned int*)dst)[q] = ((const unsigned int*)src)[q];
        }
    } else {
        for (long long b = l.tlane; b < row_bytes; b += l.tile) dst[b] = src[b];
    }
}

// Claims an index slot for absent key k, pointing it at `row`; every lane of the warp calls it.
__device__ void warp_claim(long long* slot_keys, int* slot_rows, const long long gmask,
                           const long long k, const int row, const bool active,
                           unsigned long long* reused, const Lanes& l)
{
    bool pending = active;
    long long g = home_group(k, gmask), r = 1;
    while (__any_sync(FULL_WARP, pending)) {
        const bool reads = pending && l.tlane < GROUP;
        const long long slot = g * GROUP + l.tlane;
        // volatile: a slot another tile just claimed must be seen, not a cached EMPTY
        const long long sk = reads ? ((volatile long long*)slot_keys)[slot] : k;
        const unsigned int free = __ballot_sync(FULL_WARP, reads && sk <= TOMB) & l.tmask;
        const int owner = free ? __ffs((int)free) - 1 : l.lane;
        const long long seen = __shfl_sync(FULL_WARP, sk, owner);
        bool won = false;
        if (pending && free && l.lane == owner) {
            const unsigned long long was = atomicCAS((unsigned long long*)slot_keys + slot,
                                                     (unsigned long long)seen,
                                                     (unsigned long long)k);
            won = was == (unsigned long long)seen;
            if (won) {
                slot_rows[slot] = row;
                if (seen == TOMB) atomicAdd(reused, 1ULL);
            }
        }
        const unsigned int done = __ballot_sync(FULL_WARP, won) & l.tmask;
        if (pending) {
            if (done) {
                pending = false;
            } else if (!free) {  // a full group: the next of the probe sequence
                if (r > gmask + 1) pending = false;  // a full index (the host prevents it)
                g = (g + r) & gmask;
                ++r;
            }  // else another key took the free slot first: read the group again
        }
    }
}

extern "C" __global__ void place_rows(
    long long* slot_keys, int* slot_rows, const long long gmask,
    const long long* keys, const long long* rows, const long long n,
    const unsigned char* src, unsigned char* values, const long long row_bytes,
    const int word, long long* row_keys, unsigned long long* ticks,
    const unsigned long long tick, unsigned char* pinned, const int tile,
    unsigned long long* reused)
{
    const Lanes l = lanes_of(tile);
    const long long per = 32 / tile;
    for (long long base = warp_id() * per; base < n; base += warp_count() * per) {
        const long long i = base + l.lane / l.tile;
        const bool active = i < n;
        const long long k = active ? keys[i] : 0;
        const long long row = active ? rows[i] : 0;
        warp_claim(slot_keys, slot_rows, gmask, k, (int)row, active, reused, l);
        if (active) {
            tile_copy_bytes(values + row * row_bytes, src + i * row_bytes, row_bytes, word, l);
            if (l.tlane == 0) {
                row_keys[row] = k;
                ticks[row] = tick;
                pinned[row] = 0;
            }
        }
    }
}

extern "C" __global__ void write_rows(
    const long long* slot_keys, const int* slot_rows, const long long gmask,
    const long long* keys, const long long n, long long* rows_out,
    const unsigned char* allow, const unsigned char* src, unsigned char* values,
    const long long row_bytes, const int word, unsigned long long* ticks,
    const unsigned long long tick, const int stamp, const int tile)
{
    const Lanes l = lanes_of(tile);
    const long long per = 32 / tile;
    for (long long base = warp_id() * per; base < n; base += warp_count() * per) {
        const long long i = base + l.lane / l.tile;
        const bool active = i < n;
        const long long k = active ? keys[i] : EMPTY_KEY;
        const long long row = warp_find(slot_keys, slot_rows, gmask, k, active, l);
        if (!active) continue;
        if (l.tlane == 0) rows_out[i] = row;
        if (row < 0 || !src || (allow && !allow[i])) continue;
        tile_copy_bytes(values + row * row_bytes, src + i * row_bytes, row_bytes, word, l);
        if (stamp && l.tlane == 0) ticks[row] = tick;
    }
}
"""
