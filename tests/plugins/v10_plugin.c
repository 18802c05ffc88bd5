/* A plugin built the way a v1.0 plugin was: abi_minor 0 and a table that ends
 * where the parameter-server slots of minor 1 begin. It all-reduces f32 sums
 * through the rendezvous store (each rank publishes its buffer, everyone sums
 * all of them), enough to show that a v1.0 plugin still loads and runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/abi/backend_v1.h"

typedef struct comm {
  int32_t rank, world;
  const dt_store_v1_t* store;
  uint64_t seq;
  volatile int aborted;
  char error[256];
} comm_t;

typedef struct work {
  comm_t* comm;
  dt_buffer_v1_t send, recv;
  uint64_t seq;
  int published;
  int done;
  dt_status_t status;
  char error[256];
} work_t;

static __thread char g_error[256];

static dt_status_t comm_create(const dt_comm_init_v1_t* init, dt_comm_h* out) {
  comm_t* c = (comm_t*)calloc(1, sizeof(comm_t));
  if (!c) {
    snprintf(g_error, sizeof g_error, "out of memory");
    return DT_ERR_SYSTEM;
  }
  c->rank = init->rank;
  c->world = init->world_size;
  c->store = init->store;
  *out = (dt_comm_h)c;
  return DT_OK;
}

static const char* backend_last_error(void) { return g_error; }
static dt_status_t comm_destroy(dt_comm_h h) {
  free(h);
  return DT_OK;
}
static dt_status_t comm_abort(dt_comm_h h, const char* reason) {
  (void)reason;
  ((comm_t*)h)->aborted = 1;
  return DT_OK;
}
static const char* comm_last_error(dt_comm_h h) { return ((comm_t*)h)->error; }

static dt_status_t allreduce(dt_comm_h h, const dt_buffer_v1_t* send, const dt_buffer_v1_t* recv, int32_t op,
                             const dt_call_opts_v1_t* opts, dt_work_h* out) {
  comm_t* c = (comm_t*)h;
  (void)opts;
  if (op != DT_OP_SUM || send->dtype != DT_DTYPE_F32) {
    snprintf(c->error, sizeof c->error, "the v1.0 test plugin sums f32 only");
    return DT_ERR_NOT_SUPPORTED;
  }
  work_t* w = (work_t*)calloc(1, sizeof(work_t));
  if (!w) return DT_ERR_SYSTEM;
  w->comm = c;
  w->send = *send;
  w->recv = *recv;
  w->seq = ++c->seq;
  *out = (dt_work_h)w;
  return DT_OK;
}

static dt_status_t finish(work_t* w, dt_status_t st, const char* msg) {
  w->done = 1;
  w->status = st;
  if (msg) snprintf(w->error, sizeof w->error, "%s", msg);
  return st;
}

static dt_status_t work_wait(dt_work_h h, int64_t timeout_ms) {
  work_t* w = (work_t*)h;
  comm_t* c = w->comm;
  if (w->done) return w->status;
  if (c->aborted) return finish(w, DT_ERR_ABORTED, "aborted");
  size_t bytes = (size_t)w->send.count * sizeof(float);
  char key[64];
  if (!w->published) {
    snprintf(key, sizeof key, "ar/%llu/%d", (unsigned long long)w->seq, c->rank);
    if (c->store->set(c->store->ctx, key, w->send.ptr, bytes) != DT_OK) return finish(w, DT_ERR_SYSTEM, "store set");
    w->published = 1;
  }
  float* sum = (float*)calloc(w->send.count ? w->send.count : 1, sizeof(float));
  if (!sum) return finish(w, DT_ERR_SYSTEM, "out of memory");
  for (int32_t r = 0; r < c->world; ++r) {
    void* value = NULL;
    uint64_t len = 0;
    snprintf(key, sizeof key, "ar/%llu/%d", (unsigned long long)w->seq, r);
    if (c->store->get(c->store->ctx, key, timeout_ms, &value, &len) != DT_OK) {
      free(sum);
      return DT_IN_PROGRESS;
    }
    if (len != bytes) {
      c->store->free_value(c->store->ctx, value);
      free(sum);
      return finish(w, DT_ERR_REMOTE, "a rank sent a different count");
    }
    const float* v = (const float*)value;
    for (uint64_t i = 0; i < w->send.count; ++i) sum[i] += v[i];
    c->store->free_value(c->store->ctx, value);
  }
  if (bytes) memcpy(w->recv.ptr, sum, bytes);
  free(sum);
  return finish(w, DT_OK, NULL);
}

static dt_status_t work_test(dt_work_h h) {
  work_t* w = (work_t*)h;
  return w->done ? w->status : DT_IN_PROGRESS;
}
static const char* work_error(dt_work_h h) { return ((work_t*)h)->error; }
static void work_release(dt_work_h h) { free(h); }

/* The v1.0 layout: everything before the PS slots. */
static _Alignas(16) unsigned char storage[offsetof(dt_backend_v1_t, ps_table)];

__attribute__((visibility("default"))) const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {
  (void)host;
  dt_backend_v1_t t;
  memset(&t, 0, sizeof t);
  t.abi_major = 1;
  t.abi_minor = 0;
  t.struct_size = (uint32_t)offsetof(dt_backend_v1_t, ps_table);
  t.name = "v10";
  t.version = "1.0-test";
  t.description = "a plugin built against ABI 1.0 (tests)";
  t.caps = DT_CAP_ALLREDUCE | DT_CAP_CPU_BUFFERS;
  t.comm_create = comm_create;
  t.backend_last_error = backend_last_error;
  t.comm_destroy = comm_destroy;
  t.comm_abort = comm_abort;
  t.comm_last_error = comm_last_error;
  t.allreduce = allreduce;
  t.work_test = work_test;
  t.work_wait = work_wait;
  t.work_error = work_error;
  t.work_release = work_release;
  /* Only the v1.0 part exists in this plugin's memory. */
  memcpy(storage, &t, sizeof storage);
  return (const dt_backend_v1_t*)(const void*)storage;
}
