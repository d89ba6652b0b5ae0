/* The interface between the core (core/dist.c) and the communication backend
 * (dist/mpi.c, built into libremat_mpi.so and dlopen'ed by remat.dist.init()).
 *
 * Plain C types only: the backend depends on MPI (and, when built with it, on NCCL
 * opened at run time), never on remat's core symbols; remat itself never links MPI,
 * so it builds and runs where Open MPI is not installed.
 *
 * Every function that can fail returns 0, or nonzero with a message written into
 * err (RM_DIST_ERRLEN bytes). Buffers are raw pointers: host memory for the MPI
 * functions, device memory for the gpu_* ones. Counts are elements. */
#ifndef REMAT_DIST_API_H
#define REMAT_DIST_API_H

#include <stdint.h>

#define RM_DIST_ABI 1
#define RM_DIST_ERRLEN 512

enum { RM_DIST_F32, RM_DIST_F64, RM_DIST_BF16, RM_DIST_F16, RM_DIST_U8 };
enum { RM_DIST_SUM, RM_DIST_MAX };
/* Error kinds (the return values): a timeout, a peer that reported an error, MPI. */
enum { RM_DIST_OK = 0, RM_DIST_EFAIL = 1, RM_DIST_ETIMEOUT = 2, RM_DIST_EPEER = 3 };

typedef struct rm_dist_req rm_dist_req;   /* an outstanding nonblocking operation */

typedef struct rm_dist_api {
  int abi;                                /* RM_DIST_ABI */
  /* Initialises MPI (once per process; a second call reports the same values).
   * rank and local_rank are 0-based here; the Lua API adds 1. */
  int (*init)(int *rank, int *size, int *local_rank, char *err);
  /* Ends this rank's part of the job: tells every other rank it has ended, waits up to
   * timeout seconds for each of them to end too, then MPI_Finalize. When some rank does
   * not end in time, or dirty (this rank abandoned a collective after an error), it
   * MPI_Abort's the job with code 1 instead (MPI cannot finalise cleanly then).
   * Idempotent; a no-op when MPI was not initialised here. */
  void (*finalize)(double timeout, int dirty);
  /* Nonblocking collectives on host buffers; *req receives the request. In place for
   * allreduce and broadcast (root 0-based); allgather: recv holds size * n elements. */
  int (*iallreduce)(void *buf, int64_t n, int dtype, int op, rm_dist_req **req, char *err);
  int (*ibroadcast)(void *buf, int64_t n, int dtype, int root, rm_dist_req **req, char *err);
  int (*iallgather)(const void *send, void *recv, int64_t n, int dtype, rm_dist_req **req, char *err);
  int (*ibarrier)(rm_dist_req **req, char *err);
  /* Drives progress; *done tells whether req finished (req stays valid until wait). */
  int (*test)(rm_dist_req *req, int *done, char *err);
  /* Waits for req until timeout seconds have passed (<= 0: no limit) and frees it.
   * While waiting it watches for an error posted by another rank (RM_DIST_EPEER);
   * `what` names the collective in the messages. After a failure the request is
   * abandoned (MPI cannot cancel a collective): the job must end. */
  int (*wait)(rm_dist_req *req, double timeout, const char *what, char *err);
  /* Tells every other rank that this one failed with msg, waits up to grace seconds
   * for each of them to answer (they answer by failing in turn), then MPI_Abort's
   * the job with code. Only returns when MPI is not initialised. */
  void (*abort_job)(const char *msg, double grace, int code);

  /* CUDA tensors through NCCL (communicator bootstrapped over MPI on first use).
   * NULL when the backend was built without NCCL. Blocking, with the timeout. */
  int (*gpu_allreduce)(void *buf, int64_t n, int dtype, int op, double timeout, char *err);
  int (*gpu_broadcast)(void *buf, int64_t n, int dtype, int root, double timeout, char *err);
  int (*gpu_allgather)(const void *send, void *recv, int64_t n, int dtype, double timeout, char *err);
} rm_dist_api;

/* The one symbol libremat_mpi.so exports. */
typedef const rm_dist_api *(*rm_dist_api_get_fn)(void);
#define RM_DIST_API_SYMBOL "rm_dist_api_get"

#endif
