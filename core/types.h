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

/* int32/int64 hold labels and indices (1-based, as every index in remat): they never
 * require grad, and only the ops a backend declares for them (rm_backend.int_ops) take
 * them. */
typedef enum { RM_F32 = 0, RM_F64, RM_BF16, RM_F16, RM_I32, RM_I64, RM_DTYPE_COUNT } rm_dtype;
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
 * "half", "bf16", "int", "long"); false for anything else. The one table of spellings. */
bool rm_dtype_parse(const char *s, rm_dtype *out);
/* The i-th alias (0-based) and its dtype; NULL past the last (for bindings' tables). */
const char *rm_dtype_alias(int i, rm_dtype *d);
size_t rm_dtype_size(rm_dtype d);
static inline bool rm_dtype_is_int(rm_dtype d) { return d == RM_I32 || d == RM_I64; }
/* The integer a float converts to (truncated toward zero, as PyTorch does); false when
 * v is NaN, infinite or outside dt's range (nothing else is checked). */
bool rm_float_to_int(double v, rm_dtype dt, int64_t *out);
/* Element off (in elements) of host data p of dtype dt (float32, float64, int32, int64),
 * read as a double or as an int64 (a float is truncated; the caller checked it), and
 * written from a double (an int dtype: truncated, checked by the caller) or an int64. */
double rm_load_f64(const void *p, rm_dtype dt, int64_t off);
int64_t rm_load_i64(const void *p, rm_dtype dt, int64_t off);
void rm_store_f64(void *p, rm_dtype dt, int64_t off, double v);
void rm_store_i64(void *p, rm_dtype dt, int64_t off, int64_t v);
const char *rm_device_name(rm_device d);
const char *rm_category_name(rm_category c);
int64_t rm_meta_numel(const rm_meta *m);
/* Writes "2x3x4" (or "scalar" for 0-d) into buf; returns buf. */
char *rm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#endif
