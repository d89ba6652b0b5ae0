/* Basic types shared by every layer of remat: status codes, dtypes, devices,
 * memory categories and tensor metadata. No Lua here (core/ never sees lua.h). */
#ifndef REMAT_TYPES_H
#define REMAT_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* rm_status (RM_OK, RM_ERR_*): every fallible core function returns one, with the
 * message on the ctx. Defined once, in the public header, so that a host including
 * only remat.h gets the same codes. */
#include "remat.h"

#define RM_MAX_DIM 8

typedef struct rm_ctx rm_ctx;
typedef struct rm_tensor rm_tensor;
typedef struct rm_node rm_node;

typedef enum { RM_F32 = 0, RM_F64, RM_BF16, RM_F16, RM_DTYPE_COUNT } rm_dtype;
typedef enum { RM_CPU = 0, RM_CUDA, RM_DEVICE_COUNT } rm_device;

/* Allocation categories: every byte of every storage is tagged with one. data: datasets
 * and the batches read from them. */
typedef enum {
  RM_CAT_PARAM = 0, RM_CAT_GRAD, RM_CAT_OPTIM, RM_CAT_ACTIVATION,
  RM_CAT_WORKSPACE, RM_CAT_TEMP, RM_CAT_DATA, RM_CAT_COUNT
} rm_category;

/* Shape and type of a tensor, without data (what an op's infer step produces). */
typedef struct rm_meta {
  rm_dtype dtype;
  rm_device device;
  int ndim;
  int64_t shape[RM_MAX_DIM];
} rm_meta;

const char *rm_dtype_name(rm_dtype d);
/* The dtype a name means: its own name ("float32") or an alias ("float", "double",
 * "half", "bf16"); false for anything else. The one table of spellings. */
bool rm_dtype_parse(const char *s, rm_dtype *out);
/* The i-th alias (0-based) and its dtype; NULL past the last (for bindings' tables). */
const char *rm_dtype_alias(int i, rm_dtype *d);
size_t rm_dtype_size(rm_dtype d);
const char *rm_device_name(rm_device d);
const char *rm_category_name(rm_category c);
int64_t rm_meta_numel(const rm_meta *m);
/* Writes "2x3x4" (or "scalar" for 0-d) into buf; returns buf. */
char *rm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#endif
