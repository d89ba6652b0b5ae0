/* The communication backend of remat.dist: MPI between processes (host buffers) and,
 * when built with nccl.h, NCCL between GPUs (device buffers), its communicator
 * bootstrapped over MPI. Built into libremat_mpi.so, dlopen'ed by remat.dist.init();
 * see dist/dist_api.h for the contract.
 *
 * MPI is process-wide state by nature (one MPI_Init per process), so this file keeps
 * one static state; every remat context in the process shares it.
 *
 * Every wait polls its request against a deadline instead of blocking in MPI, so a
 * rank that never joins a collective turns into a clear timeout error, and while it
 * polls it watches a side channel (a duplicate communicator, tag ERR_TAG) on which a
 * failing rank posts its error message before aborting the job. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "dist_api.h"

#define EXPORT __attribute__((visibility("default")))
#define ERR_TAG 7301
#define END_TAG 7302
/* A rank that ended while another waits in a collective: how long the waiter still
 * gives the collective to complete (it may be finishing) before reporting it. */
#define END_GRACE 5.0

struct rm_dist_req {
  MPI_Request r;
};

static struct {
  int inited;          /* we called MPI_Init */
  int finalized;
  int rank, size, local_rank;
  MPI_Comm err_comm;   /* side channel for error messages */
  char *heard;         /* heard[r]: rank r posted an error or ended */
  char *ended;         /* ended[r]: rank r ended its part of the job */
  int first_ended;     /* the first rank seen ending (-1: none) */
  double ended_at;     /* when it was seen */
  char peer_msg[RM_DIST_ERRLEN];  /* the first error another rank posted ("" none) */
} S;

static int fail(char *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, RM_DIST_ERRLEN, fmt, ap);
  va_end(ap);
  return code;
}

static int mpi_fail(char *err, const char *what, int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
  return fail(err, RM_DIST_EFAIL, "%s: MPI: %s", what, s);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps a little longer each time a poll finds nothing (spins first: most collectives
 * of a training step finish within microseconds of the last rank arriving). */
static void backoff(int polls) {
  if (polls < 2000) return;
  struct timespec ts = { 0, polls < 20000 ? 20000 : 500000 };
  nanosleep(&ts, NULL);
}

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
  case RM_DIST_F32: return MPI_FLOAT;
  case RM_DIST_F64: return MPI_DOUBLE;
  case RM_DIST_U8: return MPI_UNSIGNED_CHAR;
  default: return MPI_DATATYPE_NULL;
  }
}

static const char *type_name(int dtype) {
  static const char *const names[] = { "float32", "float64", "bfloat16", "float16", "uint8" };
  return dtype >= 0 && dtype <= RM_DIST_U8 ? names[dtype] : "unknown";
}

/* Checks that MPI is up and the count and dtype can be sent; fills *t. */
static int check_args(int64_t n, int dtype, MPI_Datatype *t, const char *what, char *err) {
  if (!S.inited || S.finalized) return fail(err, RM_DIST_EFAIL, "%s: MPI is not initialised", what);
  if (n < 0 || n > INT_MAX)
    return fail(err, RM_DIST_EFAIL, "%s: %lld elements is more than one MPI call sends (%d)", what, (long long)n, INT_MAX);
  *t = mpi_type(dtype);
  if (*t == MPI_DATATYPE_NULL)
    return fail(err, RM_DIST_EFAIL, "%s: MPI cannot reduce %s tensors on the host", what, type_name(dtype));
  return RM_DIST_OK;
}

static int new_req(rm_dist_req **req, char *err) {
  *req = malloc(sizeof **req);
  if (!*req) return fail(err, RM_DIST_EFAIL, "out of host memory");
  (*req)->r = MPI_REQUEST_NULL;
  return RM_DIST_OK;
}

static void d_finalize(double timeout, int dirty);

/* A script that ends with os.exit() never closes its state: MPI that this file
 * started is finalised when the process exits, or mpirun reports the rank as gone
 * without finalising. */
static void finalize_at_exit(void) { d_finalize(60, 0); }

static int d_init(int *rank, int *size, int *local_rank, char *err) {
  if (S.finalized) return fail(err, RM_DIST_EFAIL, "MPI was finalised in this process and cannot start again");
  int flag = 0;
  MPI_Initialized(&flag);
  if (!S.inited) {
    if (!flag) {
      int rc = MPI_Init(NULL, NULL);
      if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Init", rc);
      atexit(finalize_at_exit);
    }
    /* errors come back as codes; this file turns them into messages */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &S.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &S.size);
    MPI_Comm node;
    S.local_rank = S.rank;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_rank(node, &S.local_rank);
      MPI_Comm_free(&node);
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &S.err_comm);
    if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Comm_dup", rc);
    S.heard = calloc((size_t)S.size, 1);
    S.ended = calloc((size_t)S.size, 1);
    if (!S.heard || !S.ended) return fail(err, RM_DIST_EFAIL, "out of host memory");
    S.first_ended = -1;
    S.inited = 1;
  }
  *rank = S.rank;
  *size = S.size;
  *local_rank = S.local_rank;
  return RM_DIST_OK;
}

