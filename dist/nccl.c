/* NCCL for CUDA tensors (part of dist/mpi.c, included when built with nccl.h).
 *
 * libnccl and libcudart are opened at first use, so libremat_mpi.so loads on machines
 * without CUDA; the types and prototypes come from nccl.h, so this is checked by the
 * compiler even where no GPU runs it. The communicator is bootstrapped over MPI: rank 1
 * makes the unique id and broadcasts it. Each collective runs on a stream of its own
 * and is polled to completion against the deadline (ncclCommAbort on a timeout, since a
 * hung NCCL kernel is not cancellable otherwise). The caller has synchronised the remat
 * CUDA backend first, so the buffers hold their final data. */
#include <dlfcn.h>
#include <nccl.h>

static struct {
  int tried, ready;
  char why[RM_DIST_ERRLEN];
  void *lib, *rt;
  ncclComm_t comm;
  cudaStream_t stream;
  __typeof__(&ncclGetUniqueId) get_id;
  __typeof__(&ncclCommInitRank) init_rank;
  __typeof__(&ncclCommAbort) comm_abort;
  __typeof__(&ncclCommGetAsyncError) async_error;
  __typeof__(&ncclAllReduce) allreduce;
  __typeof__(&ncclBroadcast) broadcast;
  __typeof__(&ncclAllGather) allgather;
  __typeof__(&ncclGetErrorString) error_string;
  __typeof__(&cudaStreamCreateWithFlags) stream_create;
  __typeof__(&cudaStreamQuery) stream_query;
  __typeof__(&cudaGetErrorString) cuda_error_string;
} N;

static void *open_first(const char *const *names) {
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  return NULL;
}

#define SYM(h, field, name) (N.field = (__typeof__(N.field))dlsym(h, name))

