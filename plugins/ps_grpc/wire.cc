#include "wire.h"

#include <cctype>

namespace dtrain::ps_grpc {

grpc::StatusCode grpc_code(dt_status_t status) {
  switch (status) {
    case DT_OK: return grpc::StatusCode::OK;
    case DT_ERR_INVALID_USAGE: return grpc::StatusCode::INVALID_ARGUMENT;
    case DT_ERR_TIMEOUT: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case DT_ERR_NOT_SUPPORTED: return grpc::StatusCode::UNIMPLEMENTED;
    case DT_ERR_ABORTED: return grpc::StatusCode::ABORTED;
    case DT_ERR_REMOTE: return grpc::StatusCode::FAILED_PRECONDITION;
    case DT_ERR_SYSTEM: return grpc::StatusCode::DATA_LOSS;
    default: return grpc::StatusCode::INTERNAL;
  }
}

void to_proto(const sdk::TableDesc& d, TableDesc* p) {
  p->set_kind(d.kind);
  p->set_name(d.name);
  p->set_dim(d.dim);
  p->set_dtype(d.dtype);
  p->set_mode(d.mode);
  p->set_optimizer(d.optimizer);
  p->set_initializer(d.initializer);
  p->set_learning_rate(d.learning_rate);
  p->set_beta1(d.beta1);
  p->set_beta2(d.beta2);
  p->set_epsilon(d.epsilon);
  p->set_initial_g2sum(d.initial_g2sum);
  p->set_init_a(d.init_a);
  p->set_init_b(d.init_b);
  p->set_seed(d.seed);
  p->set_admit_count(d.admit_count);
  p->set_admit_probability(d.admit_probability);
  p->set_decay_rate(d.decay_rate);
  p->set_nonclk_coeff(d.nonclk_coeff);
  p->set_click_coeff(d.click_coeff);
  p->set_delete_threshold(d.delete_threshold);
  p->set_delete_after_unseen_days(d.delete_after_unseen_days);
}

sdk::TableDesc from_proto(const TableDesc& p) {
  sdk::TableDesc d;
  d.kind = p.kind();
  d.name = p.name();
  d.dim = p.dim();
  d.dtype = p.dtype();
  d.mode = p.mode();
  d.optimizer = p.optimizer();
  d.initializer = p.initializer();
  d.learning_rate = p.learning_rate();
  d.beta1 = p.beta1();
  d.beta2 = p.beta2();
  d.epsilon = p.epsilon();
  d.initial_g2sum = p.initial_g2sum();
  d.init_a = p.init_a();
  d.init_b = p.init_b();
  d.seed = p.seed();
  d.admit_count = p.admit_count();
  d.admit_probability = p.admit_probability();
  d.decay_rate = p.decay_rate();
  d.nonclk_coeff = p.nonclk_coeff();
  d.click_coeff = p.click_coeff();
  d.delete_threshold = p.delete_threshold();
  d.delete_after_unseen_days = p.delete_after_unseen_days();
  return d;
}

void check_desc(const sdk::TableDesc& d) {
  auto bad = [&](const std::string& what) { sdk::fail(DT_ERR_INVALID_USAGE, "ps table '" + d.name + "': " + what); };
  if (d.name.empty()) sdk::fail(DT_ERR_INVALID_USAGE, "ps table: the name is empty");
  for (char c : d.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-')
      bad("the name may hold only letters, digits, '_', '.' and '-'");
  if (d.name == "." || d.name == "..") bad("the name may not be '.' or '..'");
  if (d.kind != DT_PS_TABLE_DENSE && d.kind != DT_PS_TABLE_SPARSE)
    bad("kind " + std::to_string(d.kind) + " is unknown");
  if (d.dim == 0) bad("dim is 0");
  if (d.dtype != DT_DTYPE_F32) bad(std::string("dtype ") + sdk::dtype_name(d.dtype) + " is not supported (only f32)");
  if (d.mode < DT_PS_MODE_SYNC || d.mode > DT_PS_MODE_GEO) bad("mode " + std::to_string(d.mode) + " is unknown");
  if (d.optimizer < DT_PS_OPT_SGD || d.optimizer > DT_PS_OPT_ADAM)
    bad("optimizer " + std::to_string(d.optimizer) + " is unknown");
  if (d.initializer < DT_PS_INIT_CONSTANT || d.initializer > DT_PS_INIT_NORMAL)
    bad("initializer " + std::to_string(d.initializer) + " is unknown");
  if (d.mode == DT_PS_MODE_GEO && d.optimizer != DT_PS_OPT_SGD)
    bad("GEO mode takes only the sgd rule (the workers apply the optimizer)");
}

}  // namespace dtrain::ps_grpc
