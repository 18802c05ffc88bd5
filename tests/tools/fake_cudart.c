/* A stand-in CUDA runtime for machines without a GPU (DTRAIN_CUDART=<this .so>):
 * one "device" whose memory is host memory, and asynchronous copies that
 * really are deferred: a cudaMemcpyAsync only lands at cudaStreamSynchronize,
 * cudaEventSynchronize, or the second cudaEventQuery of an event recorded
 * after it (the first query says "not ready"). So a staging that reads a copy
 * before synchronizing, or completes before its copy back, sees stale bytes
 * and fails its test. Streams are not told apart (one queue, in order).
 * fake_cuda_host_allocs() counts cudaHostAlloc calls (the pinned pool's reuse);
 * fake_cuda_pending() is the number of copies issued that have not landed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum { kSuccess = 0, kErrorInvalidValue = 1, kErrorNotReady = 600 };

typedef struct {
  void* dst;
  void* src; /* read when the copy lands, as a GPU would */
  size_t n;
} Copy;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Copy* pending;
static size_t npending, cap;
static unsigned long long issued, landed; /* copies issued / landed, in order */
static long host_allocs;

typedef struct {
  unsigned long long mark; /* copies issued before the record */
  int queried;
} Event;

static void land_until(unsigned long long mark) { /* under mu */
  size_t k = 0;
  while (landed < mark && k < npending) {
    if (pending[k].n) memcpy(pending[k].dst, pending[k].src, pending[k].n);
    ++k;
    ++landed;
  }
  if (k == 0) return;
  memmove(pending, pending + k, (npending - k) * sizeof(Copy));
  npending -= k;
}

EXPORT int cudaGetDeviceCount(int* n) {
  *n = 1;
  return kSuccess;
}
EXPORT const char* cudaGetErrorString(int st) { return st == kErrorNotReady ? "fake: not ready" : "fake: error"; }
EXPORT int cudaGetLastError(void) { return kSuccess; }
EXPORT int cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return kSuccess;
}
EXPORT int cudaGetDevice(int* d) {
  *d = 0;
  return kSuccess;
}
EXPORT int cudaSetDevice(int d) { return d == 0 ? kSuccess : kErrorInvalidValue; }
EXPORT int cudaMalloc(void** p, size_t n) {
  *p = malloc(n ? n : 1);
  return *p ? kSuccess : 2;
}
EXPORT int cudaFree(void* p) {
  free(p);
  return kSuccess;
}
EXPORT int cudaHostAlloc(void** p, size_t n, unsigned flags) {
  (void)flags;
  *p = malloc(n ? n : 1);
  pthread_mutex_lock(&mu);
  ++host_allocs;
  pthread_mutex_unlock(&mu);
  return *p ? kSuccess : 2;
}
EXPORT int cudaFreeHost(void* p) {
  free(p);
  return kSuccess;
}
EXPORT int cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
  (void)kind;
  pthread_mutex_lock(&mu);
  land_until(issued);
  if (n) memcpy(dst, src, n);
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  (void)kind;
  (void)stream;
  pthread_mutex_lock(&mu);
  if (npending == cap) {
    cap = cap ? 2 * cap : 64;
    pending = realloc(pending, cap * sizeof(Copy));
  }
  pending[npending].dst = dst;
  pending[npending].src = (void*)src;
  pending[npending].n = n;
  ++npending;
  ++issued;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int cudaStreamSynchronize(void* stream) {
  (void)stream;
  pthread_mutex_lock(&mu);
  land_until(issued);
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int cudaEventCreateWithFlags(void** e, unsigned flags) {
  (void)flags;
  *e = calloc(1, sizeof(Event));
  return *e ? kSuccess : 2;
}
EXPORT int cudaEventRecord(void* e, void* stream) {
  (void)stream;
  pthread_mutex_lock(&mu);
  ((Event*)e)->mark = issued;
  ((Event*)e)->queried = 0;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int cudaEventQuery(void* e) {
  Event* ev = (Event*)e;
  int st = kSuccess;
  pthread_mutex_lock(&mu);
  if (landed < ev->mark && !ev->queried++)
    st = kErrorNotReady;
  else
    land_until(ev->mark);
  pthread_mutex_unlock(&mu);
  return st;
}
EXPORT int cudaEventSynchronize(void* e) {
  pthread_mutex_lock(&mu);
  land_until(((Event*)e)->mark);
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int cudaEventDestroy(void* e) {
  free(e);
  return kSuccess;
}
EXPORT long fake_cuda_host_allocs(void) {
  pthread_mutex_lock(&mu);
  long n = host_allocs;
  pthread_mutex_unlock(&mu);
  return n;
}
EXPORT long fake_cuda_pending(void) {
  pthread_mutex_lock(&mu);
  long n = (long)npending;
  pthread_mutex_unlock(&mu);
  return n;
}
