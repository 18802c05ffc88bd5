#pragma once
// What the client and the server share beside ps.proto: the metadata keys,
// the mapping of dtrain statuses onto gRPC codes, table descriptors on the
// wire and their checks.

#include <grpcpp/grpcpp.h>

#include <string>

#include "dtrain/sdk/backend.h"
#include "files.h"
#include "plugins/ps_grpc/ps.pb.h"

namespace dtrain::ps_grpc {

constexpr char kTokenKey[] = "dtrain-token";    // request metadata: the job token
constexpr char kStatusKey[] = "dtrain-status";  // trailing metadata of a failed call: the DT_ERR_* code

grpc::StatusCode grpc_code(dt_status_t status);

void to_proto(const sdk::TableDesc& d, TableDesc* out);
sdk::TableDesc from_proto(const TableDesc& p);

// Refuses (DT_ERR_INVALID_USAGE, naming the table and the field) a
// descriptor the engine does not take: bad name, dim 0, a dtype other than
// f32, an unknown kind, mode, rule or initializer, GEO with a rule other than SGD.
void check_desc(const sdk::TableDesc& d);

}  // namespace dtrain::ps_grpc