/* Opens the libraries and builds the communicator; returns 0 or fails into err. */
static int nccl_setup(const char *what, double timeout, char *err) {
  if (N.ready) return RM_DIST_OK;
  if (N.tried) return fail(err, RM_DIST_EFAIL, "%s: NCCL is not available: %s", what, N.why);
  N.tried = 1;
  if (!S.inited || S.finalized) {
    snprintf(N.why, sizeof N.why, "MPI is not initialised (dist.init() bootstraps NCCL)");
    return fail(err, RM_DIST_EFAIL, "%s: %s", what, N.why);
  }
  static const char *const nccl_names[] = { "libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2", NULL };
  static const char *const rt_names[] = { "libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                          "/usr/local/cuda/lib64/libcudart.so", NULL };
  N.lib = open_first(nccl_names);
  N.rt = open_first(rt_names);
  if (!N.lib || !N.rt) {
    snprintf(N.why, sizeof N.why, "cannot load %s", !N.lib ? "libnccl.so.2" : "libcudart.so");
    return fail(err, RM_DIST_EFAIL, "%s: NCCL is not available: %s", what, N.why);
  }
  int ok = SYM(N.lib, get_id, "ncclGetUniqueId") && SYM(N.lib, init_rank, "ncclCommInitRank") &&
           SYM(N.lib, comm_abort, "ncclCommAbort") && SYM(N.lib, async_error, "ncclCommGetAsyncError") &&
           SYM(N.lib, allreduce, "ncclAllReduce") && SYM(N.lib, broadcast, "ncclBroadcast") &&
           SYM(N.lib, allgather, "ncclAllGather") && SYM(N.lib, error_string, "ncclGetErrorString") &&
           SYM(N.rt, stream_create, "cudaStreamCreateWithFlags") && SYM(N.rt, stream_query, "cudaStreamQuery") &&
           SYM(N.rt, cuda_error_string, "cudaGetErrorString");
  if (!ok) {
    snprintf(N.why, sizeof N.why, "a NCCL or CUDA runtime function is missing (%s)", dlerror());
    return fail(err, RM_DIST_EFAIL, "%s: NCCL is not available: %s", what, N.why);
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (S.rank == 0) {
    ncclResult_t r = N.get_id(&id);
    if (r != ncclSuccess) {
      snprintf(N.why, sizeof N.why, "ncclGetUniqueId: %s", N.error_string(r));
      return fail(err, RM_DIST_EFAIL, "%s: %s", what, N.why);
    }
  }
  rm_dist_req *req;
  int rc = d_ibroadcast(&id, (int64_t)sizeof id, RM_DIST_U8, 0, &req, err);
  if (rc || (rc = d_wait(req, timeout, "NCCL bootstrap (broadcast of the unique id)", err))) {
    snprintf(N.why, sizeof N.why, "%s", err);
    return rc;
  }
  cudaError_t ce = N.stream_create(&N.stream, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    snprintf(N.why, sizeof N.why, "cudaStreamCreate: %s", N.cuda_error_string(ce));
    return fail(err, RM_DIST_EFAIL, "%s: %s", what, N.why);
  }
  ncclResult_t r = N.init_rank(&N.comm, S.size, id, S.rank);
  if (r != ncclSuccess) {
    snprintf(N.why, sizeof N.why, "ncclCommInitRank: %s", N.error_string(r));
    return fail(err, RM_DIST_EFAIL, "%s: %s", what, N.why);
  }
  N.ready = 1;
  return RM_DIST_OK;
}

static int nccl_type(int dtype, ncclDataType_t *t) {
  switch (dtype) {
  case RM_DIST_F32: *t = ncclFloat32; return 1;
  case RM_DIST_F64: *t = ncclFloat64; return 1;
  case RM_DIST_BF16: *t = ncclBfloat16; return 1;
  case RM_DIST_F16: *t = ncclFloat16; return 1;
  case RM_DIST_U8: *t = ncclUint8; return 1;
  default: return 0;
  }
}

/* Polls the stream until the enqueued collective is done, a NCCL error shows, or the
 * deadline passes (then the communicator is aborted: the job must end). */
static int nccl_finish(ncclResult_t r, const char *what, double timeout, char *err) {
  if (r != ncclSuccess) return fail(err, RM_DIST_EFAIL, "%s: NCCL: %s", what, N.error_string(r));
  double deadline = timeout > 0 ? now() + timeout : 0;
  for (int polls = 0;; polls++) {
    cudaError_t q = N.stream_query(N.stream);
    if (q == cudaSuccess) return RM_DIST_OK;
    if (q != cudaErrorNotReady) return fail(err, RM_DIST_EFAIL, "%s: CUDA: %s", what, N.cuda_error_string(q));
    ncclResult_t a = ncclSuccess;
    if (N.async_error(N.comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress)
      return fail(err, RM_DIST_EFAIL, "%s: NCCL: %s", what, N.error_string(a));
    if ((polls & 63) == 0 && peer_failed()) {
      N.comm_abort(N.comm);
      N.ready = 0;
      return fail(err, RM_DIST_EPEER, "%s: %s", what, S.peer_msg);
    }
    if (deadline && now() > deadline) {
      N.comm_abort(N.comm);
      N.ready = 0;
      snprintf(N.why, sizeof N.why, "the communicator was aborted after a timeout");
      return fail(err, RM_DIST_ETIMEOUT, "%s timed out after %g s: rank %d of %d waited for the others (NCCL)",
                  what, timeout, S.rank + 1, S.size);
    }
    backoff(polls);
  }
}

static int g_allreduce(void *buf, int64_t n, int dtype, int op, double timeout, char *err) {
  ncclDataType_t t;
  if (!nccl_type(dtype, &t)) return fail(err, RM_DIST_EFAIL, "allreduce: NCCL cannot reduce %s", type_name(dtype));
  int rc = nccl_setup("allreduce", timeout, err);
  if (rc) return rc;
  return nccl_finish(N.allreduce(buf, buf, (size_t)n, t, op == RM_DIST_MAX ? ncclMax : ncclSum, N.comm, N.stream),
                     "allreduce", timeout, err);
}

static int g_broadcast(void *buf, int64_t n, int dtype, int root, double timeout, char *err) {
  ncclDataType_t t;
  if (!nccl_type(dtype, &t)) return fail(err, RM_DIST_EFAIL, "broadcast: NCCL cannot send %s", type_name(dtype));
  int rc = nccl_setup("broadcast", timeout, err);
  if (rc) return rc;
  return nccl_finish(N.broadcast(buf, buf, (size_t)n, t, root, N.comm, N.stream), "broadcast", timeout, err);
}

static int g_allgather(const void *send, void *recv, int64_t n, int dtype, double timeout, char *err) {
  ncclDataType_t t;
  if (!nccl_type(dtype, &t)) return fail(err, RM_DIST_EFAIL, "all_gather: NCCL cannot send %s", type_name(dtype));
  int rc = nccl_setup("all_gather", timeout, err);
  if (rc) return rc;
  return nccl_finish(N.allgather(send, recv, (size_t)n, t, N.comm, N.stream), "all_gather", timeout, err);
}