/* Receives what other ranks posted on the side channel (errors, ends); returns
 * whether any of them has failed. */
static int peer_failed(void) {
  int flag = 0;
  MPI_Status st;
  while (MPI_Iprobe(MPI_ANY_SOURCE, END_TAG, S.err_comm, &flag, &st) == MPI_SUCCESS && flag) {
    MPI_Recv(NULL, 0, MPI_CHAR, st.MPI_SOURCE, END_TAG, S.err_comm, MPI_STATUS_IGNORE);
    S.ended[st.MPI_SOURCE] = S.heard[st.MPI_SOURCE] = 1;
    if (S.first_ended < 0) S.first_ended = st.MPI_SOURCE, S.ended_at = now();
  }
  while (MPI_Iprobe(MPI_ANY_SOURCE, ERR_TAG, S.err_comm, &flag, &st) == MPI_SUCCESS && flag) {
    char msg[RM_DIST_ERRLEN];
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    if (count < 0 || count >= (int)sizeof msg) count = (int)sizeof msg - 1;
    MPI_Recv(msg, count, MPI_CHAR, st.MPI_SOURCE, ERR_TAG, S.err_comm, MPI_STATUS_IGNORE);
    msg[count] = 0;
    S.heard[st.MPI_SOURCE] = 1;
    if (!S.peer_msg[0]) snprintf(S.peer_msg, sizeof S.peer_msg, "rank %d failed: %.480s", st.MPI_SOURCE + 1, msg);
  }
  return S.peer_msg[0] != 0;
}

/* Posts a message (tag, bytes) to every other rank; sends[] receives the requests. */
static void post_all(MPI_Request *sends, const char *msg, int len, int tag) {
  for (int r = 0; r < S.size; r++) {
    sends[r] = MPI_REQUEST_NULL;
    if (r != S.rank) MPI_Isend(msg, len, MPI_CHAR, r, tag, S.err_comm, &sends[r]);
  }
}

/* Polls the side channel until every other rank was heard from (of `ended` when
 * only_ended) or the deadline passes; returns whether all were. */
static int await_all(double deadline, int only_ended) {
  for (int polls = 0;; polls++) {
    peer_failed();
    int all = 1;
    for (int r = 0; r < S.size; r++) all = all && (r == S.rank || (only_ended ? S.ended[r] : S.heard[r]));
    if (all) return 1;
    if (now() > deadline) return 0;
    backoff(polls);
  }
}

static void d_finalize(double timeout, int dirty) {
  if (!S.inited || S.finalized) return;
  S.finalized = 1;
  MPI_Request *sends = calloc((size_t)S.size, sizeof *sends);
  if (!sends) MPI_Abort(MPI_COMM_WORLD, 1);
  post_all(sends, "", 0, END_TAG);
  int all = await_all(now() + (timeout > 0 ? timeout : 1e9), 1);
  if (!all || dirty) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Waitall(S.size, sends, MPI_STATUSES_IGNORE);
  free(sends);
  MPI_Comm_free(&S.err_comm);
  MPI_Finalize();
  free(S.heard);
  free(S.ended);
  S.heard = S.ended = NULL;
}

static int d_iallreduce(void *buf, int64_t n, int dtype, int op, rm_dist_req **req, char *err) {
  MPI_Datatype t;
  int rc = check_args(n, dtype, &t, "allreduce", err);
  if (rc || (rc = new_req(req, err))) return rc;
  rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, t, op == RM_DIST_MAX ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD, &(*req)->r);
  if (rc != MPI_SUCCESS) { free(*req); *req = NULL; return mpi_fail(err, "allreduce", rc); }
  return RM_DIST_OK;
}

static int d_ibroadcast(void *buf, int64_t n, int dtype, int root, rm_dist_req **req, char *err) {
  MPI_Datatype t;
  int rc = check_args(n, dtype, &t, "broadcast", err);
  if (rc || (rc = new_req(req, err))) return rc;
  if (root < 0 || root >= S.size) { free(*req); *req = NULL; return fail(err, RM_DIST_EFAIL, "broadcast: no rank %d", root + 1); }
  rc = MPI_Ibcast(buf, (int)n, t, root, MPI_COMM_WORLD, &(*req)->r);
  if (rc != MPI_SUCCESS) { free(*req); *req = NULL; return mpi_fail(err, "broadcast", rc); }
  return RM_DIST_OK;
}

