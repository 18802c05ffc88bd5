#include "work.h"

#include <gloo/common/error.h>

namespace dtrain::gloo_backend {

void rethrow_gloo(const std::exception& e, const std::string& what) {
  std::string m = e.what();
  std::string msg = what + ": " + m;
  if (m.find("Timed out") != std::string::npos || m.find("timed out") != std::string::npos)
    sdk::fail(DT_ERR_TIMEOUT, msg);
  if (dynamic_cast<const ::gloo::IoException*>(&e)) sdk::fail(DT_ERR_REMOTE, msg);
  sdk::fail(DT_ERR_INTERNAL, msg);
}

std::string P2pWork::what() const {
  return std::string(is_send_ ? "send to" : "recv from") + " rank " + std::to_string(peer_);
}

void P2pWork::finish() {
  try {
    auto left = sdk::remaining_ms(deadline_, kGlooSlack);
    int rank = -1;
    bool ok = is_send_ ? buf_->waitSend(&rank, left) : buf_->waitRecv(&rank, left);
    if (ok)
      complete(DT_OK);
    else
      complete(DT_ERR_ABORTED, what() + " aborted");
  } catch (const std::exception& e) {
    try {
      rethrow_gloo(e, what());
    } catch (const sdk::Error& err) {
      complete(err.status(), err.what());
    }
  }
}

void P2pWork::cancel(const std::string& reason) {
  if (is_send_)
    buf_->abortWaitSend();
  else
    buf_->abortWaitRecv();
  complete(DT_ERR_ABORTED, reason);
}

}  // namespace dtrain::gloo_backend
