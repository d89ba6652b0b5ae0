/* A small strict JSON reader for file headers (the safetensors header): it walks a
 * buffer in place, the caller driving it value by value, and rejects anything RFC 8259
 * does not allow (leading zeros, bad escapes, lone surrogates, control characters).
 * Strings are decoded in place, so the buffer must be writable and outlive them.
 *
 * Every failure is an RM_ERR_IO through rm_fail on the reader's ctx, worded
 * "<path>: corrupted header: <what> at byte <offset>", where the offset counts from
 * the start of the file (the buffer begins at byte `origin` of it). */
#ifndef REMAT_JSON_H
#define REMAT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"

/* Deepest nesting rm_json_skip_value accepts. */
#define RM_JSON_MAX_DEPTH 32

/* The reader: p is the next byte to read, end one past the last; base is the start of
 * the buffer, which sits at byte `origin` of the file named `path` (for messages). */
typedef struct rm_json {
  rm_ctx *ctx;
  const char *path;
  char *p, *end, *base;
  long long origin;
} rm_json;

/* Length of the valid UTF-8 prefix of s[0..n) (n when all of it is valid): JSON text
 * and the strings written into it must be UTF-8. */
size_t rm_utf8_valid_prefix(const unsigned char *s, size_t n);

/* Raises "corrupted header: <what>" at the reader's position; returns RM_ERR_IO. */
int rm_json_fail(rm_json *j, const char *what);

/* Skips whitespace (space, tab, newline, carriage return). */
void rm_json_skip_ws(rm_json *j);

/* Consumes the character c after optional whitespace; returns RM_OK or raises. */
int rm_json_expect(rm_json *j, char c);

/* Consumes `null` (after optional whitespace) if it comes next; returns whether it did. */
bool rm_json_take_null(rm_json *j);

/* Reads a string literal, decoding it in place, NUL-terminated (a \u0000 escape is
 * refused); *out points into the buffer. Returns RM_OK or raises. */
int rm_json_string(rm_json *j, const char **out);

/* Reads a non-negative integer (no sign, fraction or exponent) of at most INT64_MAX
 * into *out. Returns RM_OK or raises. */
int rm_json_uint(rm_json *j, uint64_t *out);

/* Skips any one value (for fields the caller does not use); depth is the nesting
 * depth the value sits at, refused past RM_JSON_MAX_DEPTH. Returns RM_OK or raises. */
int rm_json_skip_value(rm_json *j, int depth);

/* Iterates over "[v1, v2, ...]" or "{k: v, ...}": rm_json_expect the opening bracket,
 * set *count = 0, then call this before each element with close = ']' or '}'. Returns
 * 1 while there is an element (consuming the ',' between them), 0 after consuming
 * the closing bracket, <0 when it raised. */
int rm_json_next(rm_json *j, char close, int *count);

/* Reads an array of non-negative integers into v; stops reading past max of them,
 * setting *n = max + 1 (the caller refuses that), else *n = their count. Returns RM_OK
 * or raises. */
int rm_json_uints(rm_json *j, uint64_t *v, int max, int *n);

#endif
