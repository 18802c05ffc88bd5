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
#define DT_BACKEND_V1_MINOR 2
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
/* Bits 32..47: the parameter-server operations of minor 1. A v1.0 plugin
 * leaves them clear; the core then never looks past the v1.0 fields.
 *   PS_DENSE:  ps_table (dense), ps_pull_dense, ps_push_dense
 *   PS_SPARSE: ps_table (sparse), ps_pull_sparse, ps_push_sparse, ps_shrink
 *   PS_SERVER: ps_serve, ps_stop, ps_finish, ps_barrier, ps_save, ps_load
 * A plugin with any PS bit must set PS_SERVER and fill every ps_* slot of the
 * kinds it announces. */
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
  int32_t root;       /* broadcast / reduce root rank */
  int32_t tag;        /* send / recv matching tag (>= 0) */
  uint32_t flags;     /* DT_CALL_* (minor 2; `int32_t reserved0`, always 0, before) */
  int64_t timeout_ms; /* the op's deadline; the transport may use it for its own
                         timeouts, but the core's watchdog enforces it anyway */
  uint64_t reserved[4];
} dt_call_opts_v1_t;

/* Minor 2. The caller blocks until this collective has finished (it waits for
 * the work at once, with the op's whole deadline). The plugin MAY then run the
 * op to completion on the calling thread inside the submitting call itself,
 * bounded by opts->timeout_ms and returning promptly on comm_abort, and
 * return DT_OK with *out = NULL: the op succeeded and no work exists. A failed
 * op still comes back as a (finished) work, and a non-OK status with no work
 * still means the call was refused and nothing ran. A plugin may ignore the
 * flag and return a work as usual. The core sets it only for plugins whose
 * abi_minor is >= 2, on collectives (not on send/recv or the PS calls). */
#define DT_CALL_WAIT (1u << 0)

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
  /* minor 1 (a v1.0 core passes zeros here: NULL, 0, 0) */
  const char* job_token; /* the job's shared secret, "" or NULL if none; a PS
                            backend demands it from every client */
  int32_t num_servers;   /* PS communicators: servers in the job, else 0 */
  int32_t num_workers;   /* PS communicators: workers in the job, else 0.
                            For a PS communicator rank is the index among
                            the processes of its role and world_size equals
                            num_workers. */
  uint64_t reserved[2];
} dt_comm_init_v1_t;

/* One option a plugin reads from its TOML table. The core validates the
 * user's table against this list (unknown key, wrong type) before comm_create. */
/* ---- parameter server (minor 1) ----
 *
 * A PS communicator is created with role DT_ROLE_SERVER on each of the
 * num_servers servers and DT_ROLE_WORKER on each of the num_workers workers.
 * Servers call ps_serve; workers declare tables with ps_table and then pull
 * and push. Every operation below returns a work handle exactly like the
 * collectives (so the core's watchdog, timeouts, abort and error reporting
 * cover it), is thread-compatible like them (one submitting thread per
 * communicator at a time; unlike collectives, workers need not submit in the
 * same order), and fails with DT_ERR_REMOTE naming the server (index and
 * endpoint) when a server is unreachable or dies.
 */

/* table kinds (dt_ps_table_desc_v1_t.kind) */
#define DT_PS_TABLE_DENSE 0  /* one flat vector of dim values, split evenly over servers */
#define DT_PS_TABLE_SPARSE 1 /* u64 key -> row of dim values, keys hashed over shards and servers */

/* training modes (dt_ps_table_desc_v1_t.mode), Paddle's DistributedStrategy:
 *  SYNC  (a_sync = false): the n-th push of each worker to a table belongs to
 *        step n. The server applies step n once every worker has pushed it:
 *        the pushed gradients are summed in worker order and divided by
 *        num_workers (sparse: per key, over the workers that pushed the key,
 *        still divided by num_workers), then one optimizer step. A worker that
 *        has made n pushes to a table waits in its next pull of that table
 *        until step n is applied; a wait that outlives the op's timeout fails
 *        naming the workers that have not pushed. Deterministic.
 *  ASYNC (a_sync = true, k_steps = 0): every push is applied on arrival.
 *  GEO   (a_sync = true, k_steps > 0): workers train on a local copy and push
 *        deltas; the server adds every push to the values as it is (the
 *        optimizer rule is applied by the worker, so only DT_PS_OPT_SGD is
 *        accepted, as in Paddle). */
