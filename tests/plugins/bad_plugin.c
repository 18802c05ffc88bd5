/* Deliberately broken plugins for the loader's error tests; one source,
 * one flavour per BAD_* macro. */
#include <string.h>

#include "dtrain/abi/backend_v1.h"

#if defined(BAD_UNRESOLVED)
extern int dtrain_test_symbol_that_does_not_exist(void);
#endif

#if !defined(BAD_NO_ENTRY)
static dt_backend_v1_t table;

__attribute__((visibility("default"))) const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {
  (void)host;
  memset(&table, 0, sizeof(table));
  table.abi_major = DT_BACKEND_V1_MAJOR;
  table.abi_minor = DT_BACKEND_V1_MINOR;
  table.struct_size = sizeof(table);
  table.name = PLUGIN_NAME;
  table.version = "0";
#if defined(BAD_ABI_MAJOR)
  table.abi_major = 99;
#endif
#if defined(BAD_STRUCT_SIZE)
  table.struct_size = 24;
#endif
#if defined(BAD_PS_NULL)
  /* claims the PS caps of ABI 1.1 but fills none of their slots */
  table.caps = DT_CAP_ALLREDUCE | DT_CAP_CPU_BUFFERS | DT_CAP_PS_DENSE | DT_CAP_PS_SERVER;
#endif
#if defined(BAD_NAME)
  table.name = "someone_else";
#endif
#if defined(BAD_UNRESOLVED)
  if (dtrain_test_symbol_that_does_not_exist()) table.version = "1";
#endif
  return &table;
}
#else
__attribute__((visibility("default"))) int dtrain_something_else(void) { return 0; }
#endif