static int d_iallgather(const void *send, void *recv, int64_t n, int dtype, rm_dist_req **req, char *err) {
  MPI_Datatype t;
  int rc = check_args(n, dtype, &t, "all_gather", err);
  if (rc || (rc = new_req(req, err))) return rc;
  rc = MPI_Iallgather(send, (int)n, t, recv, (int)n, t, MPI_COMM_WORLD, &(*req)->r);
  if (rc != MPI_SUCCESS) { free(*req); *req = NULL; return mpi_fail(err, "all_gather", rc); }
  return RM_DIST_OK;
}

static int d_ibarrier(rm_dist_req **req, char *err) {
  if (!S.inited || S.finalized) return fail(err, RM_DIST_EFAIL, "barrier: MPI is not initialised");
  int rc = new_req(req, err);
  if (rc) return rc;
  rc = MPI_Ibarrier(MPI_COMM_WORLD, &(*req)->r);
  if (rc != MPI_SUCCESS) { free(*req); *req = NULL; return mpi_fail(err, "barrier", rc); }
  return RM_DIST_OK;
}

static int d_test(rm_dist_req *req, int *done, char *err) {
  *done = 0;
  if (req->r == MPI_REQUEST_NULL) { *done = 1; return RM_DIST_OK; }
  int rc = MPI_Test(&req->r, done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return mpi_fail(err, "test", rc);
  return RM_DIST_OK;
}

static int d_wait(rm_dist_req *req, double timeout, const char *what, char *err) {
  double deadline = timeout > 0 ? now() + timeout : 0;
  int rc = RM_DIST_OK;
  for (int polls = 0;; polls++) {
    int done = 0;
    int m = MPI_Test(&req->r, &done, MPI_STATUS_IGNORE);
    if (m != MPI_SUCCESS) { rc = mpi_fail(err, what, m); break; }
    if (done) break;
    if ((polls & 63) == 0 && peer_failed()) {
      rc = fail(err, RM_DIST_EPEER, "%s: %s", what, S.peer_msg);
      break;
    }
    if (S.first_ended >= 0 && now() > S.ended_at + END_GRACE) {
      rc = fail(err, RM_DIST_EPEER, "%s: rank %d ended (its script finished or failed) while rank %d waited for it here",
                what, S.first_ended + 1, S.rank + 1);
      break;
    }
    if (deadline && now() > deadline) {
      rc = fail(err, RM_DIST_ETIMEOUT,
                "%s timed out after %g s: rank %d of %d waited for the others to join it "
                "(a rank stopped, diverged or is much slower; dist.init{timeout = seconds} sets the limit)",
                what, timeout, S.rank + 1, S.size);
      break;
    }
    backoff(polls);
  }
  /* a collective cannot be cancelled: after a failure the request is left to MPI */
  free(req);
  return rc;
}

static void d_abort_job(const char *msg, double grace, int code) {
  if (!S.inited || S.finalized) return;
  int len = (int)strnlen(msg, RM_DIST_ERRLEN - 1);
  MPI_Request *sends = calloc((size_t)S.size, sizeof *sends);
  int answering = S.peer_msg[0] != 0;   /* this rank fails because another did */
  if (sends) {
    post_all(sends, msg, len, ERR_TAG);
    /* wait for every other rank to answer (it fails in turn and posts its own message,
     * or ends), so that each can say why before MPI_Abort ends them all */
    await_all(now() + grace, 0);
  }
  /* one MPI_Abort per job reads best: an answering rank leaves it to the rank that
   * failed first (which aborts once it has heard from everyone) unless that is slow */
  for (double until = now() + (answering ? grace : 0); answering && now() < until;) backoff(1 << 20);
  MPI_Abort(MPI_COMM_WORLD, code);
  free(sends);
}

#ifdef REMAT_NCCL
#include "nccl.c"
#endif

static const rm_dist_api api = {
  .abi = RM_DIST_ABI,
  .init = d_init,
  .finalize = d_finalize,
  .iallreduce = d_iallreduce,
  .ibroadcast = d_ibroadcast,
  .iallgather = d_iallgather,
  .ibarrier = d_ibarrier,
  .test = d_test,
  .wait = d_wait,
  .abort_job = d_abort_job,
#ifdef REMAT_NCCL
  .gpu_allreduce = g_allreduce,
  .gpu_broadcast = g_broadcast,
  .gpu_allgather = g_allgather,
#endif
};

EXPORT const rm_dist_api *rm_dist_api_get(void) { return &api; }
