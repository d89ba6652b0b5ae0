/* The safetensors file format (https://github.com/huggingface/safetensors), written
 * and read without any library: an 8-byte little-endian header length N, N bytes of
 * JSON (name -> {"dtype", "shape", "data_offsets"}, plus an optional "__metadata__"
 * object of strings), then the tensors' little-endian row-major bytes.
 *
 * Files are written atomically (temp file in the same directory, fsync, rename) and
 * read strictly: every length, offset, size and name is checked before it is used, so
 * a truncated or corrupted file gives an error naming the file and the problem, never
 * a crash or an allocation larger than the file. */
#ifndef REMAT_SAFETENSORS_H
#define REMAT_SAFETENSORS_H

#include "tensor.h"

/* Largest header accepted on load (the safetensors library's own limit). */
#define RM_ST_MAX_HEADER 100000000u

/* Writes n tensors (names[i] -> ts[i], any device, dtype, strides) and nmeta metadata
 * pairs (keys[i] -> vals[i]; nmeta may be 0 and keys/vals NULL) to path. Tensors are
 * stored sorted by name, each as its logical (row-major) values. Names must be valid
 * UTF-8, distinct and not "__metadata__". The file appears complete or not at all.
 * Returns RM_OK, or an error (RM_ERR_ARG, RM_ERR_IO, ...) naming path. */
int rm_safetensors_save(rm_ctx *ctx, const char *path, int n, const char *const *names,
                        rm_tensor *const *ts, int nmeta, const char *const *keys,
                        const char *const *vals);

/* What rm_safetensors_load returns. names/keys/vals point into memory owned by the
 * struct; tensors[i] are holds owned by it until rm_safetensors_free (a caller that
 * takes one over sets tensors[i] to NULL). */
typedef struct rm_safetensors {
  int n;
  const char **names;         /* in file order of their data */
  rm_tensor **tensors;
  const char **file_dtype;    /* dtype as stored ("F32", "BF16", ...) */
  int nmeta;
  const char **keys, **vals;
  void *priv_;                /* header buffer and tables (private) */
} rm_safetensors;

/* Reads path into CPU tensors of category cat. F32 and F64 load as stored; F16 and
 * BF16 are converted to float32 (the CPU has no half-precision kernels). On error
 * nothing is left allocated and out is zeroed. Returns RM_OK or RM_ERR_IO (bad file),
 * RM_ERR_DTYPE (a dtype remat cannot hold) or RM_ERR_OOM, with a message naming path. */
int rm_safetensors_load(rm_ctx *ctx, const char *path, rm_category cat, rm_safetensors *out);

/* Gives back everything out holds (tensors not taken over are dropped). */
void rm_safetensors_free(rm_ctx *ctx, rm_safetensors *f);

#endif
