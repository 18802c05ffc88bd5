#pragma once
// The one place a parameter-server table field is declared: name, C type,
// default, what sets it, and where the frozen ABI holds it. Everything else
// is filled from these lists:
//   - the core's ps::TableConfig (its members are checked against
//     DTRAIN_PS_TABLE_KEYS at compile time, its defaults are set from it),
//     the [ps.tables.<name>] reader (keys, defaults, types, sparse-only
//     keys) and the worker's TableConfig -> dt_ps_table_desc_v1_t;
//   - sdk::TableDesc (backend.h: members, defaults, from_c);
//   - a plugin's own copies, e.g. ps_grpc's proto conversion and the check
//     that a declaration matches the table a server holds.
// dt_ps_table_desc_v1_t (backend_v1.h, frozen) and a plugin's wire message
// stay hand-written contracts; conversions reach them only through these
// lists, field by field by name, and the static_asserts below pin the ABI's
// layout to the lists.
//
// A field is added by one line here (and, for a new ABI version, its slot in
// the new descriptor); a conversion that does not have it fails to compile.
//
// The table's name (a string; const char* in the ABI) and the ABI's
// struct_size and reserved slots are not in the lists: each conversion writes
// the name by hand, once.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk::ps_fields {

// What sets a field.
enum class Key {
  Optional,    // a [ps.tables.<name>] key, the default when absent
  Required,    // a [ps.tables.<name>] key that must be given (the default is a placeholder)
  SparseOnly,  // an optional key a dense table refuses (admission, eviction)
  Job,         // not a table key: the worker sets it from the job (dtype, mode)
};

}  // namespace dtrain::sdk::ps_fields

// X(field, type, default, key, abi_offset, doc)
//   field       the member's name in dt_ps_table_desc_v1_t, sdk::TableDesc,
//               ps::TableConfig, the TOML key and a plugin's wire message
//   type        the ABI's C type; sdk::TableDesc holds the same, ps::TableConfig
//               the same or an enum of that underlying type (kind, optimizer,
//               initializer: their TOML values are the enum's names)
//   default     the value when nothing sets it
//   key         ps_fields::Key, unqualified
//   abi_offset  offsetof(dt_ps_table_desc_v1_t, field): frozen
//   doc         what it means (backend_v1.h has the exact semantics)
//
// The [ps.tables.<name>] keys, in the ABI's order.
#define DTRAIN_PS_TABLE_KEYS(X)                                                                                    \
  X(kind, int32_t, DT_PS_TABLE_SPARSE, Optional, 4, "\"sparse\" (rows by key) or \"dense\" (one vector)")          \
  X(dim, uint64_t, 0, Required, 16, "sparse: values per row; dense: the vector's length")                          \
  X(optimizer, int32_t, DT_PS_OPT_SGD, Optional, 32, "the servers' rule: \"sgd\", \"adagrad\" or \"adam\"")        \
  X(initializer, int32_t, DT_PS_INIT_CONSTANT, Optional, 36,                                                       \
    "\"constant\" (init_a), \"uniform\" [init_a, init_b) or \"normal\" (mean init_a, deviation init_b)")           \
  X(learning_rate, double, 0.01, Optional, 40, "the rule's rate")                                                  \
  X(beta1, double, 0.9, Optional, 48, "adam")                                                                      \
  X(beta2, double, 0.999, Optional, 56, "adam")                                                                    \
  X(epsilon, double, 1e-8, Optional, 64, "adagrad, adam")                                                          \
  X(initial_g2sum, double, 0.0, Optional, 72, "adagrad: the squared-gradient sum a row starts from")               \
  X(init_a, double, 0.0, Optional, 80, "the initializer's first parameter")                                        \
  X(init_b, double, 0.0, Optional, 88, "the initializer's second parameter")                                       \
  X(seed, uint64_t, 0, Optional, 96, "the initializer's seed; also decides probabilistic admission")               \
  X(admit_count, uint32_t, 0, SparseOnly, 104, "a key gets a row at its admit_count-th push (0 and 1: the first)") \
  X(admit_probability, double, 1.0, SparseOnly, 112, "then only if a hash of (seed, key) falls under this")        \
  X(decay_rate, double, 1.0, SparseOnly, 120, "shrink multiplies show and click by this")                          \
  X(nonclk_coeff, double, 1.0, SparseOnly, 128, "score = (show - click) * nonclk_coeff + click * click_coeff")     \
  X(click_coeff, double, 1.0, SparseOnly, 136, "see nonclk_coeff")                                                 \
  X(delete_threshold, double, 0.0, SparseOnly, 144, "shrink deletes a row whose score is below this")              \
  X(delete_after_unseen_days, uint32_t, 0, SparseOnly, 152, "shrink deletes a row unseen for more days (0: never)")

