#pragma once
// ps::TableConfig against the SDK's field lists (dtrain/sdk/ps_table_fields.h,
// the one place a table field is declared): the compile-time check that its
// members are exactly the listed keys, and the worker's conversion to the
// plugin ABI's table descriptor, field by field through the lists.

#include <type_traits>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/ps_table_fields.h"

namespace dtrain::ps::detail {

// A TableConfig member holds its listed ABI type, or an enum of that
// underlying type (kind, optimizer, initializer).
template <class Core, class Abi, class = void>
struct SameRepr : std::is_same<Core, Abi> {};
template <class Core, class Abi>
struct SameRepr<Core, Abi, std::enable_if_t<std::is_enum_v<Core>>> : std::is_same<std::underlying_type_t<Core>, Abi> {};

#define DTRAIN_PS_CORE_TYPE(field, type, ...)                        \
  static_assert(SameRepr<decltype(TableConfig::field), type>::value, \
                "TableConfig::" #field " is not of its listed type (dtrain/sdk/ps_table_fields.h)");
DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_CORE_TYPE)
#undef DTRAIN_PS_CORE_TYPE

// TableConfig holds its name and the listed keys, nothing else: the
// structured binding names one variable per listed key, so a member the list
// lacks (or a listed key TableConfig lacks) fails to compile here.
inline void check_table_config_members(TableConfig& c) {
#define DTRAIN_PS_BIND(field, ...) , field
  [[maybe_unused]] auto& [name DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_BIND)] = c;
#undef DTRAIN_PS_BIND
}

// The descriptor the worker declares a table with: the name, every listed
// key from c, the job's fields (dtype at its listed default, the job's mode).
// d.name points into c.
inline dt_ps_table_desc_v1_t to_desc(const TableConfig& c, Mode mode) {
  dt_ps_table_desc_v1_t d{};
  d.struct_size = sizeof(d);
  d.name = c.name.c_str();
#define DTRAIN_PS_TO_ABI(field, type, ...) d.field = static_cast<type>(c.field);
  DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_TO_ABI)
#undef DTRAIN_PS_TO_ABI
#define DTRAIN_PS_JOB_DEFAULT(field, type, def, ...) d.field = def;
  DTRAIN_PS_TABLE_JOB_FIELDS(DTRAIN_PS_JOB_DEFAULT)
#undef DTRAIN_PS_JOB_DEFAULT
  d.mode = static_cast<int32_t>(mode);
  return d;
}

}  // namespace dtrain::ps::detail
