/* Datasets: IDX files (the MNIST family's format, gzip-compressed or not), gathering
 * rows into minibatches, and reproducible shuffling from the context's generator. */
#ifndef REMAT_DATASET_H
#define REMAT_DATASET_H

#include "tensor.h"

/* Reads an IDX file of unsigned bytes (gzip or plain; zlib tells them apart):
 * images (magic 0x00000803, dims N x rows x cols) become a float32 (N, rows*cols) tensor
 * scaled to [0, 1]; labels (magic 0x00000801, dim N) an int64 (N) tensor holding
 * label + 1 (remat's class indices are 1-based). limit > 0 reads only the first
 * min(limit, N) items. Returns a new hold of category cat, or NULL with an error
 * naming path ("<path> not found", bad magic, truncated data, ...). */
rm_tensor *rm_idx_read(rm_ctx *ctx, const char *path, int64_t limit, rm_category cat);

/* A new contiguous CPU tensor (n, ...) of category cat whose row k is row rows[k]
 * (0-based) of src, or row first + k when rows is NULL. src is a CPU tensor of any
 * dtype and strides (N, ...); rows must lie in [0, N). NULL with an error otherwise. */
rm_tensor *rm_take_rows(rm_ctx *ctx, rm_tensor *src, const int64_t *rows, int64_t first,
                        int64_t n, rm_category cat);

/* A view (L - len + 1, len) of the 1-D tensor src whose row i is src[i .. i+len-1]
 * (overlapping windows, strides (1, 1)): with rm_take_rows it cuts training blocks
 * out of a token stream. Returns a new hold, or NULL with an error. */
rm_tensor *rm_windows(rm_ctx *ctx, rm_tensor *src, int64_t len);

/* Fills perm[0..n) with a uniformly random permutation of 0..n-1 drawn from the
 * context's generator (seed, offset), advancing the offset: the same after the same
 * manual_seed. Returns RM_OK or RM_ERR_ARG for a negative n. */
int rm_randperm(rm_ctx *ctx, int64_t n, int64_t *perm);

/* Fills out[0..k) with uniform integers in [0, n) from the context's generator,
 * advancing it. Returns RM_OK or RM_ERR_ARG (n < 1 or k < 0). */
int rm_randint(rm_ctx *ctx, int64_t n, int64_t k, int64_t *out);

#endif