// The descriptor's fields the worker sets from the job, not from the table's keys.
#define DTRAIN_PS_TABLE_JOB_FIELDS(X)                                                    \
  X(dtype, int32_t, DT_DTYPE_F32, Job, 24, "the value type (f32, the only one of v1.1)") \
  X(mode, int32_t, DT_PS_MODE_SYNC, Job, 28, "the job's mode (DT_PS_MODE_*), the same for every table")

// Every field of a table descriptor but its name.
#define DTRAIN_PS_TABLE_FIELDS(X) \
  DTRAIN_PS_TABLE_KEYS(X)         \
  DTRAIN_PS_TABLE_JOB_FIELDS(X)

namespace dtrain::sdk::ps_fields {

// How many fields the lists hold.
#define DTRAIN_PS_FIELD_ONE(field, ...) +1
constexpr int kNumKeys = 0 DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_FIELD_ONE);
constexpr int kNumFields = 0 DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_FIELD_ONE);
#undef DTRAIN_PS_FIELD_ONE

// The frozen ABI against the lists: every listed field is in
// dt_ps_table_desc_v1_t at its offset with its type, and the listed fields
// plus the name, struct_size and reserved slots fill the struct exactly (a
// slot the lists lack would leave bytes over).
#define DTRAIN_PS_FIELD_ABI(field, type, def, key, offset, doc)                                      \
  static_assert(offsetof(dt_ps_table_desc_v1_t, field) == (offset),                                  \
                "dt_ps_table_desc_v1_t." #field " moved: the v1 ABI is frozen (ps_table_fields.h)"); \
  static_assert(std::is_same_v<decltype(dt_ps_table_desc_v1_t::field), type>,                        \
                "dt_ps_table_desc_v1_t." #field " is not of its listed type (ps_table_fields.h)");
DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_FIELD_ABI)
#undef DTRAIN_PS_FIELD_ABI

#define DTRAIN_PS_FIELD_SIZE(field, type, ...) +sizeof(type)
constexpr size_t kUnlistedAbiBytes = sizeof(dt_ps_table_desc_v1_t::struct_size) + sizeof(dt_ps_table_desc_v1_t::name) +
                                     sizeof(dt_ps_table_desc_v1_t::reserved0) +
                                     sizeof(dt_ps_table_desc_v1_t::reserved1) + sizeof(dt_ps_table_desc_v1_t::reserved);
static_assert(sizeof(dt_ps_table_desc_v1_t) == 224, "dt_ps_table_desc_v1_t changed size: the v1 ABI is frozen");
static_assert(kUnlistedAbiBytes + (0 DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_FIELD_SIZE)) == sizeof(dt_ps_table_desc_v1_t),
              "dt_ps_table_desc_v1_t has a field DTRAIN_PS_TABLE_FIELDS lacks (or the lists one it lacks)");
#undef DTRAIN_PS_FIELD_SIZE
// The ABI's field slots: struct_size, name, reserved0, reserved1, reserved[8] and the listed ones.
constexpr int kAbiFieldSlots = 26;
static_assert(kNumFields + 5 == kAbiFieldSlots, "DTRAIN_PS_TABLE_FIELDS must list every field of the ABI descriptor");

}  // namespace dtrain::sdk::ps_fields
