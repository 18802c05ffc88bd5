/*
 * dtrain backend plugin ABI, version 1.
 *
 * FROZEN: once released, nothing in this file changes meaning. New functions are
 * appended at the end of dt_backend_v1_t with a bumped DT_BACKEND_V1_MINOR; the
 * core reads a field only when the plugin's struct_size covers it, so a plugin
 * built against v1.0 keeps loading. An incompatible change is a new file,
 * backend_v2.h, with its own entry point; a plugin may export several.
 *
 * C99, fixed-width types only: no bool, no enums as fields, no C++ types.
 * No exception and no longjmp crosses this boundary.
 *
 * Entry point, exported with default visibility by the plugin:
 *   const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host);
 * The returned table is owned by the plugin and lives until the library is
 * unloaded; the core never frees it. The core calls the entry point once per
 * loaded library, from one thread.
 */
#ifndef DTRAIN_ABI_BACKEND_V1_H
#define DTRAIN_ABI_BACKEND_V1_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_BACKEND_V1_MAJOR 1
#define DT_BACKEND_V1_MINOR 0
#define DT_BACKEND_V1_ENTRY "dtrain_backend_v1"

/* ---- status codes: every call returns one ---- */
typedef int32_t dt_status_t;
#define DT_OK 0
#define DT_IN_PROGRESS 1          /* work not finished yet (test/wait only)   */
#define DT_ERR_INVALID_USAGE (-1) /* caller broke the contract (bad args)     */
#define DT_ERR_SYSTEM (-2)        /* OS / transport failure (socket, memory)  */
#define DT_ERR_INTERNAL (-3)      /* bug in the plugin                        */
#define DT_ERR_REMOTE (-4)        /* a peer failed or went away               */
#define DT_ERR_TIMEOUT (-5)       /* the transport's own deadline passed      */
#define DT_ERR_NOT_SUPPORTED (-6) /* op, dtype or device not implemented      */
#define DT_ERR_ABORTED (-7)       /* comm_abort was called                    */

/* ---- data types (values of dt_buffer_v1_t.dtype) ---- */
#define DT_DTYPE_F32 0
#define DT_DTYPE_F64 1
#define DT_DTYPE_F16 2
#define DT_DTYPE_BF16 3
#define DT_DTYPE_I8 4
#define DT_DTYPE_U8 5
#define DT_DTYPE_I32 6
#define DT_DTYPE_I64 7
#define DT_DTYPE_COUNT 8

/* ---- reduction operations ---- */
#define DT_OP_SUM 0
#define DT_OP_AVG 1 /* sum / world size; integer types truncate toward zero */
#define DT_OP_MAX 2
#define DT_OP_MIN 3
#define DT_OP_PROD 4
#define DT_OP_COUNT 5

/* ---- device types ---- */
#define DT_DEVICE_CPU 0
#define DT_DEVICE_CUDA 1

/* ---- roles ---- */
#define DT_ROLE_WORKER 0
#define DT_ROLE_SERVER 1

/* ---- log levels (dt_host_v1_t.log) ---- */
#define DT_LOG_TRACE 0
#define DT_LOG_DEBUG 1
#define DT_LOG_INFO 2
#define DT_LOG_WARN 3
#define DT_LOG_ERROR 4

/* ---- capability bits (dt_backend_v1_t.caps) ----
 * The core refuses an op whose bit is clear with "backend X does not support Y"
 * and never calls the corresponding function pointer, which may then be NULL. */
#define DT_CAP_ALLREDUCE (1ull << 0)
#define DT_CAP_BROADCAST (1ull << 1)
#define DT_CAP_ALLGATHER (1ull << 2)
#define DT_CAP_REDUCE_SCATTER (1ull << 3)
#define DT_CAP_REDUCE (1ull << 4)
#define DT_CAP_ALLTOALL (1ull << 5)
#define DT_CAP_BARRIER (1ull << 6)
#define DT_CAP_SENDRECV (1ull << 7)
#define DT_CAP_CPU_BUFFERS (1ull << 16)
#define DT_CAP_CUDA_BUFFERS (1ull << 17)
#define DT_CAP_REDUCED_PRECISION (1ull << 18) /* f16 / bf16 reductions */
/* Bits 32..47 are reserved for the parameter-server operations of minor 1
 * (dense pull/push, sparse pull/push, the server role). A v1.0 plugin leaves
 * them clear; the core then never looks past the v1.0 fields. */
#define DT_CAP_PS_DENSE (1ull << 32)
#define DT_CAP_PS_SPARSE (1ull << 33)
#define DT_CAP_PS_SERVER (1ull << 34)

