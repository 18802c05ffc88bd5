#pragma once
// The factories of the two table kinds (dense_table.cc, sparse_table.cc):
// table.cc's Table::create calls them after checking the descriptor.

#include <memory>

#include "engine/table.h"

namespace dtrain::ps_grpc {

std::unique_ptr<Table> make_dense_table(const sdk::TableDesc& desc, const Sharding& sharding, int server, int workers);
std::unique_ptr<Table> make_sparse_table(const sdk::TableDesc& desc, const Sharding& sharding, int server, int workers);

}  // namespace dtrain::ps_grpc