#define DT_PS_MODE_SYNC 0
#define DT_PS_MODE_ASYNC 1
#define DT_PS_MODE_GEO 2

/* optimizer rules, applied on the server per value (dense) or per row
 * (sparse), with g the (averaged) pushed gradient and lr the learning rate:
 *  SGD:     w -= lr * g                                           (no state)
 *  ADAGRAD: g2 += mean(g*g) over the row (dense: per value);
 *           w -= lr * g / (sqrt(g2) + epsilon), g2 starting at initial_g2sum
 *           (sparse: one scalar of state per row, Paddle's "adagrad")
 *  ADAM:    m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g; t += 1;
 *           w -= lr * (m / (1-beta1^t)) / (sqrt(v / (1-beta2^t)) + epsilon)
 *           (state per value: m and v; per row or table: t)
 * All arithmetic in f32 except the bias corrections, computed in f64 and then
 * rounded to f32. */
#define DT_PS_OPT_SGD 0
#define DT_PS_OPT_ADAGRAD 1
#define DT_PS_OPT_ADAM 2

/* initializers of a new row or of a dense table. A sparse row's initial values
 * depend only on (seed, key, index in the row), never on the server count or
 * on the order rows were created in. */
#define DT_PS_INIT_CONSTANT 0 /* every value = init_a */
#define DT_PS_INIT_UNIFORM 1  /* uniform in [init_a, init_b) */
#define DT_PS_INIT_NORMAL 2   /* mean init_a, standard deviation init_b */

/* save modes (ps_save) */
#define DT_PS_SAVE_FULL 0 /* a checkpoint: values, optimizer state, counters of every row */
#define DT_PS_SAVE_BASE                                      \
  1 /* values and counters of every row, no optimizer state; \
       clears the rows' changed marks */
#define DT_PS_SAVE_DELTA                                      \
  2 /* values and counters of the rows changed since the last \
       BASE or DELTA save; clears the marks */
/* file formats (ps_save) */
#define DT_PS_FORMAT_BINARY 0 /* fast, little-endian, documented in the plugin's README */
#define DT_PS_FORMAT_TEXT 1   /* one line per key (sparse) or value (dense), Paddle-readable */

/* ps_shrink flags */
#define DT_PS_SHRINK_NEW_DAY 1u /* first age every row: unseen_days += 1 (Paddle's day pass) */

/* A table as the workers declare it. Every worker declares the same tables
 * with the same descriptors (a server refuses a descriptor that differs from
 * the one it already has, naming the field). Valid only during the ps_table
 * call; the plugin copies what it keeps. */