/* ---- opaque handles (owned by the plugin) ---- */
typedef struct dt_comm_s* dt_comm_h;
typedef struct dt_work_s* dt_work_h;

/* A buffer descriptor. The memory is owned by the caller and must stay valid
 * and untouched until the work that uses it completes (test/wait returned
 * something other than DT_IN_PROGRESS) or the work is released after abort. */
typedef struct dt_buffer_v1 {
  void* ptr;           /* may be NULL when count == 0 */
  uint64_t count;      /* elements, not bytes */
  int32_t dtype;       /* DT_DTYPE_* */
  int32_t device_type; /* DT_DEVICE_* */
  int32_t device_id;   /* CUDA ordinal; 0 for CPU */
  int32_t reserved0;
  void* stream; /* cudaStream_t for CUDA buffers, else NULL */
} dt_buffer_v1_t;

/* Per-call options. */
typedef struct dt_call_opts_v1 {
  uint32_t struct_size;
  int32_t root; /* broadcast / reduce root rank */
  int32_t tag;  /* send / recv matching tag (>= 0) */
  int32_t reserved0;
  int64_t timeout_ms; /* the op's deadline; the transport may use it for its own
                         timeouts, but the core's watchdog enforces it anyway */
  uint64_t reserved[4];
} dt_call_opts_v1_t;

/* The rendezvous store, served by the core. All functions are thread-safe and
 * may be called from any plugin thread. Keys are NUL-terminated and already
 * scoped to the communicator (the core prefixes them). */
typedef struct dt_store_v1 {
  void* ctx;
  dt_status_t (*set)(void* ctx, const char* key, const void* value, uint64_t len);
  /* Blocks until key exists or timeout_ms passes (DT_ERR_TIMEOUT). On success
   * *value is allocated by the core; release it with free_value. */
  dt_status_t (*get)(void* ctx, const char* key, int64_t timeout_ms, void** value, uint64_t* len);
  void (*free_value)(void* ctx, void* value);
  /* Atomically adds delta to an integer key (created as 0) and returns the new value. */
  dt_status_t (*add)(void* ctx, const char* key, int64_t delta, int64_t* result);
  /* Blocks until all keys exist or timeout_ms passes (DT_ERR_TIMEOUT). */
  dt_status_t (*wait)(void* ctx, const char* const* keys, uint32_t nkeys, int64_t timeout_ms);
  /* Deletes a key (absent keys are not an error). */
  dt_status_t (*remove)(void* ctx, const char* key);
  void* reserved[3];
} dt_store_v1_t;

/* What the core hands the entry point: process-wide services. Valid until the
 * library is unloaded. */
typedef struct dt_host_v1 {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t reserved0;
  void* ctx;
  /* Thread-safe; msg is copied before return. */
  void (*log)(void* ctx, int32_t level, const char* msg);
  const char* core_version;
  void* reserved[4];
} dt_host_v1_t;

/* Everything one communicator needs; valid only during comm_create (the plugin
 * copies what it keeps), except store, whose functions stay valid until
 * comm_destroy returns. */
typedef struct dt_comm_init_v1 {
  uint32_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t role;       /* DT_ROLE_* */
  int64_t timeout_ms; /* default op timeout */
  const dt_store_v1_t* store;
  /* The plugin's own TOML table, as flat "key = value" lines (dotted keys for
   * nested tables, TOML literals for values); already checked by the core
   * against config_keys below. Never NULL; "" when absent. */
  const char* config_toml;
  const char* job_id;
  uint64_t reserved[4];
} dt_comm_init_v1_t;

/* One option a plugin reads from its TOML table. The core validates the
 * user's table against this list (unknown key, wrong type) before comm_create. */
typedef struct dt_config_key_v1 {
  const char* name;          /* "algorithm" or "tcp.iface" */
  const char* type;          /* "string", "int", "float", "bool" */
  const char* default_value; /* as TOML literal text, "" if none */
  const char* description;
} dt_config_key_v1_t;

/*
 * The backend table. Threading contract for all comm/work functions below:
 *  - ops on one communicator are submitted by one thread at a time, in the
 *    same order on every rank (as with NCCL, Gloo and c10d);
 *  - work_test/work_wait/work_release may be called from any thread;
 *  - comm_abort may be called from any thread at any time (the core's
 *    watchdog does), concurrently with everything else;
 *  - no function calls back into the core except through dt_store_v1_t and
 *    dt_host_v1_t.log.
 * Submission functions never block on peers: they enqueue and return a work
 * handle in *out (owned by the caller, released with work_release), or return
 * an error and set nothing. Errors leave a message in comm_last_error.
 */
