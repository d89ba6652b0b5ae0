/* The strict JSON reader behind safetensors headers (see json.h). */
#include <stdio.h>
#include <string.h>

#include "json.h"

size_t rm_utf8_valid_prefix(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t len;
    unsigned min;
    if (c < 0x80) { i++; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; c &= 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; c &= 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; c &= 0x07; }
    else return i;
    if (n - i < len) return i;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      c = (c << 6) | (s[i + k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

int rm_json_fail(rm_json *j, const char *what) {
  return rm_fail(j->ctx, RM_ERR_IO, "%s: corrupted header: %s at byte %lld", j->path, what,
                 (long long)(j->origin + (j->p - j->base)));
}

void rm_json_skip_ws(rm_json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* Consumes c after optional whitespace. */
int rm_json_expect(rm_json *j, char c) {
  rm_json_skip_ws(j);
  if (j->p >= j->end) return rm_json_fail(j, "unexpected end of the header");
  if (*j->p != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return rm_json_fail(j, what);
  }
  j->p++;
  return RM_OK;
}

bool rm_json_take_null(rm_json *j) {
  rm_json_skip_ws(j);
  if (j->end - j->p < 4 || memcmp(j->p, "null", 4)) return false;
  j->p += 4;
  return true;
}

static int hex4(rm_json *j, unsigned *out) {
  if (j->end - j->p < 4) return rm_json_fail(j, "truncated \\u escape");
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    const char *hex = "0123456789abcdef0123456789ABCDEF", *at = j->p[k] ? strchr(hex, j->p[k]) : NULL;
    if (!at) return rm_json_fail(j, "bad \\u escape");
    v = v * 16 + (unsigned)((at - hex) % 16);
  }
  j->p += 4;
  *out = v;
  return RM_OK;
}

/* Parses a string literal, decoding it in place (the decoded form is never longer),
 * NUL-terminated; *out points into the header buffer. */
int rm_json_string(rm_json *j, const char **out) {
  rm_json_skip_ws(j);
  if (j->p >= j->end) return rm_json_fail(j, "unexpected end of the header");
  if (*j->p != '"') return rm_json_fail(j, "expected a string");
  char *w = ++j->p, *start = w;
  for (;;) {
    if (j->p >= j->end) return rm_json_fail(j, "unterminated string");
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') { j->p++; break; }
    if (c < 0x20) return rm_json_fail(j, "control character in a string");
    if (c != '\\') { *w++ = *j->p++; continue; }
    if (++j->p >= j->end) return rm_json_fail(j, "unterminated string");
    c = (unsigned char)*j->p++;
    const char *simple = "\"\\/bfnrt", *at = c ? strchr(simple, c) : NULL;
    unsigned cp;
    if (at) { *w++ = "\"\\/\b\f\n\r\t"[at - simple]; continue; }
    switch (c) {
    case 'u':
      if (hex4(j, &cp) != RM_OK) return j->ctx->err_code;
      if (cp >= 0xDC00 && cp <= 0xDFFF) return rm_json_fail(j, "lone low surrogate in \\u escape");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned lo;
        if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
          return rm_json_fail(j, "lone high surrogate in \\u escape");
        j->p += 2;
        if (hex4(j, &lo) != RM_OK) return j->ctx->err_code;
        if (lo < 0xDC00 || lo > 0xDFFF) return rm_json_fail(j, "bad surrogate pair in \\u escape");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      if (cp == 0) return rm_json_fail(j, "\\u0000 in a string");
      if (cp < 0x80) *w++ = (char)cp;
      else if (cp < 0x800) { *w++ = (char)(0xC0 | (cp >> 6)); *w++ = (char)(0x80 | (cp & 0x3F)); }
      else if (cp < 0x10000) {
        *w++ = (char)(0xE0 | (cp >> 12)); *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
      } else {
        *w++ = (char)(0xF0 | (cp >> 18)); *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *w++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *w++ = (char)(0x80 | (cp & 0x3F));
      }
      continue;
    default: return rm_json_fail(j, "bad escape in a string");
    }
  }
  *w = 0;
  *out = start;
  return RM_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A non-negative integer (no sign, fraction or exponent), at most INT64_MAX. */
int rm_json_uint(rm_json *j, uint64_t *out) {
  rm_json_skip_ws(j);
  if (j->p >= j->end) return rm_json_fail(j, "unexpected end of the header");
  if (*j->p == '-') return rm_json_fail(j, "negative number where a size or offset was expected");
  if (!is_digit(*j->p)) return rm_json_fail(j, "expected a number");
  if (*j->p == '0' && j->p + 1 < j->end && is_digit(j->p[1])) return rm_json_fail(j, "number with a leading zero");
  uint64_t v = 0;
  while (j->p < j->end && is_digit(*j->p)) {
    unsigned d = (unsigned)(*j->p - '0');
    if (v > ((uint64_t)INT64_MAX - d) / 10) return rm_json_fail(j, "number too large");
    v = v * 10 + d;
    j->p++;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
    return rm_json_fail(j, "expected an integer");
  *out = v;
  return RM_OK;
}

static int skip_number(rm_json *j) {
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end || !is_digit(*j->p)) return rm_json_fail(j, "bad number");
  if (*j->p == '0') j->p++;
  else while (j->p < j->end && is_digit(*j->p)) j->p++;
  if (j->p < j->end && *j->p == '.') {
    j->p++;
    if (j->p >= j->end || !is_digit(*j->p)) return rm_json_fail(j, "bad number");
    while (j->p < j->end && is_digit(*j->p)) j->p++;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    if (j->p >= j->end || !is_digit(*j->p)) return rm_json_fail(j, "bad number");
    while (j->p < j->end && is_digit(*j->p)) j->p++;
  }
  return RM_OK;
}

static int literal(rm_json *j, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n)) return rm_json_fail(j, "unexpected character");
  j->p += n;
  return RM_OK;
}

/* Skips any JSON value (fields of a tensor entry that remat does not use). */
int rm_json_skip_value(rm_json *j, int depth) {
  if (depth > RM_JSON_MAX_DEPTH) return rm_json_fail(j, "nesting too deep");
  rm_json_skip_ws(j);
  if (j->p >= j->end) return rm_json_fail(j, "unexpected end of the header");
  const char *s;
  char c = *j->p;
  if (c == '"') return rm_json_string(j, &s);
  if (c == 't') return literal(j, "true");
  if (c == 'f') return literal(j, "false");
  if (c == 'n') return literal(j, "null");
  if (c == '-' || is_digit(c)) return skip_number(j);
  if (c != '[' && c != '{') return rm_json_fail(j, "unexpected character");
  char close = c == '[' ? ']' : '}';
  j->p++;
  rm_json_skip_ws(j);
  if (j->p < j->end && *j->p == close) { j->p++; return RM_OK; }
  for (;;) {
    if (close == '}') {
      if (rm_json_string(j, &s) != RM_OK || rm_json_expect(j, ':') != RM_OK) return j->ctx->err_code;
    }
    if (rm_json_skip_value(j, depth + 1) != RM_OK) return j->ctx->err_code;
    rm_json_skip_ws(j);
    if (j->p >= j->end) return rm_json_fail(j, "unexpected end of the header");
    if (*j->p == close) { j->p++; return RM_OK; }
    if (*j->p != ',') return rm_json_fail(j, "expected ',' or a closing bracket");
    j->p++;
  }
}

/* Iterates over "[v1, v2, ...]" / "{k: v, ...}": rm_json_expect the opening bracket, then
 * rm_json_next before each element: 1 while there is one, 0 at the closing bracket, <0 on error. */
int rm_json_next(rm_json *j, char close, int *count) {
  rm_json_skip_ws(j);
  if (j->p >= j->end) { rm_json_fail(j, "unexpected end of the header"); return -1; }
  if (*j->p == close) { j->p++; return 0; }
  if (*count > 0) {
    if (*j->p != ',') { rm_json_fail(j, close == ']' ? "expected ',' or ']'" : "expected ',' or '}'"); return -1; }
    j->p++;
  }
  (*count)++;
  return 1;
}

/* An array of non-negative integers; stops reading past max of them (*n = max + 1). */
int rm_json_uints(rm_json *j, uint64_t *v, int max, int *n) {
  if (rm_json_expect(j, '[') != RM_OK) return j->ctx->err_code;
  int count = 0, r;
  while ((r = rm_json_next(j, ']', &count)) > 0) {
    if (count > max) { *n = count; return RM_OK; }
    if (rm_json_uint(j, &v[count - 1]) != RM_OK) return j->ctx->err_code;
  }
  *n = count;
  return r < 0 ? j->ctx->err_code : RM_OK;
}

