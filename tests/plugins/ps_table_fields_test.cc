// The parameter-server table fields, declared once (dtrain/sdk/ps_table_fields.h),
// through every copy of them: the worker's ps::TableConfig, the frozen ABI
// descriptor, sdk::TableDesc, ps_grpc's wire message and the table a server
// holds. Every check walks the lists, so a field added to them is covered
// here without a change to this file.

#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "dtrain/config.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/backend.h"
#include "dtrain/sdk/ps_table_fields.h"
#include "engine/table.h"
#include "ps/table_desc.h"
#include "service/wire.h"

namespace dtrain {
namespace {

namespace fields = sdk::ps_fields;

// A distinct value for the field at `index` of the lists, apart from every
// listed default (TheTestValuesAreNotTheDefaults checks).
template <class T>
T distinct(int index) {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(0.0625 * (index + 1) + 0.001);
  else
    return static_cast<T>(index + 101);
}

// The valid non-default values of the enum-coded keys (kind, optimizer,
// initializer), each another value, so two swapped fields show.
ps::TableKind pick(ps::TableKind) { return ps::TableKind::Dense; }
ps::Optimizer pick(ps::Optimizer) { return ps::Optimizer::Adam; }
ps::Initializer pick(ps::Initializer) { return ps::Initializer::Uniform; }
template <class T>
T valid_distinct(int index) {
  if constexpr (std::is_enum_v<T>)
    return pick(T{});
  else
    return distinct<T>(index);
}

TEST(PsTableFields, TheListsCoverTheAbiDescriptorAndTheWireMessage) {
  // Compile-time in ps_table_fields.h: offsets, types and the ABI's size.
  EXPECT_EQ(fields::kNumFields + 5, fields::kAbiFieldSlots);  // + struct_size, name, reserved0, reserved1, reserved
  EXPECT_EQ(fields::kNumKeys + 2, fields::kNumFields);        // + dtype, mode
  // The wire message holds the name and every listed field, nothing else.
  const auto* message = ps_grpc::TableDesc::descriptor();
  EXPECT_EQ(message->field_count(), fields::kNumFields + 1);
  EXPECT_NE(message->FindFieldByName("name"), nullptr);
#define CHECK_ON_WIRE(field, ...) EXPECT_NE(message->FindFieldByName(#field), nullptr) << #field;
  DTRAIN_PS_TABLE_FIELDS(CHECK_ON_WIRE)
#undef CHECK_ON_WIRE
}

TEST(PsTableFields, EveryCopyStartsAtTheListedDefaults) {
  const ps::TableConfig config;
  const sdk::TableDesc desc;
  EXPECT_EQ(config.name, "");
#define CHECK_DEFAULT(field, type, def, ...)                                    \
  EXPECT_EQ(static_cast<type>(config.field), static_cast<type>(def)) << #field; \
  EXPECT_EQ(desc.field, static_cast<type>(def)) << #field;
  DTRAIN_PS_TABLE_KEYS(CHECK_DEFAULT)
#undef CHECK_DEFAULT
#define CHECK_DEFAULT(field, type, def, ...) EXPECT_EQ(desc.field, static_cast<type>(def)) << #field;
  DTRAIN_PS_TABLE_JOB_FIELDS(CHECK_DEFAULT)
#undef CHECK_DEFAULT
}

TEST(PsTableFields, AJobFileTableWithOnlyItsDimReadsTheListedDefaults) {
  Config c = Config::from_string("[ps.tables.t]\ndim = 3\n", "job.toml");
  const ps::TableConfig t = ps::TableConfig::from_config(c, "t");
  EXPECT_EQ(t.name, "t");
  EXPECT_EQ(t.dim, 3u);
#define CHECK_READ_DEFAULT(field, type, def, key, ...)                       \
  if (fields::Key::key != fields::Key::Required) {                           \
    EXPECT_EQ(static_cast<type>(t.field), static_cast<type>(def)) << #field; \
  }
  DTRAIN_PS_TABLE_KEYS(CHECK_READ_DEFAULT)
#undef CHECK_READ_DEFAULT
}

TEST(PsTableFields, TheTestValuesAreNotTheDefaults) {
  int i = 0;
#define CHECK_NOT_DEFAULT(field, type, def, ...)                  \
  EXPECT_NE(distinct<type>(i), static_cast<type>(def)) << #field; \
  ++i;
  DTRAIN_PS_TABLE_FIELDS(CHECK_NOT_DEFAULT)
#undef CHECK_NOT_DEFAULT
  i = 0;
#define CHECK_NOT_DEFAULT(field, type, def, ...)                                                                       \
  EXPECT_NE(static_cast<type>(valid_distinct<decltype(ps::TableConfig::field)>(i)), static_cast<type>(def)) << #field; \
  ++i;
  DTRAIN_PS_TABLE_KEYS(CHECK_NOT_DEFAULT)
#undef CHECK_NOT_DEFAULT
}

// ABI descriptor -> sdk::TableDesc -> wire bytes -> sdk::TableDesc: every
// field, the job's fields too, at a distinct value (not necessarily one a
// table takes).
TEST(PsTableFields, EveryFieldRoundTripsThroughTheSdkAndTheWire) {
  dt_ps_table_desc_v1_t abi{};
  abi.struct_size = sizeof(abi);
  abi.name = "every.field";
  int i = 0;
#define SET_ABI(field, type, ...) abi.field = distinct<type>(i++);
  DTRAIN_PS_TABLE_FIELDS(SET_ABI)
#undef SET_ABI

  const sdk::TableDesc from_abi = sdk::TableDesc::from_c(abi);
  ps_grpc::TableDesc message;
  ps_grpc::to_proto(from_abi, &message);
  std::string bytes;
  ASSERT_TRUE(message.SerializeToString(&bytes));
  ps_grpc::TableDesc received;
  ASSERT_TRUE(received.ParseFromString(bytes));
  const sdk::TableDesc back = ps_grpc::from_proto(received);

  EXPECT_EQ(from_abi.name, "every.field");
  EXPECT_EQ(back.name, "every.field");
  i = 0;
#define CHECK_FIELD(field, type, ...)                                \
  EXPECT_EQ(from_abi.field, distinct<type>(i)) << "from_c: " #field; \
  EXPECT_EQ(back.field, distinct<type>(i)) << "wire: " #field;       \
  ++i;
  DTRAIN_PS_TABLE_FIELDS(CHECK_FIELD)
#undef CHECK_FIELD
}

// The whole way a declaration travels: the worker's TableConfig -> the ABI
// descriptor (the core's to_desc) -> sdk::TableDesc (the plugin's from_c)
// -> ps_grpc's wire message -> the table a server creates from it. Every key
// at a distinct value a table takes; the job's fields as the worker sets them.
TEST(PsTableFields, EveryKeyRoundTripsFromTheWorkersConfigToTheServersTable) {
  ps::TableConfig config;
  config.name = "every_key";
  int i = 0;
#define SET_KEY(field, ...) config.field = valid_distinct<decltype(config.field)>(i++);
  DTRAIN_PS_TABLE_KEYS(SET_KEY)
#undef SET_KEY

  const dt_ps_table_desc_v1_t abi = ps::detail::to_desc(config, ps::Mode::Async);
  const sdk::TableDesc declared = sdk::TableDesc::from_c(abi);
  ps_grpc::TableDesc message;
  ps_grpc::to_proto(declared, &message);
  std::string bytes;
  ASSERT_TRUE(message.SerializeToString(&bytes));
  ps_grpc::TableDesc received;
  ASSERT_TRUE(received.ParseFromString(bytes));
  const sdk::TableDesc on_server = ps_grpc::from_proto(received);
  ps_grpc::check_desc(on_server);
  ps_grpc::Sharding sharding;
  auto table = ps_grpc::Table::create(on_server, sharding, 0, 1);
  const sdk::TableDesc& held = table->desc();

  EXPECT_STREQ(abi.name, "every_key");
  EXPECT_EQ(held.name, "every_key");
#define CHECK_KEY(field, type, ...)                                        \
  EXPECT_EQ(abi.field, static_cast<type>(config.field)) << "abi: " #field; \
  EXPECT_EQ(held.field, static_cast<type>(config.field)) << "server: " #field;
  DTRAIN_PS_TABLE_KEYS(CHECK_KEY)
#undef CHECK_KEY
  EXPECT_EQ(held.mode, DT_PS_MODE_ASYNC);
  EXPECT_EQ(held.dtype, DT_DTYPE_F32);
  EXPECT_EQ(table->differs(declared), "");

  // And the server tells a declaration that differs in any one field, by its name.
#define CHECK_DIFFERS(field, ...)                                                          \
  {                                                                                        \
    sdk::TableDesc other = declared;                                                       \
    other.field = other.field + 1;                                                         \
    EXPECT_EQ(table->differs(other).rfind(#field " is ", 0), 0u) << table->differs(other); \
  }
  DTRAIN_PS_TABLE_FIELDS(CHECK_DIFFERS)
#undef CHECK_DIFFERS
}

}  // namespace
}  // namespace dtrain