typedef struct dt_backend_v1 {
  /* header: checked by the core before anything else */
  uint32_t abi_major;   /* must be DT_BACKEND_V1_MAJOR */
  uint32_t abi_minor;   /* DT_BACKEND_V1_MINOR the plugin was built with */
  uint32_t struct_size; /* sizeof(dt_backend_v1_t) the plugin was built with */
  uint32_t reserved0;
  const char* name;    /* must equal the NAME in libdtrain_NAME.so */
  const char* version; /* the plugin's own version, free-form */
  const char* description;
  uint64_t caps; /* DT_CAP_* */
  const dt_config_key_v1_t* config_keys;
  uint32_t num_config_keys;
  uint32_t reserved1;

  /* Creates a communicator; blocks until connected to all peers (through the
   * store) or init->timeout_ms passes. On failure *out is untouched and the
   * message is available from backend_last_error (thread-local). */
  dt_status_t (*comm_create)(const dt_comm_init_v1_t* init, dt_comm_h* out);
  /* Message of the last failed comm_create on this thread. */
  const char* (*backend_last_error)(void);
  /* Destroys a communicator. Outstanding works must have been released or
   * completed; after comm_abort it must not block on peers. */
  dt_status_t (*comm_destroy)(dt_comm_h comm);
  /* Fails every in-flight and future work on comm with DT_ERR_ABORTED and
   * unblocks every thread inside work_wait promptly. Idempotent. */
  dt_status_t (*comm_abort)(dt_comm_h comm, const char* reason);
  /* Message of the last error on comm; owned by the plugin, valid until the
   * next call on comm from the same thread. */
  const char* (*comm_last_error)(dt_comm_h comm);

  /* Collectives. send == recv (same ptr) means in place.
   * allreduce: send.count == recv.count.
   * broadcast: buf on every rank; root's data is sent.
   * allgather: recv.count == send.count * world_size, rank-major.
   * reduce_scatter: send.count == recv.count * world_size; rank r gets block r.
   * reduce: recv is used only on root.
   * alltoall: send.count == recv.count, divisible by world_size; block j of
   *           send goes to rank j, block i of recv comes from rank i. */
  dt_status_t (*allreduce)(dt_comm_h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv, int32_t op,
                           const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*broadcast)(dt_comm_h, const dt_buffer_v1_t* buf, const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*allgather)(dt_comm_h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv,
                           const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*reduce_scatter)(dt_comm_h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv, int32_t op,
                                const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*reduce)(dt_comm_h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv, int32_t op,
                        const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*alltoall)(dt_comm_h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv,
                          const dt_call_opts_v1_t* opts, dt_work_h* out);
  dt_status_t (*barrier)(dt_comm_h, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Point-to-point; matched by (peer, opts->tag) in order of posting. */
  dt_status_t (*send)(dt_comm_h, const dt_buffer_v1_t* buf, int32_t peer, const dt_call_opts_v1_t* opts,
                      dt_work_h* out);
  dt_status_t (*recv)(dt_comm_h, const dt_buffer_v1_t* buf, int32_t peer, const dt_call_opts_v1_t* opts,
                      dt_work_h* out);

  /* Work handles. test: DT_OK (done), DT_IN_PROGRESS, or the op's error.
   * wait: like test but blocks up to timeout_ms (< 0: no limit); returns
   * DT_IN_PROGRESS if time ran out. The plugin may run the op on the calling
   * thread inside wait; it then may fail the op with DT_ERR_TIMEOUT once
   * timeout_ms has passed (the core never passes more than the time left to
   * the op's deadline, so nothing is failed early). */
  dt_status_t (*work_test)(dt_work_h work);
  dt_status_t (*work_wait)(dt_work_h work, int64_t timeout_ms);
  /* Message of a failed work; valid until work_release. */
  const char* (*work_error)(dt_work_h work);
  /* Releases the handle; never blocks. Releasing an unfinished work is allowed
   * only after comm_abort (the plugin then keeps the op alive internally). */
  void (*work_release)(dt_work_h work);

  /* Minor versions give these slots names (v1.1: the parameter-server
   * operations, announced by DT_CAP_PS_* bits). A v1.0 plugin leaves them NULL
   * and the core never calls a NULL slot. */
  void* reserved[16];
} dt_backend_v1_t;

typedef const dt_backend_v1_t* (*dt_backend_v1_entry_fn)(const dt_host_v1_t* host);

#ifdef __cplusplus
}
#endif

#endif /* DTRAIN_ABI_BACKEND_V1_H */