typedef struct dt_ps_table_desc_v1 {
  uint32_t struct_size; /* sizeof(dt_ps_table_desc_v1_t) the caller was built with */
  int32_t kind;         /* DT_PS_TABLE_* */
  const char* name;     /* unique in the job: [A-Za-z0-9_.-]+, used in file names and messages */
  uint64_t dim;         /* dense: number of values; sparse: values per row */
  int32_t dtype;        /* DT_DTYPE_F32 (the only value type of v1.1) */
  int32_t mode;         /* DT_PS_MODE_*: the job's mode, the same for every table */
  int32_t optimizer;    /* DT_PS_OPT_* */
  int32_t initializer;  /* DT_PS_INIT_* */
  double learning_rate;
  double beta1;         /* adam */
  double beta2;         /* adam */
  double epsilon;       /* adagrad, adam */
  double initial_g2sum; /* adagrad */
  double init_a;        /* see DT_PS_INIT_* */
  double init_b;
  uint64_t seed; /* initializer seed; also decides probabilistic admission */
  /* Sparse admission. A key gets a row at its admit_count-th push (0 and 1:
   * the first), and then only if a hash of (seed, key) falls under
   * admit_probability (1.0: always). A key without a row pulls as its
   * initial values and its pushes are counted, not applied. */
  uint32_t admit_count;
  uint32_t reserved0;
  double admit_probability;
  /* Sparse eviction, applied by ps_shrink only. Each row keeps show and click
   * (summed from pushes), unseen_days (reset by a push) and a changed mark.
   * shrink multiplies show and click by decay_rate, then deletes a row whose
   * score = (show - click) * nonclk_coeff + click * click_coeff is below
   * delete_threshold, or whose unseen_days exceeds delete_after_unseen_days
   * (0: never by age). */
  double decay_rate;
  double nonclk_coeff;
  double click_coeff;
  double delete_threshold;
  uint32_t delete_after_unseen_days;
  uint32_t reserved1;
  uint64_t reserved[8];
} dt_ps_table_desc_v1_t;

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

  /* ---- minor 1: the parameter server (DT_CAP_PS_*). These sixteen slots were
   * `void* reserved[16]` in v1.0: a v1.0 plugin leaves them NULL and the core
   * never calls a slot whose capability bit is clear or which is NULL. ---- */

  /* Worker: declares a table on every server (idempotent for an identical
   * descriptor) and returns its id in *table at once; the work completes when
   * every server has it. The id is valid on this communicator only. */
  dt_status_t (*ps_table)(dt_comm_h, const dt_ps_table_desc_v1_t* desc, uint32_t* table, const dt_call_opts_v1_t* opts,
                          dt_work_h* out);
  /* Worker: values.count == dim; f32. In SYNC mode waits as described above. */
  dt_status_t (*ps_pull_dense)(dt_comm_h, uint32_t table, const dt_buffer_v1_t* values, const dt_call_opts_v1_t* opts,
                               dt_work_h* out);
  /* Worker: grads.count == dim; f32 (GEO: deltas). */
  dt_status_t (*ps_push_dense)(dt_comm_h, uint32_t table, const dt_buffer_v1_t* grads, const dt_call_opts_v1_t* opts,
                               dt_work_h* out);
  /* Worker: values.count == nkeys * dim, row-major in key order; keys may
   * repeat and may be unsorted. keys must stay valid until the work completes. */
  dt_status_t (*ps_pull_sparse)(dt_comm_h, uint32_t table, const uint64_t* keys, uint64_t nkeys,
                                const dt_buffer_v1_t* values, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Worker: grads.count == nkeys * dim. Rows of a repeated key are summed.
   * show_click: NULL (each key counts show 1, click 0) or 2 * nkeys floats,
   * (show, click) per key. */
  dt_status_t (*ps_push_sparse)(dt_comm_h, uint32_t table, const uint64_t* keys, uint64_t nkeys,
                                const dt_buffer_v1_t* grads, const float* show_click, const dt_call_opts_v1_t* opts,
                                dt_work_h* out);
  /* Worker: every server writes its part of the table under dir/<table name>/
   * (temporary files, fsync, rename), then one manifest is written last: a
   * save interrupted at any point leaves the previous save in dir loadable.
   * mode DT_PS_SAVE_*, format DT_PS_FORMAT_*. dir is shared by the servers
   * (one machine, or a shared file system). */
  dt_status_t (*ps_save)(dt_comm_h, uint32_t table, const char* dir, int32_t mode, int32_t format,
                         const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Worker: loads dir/<table name>/ as written by ps_save, onto any number of
   * servers. A FULL or BASE save replaces the table; a DELTA save overwrites
   * the rows it holds. Fails naming the file and the field on a mismatch
   * (dimension, kind, optimizer state missing for a FULL load...). */
  dt_status_t (*ps_load)(dt_comm_h, uint32_t table, const char* dir, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Worker: eviction on every server, flags DT_PS_SHRINK_*; sparse tables only. */
  dt_status_t (*ps_shrink)(dt_comm_h, uint32_t table, uint32_t flags, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Worker: a barrier among the workers (through the servers). */
  dt_status_t (*ps_barrier)(dt_comm_h, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Worker: tells every server this worker is done (once, before destroy). */
  dt_status_t (*ps_finish)(dt_comm_h, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Server: serves until every worker has called ps_finish or ps_stop is
   * called; the work then completes with DT_OK. opts->timeout_ms is ignored:
   * serving has no deadline (a dead worker is the launcher's to report). */
  dt_status_t (*ps_serve)(dt_comm_h, const dt_call_opts_v1_t* opts, dt_work_h* out);
  /* Server: ends ps_serve gracefully (DT_OK); any thread, never blocks. */
  dt_status_t (*ps_stop)(dt_comm_h, const char* reason);
  void* reserved[4];
} dt_backend_v1_t;

typedef const dt_backend_v1_t* (*dt_backend_v1_entry_fn)(const dt_host_v1_t* host);

#ifdef __cplusplus
}
#endif

#endif /* DTRAIN_ABI_BACKEND_V1_H */
