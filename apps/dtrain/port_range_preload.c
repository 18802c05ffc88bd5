/* libdtrain_portrange.so: with `dtrain --start_port`, the launcher preloads
 * it into every process of the job (LD_PRELOAD) with DTRAIN_PORT_RANGE=lo-hi,
 * the process's own block of the job's range. A TCP socket bound to port 0
 * (any port: Gloo's pair listeners, which its API gives no way to place) is
 * bound to the next free port of the block instead; a busy port is skipped,
 * and a full block fails the bind with EADDRINUSE. Binds to a given port, and
 * everything without DTRAIN_PORT_RANGE, pass through unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr*, socklen_t);

static int range_lo = -1, range_hi = -1;
static atomic_int cursor;

static void read_range(void) {
  const char* text = getenv("DTRAIN_PORT_RANGE");
  char* end = NULL;
  if (!text || !*text) return;
  long lo = strtol(text, &end, 10);
  if (*end != '-') return;
  long hi = strtol(end + 1, &end, 10);
  if (*end != '\0' || lo < 1 || hi < lo || hi > 65535) return;
  range_lo = (int)lo;
  range_hi = (int)hi;
  atomic_init(&cursor, 0);
}

__attribute__((constructor)) static void init(void) { read_range(); }

static int stream_socket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  static bind_fn real = NULL;
  if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
  int any_port = 0;
  if (range_lo > 0 && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
    any_port = ((const struct sockaddr_in*)addr)->sin_port == 0;
  else if (range_lo > 0 && addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
    any_port = ((const struct sockaddr_in6*)addr)->sin6_port == 0;
  if (!any_port || !stream_socket(fd)) return real(fd, addr, len);
  struct sockaddr_storage copy;
  const int span = range_hi - range_lo + 1;
  for (int tries = 0; tries < span; ++tries) {
    int port = range_lo + atomic_fetch_add(&cursor, 1) % span;
    __builtin_memcpy(&copy, addr, len);
    if (addr->sa_family == AF_INET)
      ((struct sockaddr_in*)&copy)->sin_port = htons((uint16_t)port);
    else
      ((struct sockaddr_in6*)&copy)->sin6_port = htons((uint16_t)port);
    if (real(fd, (const struct sockaddr*)&copy, len) == 0) return 0;
    if (errno != EADDRINUSE) return -1;
  }
  errno = EADDRINUSE;
  return -1;
}
