"""CUDA source of the kernels over a request's buffer on the device (rows kept on the GPU).

- ``scatter_rows``: the rows found below L1, every table's at once, into the request's
  buffer: one warp a row, from ``src_at[i]`` (up to ``src_at[i + 1]``: rows of different
  widths) to ``dst_at[i]``. One launch per request.
- ``pool_rows``: the CTR model's sum-pooling, every table and sample at once: one warp per
  (table, sample) sums the sample's rows of the table (its CSR segment) into its columns of
  ``out [batch, width]``, lanes over the row's elements, rows added in order (NumPy's
  ``add.reduceat`` may add a run pairwise: the sums agree up to float32 rounding); an empty
  segment is zeros. ``tables [T, 3]``: where the table's rows start in the request's
  buffer, its dim, its first column; ``offsets [T, batch + 1]``: each table's CSR offsets.
  One launch per request.

Both use ``warp_id`` and ``warp_count`` of :mod:`hps.cache.cuda_probe` (its source comes
first).
"""

REQUEST_SOURCE = r"""
extern "C" __global__ void scatter_rows(const long long* dst_at, const long long* src_at,
                                        const long long n, const float* src, float* out)
{
    const long long lane = (long long)(threadIdx.x & 31u);
    for (long long i = warp_id(); i < n; i += warp_count()) {
        const long long from = src_at[i], width = src_at[i + 1] - from, to = dst_at[i];
        for (long long d = lane; d < width; d += 32) out[to + d] = src[from + d];
    }
}

extern "C" __global__ void pool_rows(const long long* tables, const long long* offsets,
                                     const long long n_tables, const long long batch,
                                     const long long width, const float* rows, float* out)
{
    const long long lane = (long long)(threadIdx.x & 31u);
    for (long long w = warp_id(); w < n_tables * batch; w += warp_count()) {
        const long long t = w / batch, b = w % batch;
        const long long at = tables[3 * t], dim = tables[3 * t + 1], col = tables[3 * t + 2];
        const long long first = offsets[t * (batch + 1) + b];
        const long long end = offsets[t * (batch + 1) + b + 1];
        for (long long d = lane; d < dim; d += 32) {
            float sum = first < end ? rows[at + first * dim + d] : 0.0f;
            for (long long r = first + 1; r < end; ++r) {
                sum = __fadd_rn(sum, rows[at + r * dim + d]);
            }
            out[b * width + col + d] = sum;
        }
    }
}
"""
